// llmc/plan/hardware.cpp: the built-in hardware profiles and their JSON form
// (llmc/plan/hardware.h). Every number of a built-in profile carries its source;
// the efficiencies that no datasheet gives are marked as assumptions, which
// --calibrate replaces with measurements.
#include "llmc/plan/hardware.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "llmc/base/fileio.h"

using json = nlohmann::json;

namespace {

Hardware h100_sxm() {
    Hardware h;
    h.name = "h100-sxm";
    h.source =
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB): 989 TFLOP/s dense bf16 (1979 with sparsity), "
        "3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s total (450 each way); DGX H100: one 400 Gb/s ConnectX-7 port "
        "per GPU (50 GB/s); 132 SMs (H100 SXM5). Large bf16 matmul about 790 TFLOP/s, 80% of peak: reported "
        "for H100 and H200, not yet measured by this project (docs/design.md section 10; 792 TFLOP/s measured "
        "by the ml-engineering book's MAMF finder, CUDA 12.1). FP8 products: 1979 TFLOP/s dense peak (the same "
        "datasheet), assumed at 2/3 of it, 1320 TFLOP/s (an FP8 product meets the same power limit as a bf16 one at "
        "twice the rate, so it keeps less of its peak), not yet measured by this project. GEMM tile 128x256: cuBLAS's most efficient "
        "tiles are 256x128 and 128x256 (NVIDIA, Matrix Multiplication Background User's Guide, sec. 2.3), "
        "which one it picks per shape is assumed. Attention 137 TFLOP/s, 14% of peak: this trainer's "
        "tensor-core kernels measured in its kernel lab on an H200 (the H100's 132 SMs and clocks; "
        "docs/gpu-results.md, 2026-11-26, head size 64): forward up to 173 TFLOP/s, backward up to 126, so "
        "3.5/(1/173 + 2.5/126) for a forward and its 2.5x backward; FlashAttention-2 reaches 35% of an H100's "
        "peak (Shah et al. 2024, FlashAttention-3, sec. 1), a rate this trainer's kernels do not. Collectives "
        "at what NCCL reaches of the links: on 8 A100 over NVLink about 200 of 300 GB/s "
        "(github.com/NVIDIA/nccl-tests/issues/149 and /178), so 2/3 of NVLink here too (300 GB/s), and about "
        "90% of InfiniBand's line rate (github.com/NVIDIA/nccl-tests/issues/119: 85-96 of 100 GB/s), 45 GB/s. "
        "Assumed (no datasheet; --calibrate measures them): memory-bound kernels at 80% of HBM, 5 us per "
        "kernel launch, 5 us (NVLink) and 10 us (InfiniBand) latency per collective step, 2 GiB held by the "
        "CUDA context, NCCL and allocator slack.";
    h.peak_flops = 989e12;
    h.matmul_flops = 790e12;
    h.fp8_matmul_flops = 1979e12 * 2 / 3;
    h.attn_flops = 3.5 / (1 / 173e12 + 2.5 / 126e12);
    h.mem_bw = 0.8 * 3.35e12;
    h.mem_bytes = 80e9;
    h.reserve_bytes = 2.0 * 1024 * 1024 * 1024;
    h.launch_s = 5e-6;
    h.sm_count = 132;
    h.gemm_tile_m = 128, h.gemm_tile_n = 256;
    h.gpus_per_node = 8;
    h.intra_bw = 300e9;
    h.intra_lat = 5e-6;
    h.inter_bw = 45e9;
    h.inter_lat = 10e-6;
    h.p2p_lat = 10e-6;
    return h;
}

Hardware a100_sxm_80g() {
    Hardware h;
    h.name = "a100-sxm-80g";
    h.source =
        "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): 312 TFLOP/s dense bf16, 2.0 TB/s HBM2e, 80 GB, "
        "NVLink 600 GB/s total (300 each way); DGX A100: one 200 Gb/s HDR InfiniBand port per GPU (25 GB/s); "
        "108 SMs, no FP8 tensor cores (--fp8 1 needs compute capability 8.9). GEMM tile 128x256: cuBLAS's most "
        "efficient tiles (NVIDIA, Matrix Multiplication Background "
        "User's Guide, sec. 2.3), which one it picks per shape is assumed. Attention 60% of peak: "
        "FlashAttention-2 reaches 50-73% of A100 peak (Dao 2023, abstract); this trainer's kernels have not "
        "run on an A100. Collectives at what NCCL reaches: all-reduce bus bandwidth about 200 GB/s on 8 A100 "
        "over NVLink (github.com/NVIDIA/nccl-tests/issues/149 and /178), about 90% of InfiniBand's line rate "
        "(github.com/NVIDIA/nccl-tests/issues/119: 85-96 of 100 GB/s), 22.5 GB/s. Assumed (--calibrate "
        "measures them): large bf16 matmul at the 80% of peak reported for H100 (790/989, docs/design.md "
        "section 10; the ml-engineering book's MAMF finder measured 267.9 TFLOP/s, 86%, at its best shape "
        "with CUDA 12.1, newer software than the runs compared with), memory-bound kernels at 80% of HBM, "
        "5 us per kernel launch, 5 us (NVLink) and 10 us (InfiniBand) latency per collective step, 2 GiB "
        "held by the runtime.";
    h.peak_flops = 312e12;
    h.matmul_flops = 0.8 * 312e12;
    h.attn_flops = 0.6 * 312e12;
    h.mem_bw = 0.8 * 2.0e12;
    h.mem_bytes = 80e9;
    h.reserve_bytes = 2.0 * 1024 * 1024 * 1024;
    h.launch_s = 5e-6;
    h.sm_count = 108;
    h.gemm_tile_m = 128, h.gemm_tile_n = 256;
    h.gpus_per_node = 8;
    h.intra_bw = 200e9;
    h.intra_lat = 5e-6;
    h.inter_bw = 22.5e9;
    h.inter_lat = 10e-6;
    h.p2p_lat = 10e-6;
    return h;
}

}  // namespace

// This machine's CPU, for planning a run on it before calibrating: its
// cores and memory as the system reports them, the speeds assumed.
Hardware cpu_host() {
    Hardware h;
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    const double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    h.name = "cpu";
    h.source = "this machine: " + std::to_string(cores) +
               " cores and its memory (sysconf); speeds assumed, not measured (--calibrate FILE measures them): "
               "16 GFLOP/s per core for matrix products (fp32 OpenBLAS on AVX2), 4 GFLOP/s per core for attention, "
               "10 GB/s for memory-bound ops, 10 us per op; MPI between ranks at 5 GB/s and 20 us, not beside compute";
    h.peak_flops = 0;  // MFU is not reported on a CPU
    h.matmul_flops = 16e9 * (double)cores;
    h.fp8_matmul_flops = h.matmul_flops;  // --fp8 1 emulated: the rounded copies multiply in the compute type
    h.attn_flops = 4e9 * (double)cores;
    h.mem_bw = 10e9;
    h.mem_bytes = mem > 0 ? mem : 0;
    h.reserve_bytes = 0;
    h.launch_s = 10e-6;
    h.gpus_per_node = (int)cores;
    h.intra_bw = h.inter_bw = 5e9;
    h.intra_lat = h.inter_lat = h.p2p_lat = 20e-6;
    h.comm_overlap = 0;
    h.device = "cpu";
    h.dtype = "fp32";
    h.threads = (int)cores;
    return h;
}

std::string hardware_names() { return "h100-sxm, a100-sxm-80g, cpu"; }

// What makes a profile unusable, or "" when nothing does: rates must be
// positive and finite, times, sizes and latencies finite and not negative
// (0 for memory means unknown, 0 for a latency or the launch time is a
// one-rank or an idealised profile), at least one GPU per node, an overlap
// between 0 and 1, a known device and dtype. A profile that breaks one of
// these was planned with silently before, giving nonsense figures.
static std::string hardware_problem(const Hardware& h) {
    auto bad = [](const char* field, double v, const char* need) {
        std::ostringstream m;
        m << field << " = " << v << ": " << need;
        return m.str();
    };
    const std::pair<const char*, double> rates[] = {{"matmul_flops", h.matmul_flops}, {"attn_flops", h.attn_flops},
                                                    {"mem_bw", h.mem_bw},             {"intra_bw", h.intra_bw},
                                                    {"inter_bw", h.inter_bw}};
    for (const auto& r : rates)
        if (!(std::isfinite(r.second) && r.second > 0)) return bad(r.first, r.second, "must be a positive rate");
    const std::pair<const char*, double> others[] = {
        {"peak_flops", h.peak_flops},         {"fp8_matmul_flops", h.fp8_matmul_flops},
        {"mem_bytes", h.mem_bytes},           {"reserve_bytes", h.reserve_bytes},
        {"launch_s", h.launch_s},     {"intra_lat", h.intra_lat}, {"inter_lat", h.inter_lat},
        {"p2p_lat", h.p2p_lat},       {"p2p_bw", h.p2p_bw}};
    for (const auto& o : others)
        if (!(std::isfinite(o.second) && o.second >= 0)) return bad(o.first, o.second, "must be 0 or more");
    if (h.mem_bytes > 0 && h.reserve_bytes >= h.mem_bytes)
        return bad("reserve_bytes", h.reserve_bytes, "must be less than mem_bytes");
    if (h.gpus_per_node < 1) return bad("gpus_per_node", h.gpus_per_node, "must be at least 1");
    const std::pair<const char*, int> counts[] = {
        {"sm_count", h.sm_count}, {"gemm_tile_m", h.gemm_tile_m}, {"gemm_tile_n", h.gemm_tile_n}};
    for (const auto& c : counts)
        if (c.second < 0) return bad(c.first, c.second, "must be 0 or more");
    if (h.threads < 0) return bad("threads", h.threads, "must be 0 or more");
    if (!(h.comm_overlap >= 0 && h.comm_overlap <= 1)) return bad("comm_overlap", h.comm_overlap, "must be in [0, 1]");
    if (h.device != "cuda" && h.device != "cpu") return "device = '" + h.device + "': expected cuda or cpu";
    if (h.dtype != "bf16" && h.dtype != "fp32" && h.dtype != "fp64")
        return "dtype = '" + h.dtype + "': expected bf16, fp32 or fp64";
    return "";
}

bool load_hardware(const std::string& s, Hardware* hw, std::string* err) {
    if (s == "cpu") {
        *hw = cpu_host();
        return true;
    }
    if (s == "h100-sxm" || s == "h100") {
        *hw = h100_sxm();
        return true;
    }
    if (s == "a100-sxm-80g" || s == "a100") {
        *hw = a100_sxm_80g();
        return true;
    }
    std::ifstream in(s);
    if (!in) {
        *err = "flag --hardware: '" + s + "' is neither a built-in profile (" + hardware_names() +
               ") nor a readable file";
        return false;
    }
    try {
        json j = json::parse(in);
        Hardware h;
        h.name = j.value("name", s);
        h.source = j.value("source", std::string("file ") + s);
        h.peak_flops = j.value("peak_flops", 0.0);
        h.matmul_flops = j.at("matmul_flops");
        h.fp8_matmul_flops = j.value("fp8_matmul_flops", 0.0);
        h.attn_flops = j.at("attn_flops");
        h.mem_bw = j.at("mem_bw");
        h.mem_bytes = j.value("mem_bytes", 0.0);
        h.reserve_bytes = j.value("reserve_bytes", 0.0);
        h.launch_s = j.value("launch_s", 0.0);
        h.sm_count = j.value("sm_count", 0);
        h.gemm_tile_m = j.value("gemm_tile_m", 0);
        h.gemm_tile_n = j.value("gemm_tile_n", 0);
        h.gpus_per_node = j.value("gpus_per_node", 1);
        h.intra_bw = j.at("intra_bw");
        h.intra_lat = j.at("intra_lat");
        h.inter_bw = j.value("inter_bw", h.intra_bw);
        h.inter_lat = j.value("inter_lat", h.intra_lat);
        h.p2p_lat = j.value("p2p_lat", h.intra_lat);
        h.p2p_bw = j.value("p2p_bw", 0.0);
        h.comm_overlap = j.value("comm_overlap", 1.0);
        h.device = j.value("device", std::string("cuda"));
        h.dtype = j.value("dtype", std::string("bf16"));
        h.threads = j.value("threads", 0);
        const std::string why = hardware_problem(h);
        if (!why.empty()) throw std::runtime_error(why);
        *hw = h;
    } catch (const std::exception& e) {
        *err = "flag --hardware: " + s + ": " + e.what();
        return false;
    }
    return true;
}

bool save_hardware(const std::string& path, const Hardware& h, std::string* err) {
    json j = {{"name", h.name},
              {"source", h.source},
              {"dtype", h.dtype},
              {"peak_flops", h.peak_flops},
              {"matmul_flops", h.matmul_flops},
              {"fp8_matmul_flops", h.fp8_matmul_flops},
              {"attn_flops", h.attn_flops},
              {"mem_bw", h.mem_bw},
              {"mem_bytes", h.mem_bytes},
              {"reserve_bytes", h.reserve_bytes},
              {"launch_s", h.launch_s},
              {"sm_count", h.sm_count},
              {"gemm_tile_m", h.gemm_tile_m},
              {"gemm_tile_n", h.gemm_tile_n},
              {"gpus_per_node", h.gpus_per_node},
              {"intra_bw", h.intra_bw},
              {"intra_lat", h.intra_lat},
              {"inter_bw", h.inter_bw},
              {"inter_lat", h.inter_lat},
              {"p2p_lat", h.p2p_lat},
              {"p2p_bw", h.p2p_bw},
              {"comm_overlap", h.comm_overlap},
              {"device", h.device},
              {"threads", h.threads}};
    const std::string text = j.dump(2) + "\n";
    AtomicWriter w;
    return w.open(path, err) && w.write(text.data(), text.size()) && w.commit(err);
}
