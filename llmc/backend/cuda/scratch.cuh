// llmc/backend/cuda/scratch.cuh: device memory for the kernels' temporaries
// (partial sums, the encoder's sort, the multi-tensor tables), reserved once.
//
// cudaMalloc and cudaFree synchronise the whole device: done while NCCL
// kernels are in flight they stall this rank until its collectives end,
// and a peer blocked on this rank then never lets them end. So the trainer
// reserves every buffer when it builds the model stack, with the largest
// size the stack will ask for (Backend::reserve_workspace), and from then
// on a buffer never allocates: a larger request is a sizing bug and ends
// the run with a line naming the op and both sizes. Before a reservation
// (the kernel lab, tests) a buffer grows on demand, waiting for the stream
// before it frees the old block.
#pragma once
#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

// Whether the stream's work is being captured into a graph (cuda/graphs.cuh).
inline bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    return cs != cudaStreamCaptureStatusNone;
}

// A table of runs that must go to the device inside a recorded region: the
// capture would hold a copy from host memory that changes after it. The
// trainer passes the same runs every step, so the first step (run before
// any whole-step recording) uploads them; a region that meets new ones is a
// bug, named here.
inline void refuse_table_in_capture(cudaStream_t stream, const char* what) {
    if (capturing(stream))
        throw std::logic_error(std::string("cuda backend: ") + what +
                               ": new runs inside a recorded region (LLMC_CUDA_GRAPH); their table goes to the "
                               "device before the region (docs/design.md 2.9)");
}

class GrowBuffer {
  public:
    // At least `bytes` of device memory; `what` names the op in the error.
    void* get(size_t bytes, cudaStream_t stream, const char* what) {
        if (bytes > cap_) {
            if (fixed_)
                throw std::runtime_error(std::string("cuda backend: ") + what + " needs " + std::to_string(bytes) +
                                         " bytes of scratch, more than the " + std::to_string(cap_) +
                                         " reserved when the model was built (Backend::reserve_workspace); "
                                         "no device memory is allocated between steps");
            // A stream being captured into a graph (cuda/graphs.cuh) cannot
            // allocate: say which op asked, rather than the capture's error.
            if (capturing(stream))
                throw std::runtime_error(std::string("cuda backend: ") + what + " needs " + std::to_string(bytes) +
                                         " bytes of scratch inside a recorded region (LLMC_CUDA_GRAPH), more than "
                                         "the " + std::to_string(cap_) + " held; reserve it first "
                                         "(Backend::reserve_workspace)");
            grow(std::max(bytes, cap_ + cap_ / 2), stream);
        }
        return p_;
    }
    // Allocates at least `bytes` now (nothing if already held) and fixes the
    // size from then on.
    void reserve(size_t bytes, cudaStream_t stream) {
        if (bytes > cap_) grow(bytes, stream);
        fixed_ = true;
    }
    size_t capacity() const { return cap_; }
    void release() {
        if (p_) cudaFree(p_);
        p_ = nullptr;
        cap_ = 0;
        fixed_ = false;
    }

  private:
    void grow(size_t bytes, cudaStream_t stream) {
        if (p_) {
            CUDA_CHECK(cudaStreamSynchronize(stream));  // a kernel launched earlier may still use it
            CUDA_CHECK(cudaFree(p_));
            p_ = nullptr;
        }
        CUDA_CHECK(cudaMalloc(&p_, bytes));
        cap_ = bytes;
    }
    void* p_ = nullptr;
    size_t cap_ = 0;
    bool fixed_ = false;
};

}  // namespace llmc_cuda
