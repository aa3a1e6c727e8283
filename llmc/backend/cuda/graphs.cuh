// llmc/backend/cuda/graphs.cuh: recorded regions as CUDA graphs (backend.h,
// docs/design.md section 2.9), under LLMC_CUDA_GRAPH=1 (cuda/switches.h).
//
// A region is captured from the backend's stream the first time its key is
// seen (cudaStreamBeginCapture: the kernels, cuBLASLt calls, memsets and
// device copies are recorded, not run), instantiated once, and launched:
// at the end of its capture, and in place of the ops every later time. A
// step's forward and backward are a few hundred short kernels; one launch
// each saves their launch gaps, which at d12's sizes are a few percent of
// the step (the benchmark measures it with and without).
//
// Capture mode is thread-local: a call from this thread that would make
// the capture invalid (a synchronisation, a host transfer, an allocation)
// fails at once with its error, naming the call, rather than silently
// recording something else; other threads are left alone (the collective
// watchdog queries its events from its own thread, llmc/comm/watchdog.h,
// which global mode would forbid while a capture is open). The CPU
// emulation of regions (llmc/backend/backend_recorder.h) enforces the same
// rules in the tests.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <unordered_map>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

class StepGraphs {
  public:
    bool on = false;  // LLMC_CUDA_GRAPH
    int recorded() const { return (int)execs_.size(); }
    long long replays() const { return replays_; }

    // Launches the graph recorded under key; false when there is none (or
    // recording is off, or a capture is open: an inner region folds into
    // the outer one, backend.h).
    bool replay(uint64_t key, cudaStream_t stream) {
        if (!on || capturing_) return false;
        auto it = execs_.find(key);
        if (it == execs_.end()) return false;
        CUDA_CHECK(cudaGraphLaunch(it->second, stream));
        replays_++;
        return true;
    }
    // Starts capturing the stream's work under key (false when off, or
    // inside another capture, which then holds this region's work).
    bool begin(uint64_t key, cudaStream_t stream) {
        if (!on || capturing_) return false;
        capturing_ = true;
        key_ = key;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        return true;
    }
    // Ends the capture, keeps the instantiated graph and launches it (the
    // captured work has not run yet).
    void end(cudaStream_t stream) {
        if (!capturing_) throw std::logic_error("cuda graphs: region_end without region_begin");
        capturing_ = false;
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
        auto old = execs_.find(key_);
        if (old != execs_.end()) CUDA_CHECK(cudaGraphExecDestroy(old->second));
        execs_[key_] = exec;
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
    }
    void release() {
        for (auto& kv : execs_) cudaGraphExecDestroy(kv.second);
        execs_.clear();
    }

  private:
    std::unordered_map<uint64_t, cudaGraphExec_t> execs_;
    bool capturing_ = false;
    uint64_t key_ = 0;
    long long replays_ = 0;
};

}  // namespace llmc_cuda
