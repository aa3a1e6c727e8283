// llmc/plan/hardware.h: what the layout planner (llmc/plan/planner.h) assumes about a
// device and its links: a hardware profile. Two are built in, from the
// vendors' datasheets (each number says where it comes from); others are
// JSON files, written by --calibrate from measurements on the machine at
// hand (llmc/plan/calibrate.cpp) or by hand.
//
// Rates are what the trainer's operations reach, not the silicon's peak:
// compute time = FLOPs / (peak · efficiency), a memory-bound op's time =
// bytes / (bandwidth · efficiency), a collective's time = the alpha-beta
// model of docs/design.md section 10 with the link's latency and
// per-GPU bandwidth (one direction).
#pragma once
#include <string>

struct Hardware {
    std::string name;
    std::string source;     // where the numbers come from
    double peak_flops = 0;  // dense peak of the training dtype (FLOP/s): MFU's denominator (0: unknown)
    double matmul_flops = 0;  // FLOP/s a large matrix product of the training dtype reaches
    // FLOP/s a large FP8 product reaches (--fp8 1, docs/fp8.md), its operands
    // already quantised. 0: the device has none (a GPU profile then refuses
    // --fp8 1); a CPU's emulation multiplies in the compute type, at
    // matmul_flops.
    double fp8_matmul_flops = 0;
    double attn_flops = 0;    // FLOP/s the attention kernels reach
    double mem_bw = 0;        // bytes/s memory-bound kernels reach
    double mem_bytes = 0;     // device memory (bytes)
    double reserve_bytes = 0; // of it, taken by the runtime (CUDA context, NCCL, allocator slack)
    double launch_s = 0;      // fixed cost of one kernel or op
    // The wave model of a matrix product (llmc/plan/cost_model.h): the
    // multiprocessors the tiles run on, and the library's tile (rows x
    // columns of the output, either way round). 0: time products by FLOPs
    // over matmul_flops alone (a CPU, or a rate measured at the model's shapes).
    int sm_count = 0;
    int gemm_tile_m = 0, gemm_tile_n = 0;
    int gpus_per_node = 8;
    double intra_bw = 0, intra_lat = 0;  // within a node: bytes/s per rank (one direction), seconds
    double inter_bw = 0, inter_lat = 0;  // across nodes
    double p2p_lat = 0;                  // latency of a point-to-point transfer (seconds)
    double p2p_bw = 0;                   // its bandwidth (0: the collective link's)
    double comm_overlap = 1;             // 1: collectives run beside compute (GPU); 0: they do not (CPU MPI)
    std::string device = "cuda";         // the backend the profile describes (cuda or cpu)
    std::string dtype = "bf16";          // its precision (bf16, fp32, fp64)
    int threads = 0;                     // CPU threads per rank it was measured with (0: not a CPU profile)
};

// This machine's CPU: its cores and memory, assumed speeds (a plan of a run
// on a CPU before --calibrate has measured one).
Hardware cpu_host();
// A built-in profile ("h100-sxm", "a100-sxm-80g", "cpu") or a JSON file; false with
// *err naming the flag and value otherwise.
bool load_hardware(const std::string& name_or_file, Hardware* hw, std::string* err);
// Writes a profile as JSON (atomically).
bool save_hardware(const std::string& path, const Hardware& hw, std::string* err);
// The names of the built-in profiles, for messages.
std::string hardware_names();
