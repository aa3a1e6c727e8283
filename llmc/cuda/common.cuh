// llmc/cuda/common.cuh: what every CUDA kernel header shares: error-check
// macros, the bf16 alias, float <-> element conversions, ceil_div, warp and
// block reductions.
//
// Kernels are templates over the element type T (float for the fp32 build,
// bf16 for the mixed-precision build) and always compute in fp32, so one
// source serves both builds. Everything here is header-only; non-template
// functions are `inline` / `static` so several translation units (the
// backend and each kernel-lab program) may include it.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

// A failed CUDA call is a broken machine or a bug: name the place and stop.
#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess) {                                                                        \
            std::fprintf(stderr, "CUDA error at %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
            std::exit(1);                                                                                 \
        }                                                                                                 \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                  \
    do {                                                                                                    \
        cublasStatus_t st_ = (call);                                                                        \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
            std::fprintf(stderr, "cuBLAS error at %s:%d: %s\n", __FILE__, __LINE__, cublasLtGetStatusString(st_)); \
            std::exit(1);                                                                                   \
        }                                                                                                   \
    } while (0)

// Launch errors (bad configuration, too much shared memory) surface here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace llmc_cuda {

using bf16 = __nv_bfloat16;

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// ---- element <-> float -------------------------------------------------------
// Loads widen to fp32; stores narrow with round-to-nearest-even (what the host
// f32_to_bf16 does), so device and host conversions agree bit for bit.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(double x) { return (float)x; }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ double from_float<double>(float x) { return (double)x; }

// ---- reductions ----------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum over the block; every thread gets the result. blockDim.x must be a
// multiple of 32 (at most 1024); `shared` holds at least 32 floats. Starts and
// ends with a barrier so the scratch can be reused by back-to-back calls.
__device__ __forceinline__ float block_sum(float x, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < nwarps ? shared[lane] : 0.f;
    x = warp_sum(x);
    __syncthreads();
    return x;
}
__device__ __forceinline__ float block_max(float x, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < nwarps ? shared[lane] : -INFINITY;
    x = warp_max(x);
    __syncthreads();
    return x;
}

// Grid size for a grid-stride loop over n elements: enough blocks to fill the
// GPU, never more than needed, never zero.
inline unsigned grid_for(size_t n, int block, size_t max_blocks = 65535u * 16) {
    size_t g = ceil_div(n, (size_t)block);
    if (g > max_blocks) g = max_blocks;
    if (g == 0) g = 1;
    return (unsigned)g;
}

// Kernels that want more than the default 48 KiB of dynamic shared memory must
// opt in; cheap enough to do before each such launch.
template <typename Kernel>
inline void allow_smem(Kernel k, size_t bytes) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

}  // namespace llmc_cuda
