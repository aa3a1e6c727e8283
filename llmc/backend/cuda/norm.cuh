// llmc/backend/cuda/norm.cuh: sum of squares of a buffer (the global gradient norm
// for clipping), returned to the host as a double.
//
// A fixed grid of blocks (independent of the GPU) each sums a grid-stride
// slice in double and writes one double partial; the host adds the partials
// in block order. Double accumulation keeps 124M-element sums accurate, and
// the operation is memory-bound, so fp64 arithmetic costs nothing visible on
// data-centre GPUs.
#pragma once
#include <vector>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

constexpr int kNormBlock = 512;
constexpr int kNormMaxBlocks = 1024;

inline int sum_squares_blocks(size_t n) {
    size_t g = ceil_div(n, (size_t)kNormBlock * 8);
    return (int)(g < 1 ? 1 : (g > kNormMaxBlocks ? kNormMaxBlocks : g));
}
// Scratch the reduction needs, in doubles.
inline size_t sum_squares_scratch_doubles(size_t n) { return (size_t)sum_squares_blocks(n); }

__device__ __forceinline__ double warp_sum_double(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Widen to double (bf16 via float: exact).
__device__ __forceinline__ double to_double(float x) { return (double)x; }
__device__ __forceinline__ double to_double(double x) { return x; }
__device__ __forceinline__ double to_double(bf16 x) { return (double)__bfloat162float(x); }

template <typename E>
__global__ void sum_squares_kernel(double* partial, const E* x, size_t n) {
    __shared__ double red[32];
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const double v = to_double(x[i]);
        acc += v * v;
    }
    acc = warp_sum_double(acc);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x / 32) ? red[lane] : 0.0;
        acc = warp_sum_double(acc);
        if (lane == 0) partial[blockIdx.x] = acc;
    }
}

// scratch: at least sum_squares_scratch_doubles(n) doubles of device memory.
// Synchronises the stream (the result goes to the host).
template <typename E>
double sum_squares(const E* x, size_t n, double* scratch, cudaStream_t stream) {
    if (n == 0) return 0.0;
    const int nblocks = sum_squares_blocks(n);
    sum_squares_kernel<E><<<nblocks, kNormBlock, 0, stream>>>(scratch, x, n);
    CUDA_CHECK_LAUNCH();
    std::vector<double> host(nblocks);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), scratch, nblocks * sizeof(double), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double total = 0.0;
    for (double p : host) total += p;
    return total;
}

}  // namespace llmc_cuda
