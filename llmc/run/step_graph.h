// llmc/run/step_graph.h: the whole training step as one recorded region
// (backend.h; docs/design.md section 2.9). The passes' regions leave the
// host's part of a step between them: each forward's token upload, the
// loss, the norm, the optimizer's values. With --sync-free 1 those stay on
// the device (section 2.10), and in a step that communicates nothing (one
// process, a dense model) what remains of the host's part is the data. So
// the step's micro-batches are staged in backend memory before it, and
// everything from zero_grad to AdamW runs as one region: on a GPU under
// LLMC_CUDA_GRAPH=1 one CUDA graph, one launch per step; on the CPU under
// LLMC_CPU_GRAPH=1 the recording backend, which refuses any op a graph
// could not hold. The passes' own regions fold into it.
//
// The first step runs plainly: its first calls upload the optimizer's and
// the norm's tables of runs and make first-use allocations, which a region
// may not hold. The second is recorded (and run), every later one replayed,
// each with the same pointers and arguments: what changes from step to step
// (the staged tokens, the learning rate, the update count, the rounding key,
// the running mean) is in backend memory. A step that a test hook poisons
// runs plainly too (the hook uploads inside the step).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "llmc/backend/backend.h"

class StepGraph {
  public:
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() { release(); }

    // Why the run's steps cannot be one region ("" when they can): the
    // backend records no regions, the figures come to the host every step
    // (no --sync-free), or the step communicates (more than one rank).
    static std::string why_not(bool regions, bool sync_free, int world);
    // Turns it on for steps of `micro` micro-batches of B x T tokens (with
    // document starts when `docs`): the staging buffers in be's memory.
    void start(Backend* be, int micro, int B, int T, bool docs);
    bool on() const { return be_ != nullptr; }

    // Micro-batch k's ids (host) into the staging buffers, before run();
    // dc may be null without the document mask.
    void stage(int k, const int* in, const int* tg, const int* dc);
    // Micro-batch k's staged ids, in backend memory (docs: null without).
    const int* inputs(int k) const { return at(in_, k); }
    const int* targets(int k) const { return at(tg_, k); }
    const int* docs(int k) const { return dc_ ? at(dc_, k) : nullptr; }

    // Runs the step's device work `ops`: plainly (the first step, or
    // `plain`), else replayed, or recorded and run when there is no
    // recording (the second step, and after the backend dropped its
    // recordings: --matmul-tune's choice).
    void run(const std::function<void()>& ops, bool plain);
    int recorded() const { return recorded_; }
    long long replays() const { return replays_; }
    long long plain() const { return plain_; }

  private:
    const int* at(int* base, int k) const { return base + (size_t)k * rows_; }
    void release();
    Backend* be_ = nullptr;
    int *in_ = nullptr, *tg_ = nullptr, *dc_ = nullptr;
    size_t rows_ = 0;  // B x T ids per micro-batch
    int micro_ = 0;
    uint64_t key_ = 0;
    bool seen_ = false;
    int recorded_ = 0;
    long long replays_ = 0, plain_ = 0;
};
