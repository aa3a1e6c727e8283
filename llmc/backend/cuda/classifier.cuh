// llmc/backend/cuda/classifier.cuh: the fused softmax + cross-entropy of the LM head.
//
// One block per row of logits[N, Vp]. Pass 1 keeps a running (max, sum of
// exp) per thread over columns < V (an online softmax, one read of the row),
// then block reductions give the row's log-sum-exp; loss = lse - logit[target]
// in fp32. With write_grad, pass 2 overwrites the row in place with
// dloss * (softmax - onehot) over the first V columns and zero in the padding
// V..Vp-1, so the logits buffer becomes dlogits without another allocation.
// Targets are expected in [0, V); a row with an out-of-range target gets a
// NaN loss (so the bug shows in the mean loss) and no one-hot term.
// Rows are read and written 16 bytes at a time (8 bf16) when Vp is a
// multiple of the pack and the buffer is aligned; element by element else.
//
// Vocab-parallel cross-entropy (tensor parallel): the same computation in
// three kernels with all-reduces between them (backend.h). Each rank holds
// logits[N, Vl] for global ids v_begin..v_begin+Vl-1; local columns
// j >= nv = max(0, min(Vl, V - v_begin)) are padding. One block per row, fp32
// math, fp32 statistics:
//   crossentropy_stats:  row_max (-inf when nv == 0) and target_logit (the
//                        target's logit when this rank holds it, else 0);
//   crossentropy_sumexp: sum over valid columns of exp(logit - row_max), with
//                        the GLOBAL row_max; an -inf logit contributes 0 (so
//                        an all -inf row with row_max -inf sums to 0, not NaN);
//   crossentropy_finish: loss = log(sumexp) + row_max - target_logit, and with
//                        write_grad the row in place becomes
//                        dloss * (softmax - onehot), 0 in the padding.
// Unlike the fused kernel these follow the CPU reference for a target outside
// [0, V): no rank holds it, target_logit stays 0, and no one-hot term.
#pragma once
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

// Row loops go over packs of W columns (16 bytes when the row length is a
// multiple of the pack and logits is aligned, so every row start is; W = 1
// otherwise): pack p holds columns [p*W, p*W + W), thread x takes packs x,
// x + blockDim.x, ...; columns at or past the valid count are masked per
// element (V, or nv, need not be a multiple of W).

// Online softmax over one pack: fold the pack's valid values into the
// thread's running (m, s) = (max, sum of exp(x - m)). -inf values add
// nothing; NaN fails every comparison and is skipped here as before (it
// still turns the gradient into NaN in the second pass).
template <int W>
__device__ __forceinline__ void online_softmax_pack(float& m, float& s, const float* v, int valid) {
    float pm = -INFINITY;
#pragma unroll
    for (int j = 0; j < W; j++)
        if (j < valid) pm = fmaxf(pm, v[j]);
    if (!(pm > -INFINITY)) return;  // nothing finite (or all NaN) in this pack
    if (pm > m) {
        s *= expf(m - pm);  // m = -inf the first time: expf(-inf) = 0 and s is 0 anyway
        m = pm;
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        if (j < valid && v[j] > -INFINITY) s += expf(v[j] - m);
}

template <typename E, int W>
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
    for (int p = threadIdx.x; p * W < V; p += blockDim.x) {
        float v[W];
        load_floats<E, W>(v, x + (size_t)p * W);  // p*W < V <= Vp and Vp % W == 0: the whole pack is in the row
        online_softmax_pack<W>(m, s, v, V - p * W);
    }
    const float M = block_max(m, red);
    const float S = block_sum(m > -INFINITY ? s * expf(m - M) : 0.f, red);
    const float lse = logf(S) + M;
    if (threadIdx.x == 0) losses[row] = t_ok ? lse - xt : NAN;
    if (!write_grad) return;
    const float inv = 1.f / S;
    for (int p = threadIdx.x; p * W < Vp; p += blockDim.x) {
        float v[W];
        load_floats<E, W>(v, x + (size_t)p * W);
#pragma unroll
        for (int j = 0; j < W; j++) {
            const int i = p * W + j;
            float g = 0.f;
            if (i < V) {
                const float q = expf(v[j] - M) * inv;
                g = (q - (i == t ? 1.f : 0.f)) * dloss;
            }
            v[j] = g;
        }
        store_floats<E, W>(x + (size_t)p * W, v);
    }
}

template <typename E>
void softmax_crossentropy(E* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                          bool write_grad, cudaStream_t stream) {
    if (N <= 0) return;
    constexpr int VEC = kVec<E>;
    const bool vec = Vp % VEC == 0 && aligned16(logits);
    const int packs = vec ? Vp / VEC : Vp;
    // Enough threads to stream a 50k-wide row; fewer for the tiny test vocabularies.
    int block = 1024;
    while (block > 32 && block / 2 >= packs) block /= 2;
    if (vec)
        softmax_crossentropy_kernel<E, VEC><<<N, block, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_grad);
    else
        softmax_crossentropy_kernel<E, 1><<<N, block, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_grad);
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

template <typename E, int W>
__global__ void crossentropy_stats_kernel(const E* logits, const int* targets, float* row_max, float* target_logit,
                                          int Vl, int nv, int v_begin) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    float m = -INFINITY;
    for (int p = threadIdx.x; p * W < nv; p += blockDim.x) {
        float v[W];
        load_floats<E, W>(v, x + (size_t)p * W);  // nv <= Vl, Vl % W == 0
#pragma unroll
        for (int j = 0; j < W; j++)
            if (p * W + j < nv) m = fmaxf(m, v[j]);
    }
    m = block_max(m, red);
    if (threadIdx.x == 0) {
        row_max[row] = m;
        const long long t = (long long)targets[row] - v_begin;
        target_logit[row] = (t >= 0 && t < nv) ? to_float(x[t]) : 0.f;
    }
}

template <typename E, int W>
__global__ void crossentropy_sumexp_kernel(const E* logits, const float* row_max, float* sumexp, int Vl, int nv) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    const float M = row_max[row];
    float s = 0.f;
    for (int p = threadIdx.x; p * W < nv; p += blockDim.x) {
        float v[W];
        load_floats<E, W>(v, x + (size_t)p * W);
#pragma unroll
        for (int j = 0; j < W; j++) {
            // exp(-inf - M) is 0 for any M but -inf, where it is NaN; a NaN logit
            // still propagates (v == -inf is false for NaN).
            if (p * W + j < nv) s += v[j] == -INFINITY ? 0.f : expf(v[j] - M);
        }
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) sumexp[row] = s;
}

template <typename E, int W>
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
    // Each pack is read and written by the same thread: in place is safe.
    for (int p = threadIdx.x; p * W < Vl; p += blockDim.x) {
        float v[W];
        load_floats<E, W>(v, x + (size_t)p * W);
#pragma unroll
        for (int j = 0; j < W; j++) {
            const int col = p * W + j;
            float g = 0.f;
            if (col < nv) {
                const float q = v[j] == -INFINITY ? 0.f : expf(v[j] - M) * inv;
                g = (q - (col == t ? 1.f : 0.f)) * dloss;
            }
            v[j] = g;
        }
        store_floats<E, W>(x + (size_t)p * W, v);
    }
}

// 16-byte packs when every row of the slice starts aligned.
template <typename E>
inline bool ce_vec(const E* logits, int Vl) {
    return Vl % kVec<E> == 0 && aligned16(logits);
}

template <typename E>
void crossentropy_stats(const E* logits, const int* targets, float* row_max, float* target_logit, int N, int Vl,
                        int v_begin, int V, cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    constexpr int VEC = kVec<E>;
    if (ce_vec(logits, Vl))
        crossentropy_stats_kernel<E, VEC><<<N, ce_block_size((int)ceil_div(nv, VEC)), 0, stream>>>(
            logits, targets, row_max, target_logit, Vl, nv, v_begin);
    else
        crossentropy_stats_kernel<E, 1><<<N, ce_block_size(nv), 0, stream>>>(logits, targets, row_max, target_logit,
                                                                             Vl, nv, v_begin);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_sumexp(const E* logits, const float* row_max, float* sumexp, int N, int Vl, int v_begin, int V,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    constexpr int VEC = kVec<E>;
    if (ce_vec(logits, Vl))
        crossentropy_sumexp_kernel<E, VEC><<<N, ce_block_size((int)ceil_div(nv, VEC)), 0, stream>>>(logits, row_max,
                                                                                                     sumexp, Vl, nv);
    else
        crossentropy_sumexp_kernel<E, 1><<<N, ce_block_size(nv), 0, stream>>>(logits, row_max, sumexp, Vl, nv);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_finish(E* logits, float* losses, const int* targets, const float* row_max, const float* sumexp,
                         const float* target_logit, float dloss, int N, int Vl, int v_begin, int V, bool write_grad,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    constexpr int VEC = kVec<E>;
    const bool vec = ce_vec(logits, Vl);
    // Without write_grad only thread 0 works: one warp is plenty.
    const int block = write_grad ? ce_block_size(vec ? (int)ceil_div(Vl, VEC) : Vl) : 32;
    if (vec)
        crossentropy_finish_kernel<E, VEC><<<N, block, 0, stream>>>(logits, losses, targets, row_max, sumexp,
                                                                    target_logit, dloss, Vl, nv, v_begin, write_grad);
    else
        crossentropy_finish_kernel<E, 1><<<N, block, 0, stream>>>(logits, losses, targets, row_max, sumexp,
                                                                  target_logit, dloss, Vl, nv, v_begin, write_grad);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
