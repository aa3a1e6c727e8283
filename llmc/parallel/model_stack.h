// llmc/parallel/model_stack.h: the one function that builds a rank's model
// with its parallel modes from a checked layout and the rank's groups: the
// tensor-, context- and expert-parallel hooks the model calls, the
// pipeline's chunks, the model itself (its options derived from the
// layout), data parallel with ZeRO, and what the optimizer step reduces
// over. The trainer builds its own rank's stack on its backend; the planner
// (llmc/plan/planner.h) builds any rank's stack of any layout on a backend
// that only counts, so both allocate through the same code and the
// planner's memory is the trainer's, byte for byte.
#pragma once
#include <memory>

#include "llmc/model/gpt.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/parallel/data_parallel.h"
#include "llmc/parallel/expert_parallel.h"
#include "llmc/parallel/layout.h"
#include "llmc/parallel/optimizer_step.h"
#include "llmc/parallel/pipeline_parallel.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/parallel/tensor_parallel.h"

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
    double step(const OptimConfig& o, int step, int update, bool skip = false, bool* skipped = nullptr,
                void* figures = nullptr);
    ~ModelStack();
};

// Builds the stack of a checked layout on backend be (throws
// std::invalid_argument naming the flag if the pipeline does not fit).
void build_stack(Backend& be, const GPTConfig& mc, const Layout& l, const RankGroups& g, ModelStack* s);
