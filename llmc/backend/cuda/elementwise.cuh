// llmc/backend/cuda/elementwise.cuh: the elementwise ops: GELU (tanh approximation)
// forward and backward, and the residual add out = a + b (also the
// gradient accumulation dst += src).
//
// Memory-bound grid-stride loops computing in fp32, 16 bytes per access
// (8 bf16 or 4 fp32) when every pointer is 16-byte aligned, element by
// element otherwise; llmc_idx::for_each_pack (kernel_index.h) decides which thread
// takes which pack and the tail after the last whole pack. No __restrict__:
// the contract lets gelu_backward's dinp alias dout and residual_forward's
// out alias a or b, which is safe because every pack is read whole and then
// written by the same thread.
#pragma once
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

// tanh through expf: under --use_fast_math nvcc turns tanhf into
// tanh.approx.f32 (about 2^-11 relative error), too coarse for the fp32
// build's checks, while expf stays within a few ulp. Saturates correctly:
// expf overflows to inf for large u (t = 1) and underflows to 0 (t = -1).
__device__ __forceinline__ float tanh_via_exp(float u) { return 1.f - 2.f / (expf(2.f * u) + 1.f); }

__device__ __forceinline__ float gelu_value(float x) {
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    return 0.5f * x * (1.f + tanh_via_exp(u));
}
// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'(x),
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float gelu_grad(float x) {
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float t = tanh_via_exp(u);
    const float sech2 = 1.f - t * t;
    return 0.5f * (1.f + t) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
}

__device__ __forceinline__ size_t global_tid() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t global_threads() { return (size_t)gridDim.x * blockDim.x; }

// out = op(a) or op(a, b) over n elements, W per access. f(first, count)
// from for_each_pack: count is W (a whole pack) or 1 (a tail element).
// amax (null: none): the max of |out| as written (abs_bits) into *amax, the
// next FP8 product's operand measured in this pass (Backend::activation_amax).
template <typename E, int W, typename Op>
__global__ void map1_kernel(E* out, const E* a, size_t n, Op op, unsigned* amax) {
    unsigned m = 0;
    llmc_idx::for_each_pack(n, W, global_tid(), global_threads(), [&](size_t i, int count) {
        if (count == W) {
            const Vec<E, W> x = load_vec<E, W>(a + i);
            Vec<E, W> y;
#pragma unroll
            for (int j = 0; j < W; j++) y.v[j] = from_float<E>(op(to_float(x.v[j])));
            store_vec<E, W>(out + i, y);
            if (amax)
                for (int j = 0; j < W; j++) m = max(m, abs_bits(to_float(y.v[j])));
        } else {
            const E y = from_float<E>(op(to_float(a[i])));
            out[i] = y;
            if (amax) m = max(m, abs_bits(to_float(y)));
        }
    });
    if (amax) warp_amax_commit(amax, m);
}
template <typename E, int W, typename Op>
__global__ void map2_kernel(E* out, const E* a, const E* b, size_t n, Op op, unsigned* amax) {
    unsigned m = 0;
    llmc_idx::for_each_pack(n, W, global_tid(), global_threads(), [&](size_t i, int count) {
        if (count == W) {
            const Vec<E, W> x = load_vec<E, W>(a + i);
            const Vec<E, W> z = load_vec<E, W>(b + i);
            Vec<E, W> y;
#pragma unroll
            for (int j = 0; j < W; j++) y.v[j] = from_float<E>(op(to_float(x.v[j]), to_float(z.v[j])));
            store_vec<E, W>(out + i, y);
            if (amax)
                for (int j = 0; j < W; j++) m = max(m, abs_bits(to_float(y.v[j])));
        } else {
            const E y = from_float<E>(op(to_float(a[i]), to_float(b[i])));
            out[i] = y;
            if (amax) m = max(m, abs_bits(to_float(y)));
        }
    });
    if (amax) warp_amax_commit(amax, m);
}

struct GeluForwardOp {
    __device__ float operator()(float x) const { return gelu_value(x); }
};
struct GeluBackwardOp {  // (inp, dout)
    __device__ float operator()(float x, float g) const { return gelu_grad(x) * g; }
};
struct AddOp {
    __device__ float operator()(float x, float y) const { return x + y; }
};

// Enough blocks of 256 threads for one pack each, capped (grid-stride beyond).
inline unsigned map_grid(size_t n, int W) { return grid_for(ceil_div(n, (size_t)W), 256, (size_t)132 * 32); }

template <typename E, typename Op>
void launch_map1(E* out, const E* a, size_t n, Op op, cudaStream_t stream, unsigned* amax = nullptr) {
    if (n == 0) return;
    constexpr int V = kVec<E>;
    if (aligned16(out) && aligned16(a))
        map1_kernel<E, V, Op><<<map_grid(n, V), 256, 0, stream>>>(out, a, n, op, amax);
    else
        map1_kernel<E, 1, Op><<<map_grid(n, 1), 256, 0, stream>>>(out, a, n, op, amax);
    CUDA_CHECK_LAUNCH();
}
template <typename E, typename Op>
void launch_map2(E* out, const E* a, const E* b, size_t n, Op op, cudaStream_t stream, unsigned* amax = nullptr) {
    if (n == 0) return;
    constexpr int V = kVec<E>;
    if (aligned16(out) && aligned16(a) && aligned16(b))
        map2_kernel<E, V, Op><<<map_grid(n, V), 256, 0, stream>>>(out, a, b, n, op, amax);
    else
        map2_kernel<E, 1, Op><<<map_grid(n, 1), 256, 0, stream>>>(out, a, b, n, op, amax);
    CUDA_CHECK_LAUNCH();
}

// amax: see map1_kernel (null: none).
template <typename E>
void gelu_forward(E* out, const E* inp, size_t n, cudaStream_t stream, unsigned* amax = nullptr) {
    launch_map1<E>(out, inp, n, GeluForwardOp{}, stream, amax);
}

template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, size_t n, cudaStream_t stream, unsigned* amax = nullptr) {
    launch_map2<E>(dinp, inp, dout, n, GeluBackwardOp{}, stream, amax);
}

template <typename E>
void residual_forward(E* out, const E* a, const E* b, size_t n, cudaStream_t stream) {
    launch_map2<E>(out, a, b, n, AddOp{}, stream);
}

}  // namespace llmc_cuda
