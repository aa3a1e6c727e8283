// dev/cuda/previous_layernorm.h: the previous LayerNorm kernels (from
// layernorm.cuh): forward, fused residual + forward, and the backward with
// its per-block partials. Kept verbatim in namespace llmc_prev (see
// previous.h).
#pragma once
#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/layernorm.cuh ====
constexpr float kLayerNormEps = 1e-5f;

// Normalise the row x (already in memory, possibly just written by this same
// lane) and write out, mean, rstd. Each lane touches channels lane, lane+32, ...
// in every pass, so a lane only ever reads back what it wrote itself.
template <typename E>
__device__ __forceinline__ void layernorm_row(E* o, float* mean, float* rstd, const E* x, const E* w, const E* b,
                                              int row, int C, int lane) {
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += to_float(x[c]);
    const float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        const float d = to_float(x[c]) - m;
        v += d * d;
    }
    const float r = 1.f / sqrtf(warp_sum(v) / C + kLayerNormEps);
    for (int c = lane; c < C; c += 32)
        o[c] = from_float<E>((to_float(x[c]) - m) * r * to_float(w[c]) + to_float(b[c]));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

template <typename E>
__global__ void layernorm_forward_kernel(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N,
                                         int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    layernorm_row(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, C, threadIdx.x % 32);
}

// residual = a + b (rounded to E), then LayerNorm of the rounded residual, so
// the statistics match what backward will read back from `residual`.
// residual may alias a or b: each element is read before it is written by
// the same lane.
template <typename E>
__global__ void residual_layernorm_forward_kernel(E* residual, E* out, float* mean, float* rstd, const E* a,
                                                  const E* bb, const E* w, const E* bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    for (int c = lane; c < C; c += 32) residual[off + c] = from_float<E>(to_float(a[off + c]) + to_float(bb[off + c]));
    layernorm_row(out + off, mean, rstd, residual + off, w, bias, row, C, lane);
}

template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N, int C,
                       cudaStream_t stream) {
    if (N <= 0) return;
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, w,
                                                                                             b, N, C);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a, const E* b, const E* w,
                                const E* bias, int N, int C, cudaStream_t stream) {
    if (N <= 0) return;
    const int block = 256, rows_per_block = block / 32;
    residual_layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(
        residual, out, mean, rstd, a, b, w, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---- backward ------------------------------------------------------------------
constexpr int kLnBwdBlock = 256;       // 8 warps, one row each at a time
constexpr int kLnBwdMaxBlocks = 512;   // fixed cap: same grid (and sums) on every GPU

inline int layernorm_backward_blocks(int N) {
    int g = (int)ceil_div(N, kLnBwdBlock / 32);
    return g < kLnBwdMaxBlocks ? (g > 0 ? g : 1) : kLnBwdMaxBlocks;
}
// fp32 scratch the backward needs: one (dw, db) slice per block.
inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)layernorm_backward_blocks(N) * 2 * C;
}

// dinp += (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd, with
// dnorm = w * dout and xhat = (x - mean) * rstd; block partials of dout * xhat
// and dout go to shared memory, then to partial[blockIdx.x] = [dw(C) | db(C)].
template <typename E>
__global__ void layernorm_backward_kernel(E* dinp, float* partial, const E* dout, const E* inp, const E* w,
                                          const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float sm[];  // [2C]: dw, db partial sums of this block
    float* dw_s = sm;
    float* db_s = sm + C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) sm[c] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
        const size_t off = (size_t)row * C;
        const E* x = inp + off;
        const E* dy = dout + off;
        const float m = mean[row], r = rstd[row];
        float sum_dn = 0.f, sum_dn_xhat = 0.f;
        for (int c = lane; c < C; c += 32) {
            const float xhat = (to_float(x[c]) - m) * r;
            const float dn = to_float(w[c]) * to_float(dy[c]);
            sum_dn += dn;
            sum_dn_xhat += dn * xhat;
        }
        const float mean_dn = warp_sum(sum_dn) / C;
        const float mean_dn_xhat = warp_sum(sum_dn_xhat) / C;
        E* dx = dinp + off;
        for (int c = lane; c < C; c += 32) {
            const float g = to_float(dy[c]);
            const float xhat = (to_float(x[c]) - m) * r;
            const float dn = to_float(w[c]) * g;
            dx[c] = from_float<E>(to_float(dx[c]) + (dn - mean_dn - xhat * mean_dn_xhat) * r);
            atomicAdd(&dw_s[c], g * xhat);  // shared-memory atomics: other warps of the block share c
            atomicAdd(&db_s[c], g);
        }
    }
    __syncthreads();
    float* p = partial + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) p[c] = sm[c];
}

// dw[c] += sum over blocks of partial dw, db likewise (fixed block order).
template <typename E>
__global__ void layernorm_backward_finish_kernel(E* dw, E* db, const float* partial, int nblocks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float gw = 0.f, gb = 0.f;
    for (int k = 0; k < nblocks; k++) {
        gw += partial[(size_t)k * 2 * C + c];
        gb += partial[(size_t)k * 2 * C + C + c];
    }
    dw[c] = from_float<E>(to_float(dw[c]) + gw);
    db[c] = from_float<E>(to_float(db[c]) + gb);
}

// scratch: at least layernorm_backward_scratch_floats(N, C) floats.
template <typename E>
void layernorm_backward(E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, const float* mean,
                        const float* rstd, int N, int C, float* scratch, cudaStream_t stream) {
    const int nblocks = layernorm_backward_blocks(N);
    const size_t smem = (size_t)2 * C * sizeof(float);
    allow_smem(layernorm_backward_kernel<E>, smem);
    layernorm_backward_kernel<E><<<nblocks, kLnBwdBlock, smem, stream>>>(dinp, scratch, dout, inp, w, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    layernorm_backward_finish_kernel<E><<<(unsigned)ceil_div(C, 256), 256, 0, stream>>>(dw, db, scratch, nblocks, C);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_prev
