// dev/cuda/previous_elementwise.h: the previous element-wise and per-column
// kernels (from elementwise.cuh, adamw.cuh and matmul.cuh): GELU and the residual
// add, the AdamW update, the bias add and the bias gradient (column sums).
// Kept verbatim in namespace llmc_prev (see previous.h).
#pragma once
#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/elementwise.cuh ====
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

// ==== from llmc/backend/cuda/adamw.cuh ====
struct AdamF {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
};

inline AdamF adam_narrow(const AdamArgs& a) {
    return {(float)a.lr,         (float)a.beta1,      (float)a.beta2,      (float)a.eps,
            (float)a.weight_decay, (float)a.grad_scale, (float)a.bias_corr1, (float)a.bias_corr2};
}

template <typename P, typename G>
__global__ void adamw_kernel(P* param, float* master, const G* grad, float* m, float* v, size_t n, AdamF a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = to_float(grad[i]) * a.grad_scale;
        const float mi = a.beta1 * m[i] + (1.f - a.beta1) * g;
        const float vi = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / a.bc1, vhat = vi / a.bc2;
        float p = master ? master[i] : to_float(param[i]);
        p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * p);
        if (master) master[i] = p;
        param[i] = from_float<P>(p);
    }
}

template <typename P, typename G>
void adamw_update(P* param, float* master, const G* grad, float* m, float* v, size_t n, const AdamArgs& args,
                  cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    adamw_kernel<P, G><<<grid_for(n, block), block, 0, stream>>>(param, master, grad, m, v, n, adam_narrow(args));
    CUDA_CHECK_LAUNCH();
}

// ==== from llmc/backend/cuda/matmul.cuh (bias add and bias gradient) ====
// out[n, o] += bias[o]: the fallback when cuBLASLt rejects the bias epilogue,
// and Backend::add_bias (row-parallel layers add their bias after the
// tensor-parallel reduction). fp32 add, one rounding to E.
template <typename E>
__global__ void add_bias_kernel(E* out, const E* bias, int N, int OC) {
    const size_t total = (size_t)N * OC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_float<E>(to_float(out[i]) + to_float(bias[i % OC]));
}

template <typename E>
void add_bias(E* out, const E* bias, int N, int OC, cudaStream_t stream) {
    if (N <= 0 || OC <= 0) return;
    const int block = 256;
    add_bias_kernel<E><<<grid_for((size_t)N * OC, block), block, 0, stream>>>(out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
}

// ---- bias gradient ------------------------------------------------------------
constexpr int kColSumRowsPerChunk = 64;
constexpr int kColSumMaxChunks = 128;

inline int column_sum_chunks(int N) {
    int c = (int)ceil_div(N, kColSumRowsPerChunk);
    return c < 1 ? 1 : (c > kColSumMaxChunks ? kColSumMaxChunks : c);
}
inline size_t matmul_backward_scratch_floats(int N, int OC) { return (size_t)column_sum_chunks(N) * OC; }

// Block (32, 8): 32 columns, 8 row lanes; block (x, y) sums the rows of chunk
// y for its 32 columns and writes partial[y, c].
template <typename E>
__global__ void column_sum_partial_kernel(float* partial, const E* dout, int N, int OC, int rows_per_chunk) {
    __shared__ float s[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(N, r0 + rows_per_chunk);
    float acc = 0.f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += to_float(dout[(size_t)r * OC + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) t += s[i][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + c] = t;
    }
}

template <typename E>
__global__ void column_sum_finish_kernel(E* dbias, const float* partial, int nchunks, int OC) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float t = 0.f;
    for (int k = 0; k < nchunks; k++) t += partial[(size_t)k * OC + c];
    dbias[c] = from_float<E>(to_float(dbias[c]) + t);
}

// dbias[o] += sum_n dout[n, o]. scratch: matmul_backward_scratch_floats(N, OC).
template <typename E>
void bias_backward(E* dbias, const E* dout, int N, int OC, float* scratch, cudaStream_t stream) {
    const int chunks = column_sum_chunks(N);
    const int rows_per_chunk = (int)ceil_div(N, chunks);
    dim3 grid((unsigned)ceil_div(OC, 32), (unsigned)chunks);
    column_sum_partial_kernel<E><<<grid, dim3(32, 8), 0, stream>>>(scratch, dout, N, OC, rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    column_sum_finish_kernel<E><<<(unsigned)ceil_div(OC, 256), 256, 0, stream>>>(dbias, scratch, chunks, OC);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_prev
