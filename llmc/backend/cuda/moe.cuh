// llmc/backend/cuda/moe.cuh: Mixtral's mixture-of-experts ops (backend.h,
// Mixtral's section; docs/moe.md) as simple kernels, the CPU ops of
// llmc/backend/cpu_moe.h on the GPU: element type E (bf16 or fp32) for the
// activations, fp32 for the statistics (router probabilities, the weights'
// gradient, the load-balancing gradient). The per-expert products are the
// model's loop of cuBLASLt matmuls over each expert's group of rows, or,
// when the groups' sizes stay on the device (--sync-free), one launch per
// product over every group (grouped_gemm.h); the routing statistics, the
// load-balancing loss and the balance figures are small kernels running
// moe_figures.h.
//   routing   one thread per token: softmax, top-k (ties to the lower
//             index), renormalisation; then one thread groups the N·K
//             assignments by expert (a sequential, stable scan: the order
//             of the CPU op, and few enough rows for one thread here);
//   backward  one thread per token;
//   dispatch, combine  one block per assignment / token, threads over C,
//             the dispatch's dot products by a block sum.
#pragma once

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/grouped_gemm.h"
#include "llmc/backend/moe_figures.h"

namespace llmc_cuda {

template <typename E>
__global__ void moe_route_kernel(float* probs, E* topw, int* topi, const E* logits, int N, int NE, int K,
                                 const float* bias) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const E* l = logits + (size_t)n * NE;
    float* p = probs + (size_t)n * NE;
    float mx = to_float(l[0]);
    for (int e = 1; e < NE; e++) mx = fmaxf(mx, to_float(l[e]));
    float sum = 0.f;
    for (int e = 0; e < NE; e++) sum += p[e] = expf(to_float(l[e]) - mx);
    for (int e = 0; e < NE; e++) p[e] /= sum;
    int* ti = topi + (size_t)n * K;
    float ksum = 0.f;
    for (int j = 0; j < K; j++) {
        int best = -1;
        float best_score = 0.f;
        for (int e = 0; e < NE; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken = taken || ti[i] == e;
            const float s = bias ? p[e] + bias[e] : p[e];  // the choice's score; the weights are p's
            if (!taken && (best < 0 || s > best_score)) best = e, best_score = s;
        }
        ti[j] = best;
        ksum += p[best];
    }
    for (int j = 0; j < K; j++) topw[(size_t)n * K + j] = from_float<E>(p[ti[j]] / ksum);
}

// cursor: NE + 1 ints of dynamic shared memory.
__global__ void moe_group_kernel(int* offsets, int* perm, int* inv, const int* topi, int NK, int NE) {
    extern __shared__ int cursor[];
    if (threadIdx.x != 0) return;
    for (int e = 0; e <= NE; e++) cursor[e] = 0;
    for (int a = 0; a < NK; a++) cursor[topi[a] + 1]++;
    for (int e = 0; e < NE; e++) cursor[e + 1] += cursor[e];
    for (int e = 0; e <= NE; e++) offsets[e] = cursor[e];
    for (int a = 0; a < NK; a++) {
        const int g = cursor[topi[a]]++;
        perm[g] = a;
        inv[a] = g;
    }
}

template <typename E>
__global__ void moe_route_backward_kernel(E* dlogits, const float* probs, const int* topi, const float* dtopw,
                                          const float* aux, int N, int NE, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* p = probs + (size_t)n * NE;
    const int* ti = topi + (size_t)n * K;
    const float* dw = dtopw + (size_t)n * K;
    float s = 0.f, dot = 0.f;
    for (int j = 0; j < K; j++) s += p[ti[j]];
    for (int j = 0; j < K; j++) dot += dw[j] * (p[ti[j]] / s);
    // dp_e = aux_e + (dw_j - dot) / s when e is the j-th choice.
    auto dp = [&](int e) {
        float d = aux ? aux[e] : 0.f;
        for (int j = 0; j < K; j++)
            if (ti[j] == e) d += (dw[j] - dot) / s;
        return d;
    };
    float pdp = 0.f;
    for (int e = 0; e < NE; e++) pdp += p[e] * dp(e);
    for (int e = 0; e < NE; e++) dlogits[(size_t)n * NE + e] = from_float<E>(p[e] * (dp(e) - pdp));
}

template <typename E>
__global__ void moe_dispatch_kernel(E* xg, float* dw, const E* x, const E* yg, const E* w, const int* inv, int K,
                                    int C) {
    __shared__ float shared[32];
    const size_t a = blockIdx.x;
    const E* xr = x + (a / K) * C;
    E* o = xg + (size_t)inv[a] * C;
    const float s = w ? to_float(w[a]) : 1.f;
    float d = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = to_float(xr[c]);
        if (dw) d += v * to_float(yg[(size_t)inv[a] * C + c]);
        o[c] = from_float<E>(s * v);
    }
    if (!dw) return;
    d = block_sum(d, shared);
    if (threadIdx.x == 0) dw[a] = d;
}

template <typename E>
__global__ void moe_combine_kernel(E* out, const E* yg, const E* w, const int* inv, int K, int C) {
    const size_t n = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < K; j++) {
            const size_t a = n * K + j;
            acc += (w ? to_float(w[a]) : 1.f) * to_float(yg[(size_t)inv[a] * C + c]);
        }
        out[n * C + c] = from_float<E>(acc);
    }
}

// The host calls take the backend's untyped pointers: fn(E{}) with E = float
// (the fp32 build) or bf16.
template <typename Fn>
void moe_typed(bool fp32, Fn&& fn) {
    if (fp32)
        fn(float{});
    else
        fn(bf16{});
    CUDA_CHECK_LAUNCH();
}

inline void moe_route(bool fp32, void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv,
                      const void* logits, int N, int NE, int K, const void* bias, cudaStream_t stream) {
    if (N <= 0) return;
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        moe_route_kernel<E><<<(unsigned)ceil_div(N, 128), 128, 0, stream>>>((float*)probs, (E*)topw, topi,
                                                                            (const E*)logits, N, NE, K,
                                                                            (const float*)bias);
    });
    moe_group_kernel<<<1, 32, (NE + 1) * sizeof(int), stream>>>(offsets, perm, inv, topi, N * K, NE);
    CUDA_CHECK_LAUNCH();
}

inline void moe_route_backward(bool fp32, void* dlogits, const void* probs, const int* topi, const void* dtopw,
                               const void* aux, int N, int NE, int K, cudaStream_t stream) {
    if (N <= 0) return;
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        moe_route_backward_kernel<E><<<(unsigned)ceil_div(N, 128), 128, 0, stream>>>(
            (E*)dlogits, (const float*)probs, topi, (const float*)dtopw, (const float*)aux, N, NE, K);
    });
}

inline void moe_dispatch(bool fp32, void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv,
                         int N, int K, int C, cudaStream_t stream) {
    if (N <= 0) return;
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        moe_dispatch_kernel<E><<<(unsigned)((size_t)N * K), 128, 0, stream>>>((E*)xg, (float*)dw, (const E*)x,
                                                                              (const E*)yg, (const E*)w, inv, K, C);
    });
}

inline void moe_combine(bool fp32, void* out, const void* yg, const void* w, const int* inv, int N, int K, int C,
                        cudaStream_t stream) {
    if (N <= 0) return;
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        moe_combine_kernel<E><<<(unsigned)N, 128, 0, stream>>>((E*)out, (const E*)yg, (const E*)w, inv, K, C);
    });
}

// ---- the groups' sizes on the device -----------------------------------------------
template <typename E>
struct GgLoad {
    __device__ float operator()(const E* p) const { return to_float(*p); }
};
template <typename E>
struct GgStore {
    __device__ void operator()(E* p, float v) const { *p = from_float<E>(v); }
};
// which: 0 forward, 1 input gradient, 2 weight gradient (grouped_gemm.h's jobs).
template <typename E>
__global__ void __launch_bounds__(grouped_gemm::kThreads)
    grouped_gemm_kernel(int which, E* C, const E* A, const E* B, const int* off, int NE, int IC, int OC) {
    namespace gg = grouped_gemm;
    __shared__ float sm[gg::kSmemFloats];
    gg::BlockJob<E> j;
    const bool mine = which == 0   ? gg::forward_job(&j, C, A, B, off, NE, IC, OC, blockIdx.x, blockIdx.y)
                      : which == 1 ? gg::input_job(&j, C, A, B, off, NE, IC, OC, blockIdx.x, blockIdx.y)
                                   : gg::weight_job(&j, C, A, B, off, IC, OC, blockIdx.x, blockIdx.y, blockIdx.z);
    if (!mine) return;  // the same for every thread of the block
    float acc[4][4] = {};
    for (int k0 = 0; k0 < j.K; k0 += gg::kDepth) {
        gg::load_tiles(threadIdx.x, sm, sm + gg::kDepth * gg::kPitch, j.A, j.B, j.m0, j.n0, k0, GgLoad<E>());
        __syncthreads();
        gg::multiply_add(threadIdx.x, sm, sm + gg::kDepth * gg::kPitch, acc);
        __syncthreads();
    }
    gg::store_patch(threadIdx.x, acc, j.C, j.ldc, j.m0, j.n0, j.M, j.N, j.accumulate, GgLoad<E>(), GgStore<E>());
}

// rows: the grouped rows (offsets[NE], at most N·K), which bounds the grid.
inline void moe_expert_matmul_forward(bool fp32, void* out, const void* inp, const void* w, const int* off, int rows,
                                      int NE, int IC, int OC, cudaStream_t stream) {
    namespace gg = grouped_gemm;
    if (rows <= 0) return;
    const dim3 grid((unsigned)ceil_div(OC, gg::kTile), (unsigned)gg::row_tiles_bound(rows, NE));
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        grouped_gemm_kernel<E><<<grid, gg::kThreads, 0, stream>>>(0, (E*)out, (const E*)inp, (const E*)w, off, NE, IC,
                                                                   OC);
    });
}
inline void moe_expert_matmul_backward(bool fp32, void* dinp, void* dw, const void* dout, const void* inp,
                                       const void* w, const int* off, int rows, int NE, int IC, int OC,
                                       cudaStream_t stream) {
    namespace gg = grouped_gemm;
    if (rows <= 0) return;
    moe_typed(fp32, [&](auto t) {
        using E = decltype(t);
        if (dinp) {
            const dim3 grid((unsigned)ceil_div(IC, gg::kTile), (unsigned)gg::row_tiles_bound(rows, NE));
            grouped_gemm_kernel<E><<<grid, gg::kThreads, 0, stream>>>(1, (E*)dinp, (const E*)dout, (const E*)w, off,
                                                                       NE, IC, OC);
        }
        const dim3 grid((unsigned)ceil_div(IC, gg::kTile), (unsigned)ceil_div(OC, gg::kTile), (unsigned)NE);
        grouped_gemm_kernel<E><<<grid, gg::kThreads, 0, stream>>>(2, (E*)dw, (const E*)dout, (const E*)inp, off, NE,
                                                                   IC, OC);
    });
}

constexpr int kStatsBlock = 256;
// One block per expert: its assignments, and its probabilities' sum by a
// fixed-order tree (the same bits every run).
__global__ void __launch_bounds__(kStatsBlock)
    moe_route_stats_kernel(double* stats, double* loads, const float* probs, const int* off, int N, int NE) {
    __shared__ double part[kStatsBlock];
    const int e = blockIdx.x, t = threadIdx.x;
    double s = 0;
    for (int n = t; n < N; n += kStatsBlock) s += (double)probs[(size_t)n * NE + e];
    part[t] = s;
    __syncthreads();
    for (int w = kStatsBlock / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        __syncthreads();
    }
    if (t != 0) return;
    const int c = off[e + 1] - off[e];
    stats[e] += c;
    if (loads) loads[e] += c;
    stats[NE + e] += part[0];
}
__global__ void moe_aux_loss_kernel(float* grad, double* aux_acc, double* stats, int NE, double LN, double gscale) {
    const double aux = moe_aux_from_stats(grad, stats, stats + NE, NE, LN, gscale);
    for (int e = 0; e < 2 * NE; e++) stats[e] = 0;
    if (aux_acc) *aux_acc += aux;
}
__global__ void moe_balance_kernel(double* figures, float* bias, double* bias64, double* loads, int L, int NE,
                                   double divisor, double rate) {
    const size_t n = (size_t)L * NE;
    for (size_t i = 0; i < n; i++) loads[i] /= divisor;
    figures[step_figure::moe_maxvio] = moe_imbalance(loads, L, NE);
    if (bias64 && figures[step_figure::skip] == 0.0) {
        moe_bias_step(bias64, loads, L, NE, rate);
        for (size_t i = 0; i < n; i++) bias[i] = (float)bias64[i];
    }
    for (size_t i = 0; i < n; i++) loads[i] = 0;
}
inline void moe_route_stats(void* stats, void* loads, const void* probs, const int* off, int N, int NE,
                            cudaStream_t stream) {
    moe_route_stats_kernel<<<(unsigned)NE, kStatsBlock, 0, stream>>>((double*)stats, (double*)loads,
                                                                     (const float*)probs, off, N, NE);
    CUDA_CHECK_LAUNCH();
}
inline void moe_aux_loss(void* grad, void* aux_acc, void* stats, int NE, double LN, double gscale,
                         cudaStream_t stream) {
    moe_aux_loss_kernel<<<1, 1, 0, stream>>>((float*)grad, (double*)aux_acc, (double*)stats, NE, LN, gscale);
    CUDA_CHECK_LAUNCH();
}
inline void moe_balance(void* figures, void* bias, void* bias64, void* loads, int L, int NE, double divisor,
                        double rate, cudaStream_t stream) {
    moe_balance_kernel<<<1, 1, 0, stream>>>((double*)figures, (float*)bias, (double*)bias64, (double*)loads, L, NE,
                                            divisor, rate);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
