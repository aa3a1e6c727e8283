// dev/cuda/previous_classifier.h: the previous cross-entropy kernels (from
// classifier.cuh): the fused softmax + cross-entropy and the three steps of
// the vocab-parallel one. Kept verbatim in namespace llmc_prev (see
// previous.h).
#pragma once
#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/classifier.cuh ====
template <typename E>
__global__ void softmax_crossentropy_kernel(E* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                                            bool write_grad) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    E* x = logits + (size_t)row * Vp;
    const int t = targets[row];
    const bool t_ok = t >= 0 && t < V;
    // Read the target logit before any thread can overwrite it in pass 2 (the
    // reductions below contain barriers).
    const float xt = t_ok ? to_float(x[t]) : 0.f;

    float m = -INFINITY, s = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = to_float(x[i]);
        if (v > m) {
            s = s * expf(m - v) + 1.f;  // m = -inf the first time: expf(-inf) = 0
            m = v;
        } else if (v > -INFINITY) {
            s += expf(v - m);
        }
    }
    const float M = block_max(m, red);
    const float S = block_sum(m > -INFINITY ? s * expf(m - M) : 0.f, red);
    const float lse = logf(S) + M;
    if (threadIdx.x == 0) losses[row] = t_ok ? lse - xt : NAN;
    if (!write_grad) return;
    const float inv = 1.f / S;
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float g = 0.f;
        if (i < V) {
            const float p = expf(to_float(x[i]) - M) * inv;
            g = (p - (i == t ? 1.f : 0.f)) * dloss;
        }
        x[i] = from_float<E>(g);
    }
}

template <typename E>
void softmax_crossentropy(E* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                          bool write_grad, cudaStream_t stream) {
    if (N <= 0) return;
    // Enough threads to stream a 50k-wide row; fewer for the tiny test vocabularies.
    int block = 1024;
    while (block > 32 && block / 2 >= Vp) block /= 2;
    softmax_crossentropy_kernel<E><<<N, block, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_grad);
    CUDA_CHECK_LAUNCH();
}

// ---- vocab-parallel cross-entropy ----------------------------------------------------
// Valid (non-padding) local columns of a rank's slice.
inline int ce_valid_cols(int Vl, int v_begin, int V) {
    const long long nv = (long long)V - v_begin;
    return nv <= 0 ? 0 : (nv < Vl ? (int)nv : Vl);
}

// Threads per row: enough to stream a wide slice, fewer for tiny ones.
inline int ce_block_size(int cols) {
    int block = 1024;
    while (block > 32 && block / 2 >= cols) block /= 2;
    return block;
}

template <typename E>
__global__ void crossentropy_stats_kernel(const E* logits, const int* targets, float* row_max, float* target_logit,
                                          int Vl, int nv, int v_begin) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) m = fmaxf(m, to_float(x[j]));
    m = block_max(m, red);
    if (threadIdx.x == 0) {
        row_max[row] = m;
        const long long t = (long long)targets[row] - v_begin;
        target_logit[row] = (t >= 0 && t < nv) ? to_float(x[t]) : 0.f;
    }
}

template <typename E>
__global__ void crossentropy_sumexp_kernel(const E* logits, const float* row_max, float* sumexp, int Vl, int nv) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    const float M = row_max[row];
    float s = 0.f;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        const float v = to_float(x[j]);
        // exp(-inf - M) is 0 for any M but -inf, where it is NaN; a NaN logit
        // still propagates (v == -inf is false for NaN).
        s += v == -INFINITY ? 0.f : expf(v - M);
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) sumexp[row] = s;
}

template <typename E>
__global__ void crossentropy_finish_kernel(E* logits, float* losses, const int* targets, const float* row_max,
                                           const float* sumexp, const float* target_logit, float dloss, int Vl,
                                           int nv, int v_begin, bool write_grad) {
    const int row = blockIdx.x;
    const float M = row_max[row], S = sumexp[row];
    if (threadIdx.x == 0) losses[row] = logf(S) + M - target_logit[row];
    if (!write_grad) return;
    E* x = logits + (size_t)row * Vl;
    const long long t = (long long)targets[row] - v_begin;  // local column of the target (any value)
    const float inv = 1.f / S;
    // Each element is read and written by the same thread: in place is safe.
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float g = 0.f;
        if (j < nv) {
            const float v = to_float(x[j]);
            const float p = v == -INFINITY ? 0.f : expf(v - M) * inv;
            g = (p - (j == t ? 1.f : 0.f)) * dloss;
        }
        x[j] = from_float<E>(g);
    }
}

template <typename E>
void crossentropy_stats(const E* logits, const int* targets, float* row_max, float* target_logit, int N, int Vl,
                        int v_begin, int V, cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    crossentropy_stats_kernel<E><<<N, ce_block_size(nv), 0, stream>>>(logits, targets, row_max, target_logit, Vl, nv,
                                                                       v_begin);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_sumexp(const E* logits, const float* row_max, float* sumexp, int N, int Vl, int v_begin, int V,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    crossentropy_sumexp_kernel<E><<<N, ce_block_size(nv), 0, stream>>>(logits, row_max, sumexp, Vl, nv);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_finish(E* logits, float* losses, const int* targets, const float* row_max, const float* sumexp,
                         const float* target_logit, float dloss, int N, int Vl, int v_begin, int V, bool write_grad,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    // Without write_grad only thread 0 works: one warp is plenty.
    const int block = write_grad ? ce_block_size(Vl) : 32;
    crossentropy_finish_kernel<E><<<N, block, 0, stream>>>(logits, losses, targets, row_max, sumexp, target_logit,
                                                           dloss, Vl, nv, v_begin, write_grad);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_prev
