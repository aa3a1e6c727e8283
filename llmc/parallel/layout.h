// llmc/parallel/layout.h: a layout, how a run is split over its ranks (pipeline
// stages and chunks, data, context and tensor parallel degrees, sequence
// parallel, ZeRO stage, micro-batch, recompute, LM-head chunk); the checks that say whether
// it fits a world and a model; and the one function that builds a rank's
// model with its parallel modes. The trainer builds its own rank's stack on
// its backend; the planner (llmc/plan/planner.h) builds any rank's stack of any
// layout on a backend that only counts, so both allocate through the same
// code and the planner's memory is the trainer's, byte for byte.
#pragma once
#include <memory>
#include <string>

#include "llmc/comm/comm.h"
#include "llmc/model/context_parallel.h"
#include "llmc/model/gpt.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/tensor_parallel.h"
#include "llmc/parallel/data_parallel.h"
#include "llmc/parallel/optimizer_step.h"
#include "llmc/parallel/pipeline_parallel.h"

struct Layout {
    int world = 1;
    int pp = 1, vpp = 1, tp = 1, cp = 1, sp = 0, zero = 0;
    // Expert parallel (Mixtral, docs/moe.md): the experts split over groups
    // of ep data-parallel ranks (ep divides dp and the expert count).
    int ep = 1;
    int B = 1, T = 1;            // micro-batch rows and sequence length
    long long total_batch = -1;  // tokens per optimizer step (-1: B·T·dp)
    Recompute recompute = Recompute::none;
    int head_chunk = 0;          // rows per LM-head chunk (0: the whole micro-batch at once)
    // Context parallel's implementation: ranks per all-to-all group (1: the
    // ring alone; cp: all-to-all alone, --cp-impl a2a; between: --cp-impl
    // hybrid, all-to-all in groups of cp_a2a and a ring over cp/cp_a2a).
    int cp_a2a = 1;
    bool cp_hybrid() const { return cp_a2a > 1 && cp_a2a < cp; }

    int dp() const { return world / (pp * tp * cp); }
    int T_local() const { return T / cp; }
    // Micro-batches per step on each data-parallel rank (after check_layout).
    int micro_batches() const { return (int)(total_batch / ((long long)B * dp() * T)); }
    // "pp 2 x dp 2 x cp 1 x tp 2 (sp), ZeRO 1, B=4, recompute none"
    std::string describe() const;
};

// Layout::cp_a2a of --cp-impl impl (ring, a2a, hybrid) and --cp-a2a n (0: not
// given) under --cp cp: 1, cp or n; false with *err naming the flag when
// they do not go together (n without hybrid; hybrid without 1 < n < cp
// dividing cp).
bool cp_a2a_of(const std::string& impl, int cp, int n, int* cp_a2a, std::string* err);

// The degrees against the world size alone (before the model is known);
// false with *err naming the flag.
bool check_world(const Layout& l, std::string* err);
// Everything against the world and the model, in the order the trainer
// reports them: check_world, then the sequence, the heads, the batch and the
// pipeline. Sets total_batch when it was -1.
bool check_layout(Layout* l, const GPTConfig& c, std::string* err);

// A rank's groups: its communicators (real, or shapes only for the planner)
// and its place along the context-parallel axis; hybrid context parallel's
// two splits of the cp group (null otherwise).
struct RankGroups {
    Comm *tp, *cp, *dpcp, *pp, *embed;
    int cp_rank;
    Comm *cp_a2a = nullptr, *cp_ring = nullptr;
    Comm *ep = nullptr, *edp = nullptr;  // expert parallel (ep > 1)
};

// A rank's model and parallel modes, destroyed in the right order.
struct ModelStack {
    std::unique_ptr<TensorParallel> tp;
    std::unique_ptr<ContextParallel> cp;
    std::unique_ptr<ExpertParallel> ep;
    std::unique_ptr<PipelineParallel> pipe;
    std::unique_ptr<GPT> model;
    std::unique_ptr<DataParallel> dp;
    StepGroups groups;  // what the optimizer step reduces over
    // Bytes of the parallel modes' own buffers (the memory line's comm).
    size_t comm_bytes() const;
    // The optimizer step after a train step's forwards and backwards: waits
    // for the gradient reductions in flight, then optimizer_step(). Returns
    // the global gradient norm before clipping. skip / *skipped: as
    // optimizer_step's (a bad step leaves the model as it was).
    double step(const OptimConfig& o, int step, bool skip = false, bool* skipped = nullptr);
    ~ModelStack();
};

// Builds the stack of a checked layout on backend be (throws
// std::invalid_argument naming the flag if the pipeline does not fit).
void build_stack(Backend& be, const GPTConfig& mc, const Layout& l, const RankGroups& g, ModelStack* s);
