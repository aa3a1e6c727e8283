// llmc/backend/cuda/swiglu.cuh: the SwiGLU activation of the Llama MLP (backend.h
// swiglu_forward / swiglu_backward). gu holds N rows of [gate (H) | up (H)]
// (the fused gate/up matrix product), and
//   forward:  out[n, i] = silu(g)·u, silu(g) = g·σ(g), σ(g) = 1/(1 + e^-g);
//   backward: dgate = dy·u·σ(g)·(1 + g·(1 - σ(g))), dup = dy·g·σ(g)
//             into dgu [N, 2H] (overwrite), the layout of gu.
//
// Memory-bound elementwise maps over the N·H outputs, computing in fp32, in
// the grid-stride pattern of elementwise.cuh: llmc_idx::for_each_pack over packs of
// W output elements. With H % W == 0 a pack never crosses a row, so its
// gate and up operands are packs too (at n·2H + i and n·2H + H + i): 16-byte
// accesses (8 bf16 or 4 fp32) when H % W == 0 and every pointer is 16-byte
// aligned, element by element otherwise. A pack is read whole and then
// written by the same thread, so the backward may even write dgu over gu.
// σ through expf (no fast-math intrinsics): exact enough for the fp32
// build's checks; expf(-g) overflows to inf for g < -88 and σ is then 0,
// the right limit (and the CPU op's).
#pragma once
#include <initializer_list>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

__device__ __forceinline__ float sigmoidf_(float g) { return 1.f / (1.f + expf(-g)); }

// amax (null: none): the max of |what it writes| as written (common.cuh's
// written_bits) into *amax, the next FP8 product's operand measured in this
// pass (Backend::activation_amax).

template <typename E, int W>
__global__ void swiglu_forward_kernel(E* out, const E* gu, int N, int H, unsigned* amax) {
    const size_t n_out = (size_t)N * H;
    unsigned m = 0;
    llmc_idx::for_each_pack(n_out, W, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x,
                            [&](size_t e, int count) {
                                // count == W: a whole pack (one row, H % W == 0); 1: one element.
                                const size_t n = e / (size_t)H, i = e % (size_t)H;
                                const E* g = gu + n * 2 * (size_t)H + i;
                                const E* u = g + H;
                                if (count == W) {
                                    float gf[W], uf[W], o[W];
                                    load_floats<E, W>(gf, g);
                                    load_floats<E, W>(uf, u);
#pragma unroll
                                    for (int j = 0; j < W; j++) o[j] = gf[j] * sigmoidf_(gf[j]) * uf[j];
                                    store_floats<E, W>(out + e, o);
                                    if (amax)
                                        for (int j = 0; j < W; j++) m = max(m, written_bits<E>(o[j]));
                                } else {
                                    const float gf = to_float(*g), o = gf * sigmoidf_(gf) * to_float(*u);
                                    out[e] = from_float<E>(o);
                                    if (amax) m = max(m, written_bits<E>(o));
                                }
                            });
    if (amax) warp_amax_commit(amax, m);
}

template <typename E, int W>
__global__ void swiglu_backward_kernel(E* dgu, const E* gu, const E* dout, int N, int H, unsigned* amax) {
    const size_t n_out = (size_t)N * H;
    unsigned m = 0;
    llmc_idx::for_each_pack(n_out, W, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x,
                            [&](size_t e, int count) {
                                const size_t n = e / (size_t)H, i = e % (size_t)H;
                                const size_t go = n * 2 * (size_t)H + i;
                                if (count == W) {
                                    float gf[W], uf[W], dy[W], dg[W], du[W];
                                    load_floats<E, W>(gf, gu + go);
                                    load_floats<E, W>(uf, gu + go + H);
                                    load_floats<E, W>(dy, dout + e);
#pragma unroll
                                    for (int j = 0; j < W; j++) {
                                        const float sg = sigmoidf_(gf[j]);
                                        dg[j] = dy[j] * uf[j] * sg * (1.f + gf[j] * (1.f - sg));
                                        du[j] = dy[j] * gf[j] * sg;
                                    }
                                    store_floats<E, W>(dgu + go, dg);
                                    store_floats<E, W>(dgu + go + H, du);
                                    if (amax)
                                        for (int j = 0; j < W; j++)
                                            m = max(m, max(written_bits<E>(dg[j]), written_bits<E>(du[j])));
                                } else {
                                    const float gf = to_float(gu[go]), uf = to_float(gu[go + H]);
                                    const float dy = to_float(dout[e]), sg = sigmoidf_(gf);
                                    const float dg = dy * uf * sg * (1.f + gf * (1.f - sg)), du = dy * gf * sg;
                                    dgu[go] = from_float<E>(dg);
                                    dgu[go + H] = from_float<E>(du);
                                    if (amax) m = max(m, max(written_bits<E>(dg), written_bits<E>(du)));
                                }
                            });
    if (amax) warp_amax_commit(amax, m);
}

// 16-byte packs when every row of every operand starts aligned.
template <typename E>
inline bool swiglu_vec_ok(int H, std::initializer_list<const void*> ptrs) {
    if (H % kVec<E> != 0) return false;
    for (const void* p : ptrs)
        if (!aligned16(p)) return false;
    return true;
}

// Enough blocks of 256 threads for one pack each, capped (grid-stride beyond).
inline unsigned swiglu_grid(size_t n, int W) { return grid_for(ceil_div(n, (size_t)W), 256, (size_t)132 * 32); }

template <typename E>
void swiglu_forward(E* out, const E* gu, int N, int H, cudaStream_t stream, unsigned* amax = nullptr) {
    const size_t n = (size_t)N * H;
    if (N <= 0 || H <= 0) return;
    constexpr int V = kVec<E>;
    if (swiglu_vec_ok<E>(H, {out, gu}))
        swiglu_forward_kernel<E, V><<<swiglu_grid(n, V), 256, 0, stream>>>(out, gu, N, H, amax);
    else
        swiglu_forward_kernel<E, 1><<<swiglu_grid(n, 1), 256, 0, stream>>>(out, gu, N, H, amax);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void swiglu_backward(E* dgu, const E* gu, const E* dout, int N, int H, cudaStream_t stream, unsigned* amax = nullptr) {
    const size_t n = (size_t)N * H;
    if (N <= 0 || H <= 0) return;
    constexpr int V = kVec<E>;
    if (swiglu_vec_ok<E>(H, {dgu, gu, dout}))
        swiglu_backward_kernel<E, V><<<swiglu_grid(n, V), 256, 0, stream>>>(dgu, gu, dout, N, H, amax);
    else
        swiglu_backward_kernel<E, 1><<<swiglu_grid(n, 1), 256, 0, stream>>>(dgu, gu, dout, N, H, amax);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
