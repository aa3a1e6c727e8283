// llmc/backend/cuda/rmsnorm.cuh: RMSNorm forward, the fused residual-add + RMSNorm
// forward, and RMSNorm backward (Llama; backend.h rmsnorm_* ops):
//   out = x · r · w with r = 1/sqrt(mean(x²) + eps) per row, rstd[n] = r (fp32);
//   dx (+=) r·(w∘dy) - x·r³·mean(x∘w∘dy); dw (+=) Σ_rows x·r·dy.
//
// The same plan as LayerNorm (layernorm.cuh, whose comments explain it in
// full), with one statistic instead of two:
//  - forward: one warp per row. Vector path (C a multiple of the 16-byte pack,
//    rows 16-byte aligned, C <= 32 · pack · kLnMaxPacks): the row is read
//    once, 16 bytes per access, into registers (lane l holds packs at
//    channels (k·32 + l)·W, llmc_idx::ln_pack_channel), Σx² is a warp sum of
//    the registers, the output is written once. Longer rows (C = 4096 in
//    bf16) take a looped kernel that reads the row twice (the second time
//    from L1/L2), still 16 bytes per access; odd C or unaligned rows the
//    same loop element by element. The residual variant
//    rounds a + b to E first and normalises the rounded value, which is what
//    the backward reads back.
//  - backward: deterministic, no atomics. Each warp keeps its rows' dw sums
//    in registers (rows by llmc_idx::ln_bwd_first_row / ln_bwd_row_stride,
//    grid llmc_idx::ln_bwd_blocks(N), which depends only on N), the block
//    adds its warps in warp order into shared memory, one fp32 slice per
//    block goes to the scratch, and column_sum_finish (common.cuh) adds the
//    slices in a fixed order into dw. The looped kernel (long rows, odd
//    shapes) keeps one slice per warp in the scratch instead of registers. Same bits every run and every GPU.
// out null: the residual and rstd alone (delayed scaling's cast writes the
// output, fp8.cuh's NormCast).
// eps arrives as a double (backend.h) and is used as fp32, the compute type.
#pragma once
#include <initializer_list>

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/layernorm.cuh"  // kLnMaxPacks, layernorm_vec_packs: the same register plan

namespace llmc_cuda {

// ---- looped path (any C) ---------------------------------------------------------
// One warp per row, lane l takes packs of W channels at l·W, (l + 32)·W, ...
// W = kVec<E> (16-byte accesses) when C % W == 0 and the rows are aligned,
// else 1 (element by element). Two passes over the row: Σx², then the
// output; the second reads the row again (from L1/L2: the warp just read
// it). For rows too long to hold in registers (C = 4096 in bf16, say) and
// for odd shapes. With RESIDUAL the first pass writes residual = a + b
// rounded to E, and the second pass reads residual back (the same lane's own
// writes); residual may alias a or b (each pack is read before the same lane
// writes it).
template <typename E, int W, bool RESIDUAL>
__global__ void __launch_bounds__(256) rmsnorm_forward_loop_kernel(E* residual, E* out, float* rstd, const E* a,
                                                                   const E* b, const E* w, int N, int C, float eps,
                                                                   bool w_vec, unsigned* amax) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    float ss = 0.f;
    for (int c = lane * W; c < C; c += 32 * W) {
        float x[W];
        load_floats<E, W>(x, a + off + c);
        if constexpr (RESIDUAL) {
            float y[W];
            load_floats<E, W>(y, b + off + c);
#pragma unroll
            for (int j = 0; j < W; j++) x[j] = to_float(from_float<E>(x[j] + y[j]));  // as stored
            store_floats<E, W>(residual + off + c, x);
        }
#pragma unroll
        for (int j = 0; j < W; j++) ss += x[j] * x[j];
    }
    const float r = 1.f / sqrtf(warp_sum(ss) / C + eps);
    const E* src = RESIDUAL ? residual : a;
    unsigned am = 0;
    for (int c = lane * W; out && c < C; c += 32 * W) {
        float x[W], wf[W], o[W];
        load_floats<E, W>(x, src + off + c);
        load_floats_any<E, W>(wf, w + c, w_vec);
#pragma unroll
        for (int j = 0; j < W; j++) o[j] = x[j] * r * wf[j];
        store_floats<E, W>(out + off + c, o);
        if (amax) am = written_max<E, W>(am, o);
    }
    if (lane == 0 && rstd) rstd[row] = r;
    if (amax) warp_amax_commit(amax, am);  // (the whole warp: one row per warp)
}

// ---- vector path: one read of the row ---------------------------------------------
// K packs of W = kVec<E> channels per lane (C % W == 0, so a pack is all in
// or all out of the row). With RESIDUAL the row is a + b rounded to E and
// written to residual (which may alias a or b: a lane reads both packs
// before it writes that pack); otherwise the row is a. w_vec: w is 16-byte
// aligned (a parameter slice at any offset of the flat buffer; otherwise
// read element by element).
template <typename E, int K, bool RESIDUAL>
__global__ void __launch_bounds__(256) rmsnorm_forward_vec_kernel(E* residual, E* out, float* rstd, const E* a,
                                                                  const E* b, const E* w, int N, int C, float eps,
                                                                  bool w_vec, unsigned* amax) {
    constexpr int W = kVec<E>;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    float x[K][W];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = llmc_idx::ln_pack_channel(k, lane, W);
        if (c < C) {
            load_floats<E, W>(x[k], a + off + c);
            if constexpr (RESIDUAL) {
                float y[W];
                load_floats<E, W>(y, b + off + c);
#pragma unroll
                for (int j = 0; j < W; j++) x[k][j] = to_float(from_float<E>(x[k][j] + y[j]));  // as stored
                store_floats<E, W>(residual + off + c, x[k]);
            }
#pragma unroll
            for (int j = 0; j < W; j++) ss += x[k][j] * x[k][j];
        } else {
#pragma unroll
            for (int j = 0; j < W; j++) x[k][j] = 0.f;
        }
    }
    const float r = 1.f / sqrtf(warp_sum(ss) / C + eps);
    unsigned am = 0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = llmc_idx::ln_pack_channel(k, lane, W);
        if (out && c < C) {
            float wf[W], o[W];
            load_floats_any<E, W>(wf, w + c, w_vec);
#pragma unroll
            for (int j = 0; j < W; j++) o[j] = x[k][j] * r * wf[j];
            store_floats<E, W>(out + off + c, o);
            if (amax) am = written_max<E, W>(am, o);
        }
    }
    if (lane == 0 && rstd) rstd[row] = r;
    if (amax) warp_amax_commit(amax, am);
}

template <typename E, bool RESIDUAL>
void launch_rmsnorm_forward_vec(int K, E* residual, E* out, float* rstd, const E* a, const E* b, const E* w, int N,
                                int C, float eps, cudaStream_t stream, unsigned* amax) {
    const int block = 256, rows_per_block = block / 32;
    const unsigned grid = (unsigned)ceil_div(N, rows_per_block);
    const bool w_vec = aligned16(w);
#define LLMC_RMS_FWD_CASE(KK)                                                                                   \
    case KK:                                                                                                    \
        rmsnorm_forward_vec_kernel<E, KK, RESIDUAL><<<grid, block, 0, stream>>>(residual, out, rstd, a, b, w, N, \
                                                                                C, eps, w_vec, amax);           \
        break;
    switch (K) {
        LLMC_RMS_FWD_CASE(1)
        LLMC_RMS_FWD_CASE(2)
        LLMC_RMS_FWD_CASE(3)
        LLMC_RMS_FWD_CASE(4)
        LLMC_RMS_FWD_CASE(5)
        LLMC_RMS_FWD_CASE(6)
        LLMC_RMS_FWD_CASE(7)
        LLMC_RMS_FWD_CASE(8)
        default: std::fprintf(stderr, "rmsnorm_forward: bad pack count %d\n", K), std::exit(1);
    }
#undef LLMC_RMS_FWD_CASE
    CUDA_CHECK_LAUNCH();
}

// How a row is processed: K packs per lane in registers (K > 0), or the
// looped kernel with W elements per access (K == 0).
struct RmsPlan {
    int K, W;
};
template <typename E>
inline RmsPlan rmsnorm_plan(int C, std::initializer_list<const void*> rows) {
    constexpr int V = kVec<E>;
    bool vec = C % V == 0;
    for (const void* p : rows)
        if (p && !aligned16(p)) vec = false;
    if (!vec) return {0, 1};
    const int K = llmc_idx::ln_packs_per_lane(C, V);
    return {K <= kLnMaxPacks ? K : 0, V};
}

template <typename E, bool RESIDUAL>
void launch_rmsnorm_forward(const RmsPlan& pl, E* residual, E* out, float* rstd, const E* a, const E* b, const E* w,
                            int N, int C, float eps, cudaStream_t stream, unsigned* amax) {
    if (pl.K) {
        launch_rmsnorm_forward_vec<E, RESIDUAL>(pl.K, residual, out, rstd, a, b, w, N, C, eps, stream, amax);
        return;
    }
    const int block = 256, rows_per_block = block / 32;
    const unsigned grid = (unsigned)ceil_div(N, rows_per_block);
    const bool w_vec = aligned16(w);
    if (pl.W == kVec<E>)
        rmsnorm_forward_loop_kernel<E, kVec<E>, RESIDUAL>
            <<<grid, block, 0, stream>>>(residual, out, rstd, a, b, w, N, C, eps, w_vec, amax);
    else
        rmsnorm_forward_loop_kernel<E, 1, RESIDUAL>
            <<<grid, block, 0, stream>>>(residual, out, rstd, a, b, w, N, C, eps, false, amax);
    CUDA_CHECK_LAUNCH();
}

// amax (null: none): the largest |out| as written into *amax (common.cuh's
// written_bits), the next FP8 product's input measured in this pass
// (Backend::norm_amax); likewise dinp's, as it ends, in the backward.
template <typename E>
void rmsnorm_forward(E* out, float* rstd, const E* inp, const E* w, int N, int C, double eps, cudaStream_t stream,
                     unsigned* amax = nullptr) {
    if (N <= 0 || C <= 0) return;
    launch_rmsnorm_forward<E, false>(rmsnorm_plan<E>(C, {out, inp}), nullptr, out, rstd, inp, nullptr, w, N, C,
                                     (float)eps, stream, amax);
}

template <typename E>
void residual_rmsnorm_forward(E* residual, E* out, float* rstd, const E* a, const E* b, const E* w, int N, int C,
                              double eps, cudaStream_t stream, unsigned* amax = nullptr) {
    if (N <= 0 || C <= 0) return;
    launch_rmsnorm_forward<E, true>(rmsnorm_plan<E>(C, {residual, out, a, b}), residual, out, rstd, a, b, w, N, C,
                                    (float)eps, stream, amax);
}

// ---- backward ------------------------------------------------------------------
// fp32 scratch the backward needs: the looped kernel's one dw slice per
// warp (the vector path uses the first ln_bwd_blocks(N) slices of it).
inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return llmc_idx::rms_bwd_scratch_floats(N, C); }

// Vector path: K packs of W channels per lane. Per row: dot = Σ x·w·dy (a
// warp sum), then dx += r·w·dy - x·r³·dot/C. The dinp pass reads x and dout
// again from L1 (this warp has just read them), as the LayerNorm backward
// does, to keep registers for occupancy; dwa holds the warp's Σ x·r·dy.
// At the end the warps add their dwa into shared memory in warp order (warp
// 0 writes, each next warp adds after a barrier) and the block's slice goes
// to partial[blockIdx.x]. dinp may alias dout: each pack of dout is read
// before the same lane writes that pack of dinp.
template <typename E, int K>
__global__ void __launch_bounds__(kLnBwdBlock) rmsnorm_backward_vec_kernel(E* dinp, float* partial, const E* dout,
                                                                           const E* inp, const E* w,
                                                                           const float* rstd, int N, int C,
                                                                           bool w_vec, unsigned* amax) {
    constexpr int W = kVec<E>;
    extern __shared__ float sm[];  // [C]: the block's dw
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned am = 0;
    float dwa[K][W];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < W; j++) dwa[k][j] = 0.f;

    for (int row = llmc_idx::ln_bwd_first_row(blockIdx.x, warp); row < N;
         row += llmc_idx::ln_bwd_row_stride(gridDim.x)) {
        const size_t off = (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.f;
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
                    const float xv = to_float(x.v[j]), g = to_float(gv.v[j]);
                    dot += xv * wf[j] * g;
                    dwa[k][j] += xv * r * g;
                }
            }
        }
        const float coef = warp_sum(dot) / C * r * r * r;  // r³ · mean(x∘w∘dy)
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = llmc_idx::ln_pack_channel(k, lane, W);
            if (c < C) {
                float wf[W], dx[W];
                load_floats_any<E, W>(wf, w + c, w_vec);
                load_floats<E, W>(dx, dinp + off + c);
                const Vec<E, W> x = load_vec<E, W>(inp + off + c);   // from L1
                const Vec<E, W> gv = load_vec<E, W>(dout + off + c);  // from L1
#pragma unroll
                for (int j = 0; j < W; j++) dx[j] += r * wf[j] * to_float(gv.v[j]) - to_float(x.v[j]) * coef;
                store_floats<E, W>(dinp + off + c, dx);
                if (amax) am = written_max<E, W>(am, dx);
            }
        }
    }
    if (amax) warp_amax_commit(amax, am);  // (every lane: the row loop is the warp's)
    // Warp order: a warp's lanes own disjoint channels; barriers separate the turns.
    for (int turn = 0; turn < llmc_idx::kLnBwdWarps; turn++) {
        if (warp == turn) {
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int c = llmc_idx::ln_pack_channel(k, lane, W);
                if (c < C) {
#pragma unroll
                    for (int j = 0; j < W; j++) sm[c + j] = turn == 0 ? dwa[k][j] : sm[c + j] + dwa[k][j];
                }
            }
        }
        __syncthreads();
    }
    float* p = partial + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) p[c] = sm[c];
}

// Looped path (rows longer than the register plan, or W = 1 for odd C and
// unaligned rows): lane l takes packs of W channels at l·W, (l + 32)·W, ...
// and owns those channels of its warp's own dw slice in the scratch,
// partial[block * warps + warp], adding each of its rows into it in row
// order (read-modify-write by the one owner; with W > 1 the slice is read
// and written 16 bytes at a time: C % W == 0 and the scratch is aligned).
template <typename E, int W>
__global__ void __launch_bounds__(kLnBwdBlock) rmsnorm_backward_loop_kernel(E* dinp, float* partial, const E* dout,
                                                                            const E* inp, const E* w,
                                                                            const float* rstd, int N, int C,
                                                                            bool w_vec, unsigned* amax) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* pw = partial + ((size_t)blockIdx.x * llmc_idx::kLnBwdWarps + warp) * C;
    unsigned am = 0;
    for (int c = lane * W; c < C; c += 32 * W) {
        float z[W];
#pragma unroll
        for (int j = 0; j < W; j++) z[j] = 0.f;
        store_floats<float, W>(pw + c, z);
    }
    for (int row = llmc_idx::ln_bwd_first_row(blockIdx.x, warp); row < N;
         row += llmc_idx::ln_bwd_row_stride(gridDim.x)) {
        const size_t off = (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.f;
        for (int c = lane * W; c < C; c += 32 * W) {
            float x[W], g[W], wf[W];
            load_floats<E, W>(x, inp + off + c);
            load_floats<E, W>(g, dout + off + c);
            load_floats_any<E, W>(wf, w + c, w_vec);
#pragma unroll
            for (int j = 0; j < W; j++) dot += x[j] * wf[j] * g[j];
        }
        const float coef = warp_sum(dot) / C * r * r * r;
        for (int c = lane * W; c < C; c += 32 * W) {
            float x[W], g[W], wf[W], dx[W], acc[W];
            load_floats<E, W>(x, inp + off + c);
            load_floats<E, W>(g, dout + off + c);
            load_floats_any<E, W>(wf, w + c, w_vec);
            load_floats<E, W>(dx, dinp + off + c);
            load_floats<float, W>(acc, pw + c);
#pragma unroll
            for (int j = 0; j < W; j++) {
                dx[j] += r * wf[j] * g[j] - x[j] * coef;
                acc[j] += x[j] * r * g[j];
            }
            store_floats<E, W>(dinp + off + c, dx);
            store_floats<float, W>(pw + c, acc);
            if (amax) am = written_max<E, W>(am, dx);
        }
    }
    if (amax) warp_amax_commit(amax, am);
}

// dinp (+=), dw (+=). scratch: at least rmsnorm_backward_scratch_floats(N, C) floats.
template <typename E>
void rmsnorm_backward(E* dinp, E* dw, const E* dout, const E* inp, const E* w, const float* rstd, int N, int C,
                      float* scratch, cudaStream_t stream, unsigned* amax = nullptr) {
    if (N <= 0 || C <= 0) return;
    const int nblocks = llmc_idx::ln_bwd_blocks(N);
    const RmsPlan pl = rmsnorm_plan<E>(C, {dinp, dout, inp});
    const bool w_vec = aligned16(w);
    if (pl.K) {
        const size_t smem = (size_t)C * sizeof(float);
#define LLMC_RMS_BWD_CASE(KK)                                                                                   \
    case KK:                                                                                                    \
        allow_smem(rmsnorm_backward_vec_kernel<E, KK>, smem);                                                   \
        rmsnorm_backward_vec_kernel<E, KK><<<nblocks, kLnBwdBlock, smem, stream>>>(dinp, scratch, dout, inp, w, \
                                                                                   rstd, N, C, w_vec, amax);    \
        break;
        switch (pl.K) {
            LLMC_RMS_BWD_CASE(1)
            LLMC_RMS_BWD_CASE(2)
            LLMC_RMS_BWD_CASE(3)
            LLMC_RMS_BWD_CASE(4)
            LLMC_RMS_BWD_CASE(5)
            LLMC_RMS_BWD_CASE(6)
            LLMC_RMS_BWD_CASE(7)
            LLMC_RMS_BWD_CASE(8)
            default: std::fprintf(stderr, "rmsnorm_backward: bad pack count %d\n", pl.K), std::exit(1);
        }
#undef LLMC_RMS_BWD_CASE
        CUDA_CHECK_LAUNCH();
        column_sum_finish<E>(dw, dw, scratch, nblocks, C, C, stream);
        return;
    }
    if (pl.W == kVec<E>)
        rmsnorm_backward_loop_kernel<E, kVec<E>>
            <<<nblocks, kLnBwdBlock, 0, stream>>>(dinp, scratch, dout, inp, w, rstd, N, C, w_vec, amax);
    else
        rmsnorm_backward_loop_kernel<E, 1>
            <<<nblocks, kLnBwdBlock, 0, stream>>>(dinp, scratch, dout, inp, w, rstd, N, C, false, amax);
    CUDA_CHECK_LAUNCH();
    column_sum_finish<E>(dw, dw, scratch, nblocks * llmc_idx::kLnBwdWarps, C, C, stream);
}

}  // namespace llmc_cuda
