// llmc/plan/planner.h: the layout planner (./train_gpt --plan search|eval). For
// a model, a sequence length, a global batch, a world of devices and a
// hardware profile (llmc/plan/hardware.h), it says which layouts fit and how fast
// each would run, without running them.
//
// Memory is not a formula: every rank's model and parallel modes are built
// (llmc/parallel/model_stack.h build_stack, the trainer's own code) on a backend that only
// counts (llmc/backend/backend_measure.h), so the planner's bytes are the trainer's
// memory line, byte for byte. The textbook figures are printed beside them.
//
// Time is a cost model (llmc/plan/cost_model.h, docs/design.md section 10),
// per rank and step:
//   compute   matrix products by shape (tiles in waves over the SMs, K split
//             when they cannot fill them, a launch each) at the large-GEMM
//             rate; attention, memory-bound kernels by bytes, launches;
//             recompute adds what it recomputes (with --plan-attention
//             standard, Megatron-LM 2021's block: the T x T scores as
//             batched products and through memory, dropout masks, its fp32
//             loss, its gradient accumulation outside the products);
//   tp, cp    the exact collectives the runtime issues (f and g; the ring's
//             K,V and dK,dV blocks) by the alpha-beta model, on NVLink when
//             the group sits in a node (tp varies fastest, pp slowest),
//             InfiniBand otherwise; tp is blocking, the ring overlaps its
//             transfers with the block's attention;
//   pp        the bubble of the schedule, (pp-1)/(m·vpp) of the stage's
//             time (ZB-H1: (pp-1)·(F+B-W) of a stage, ZBV of a chunk),
//             and the transfers on the pipeline's fill and drain;
//   ep        (Mixtral) the experts' all-to-all of the grouped rows, out
//             and back, forward and backward, blocking, and the counts'
//             all-gather before each forward's;
//   dp        the reduction of each ZeRO stage (and ZeRO-3's gathers),
//             overlapped with the backward as the runtime does it, and the
//             tied embeddings' all-reduce; under expert parallelism the
//             experts' over the expert-data group;
//   optimizer AdamW over the rank's part, memory-bound.
// With a profile whose collectives do not overlap compute (comm_overlap 0:
// the CPU, where MPI progresses only inside its calls) every transfer counts.
#pragma once
#include <string>

#include "llmc/model/config.h"
#include "llmc/plan/hardware.h"
#include "llmc/parallel/layout.h"

struct PlanRequest {
    std::string mode;    // "search" or "eval"
    Layout base;         // world, T, total batch, and the fixed dimensions
    // Which dimensions the user fixed (the rest are searched).
    bool fix_cp_impl = false;  // --cp-impl given: ring, all-to-all or hybrid, as given
    std::string cp_impl = "ring";
    int cp_a2a = 0;            // hybrid: --cp-a2a, ranks per all-to-all group
    bool fix_pp = false, fix_vpp = false, fix_tp = false, fix_cp = false, fix_sp = false, fix_zero = false,
         fix_B = false, fix_recompute = false, fix_ep = false, fix_pp_schedule = false;
    Hardware hw;
    std::string device = "cuda";  // whose precision and allocation rounding the memory uses
    std::string dtype = "auto";
    // The attention the time model assumes: "flash" (this trainer's: no
    // T x T scores in memory, causal half computed) or "standard" (scores
    // materialised, scaled, masked, softmaxed and dropped out in memory, the
    // full square computed: Megatron-LM 2021, before FlashAttention).
    std::string attention = "flash";
    std::string json_path;        // one JSON object per layout
    int top = 10;                 // layouts printed
    std::string model_flag;       // -e as given, for the winner's launch command
    std::string run_flags;        // the user's other training flags (" --name value" each), for the same
};

// Layouts whose predicted tokens/s is within this fraction of the winner's
// are ties: the time model's error against measured and published runs
// (docs/planner.md: 4.5% mean and 10.3% at most on Megatron-LM's ten runs,
// 7% on llm.c's d12, 1-6% on this trainer's d12 on one H200, within 25% on
// this CPU) is about this size, so it cannot order them.
constexpr double kPlanTieBand = 0.10;

// Runs the request and prints its report; false with *err (one line, naming
// the flag) when nothing could be planned.
bool run_planner(const GPTConfig& mc, const PlanRequest& r, std::string* err);
