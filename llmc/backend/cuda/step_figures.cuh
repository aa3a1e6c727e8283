// llmc/backend/cuda/step_figures.cuh: the step's figures kept on the device
// (Backend::sum_to_figure, step_verdict; step_figure in backend.h): a
// micro-batch's mean loss added to a double in device memory, and the
// step's decision (apply_verdict, llmc/backend/step_figures.h, the host's very
// function) run by one thread. The squared norm's device sum is
// SumSqMulti::run_to (global_norm.cuh); AdamW reads the clip scale and the
// decision itself (adamw.cuh). The figures come to the host one step late
// through LateDownload (pinned memory and an event).
#pragma once
#include <stdexcept>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/global_norm.cuh"
#include "llmc/backend/step_figures.h"

namespace llmc_cuda {

constexpr int kFigureBlock = 1024;

// One block: each thread sums a strided part in double, the block adds them
// by a fixed tree (the same bits run to run), thread 0 adds sum / divisor.
template <typename E>
__global__ void __launch_bounds__(kFigureBlock) sum_to_figure_kernel(double* acc, const E* x, size_t n,
                                                                      double divisor) {
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += to_double(x[i]);
    __shared__ double total;
    block_sum_double_to(s, &total);
    __syncthreads();
    if (threadIdx.x == 0) *acc += total / divisor;
}

inline void sum_to_figure(void* acc, const void* x, DType t, size_t n, double divisor, cudaStream_t stream) {
    double* a = static_cast<double*>(acc);
    switch (t) {
        case DType::F32:
            sum_to_figure_kernel<float><<<1, kFigureBlock, 0, stream>>>(a, static_cast<const float*>(x), n, divisor);
            break;
        case DType::F64:
            sum_to_figure_kernel<double><<<1, kFigureBlock, 0, stream>>>(a, static_cast<const double*>(x), n, divisor);
            break;
        default: throw std::invalid_argument("cuda sum_to_figure: unsupported type");
    }
    CUDA_CHECK_LAUNCH();
}

__global__ void step_verdict_kernel(double* figures, StepVerdict v) { apply_verdict(figures, v); }

inline void step_verdict(void* figures, const StepVerdict& v, cudaStream_t stream) {
    step_verdict_kernel<<<1, 1, 0, stream>>>(static_cast<double*>(figures), v);
    CUDA_CHECK_LAUNCH();
}

// Backend::download_late: a copy into pinned host memory after the work
// queued so far, an event behind it; wait() waits for the event alone (not
// for what was queued after) and hands the values over. The backend keeps
// two, one per slot.
class LateDownload {
  public:
    void start(const void* src, int n, cudaStream_t stream) {
        if (n > cap_) {
            release();
            CUDA_CHECK(cudaMallocHost(&pinned_, (size_t)n * sizeof(double)));
            CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
            cap_ = n;
        }
        CUDA_CHECK(cudaMemcpyAsync(pinned_, src, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaEventRecord(done_, stream));
        n_ = n;
    }
    void wait(double* dst) {
        if (n_ == 0) return;
        CUDA_CHECK(cudaEventSynchronize(done_));
        for (int i = 0; i < n_; i++) dst[i] = pinned_[i];
    }
    void release() {
        if (pinned_) cudaFreeHost(pinned_), cudaEventDestroy(done_);
        pinned_ = nullptr, cap_ = 0, n_ = 0;
    }

  private:
    double* pinned_ = nullptr;
    cudaEvent_t done_{};
    int cap_ = 0, n_ = 0;
};

}  // namespace llmc_cuda
