// llmc/backend/cuda/norms.cuh: a block's norm by kind, the one entry the
// CUDA backend's six norm ops and its FP8 measuring ones (norm_amax,
// norm_backward_amax) go through: LayerNorm (layernorm.cuh) or RMSNorm
// (rmsnorm.cuh), of a or after the residual add (b given), and the backward;
// bits (null: none) takes the max of what the kernels write (common.cuh's
// written_bits), the next FP8 product's operand.
#pragma once
#include "llmc/backend/cuda/layernorm.cuh"
#include "llmc/backend/cuda/rmsnorm.cuh"

namespace llmc_cuda {

// out = norm(a), or residual = a + b and out = norm(residual); mean (LayerNorm) and rstd fp32.
template <typename E>
void norm_forward(bool rms, E* residual, E* out, float* mean, float* rstd, const E* a, const E* b, const E* w,
                  const E* bias, int N, int C, double eps, cudaStream_t stream, unsigned* bits) {
    if (rms && b) residual_rmsnorm_forward<E>(residual, out, rstd, a, b, w, N, C, eps, stream, bits);
    else if (rms) rmsnorm_forward<E>(out, rstd, a, w, N, C, eps, stream, bits);
    else if (b) residual_layernorm_forward<E>(residual, out, mean, rstd, a, b, w, bias, N, C, stream, bits);
    else layernorm_forward<E>(out, mean, rstd, a, w, bias, N, C, stream, bits);
}

inline size_t norm_backward_scratch_floats(bool rms, int N, int C) {
    return rms ? rmsnorm_backward_scratch_floats(N, C) : layernorm_backward_scratch_floats(N, C);
}

// dinp (+=), dw (+=), db (+=, LayerNorm's bias; null for RMSNorm).
template <typename E>
void norm_backward(bool rms, E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, const float* mean,
                   const float* rstd, int N, int C, float* scratch, cudaStream_t stream, unsigned* bits) {
    if (rms) rmsnorm_backward<E>(dinp, dw, dout, inp, w, rstd, N, C, scratch, stream, bits);
    else layernorm_backward<E>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream, bits);
}

}  // namespace llmc_cuda
