// llmc/cuda/classifier.cuh: the fused softmax + cross-entropy of the LM head.
//
// One block per row of logits[N, Vp]. Pass 1 keeps a running (max, sum of
// exp) per thread over columns < V (an online softmax, one read of the row),
// then block reductions give the row's log-sum-exp; loss = lse - logit[target]
// in fp32. With write_grad, pass 2 overwrites the row in place with
// dloss * (softmax - onehot) over the first V columns and zero in the padding
// V..Vp-1, so the logits buffer becomes dlogits without another allocation.
// Targets are expected in [0, V); a row with an out-of-range target gets a
// NaN loss (so the bug shows in the mean loss) and no one-hot term.
#pragma once
#include "common.cuh"

namespace llmc_cuda {

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

}  // namespace llmc_cuda
