// llmc/backend/cuda/moe.cuh: Mixtral's mixture-of-experts ops (backend.h,
// Mixtral's section; docs/moe.md) as simple kernels, the CPU ops of
// llmc/backend/cpu_moe.h on the GPU: element type E (bf16 or fp32) for the
// activations, fp32 for the statistics (router probabilities, the weights'
// gradient, the load-balancing gradient). The per-expert products are the
// model's loop of cuBLASLt matmuls over each expert's group of rows.
//   routing   one thread per token: softmax, top-k (ties to the lower
//             index), renormalisation; then one thread groups the N·K
//             assignments by expert (a sequential, stable scan: the order
//             of the CPU op, and few enough rows for one thread here);
//   backward  one thread per token;
//   dispatch, combine  one block per assignment / token, threads over C,
//             the dispatch's dot products by a block sum.
#pragma once

#include "llmc/backend/cuda/common.cuh"

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

}  // namespace llmc_cuda
