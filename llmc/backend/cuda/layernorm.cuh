// llmc/backend/cuda/layernorm.cuh: LayerNorm forward, the fused residual-add +
// LayerNorm forward, and LayerNorm backward (eps 1e-5, biased variance).
//
// One warp per row; mean and rstd are fp32 (the backend's stat type).
//
// Forward (vector path: C a multiple of the 16-byte pack, activations
// 16-byte aligned, C <= 32 * pack * kLnMaxPacks): the row is read from
// memory once, 16 bytes per access, and held in registers (lane l holds
// packs at channels (k*32 + l)*W, llmc_idx::ln_pack_channel); the mean is a
// warp sum of the registers, the variance a second warp sum of (x - mean)^2
// over the same registers (the two-pass formula, so no cancellation, at the
// memory cost of one pass), and the output is written once. Other shapes take
// the scalar kernel, which reads the row three times (from L1/L2).
//
// out null: the residual and the statistics alone (delayed scaling's cast of
// the norm's output writes it, fp8.cuh's NormCast, from what this leaves).
//
// Backward accumulates dinp (+=) per row and dw, db (+=) over all rows,
// deterministically and without atomics: each warp sums dout*xhat and dout
// of its rows in registers, the block adds its warps in warp order into one
// fp32 slice per block, and the fixed-order column sum of common.cuh adds
// the slices. The grid depends only on N (llmc_idx::ln_bwd_blocks), so the
// result is the same bits on every GPU and every run. The scalar fallback
// keeps one fp32 slice per warp in the scratch instead of registers.
#pragma once
#include <initializer_list>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kLnMaxPacks = 8;  // packs per lane held in registers: C <= 2048 (bf16), 1024 (fp32)

// ---- scalar fallback (any C, any alignment) --------------------------------------
// Normalise the row x (already in memory, possibly just written by this same
// lane) and write out, mean, rstd. Each lane touches channels lane, lane+32, ...
// in every pass, so a lane only ever reads back what it wrote itself.
template <typename E>
__device__ __forceinline__ void layernorm_row(E* o, float* mean, float* rstd, const E* x, const E* w, const E* b,
                                              int row, int C, int lane, unsigned* amax) {
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += to_float(x[c]);
    const float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        const float d = to_float(x[c]) - m;
        v += d * d;
    }
    const float r = 1.f / sqrtf(warp_sum(v) / C + kLayerNormEps);
    unsigned am = 0;
    for (int c = lane; o && c < C; c += 32) {
        const float v = (to_float(x[c]) - m) * r * to_float(w[c]) + to_float(b[c]);
        o[c] = from_float<E>(v);
        if (amax) am = max(am, written_bits<E>(v));
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
    if (amax) warp_amax_commit(amax, am);  // (the whole warp: one row per warp)
}

template <typename E>
__global__ void layernorm_forward_kernel(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N,
                                         int C, unsigned* amax) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    layernorm_row(out ? out + (size_t)row * C : nullptr, mean, rstd, inp + (size_t)row * C, w, b, row, C,
                  threadIdx.x % 32, amax);
}

// residual = a + b (rounded to E), then LayerNorm of the rounded residual, so
// the statistics match what backward will read back from `residual`.
// residual may alias a or b: each element is read before it is written by
// the same lane.
template <typename E>
__global__ void residual_layernorm_forward_kernel(E* residual, E* out, float* mean, float* rstd, const E* a,
                                                  const E* bb, const E* w, const E* bias, int N, int C,
                                                  unsigned* amax) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    for (int c = lane; c < C; c += 32) residual[off + c] = from_float<E>(to_float(a[off + c]) + to_float(bb[off + c]));
    layernorm_row(out ? out + off : nullptr, mean, rstd, residual + off, w, bias, row, C, lane, amax);
}

// ---- vector path: one read of the row ---------------------------------------------
// K packs of W = kVec<E> channels per lane. With RESIDUAL, the row is a + b
// rounded to E (and written to residual, which may alias a or b: a lane
// reads both packs before writing the same pack); otherwise the row is a.
// wb_vec: w and bias are 16-byte aligned (they are parameter slices at any
// offset of the flat buffer; otherwise read element by element).
template <typename E, int K, bool RESIDUAL>
__global__ void __launch_bounds__(256) layernorm_forward_vec_kernel(E* residual, E* out, float* mean, float* rstd,
                                                                    const E* a, const E* b, const E* w,
                                                                    const E* bias, int N, int C, bool wb_vec,
                                                                    unsigned* amax) {
    constexpr int W = kVec<E>;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    float x[K][W];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = llmc_idx::ln_pack_channel(k, lane, W);
        if (c < C) {  // C % W == 0: a pack is all in or all out
            load_floats<E, W>(x[k], a + off + c);
            if constexpr (RESIDUAL) {
                float y[W];
                load_floats<E, W>(y, b + off + c);
#pragma unroll
                for (int j = 0; j < W; j++) x[k][j] = to_float(from_float<E>(x[k][j] + y[j]));  // as stored
                store_floats<E, W>(residual + off + c, x[k]);
            }
#pragma unroll
            for (int j = 0; j < W; j++) s += x[k][j];
        } else {
#pragma unroll
            for (int j = 0; j < W; j++) x[k][j] = 0.f;
        }
    }
    const float m = warp_sum(s) / C;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (llmc_idx::ln_pack_channel(k, lane, W) < C) {
#pragma unroll
            for (int j = 0; j < W; j++) {
                const float d = x[k][j] - m;
                v += d * d;
            }
        }
    }
    const float r = 1.f / sqrtf(warp_sum(v) / C + kLayerNormEps);
    unsigned am = 0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = llmc_idx::ln_pack_channel(k, lane, W);
        if (out && c < C) {
            float wf[W], bf[W], o[W];
            load_floats_any<E, W>(wf, w + c, wb_vec);
            load_floats_any<E, W>(bf, bias + c, wb_vec);
#pragma unroll
            for (int j = 0; j < W; j++) o[j] = (x[k][j] - m) * r * wf[j] + bf[j];
            store_floats<E, W>(out + off + c, o);
            if (amax) am = written_max<E, W>(am, o);
        }
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
    if (amax) warp_amax_commit(amax, am);
}

// Packs per lane for the vector path, or 0 when the shape or alignment needs
// the scalar kernels.
template <typename E>
inline int layernorm_vec_packs(int C, std::initializer_list<const void*> rows) {
    constexpr int W = kVec<E>;
    if (C <= 0 || C % W != 0) return 0;
    for (const void* p : rows)
        if (p && !aligned16(p)) return 0;
    const int K = llmc_idx::ln_packs_per_lane(C, W);
    return K <= kLnMaxPacks ? K : 0;
}

template <typename E, bool RESIDUAL>
void launch_layernorm_forward_vec(int K, E* residual, E* out, float* mean, float* rstd, const E* a, const E* b,
                                  const E* w, const E* bias, int N, int C, cudaStream_t stream, unsigned* amax) {
    const int block = 256, rows_per_block = block / 32;
    const unsigned grid = (unsigned)ceil_div(N, rows_per_block);
    const bool wb_vec = aligned16(w) && aligned16(bias);
#define LLMC_LN_FWD_CASE(KK)                                                                                         \
    case KK:                                                                                                         \
        layernorm_forward_vec_kernel<E, KK, RESIDUAL><<<grid, block, 0, stream>>>(residual, out, mean, rstd, a, b, w, \
                                                                                  bias, N, C, wb_vec, amax);         \
        break;
    switch (K) {
        LLMC_LN_FWD_CASE(1)
        LLMC_LN_FWD_CASE(2)
        LLMC_LN_FWD_CASE(3)
        LLMC_LN_FWD_CASE(4)
        LLMC_LN_FWD_CASE(5)
        LLMC_LN_FWD_CASE(6)
        LLMC_LN_FWD_CASE(7)
        LLMC_LN_FWD_CASE(8)
        default: std::fprintf(stderr, "layernorm_forward: bad pack count %d\n", K), std::exit(1);
    }
#undef LLMC_LN_FWD_CASE
    CUDA_CHECK_LAUNCH();
}

// amax (null: none): the largest |out| as written into *amax (common.cuh's
// written_bits), the next FP8 product's input measured in this pass
// (Backend::norm_amax); likewise dinp's, as it ends, in the backward.
template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N, int C,
                       cudaStream_t stream, unsigned* amax = nullptr) {
    if (N <= 0) return;
    if (const int K = layernorm_vec_packs<E>(C, {out, inp})) {
        launch_layernorm_forward_vec<E, false>(K, nullptr, out, mean, rstd, inp, nullptr, w, b, N, C, stream, amax);
        return;
    }
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, w,
                                                                                             b, N, C, amax);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a, const E* b, const E* w,
                                const E* bias, int N, int C, cudaStream_t stream, unsigned* amax = nullptr) {
    if (N <= 0) return;
    if (const int K = layernorm_vec_packs<E>(C, {residual, out, a, b})) {
        launch_layernorm_forward_vec<E, true>(K, residual, out, mean, rstd, a, b, w, bias, N, C, stream, amax);
        return;
    }
    const int block = 256, rows_per_block = block / 32;
    residual_layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(
        residual, out, mean, rstd, a, b, w, bias, N, C, amax);
    CUDA_CHECK_LAUNCH();
}

// ---- backward ------------------------------------------------------------------
// dinp += (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd, with
// dnorm = w * dout and xhat = (x - mean) * rstd; dw += sum dout * xhat,
// db += sum dout over the rows.
constexpr int kLnBwdBlock = 32 * llmc_idx::kLnBwdWarps;

// fp32 scratch the backward needs: the scalar fallback's one [dw | db] slice
// per warp (the vector path uses the first ln_bwd_blocks(N) slices of it).
inline size_t layernorm_backward_scratch_floats(int N, int C) { return llmc_idx::ln_bwd_scratch_floats(N, C); }

// Vector path: K packs of W channels per lane. A warp keeps its rows' dw, db
// sums in registers (dwa, dba). The dinp pass reads the row's x and dout a
// second time, from L1 (the warp has just read them): holding them in
// registers instead took 128 registers per thread at C = 768 in bf16 and
// 255 with spills at C = 2048, against 80 and 175 this way (ptxas, sm_90).
// w is re-read per row (C elements, L1-resident). At the end the warps add
// into shared memory in warp order (warp 0 writes, then each next warp adds
// after a barrier), and the block's slice goes to partial[blockIdx.x] =
// [dw(C) | db(C)]. dinp may even alias dout: each pack of dout is read before
// the same lane writes that pack of dinp.
template <typename E, int K>
__global__ void __launch_bounds__(kLnBwdBlock) layernorm_backward_vec_kernel(E* dinp, float* partial, const E* dout,
                                                                             const E* inp, const E* w,
                                                                             const float* mean, const float* rstd,
                                                                             int N, int C, bool w_vec,
                                                                             unsigned* amax) {
    constexpr int W = kVec<E>;
    extern __shared__ float sm[];  // [2C]: the block's dw | db
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned am = 0;
    float dwa[K][W], dba[K][W];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < W; j++) dwa[k][j] = dba[k][j] = 0.f;

    for (int row = llmc_idx::ln_bwd_first_row(blockIdx.x, warp); row < N; row += llmc_idx::ln_bwd_row_stride(gridDim.x)) {
        const size_t off = (size_t)row * C;
        const float m = mean[row], r = rstd[row];
        float sum_dn = 0.f, sum_dn_xhat = 0.f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = llmc_idx::ln_pack_channel(k, lane, W);
            if (c < C) {
                const Vec<E, W> x = load_vec<E, W>(inp + off + c);
                const Vec<E, W> gv = load_vec<E, W>(dout + off + c);
                float wf[W];
                load_floats_any<E, W>(wf, w + c, w_vec);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    const float xhat = (to_float(x.v[j]) - m) * r;
                    const float g = to_float(gv.v[j]);
                    const float dn = wf[j] * g;
                    sum_dn += dn;
                    sum_dn_xhat += dn * xhat;
                    dwa[k][j] += g * xhat;
                    dba[k][j] += g;
                }
            }
        }
        const float mean_dn = warp_sum(sum_dn) / C;
        const float mean_dn_xhat = warp_sum(sum_dn_xhat) / C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = llmc_idx::ln_pack_channel(k, lane, W);
            if (c < C) {
                float wf[W], dx[W];
                load_floats_any<E, W>(wf, w + c, w_vec);
                load_floats<E, W>(dx, dinp + off + c);
                // x and dout again: this warp read them just now, so from L1
                // (keeping them in registers costs occupancy instead).
                const Vec<E, W> x = load_vec<E, W>(inp + off + c);
                const Vec<E, W> gv = load_vec<E, W>(dout + off + c);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    const float xhat = (to_float(x.v[j]) - m) * r;
                    const float dn = wf[j] * to_float(gv.v[j]);
                    dx[j] += (dn - mean_dn - xhat * mean_dn_xhat) * r;
                }
                store_floats<E, W>(dinp + off + c, dx);
                if (amax) am = written_max<E, W>(am, dx);
            }
        }
    }
    if (amax) warp_amax_commit(amax, am);  // (every lane: the row loop is the warp's)
    // Warp order: the lanes of one warp own disjoint channels, so within a
    // turn there is no conflict; barriers separate the turns.
    for (int turn = 0; turn < llmc_idx::kLnBwdWarps; turn++) {
        if (warp == turn) {
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int c = llmc_idx::ln_pack_channel(k, lane, W);
                if (c < C) {
#pragma unroll
                    for (int j = 0; j < W; j++) {
                        sm[c + j] = turn == 0 ? dwa[k][j] : sm[c + j] + dwa[k][j];
                        sm[C + c + j] = turn == 0 ? dba[k][j] : sm[C + c + j] + dba[k][j];
                    }
                }
            }
        }
        __syncthreads();
    }
    float* p = partial + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) p[c] = sm[c];
}

// Scalar fallback: lane l owns channels l, l + 32, ... of its warp's own
// [dw | db] slice in the scratch, partial[block * warps + warp], and adds
// each of its rows into it in row order (read-modify-write by the one owner).
template <typename E>
__global__ void __launch_bounds__(kLnBwdBlock) layernorm_backward_scalar_kernel(E* dinp, float* partial,
                                                                                const E* dout, const E* inp,
                                                                                const E* w, const float* mean,
                                                                                const float* rstd, int N, int C,
                                                                                unsigned* amax) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* pw = partial + ((size_t)blockIdx.x * llmc_idx::kLnBwdWarps + warp) * 2 * C;
    unsigned am = 0;
    for (int c = lane; c < 2 * C; c += 32) pw[c] = 0.f;
    __syncwarp();  // pw[C + c] below may have been zeroed by another lane of this warp (C % 32 != 0)
    for (int row = llmc_idx::ln_bwd_first_row(blockIdx.x, warp); row < N; row += llmc_idx::ln_bwd_row_stride(gridDim.x)) {
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
            const float v = to_float(dx[c]) + (dn - mean_dn - xhat * mean_dn_xhat) * r;
            dx[c] = from_float<E>(v);
            if (amax) am = max(am, written_bits<E>(v));
            pw[c] += g * xhat;
            pw[C + c] += g;
        }
    }
    if (amax) warp_amax_commit(amax, am);
}

// scratch: at least layernorm_backward_scratch_floats(N, C) floats.
template <typename E>
void layernorm_backward(E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, const float* mean,
                        const float* rstd, int N, int C, float* scratch, cudaStream_t stream,
                        unsigned* amax = nullptr) {
    if (N <= 0 || C <= 0) return;
    const int nblocks = llmc_idx::ln_bwd_blocks(N);
    const int K = layernorm_vec_packs<E>(C, {dinp, dout, inp});
    if (K) {
        const size_t smem = (size_t)2 * C * sizeof(float);
        const bool w_vec = aligned16(w);
#define LLMC_LN_BWD_CASE(KK)                                                                                    \
    case KK:                                                                                                    \
        allow_smem(layernorm_backward_vec_kernel<E, KK>, smem);                                                 \
        layernorm_backward_vec_kernel<E, KK><<<nblocks, kLnBwdBlock, smem, stream>>>(dinp, scratch, dout, inp, w, \
                                                                                     mean, rstd, N, C, w_vec,   \
                                                                                     amax);                     \
        break;
        switch (K) {
            LLMC_LN_BWD_CASE(1)
            LLMC_LN_BWD_CASE(2)
            LLMC_LN_BWD_CASE(3)
            LLMC_LN_BWD_CASE(4)
            LLMC_LN_BWD_CASE(5)
            LLMC_LN_BWD_CASE(6)
            LLMC_LN_BWD_CASE(7)
            LLMC_LN_BWD_CASE(8)
            default: std::fprintf(stderr, "layernorm_backward: bad pack count %d\n", K), std::exit(1);
        }
#undef LLMC_LN_BWD_CASE
        CUDA_CHECK_LAUNCH();
        column_sum_finish<E>(dw, db, scratch, nblocks, 2 * C, C, stream);
    } else {
        layernorm_backward_scalar_kernel<E><<<nblocks, kLnBwdBlock, 0, stream>>>(dinp, scratch, dout, inp, w, mean,
                                                                                 rstd, N, C, amax);
        CUDA_CHECK_LAUNCH();
        column_sum_finish<E>(dw, db, scratch, nblocks * llmc_idx::kLnBwdWarps, 2 * C, C, stream);
    }
}

}  // namespace llmc_cuda
