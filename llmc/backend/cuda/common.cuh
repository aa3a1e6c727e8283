// llmc/backend/cuda/common.cuh: what every CUDA kernel header shares: error-check
// macros, the bf16 alias, float <-> element conversions, ceil_div, warp and
// block reductions, 16-byte vector loads and stores, and the fixed-order
// column sum of fp32 partials (LayerNorm and bias gradients).
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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llmc/backend/cuda/kernel_index.h"
#include "llmc/backend/fp8.h"

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

// ---- 16-byte vectors ----------------------------------------------------------------
// Memory-bound kernels move 16 bytes per load and store (8 bf16 or 4 fp32):
// a quarter (bf16) of the memory instructions of element-wise access, and
// every warp request covers whole 32-byte sectors. Vec<E, W> is W elements
// with the alignment of their size; W is kVec<E> on the vector path and 1 on
// the scalar fallback, so one kernel body serves both.
template <typename E>
constexpr int kVec = llmc_idx::kVecBytes / (int)sizeof(E);

template <typename E, int W>
struct alignas(sizeof(E) * W) Vec {
    E v[W];
};

// 16-byte accesses go through uint4 so nvcc emits one LDG.128 / STG.128
// (a struct copy could be split); memcpy between registers costs nothing.
template <typename E, int W>
__device__ __forceinline__ Vec<E, W> load_vec(const E* p) {
    Vec<E, W> r;
    if constexpr (sizeof(Vec<E, W>) == 16) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        memcpy(&r, &u, 16);
    } else {
        r = *reinterpret_cast<const Vec<E, W>*>(p);
    }
    return r;
}
template <typename E, int W>
__device__ __forceinline__ void store_vec(E* p, const Vec<E, W>& x) {
    if constexpr (sizeof(Vec<E, W>) == 16) {
        uint4 u;
        memcpy(&u, &x, 16);
        *reinterpret_cast<uint4*>(p) = u;
    } else {
        *reinterpret_cast<Vec<E, W>*>(p) = x;
    }
}
// W elements widened to fp32 / narrowed from fp32 (each a 16-byte access
// when W*sizeof(E) is 16; fp32 items of 8 are two).
template <typename E, int W>
__device__ __forceinline__ void load_floats(float* f, const E* p) {
    constexpr int P = (int)(sizeof(E) * W) > 16 ? 16 / (int)sizeof(E) : W;  // elements per access
#pragma unroll
    for (int q = 0; q < W; q += P) {
        const Vec<E, P> x = load_vec<E, P>(p + q);
#pragma unroll
        for (int j = 0; j < P; j++) f[q + j] = to_float(x.v[j]);
    }
}
template <typename E, int W>
__device__ __forceinline__ void store_floats(E* p, const float* f) {
    constexpr int P = (int)(sizeof(E) * W) > 16 ? 16 / (int)sizeof(E) : W;
#pragma unroll
    for (int q = 0; q < W; q += P) {
        Vec<E, P> x;
#pragma unroll
        for (int j = 0; j < P; j++) x.v[j] = from_float<E>(f[q + j]);
        store_vec<E, P>(p + q, x);
    }
}

// W elements at p, 16 bytes at a time when `vec` (p aligned), else one by
// one: for small operands such as LayerNorm weights that live at arbitrary
// offsets of the flat parameter buffer (the branch is uniform per launch).
template <typename E, int W>
__device__ __forceinline__ void load_floats_any(float* f, const E* p, bool vec) {
    if (vec) {
        load_floats<E, W>(f, p);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = to_float(p[j]);
    }
}

// True when p may be accessed 16 bytes at a time.
inline bool aligned16(const void* p) { return ((uintptr_t)p % llmc_idx::kVecBytes) == 0; }

// ---- fixed-order column sums ---------------------------------------------------------
// dst[c] (+=) sum over k < K of partial[k * ncols + c], for columns c < ncols;
// columns c >= split go to dst2[c - split] instead (LayerNorm's [dw | db]
// slices), split == ncols when there is one destination. Block (32, lanes):
// the order is llmc_idx's colsum order (lane y adds k = y, y + lanes, ...,
// then the lanes are added in lane order), so the result depends only on K.
// One rounding to E per output.
template <typename E>
__global__ void column_sum_finish_kernel(E* dst, E* dst2, const float* partial, int K, int ncols, int split) {
    __shared__ float s[llmc_idx::kColSumLanes][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.f;
    if (c < ncols)
        for (int k = llmc_idx::colsum_first(threadIdx.y); k < K; k += llmc_idx::colsum_stride())
            acc += partial[(size_t)k * ncols + c];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < ncols) {
        float t = 0.f;
#pragma unroll
        for (int y = 0; y < llmc_idx::kColSumLanes; y++) t += s[y][threadIdx.x];
        E* d = c < split ? dst + c : dst2 + (c - split);
        *d = from_float<E>(to_float(*d) + t);
    }
}

template <typename E>
inline void column_sum_finish(E* dst, E* dst2, const float* partial, int K, int ncols, int split,
                              cudaStream_t stream) {
    if (ncols <= 0) return;
    column_sum_finish_kernel<E><<<(unsigned)ceil_div(ncols, 32), dim3(32, llmc_idx::kColSumLanes), 0, stream>>>(
        dst, dst2, partial, K, ncols, split);
    CUDA_CHECK_LAUNCH();
}

// Kernels that want more than the default 48 KiB of dynamic shared memory must
// opt in; cheap enough to do before each such launch.
template <typename Kernel>
inline void allow_smem(Kernel k, size_t bytes) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// |x| as float bits that order like the magnitudes, NaN winning (the FP8
// operands' amax by atomicMax, cuda/fp8.cuh): fp8.h's, shared with the CPU.
using fp8::abs_bits;
// abs_bits of v as an E stores it (rounded): what the next FP8 product reads.
template <typename E>
__device__ __forceinline__ unsigned written_bits(float v) {
    return abs_bits(to_float(from_float<E>(v)));
}
// m, maxed with the written_bits of a pack of W values.
template <typename E, int W>
__device__ __forceinline__ unsigned written_max(unsigned m, const float* v) {
#pragma unroll
    for (int j = 0; j < W; j++) m = max(m, written_bits<E>(v[j]));
    return m;
}
// The warp's largest m into *bits (one atomicMax); every lane of the warp
// calls it. Many warps commit to one word (a norm's: one per row), so the
// first lane reads it first and leaves the atomic out when m is not above
// it: the word only grows, so a stale read can only cost an atomic, never
// skip one, and the result is the same max.
__device__ __forceinline__ void warp_amax_commit(unsigned* bits, unsigned m) {
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m > *(volatile unsigned*)bits) atomicMax(bits, m);
}

}  // namespace llmc_cuda
