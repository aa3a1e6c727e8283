// llmc/cuda/gelu.cuh: the elementwise ops: GELU (tanh approximation)
// forward and backward, and the residual add out = a + b.
//
// Memory-bound grid-stride loops computing in fp32. No __restrict__: the
// contract lets gelu_backward's dinp alias dout and residual_forward's out
// alias a or b, which is safe because every element is read and then written
// by the same thread.
#pragma once
#include "common.cuh"

namespace llmc_cuda {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

// tanh through expf: under --use_fast_math nvcc turns tanhf into
// tanh.approx.f32 (about 2^-11 relative error), too coarse for the fp32
// build's checks, while expf stays within a few ulp. Saturates correctly:
// expf overflows to inf for large u (t = 1) and underflows to 0 (t = -1).
__device__ __forceinline__ float tanh_via_exp(float u) { return 1.f - 2.f / (expf(2.f * u) + 1.f); }

template <typename E>
__global__ void gelu_forward_kernel(E* out, const E* inp, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = to_float(inp[i]);
        const float u = kGeluScale * (x + kGeluCube * x * x * x);
        out[i] = from_float<E>(0.5f * x * (1.f + tanh_via_exp(u)));
    }
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'(x),
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <typename E>
__global__ void gelu_backward_kernel(E* dinp, const E* inp, const E* dout, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = to_float(inp[i]);
        const float u = kGeluScale * (x + kGeluCube * x * x * x);
        const float t = tanh_via_exp(u);
        const float sech2 = 1.f - t * t;
        const float grad = 0.5f * (1.f + t) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
        dinp[i] = from_float<E>(grad * to_float(dout[i]));
    }
}

template <typename E>
__global__ void residual_forward_kernel(E* out, const E* a, const E* b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_float<E>(to_float(a[i]) + to_float(b[i]));
}

template <typename E>
void gelu_forward(E* out, const E* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    gelu_forward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(out, inp, n);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    gelu_backward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(dinp, inp, dout, n);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_forward(E* out, const E* a, const E* b, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    residual_forward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
