// llmc/backend/cuda/attention.cuh: softmax attention, flash-attention style, forward
// and backward, on CUDA cores with fp32 arithmetic throughout.
//
// Layout (backend.h AttnShape): element (b, t, h, d) of q is at
// q[b*qb() + t*q_stride + h*HS + d]; k, v (and dk, dv) use kb() and
// kv_stride; out and dout use ob() and o_stride; lse is fp32 at
// lse[b*lb() + h*lh() + t] (dense [B, NH, Tq] unless the shape says
// otherwise). The batch strides are resolved on the host into a Strides
// value the kernels take. Causal means key j is visible to query i when
// j <= i. HS may be anything up to 256 (not only powers of two); Tq and Tk
// may differ when not causal.
//
// Work split. A block has 4 warps and handles a tile of 32 rows (queries in
// the forward and dq kernels, keys in the dk/dv kernel); each warp owns 8 of
// them. The other side streams through shared memory in tiles of 32 rows, so
// that a lane is "one row of the streamed tile" when computing scores
// (dot_rows_lane: warp rows x lane row) and "a few channels d" when
// accumulating a weighted sum of rows (accum_rows; these building blocks are
// in attention_tiles.cuh). Tiles are stored as fp32 in shared memory with a
// padded row stride so both access patterns are free of bank conflicts. The
// forward keeps the online softmax (running max m and sum l per row) in the
// log2 domain: q is pre-multiplied by scale·log2(e) and exp2f is used; lse is
// converted back to natural log at the end.
//
// Backward (FlashAttention-2 algebra): D_i = dout_i·out_i; P_ij = exp(S_ij -
// lse_i) is recomputed from q, k and lse; dS = P ∘ (dP - D), dP = dout·v^T.
// Two kernels avoid atomics: one per key tile accumulates dk, dv over all
// query tiles; one per query tile accumulates dq over all key tiles (it
// recomputes S and dP, the price of determinism and no fp32 dq buffer).
// dq, dk, dv are overwritten.
//
// Grouped-query attention (AttnShape::NKV): k and v hold NKV heads, query
// head h reads key/value head h / (NH / NKV). The forward and dq kernels
// just offset their K/V reads by that head. The dk/dv kernel runs one block
// per key tile and key/value head and loops over the group's query heads
// inside the block, so dk and dv are summed over the group in registers, in
// head order, and written once: no atomics, same bits every run. NKV = 0 or
// NH is exactly the kernel as before (group 1).
//
// Document mask (AttnShape::doc_start, key_pos): query i also needs
// docs[i] <= the key's position. The forward and dq kernels start their key
// loop at the first key any row of their query tile may see (the key tiles
// before it are never loaded); the dk/dv kernel stops its query loop at the
// first query tile whose documents all start after its last key (document
// starts do not decrease along the queries). A tile with no visible key at
// all costs only that test.
//
// Ring attention (backend.h attention_block_forward/backward) reuses both.
// The block forward is the forward kernel with fp32 outputs: with `first` it
// writes the block's (out_b, lse_b) as the plain forward does; otherwise each
// warp merges its rows into the running fp32 (out, lse) by log-sum-exp at the
// end (a row is owned by one warp, its channels by the lanes: no races, no
// extra buffers). The block backward is the backward's two kernels storing
// with += into fp32 dq, dk, dv; the D vector comes from the E-typed final out
// and dout as in the plain backward.
//
// This is correctness first: no tensor cores. A wmma/mma version for bf16 is
// the obvious next step if attention shows up in the profile.
#pragma once
#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/attention_tiles.cuh"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {
namespace attn {

// ---- forward ----------------------------------------------------------------------
// out has type O: E for the plain forward, fp32 for the ring block forward.
// kMerge (block forward after the first block): instead of overwriting, merge
// the rows' (out_b, lse_b) into the running (out, lse) by log-sum-exp.
template <typename E, typename O, int DPL, bool kMerge>
__global__ void __launch_bounds__(kThreads) forward_kernel(O* out, float* lse, const E* q, const E* k, const E* v,
                                                           AttnShape s, Strides bs, int HSP, int LD, float qmul) {
    extern __shared__ float4 smem4[];
    float* Qs = reinterpret_cast<float*>(smem4);  // [32][LD], pre-scaled by scale*log2e
    float* Ks = Qs + kTile * LD;
    float* Vs = Ks + kTile * LD;
    float* Ps = Vs + kTile * LD;  // [kWarps][kRows][32]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.y / s.NH, h = blockIdx.y % s.NH;
    const int ntq = (s.Tq + kTile - 1) / kTile;
    const int q0 = (ntq - 1 - (int)blockIdx.x) * kTile;  // causal: the longest tiles start first
    const int kvh = bs.group == 1 ? h : h / bs.group;  // GQA: this query head's key/value head
    const E* qb = q + (size_t)b * bs.qb + (size_t)h * s.HS;
    const E* kb = k + (size_t)b * bs.kb + (size_t)kvh * s.HS;
    const E* vb = v + (size_t)b * bs.kb + (size_t)kvh * s.HS;
    load_tile(Qs, LD, HSP, qb, s.q_stride, q0, s.Tq, s.HS, qmul);

    const int row0 = q0 + warp * kRows;  // this warp's first query
    const float* Qw = Qs + warp * kRows * LD;
    float* Pw = Ps + warp * kRows * kTile;
    float m[kRows], l[kRows], acc[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) acc[r][dd] = 0.f;
    }
    const int kend = s.causal ? min(s.Tk, q0 + kTile) : s.Tk;
    const int* docs = s.doc_start ? s.doc_start + (size_t)b * bs.db : nullptr;
    int dr[kRows];  // the rows' document starts (INT_MIN: no mask)
#pragma unroll
    for (int r = 0; r < kRows; r++) dr[r] = docs && row0 + r < s.Tq ? docs[row0 + r] : INT_MIN;
    for (int k0 = tile_first_key(s, docs, q0, kend); k0 < kend; k0 += kTile) {
        __syncthreads();  // everyone is done with the previous K/V tile (and Qs is complete)
        load_tile(Ks, LD, HSP, kb, s.kv_stride, k0, s.Tk, s.HS, 1.f);
        load_tile(Vs, LD, HSP, vb, s.kv_stride, k0, s.Tk, s.HS, 1.f);
        __syncthreads();
        float sc[kRows];
        dot_rows_lane(sc, Qw, Ks, LD, HSP, lane);
        const int j = k0 + lane, kp = key_position(s, j);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const int i = row0 + r;
            const bool ok = j < s.Tk && (!s.causal || j <= i) && dr[r] <= kp;
            const float x = ok ? sc[r] : -INFINITY;
            const float mnew = fmaxf(m[r], warp_max(x));
            const float p = ok ? exp2f(x - mnew) : 0.f;  // ok implies mnew is finite
            const float corr = m[r] == -INFINITY ? 0.f : exp2f(m[r] - mnew);
            m[r] = mnew;
            l[r] = l[r] * corr + p;  // per-lane partial sums, all rescaled alike
#pragma unroll
            for (int dd = 0; dd < DPL; dd++) acc[r][dd] *= corr;
            Pw[r * kTile + lane] = p;
        }
        __syncwarp();
        accum_rows<DPL>(acc, Pw, Vs, LD, HSP, lane);
    }
    float* lse_bh = lse + (size_t)b * bs.lb + (size_t)h * bs.lh;
    O* ob = out + (size_t)b * bs.ob + (size_t)h * s.HS;
    if constexpr (!kMerge) {
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float L = warp_sum(l[r]);
            const int i = row0 + r;
            const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
            for (int dd = 0; dd < DPL; dd++) acc[r][dd] *= inv;
            if (lane == 0 && i < s.Tq) lse_bh[i] = L > 0.f ? (m[r] + log2f(L)) * kLn2 : -INFINITY;
        }
        store_rows<false, O, DPL>(ob, s.o_stride, row0, s.Tq, s.HS, acc, 1.f, lane);
    } else {
        // lse' = max + log(1 + exp(min - max)) over (lse, lse_b): the stable form
        // of log(exp(lse) + exp(lse_b)); out' = out·exp(lse - lse') +
        // out_b·exp(lse_b - lse'). A row with no keys on either side (both
        // -inf) stays out' = 0, lse' = -inf.
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float L = warp_sum(l[r]);  // all lanes, before the warp-uniform skip below
            const int i = row0 + r;
            if (i >= s.Tq) continue;
            const float lse_b = L > 0.f ? (m[r] + log2f(L)) * kLn2 : -INFINITY;
            // Lane 0 reads the running lse and alone writes it back; the shuffle
            // orders that write after the read.
            float lse_a = lane == 0 ? lse_bh[i] : 0.f;
            lse_a = __shfl_sync(0xffffffffu, lse_a, 0);
            const float mx = fmaxf(lse_a, lse_b);
            float lse_n = -INFINITY, wa = 0.f, wb = 0.f;
            if (mx > -INFINITY) {
                lse_n = mx + log1pf(expf(fminf(lse_a, lse_b) - mx));
                wa = expf(lse_a - lse_n);
                wb = L > 0.f ? expf(lse_b - lse_n) / L : 0.f;  // folds out_b = acc / L
            }
            O* o = ob + (size_t)i * s.o_stride;
#pragma unroll
            for (int dd = 0; dd < DPL; dd++) {
                const int d = lane * DPL + dd;
                if (d < s.HS) o[d] = from_float<O>(to_float(o[d]) * wa + acc[r][dd] * wb);
            }
            if (lane == 0) lse_bh[i] = lse_n;
        }
    }
}

// ---- backward ---------------------------------------------------------------------
// D[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d]; one warp per row.
// D is the backward's own scratch, dense [B, NH, Tq] whatever the shape's strides.
template <typename E>
__global__ void dot_do_o_kernel(float* D, const E* dout, const E* out, AttnShape s, Strides bs) {
    const size_t rows = (size_t)s.B * s.Tq * s.NH;
    const size_t gw = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (gw >= rows) return;
    const int lane = threadIdx.x % 32;
    const int h = (int)(gw % s.NH);
    const size_t bi = gw / s.NH;  // b * Tq + i
    const size_t b = bi / s.Tq, i = bi % s.Tq;
    const size_t off = b * bs.ob + i * s.o_stride + (size_t)h * s.HS;
    float acc = 0.f;
    for (int d = lane; d < s.HS; d += 32) acc += to_float(dout[off + d]) * to_float(out[off + d]);
    acc = warp_sum(acc);
    if (lane == 0) D[(b * s.NH + h) * s.Tq + i] = acc;
}

// One block per (query tile, b*NH + h): dq_i = scale * sum_j dS_ij k_j.
// dq has type G (E for the plain backward, fp32 for the block backward);
// kAcc adds to it instead of overwriting.
template <typename E, typename G, int DPL, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(G* dq, const E* dout, const E* q, const E* k, const E* v, const float* lse, const float* D,
                       AttnShape s, Strides bs, int HSP, int LD, float qmul) {
    extern __shared__ float4 smem4[];
    float* Qs = reinterpret_cast<float*>(smem4);  // pre-scaled by scale*log2e
    float* dOs = Qs + kTile * LD;
    float* Ks = dOs + kTile * LD;
    float* Vs = Ks + kTile * LD;
    float* Ss = Vs + kTile * LD;  // [kWarps][kRows][32] dS
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.y / s.NH, h = blockIdx.y % s.NH;
    const int ntq = (s.Tq + kTile - 1) / kTile;
    const int q0 = (ntq - 1 - (int)blockIdx.x) * kTile;
    const float* lse_bh = lse + (size_t)b * bs.lb + (size_t)h * bs.lh;
    const float* D_bh = D + ((size_t)b * s.NH + h) * s.Tq;
    const int kvh = bs.group == 1 ? h : h / bs.group;  // GQA: this query head's key/value head
    const E* kb = k + (size_t)b * bs.kb + (size_t)kvh * s.HS;
    const E* vb = v + (size_t)b * bs.kb + (size_t)kvh * s.HS;
    load_tile(Qs, LD, HSP, q + (size_t)b * bs.qb + (size_t)h * s.HS, s.q_stride, q0, s.Tq, s.HS, qmul);
    load_tile(dOs, LD, HSP, dout + (size_t)b * bs.ob + (size_t)h * s.HS, s.o_stride, q0, s.Tq, s.HS, 1.f);

    const int row0 = q0 + warp * kRows;
    float lse2[kRows], Dr[kRows], acc[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int i = row0 + r;
        const float L = i < s.Tq ? lse_bh[i] : -INFINITY;
        lse2[r] = L > -INFINITY ? L * kLog2e : INFINITY;  // rows without keys give P = 0
        Dr[r] = i < s.Tq ? D_bh[i] : 0.f;
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) acc[r][dd] = 0.f;
    }
    const float* Qw = Qs + warp * kRows * LD;
    const float* dOw = dOs + warp * kRows * LD;
    float* Sw = Ss + warp * kRows * kTile;
    const int kend = s.causal ? min(s.Tk, q0 + kTile) : s.Tk;
    const int* docs = s.doc_start ? s.doc_start + (size_t)b * bs.db : nullptr;
    int dr[kRows];  // the rows' document starts (INT_MIN: no mask)
#pragma unroll
    for (int r = 0; r < kRows; r++) dr[r] = docs && row0 + r < s.Tq ? docs[row0 + r] : INT_MIN;
    for (int k0 = tile_first_key(s, docs, q0, kend); k0 < kend; k0 += kTile) {
        __syncthreads();
        load_tile(Ks, LD, HSP, kb, s.kv_stride, k0, s.Tk, s.HS, 1.f);
        load_tile(Vs, LD, HSP, vb, s.kv_stride, k0, s.Tk, s.HS, 1.f);
        __syncthreads();
        float sc[kRows], dp[kRows];
        dot_rows_lane(sc, Qw, Ks, LD, HSP, lane);
        dot_rows_lane(dp, dOw, Vs, LD, HSP, lane);
        const int j = k0 + lane, kp = key_position(s, j);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const int i = row0 + r;
            const bool ok = j < s.Tk && (!s.causal || j <= i) && dr[r] <= kp;
            const float p = ok ? exp2f(sc[r] - lse2[r]) : 0.f;
            Sw[r * kTile + lane] = p * (dp[r] - Dr[r]);
        }
        __syncwarp();
        accum_rows<DPL>(acc, Sw, Ks, LD, HSP, lane);
    }
    store_rows<kAcc, G, DPL>(dq + (size_t)b * bs.qb + (size_t)h * s.HS, s.q_stride, row0, s.Tq, s.HS, acc,
                             (float)s.scale, lane);
}

// One block per (key tile, b*KVH + g), g a key/value head: dv_j = sum_i
// P_ij dout_i, dk_j = scale * sum_i dS_ij q_i, the sums running over the
// query rows of every query head of g's group (one head without GQA), head
// after head in a fixed order: deterministic. dk, dv have type G; kAcc adds
// to them.
template <typename E, typename G, int DPL, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(G* dk, G* dv, const E* dout, const E* q, const E* k, const E* v, const float* lse,
                         const float* D, AttnShape s, Strides bs, int HSP, int LD, float kmul) {
    extern __shared__ float4 smem4[];
    float* Ks = reinterpret_cast<float*>(smem4);  // pre-scaled by scale*log2e
    float* Vs = Ks + kTile * LD;
    float* Qs = Vs + kTile * LD;
    float* dOs = Qs + kTile * LD;
    float* Ps = dOs + kTile * LD;            // [kWarps][kRows][32]
    float* Ss = Ps + kWarps * kRows * kTile;  // [kWarps][kRows][32]
    float* lse_s = Ss + kWarps * kRows * kTile;  // [32], log2 domain
    float* D_s = lse_s + kTile;                  // [32]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // blockIdx.y = b * KVH + g over the key/value heads; the group's query
    // heads g*group .. g*group + group - 1 all read this K/V tile, and their
    // contributions to dk, dv are summed here in head order (GQA).
    const int KVH = s.NH / bs.group;
    const int b = blockIdx.y / KVH, g = blockIdx.y % KVH;
    const int k0 = blockIdx.x * kTile;  // causal: the first key tiles see the most queries, and start first
    const size_t kvbase = (size_t)b * bs.kb + (size_t)g * s.HS;
    load_tile(Ks, LD, HSP, k + kvbase, s.kv_stride, k0, s.Tk, s.HS, kmul);
    load_tile(Vs, LD, HSP, v + kvbase, s.kv_stride, k0, s.Tk, s.HS, 1.f);

    const int row0 = k0 + warp * kRows;  // this warp's first key
    const int* docs = s.doc_start ? s.doc_start + (size_t)b * bs.db : nullptr;
    const int klast = key_position(s, min(k0 + kTile, s.Tk) - 1);  // the tile's last key's position
    int kp[kRows];  // the warp's keys' positions
#pragma unroll
    for (int r = 0; r < kRows; r++) kp[r] = key_position(s, row0 + r);
    const float* Kw = Ks + warp * kRows * LD;
    const float* Vw = Vs + warp * kRows * LD;
    float* Pw = Ps + warp * kRows * kTile;
    float* Sw = Ss + warp * kRows * kTile;
    float dk_acc[kRows][DPL], dv_acc[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) {
            dk_acc[r][dd] = 0.f;
            dv_acc[r][dd] = 0.f;
        }

    for (int h = g * bs.group; h < (g + 1) * bs.group; h++) {
    const float* lse_bh = lse + (size_t)b * bs.lb + (size_t)h * bs.lh;
    const float* D_bh = D + ((size_t)b * s.NH + h) * s.Tq;
    const E* qb = q + (size_t)b * bs.qb + (size_t)h * s.HS;
    const E* dob = dout + (size_t)b * bs.ob + (size_t)h * s.HS;
    // Causal: queries before k0 see none of these keys; tiles share boundaries.
    // (The barrier at the top of each tile also guards Qs/dOs across heads.)
    for (int q0 = s.causal ? k0 : 0; q0 < s.Tq; q0 += kTile) {
        if (docs && docs[q0] > klast) break;  // this tile's documents and all later ones start after our keys
        __syncthreads();
        load_tile(Qs, LD, HSP, qb, s.q_stride, q0, s.Tq, s.HS, 1.f);
        load_tile(dOs, LD, HSP, dob, s.o_stride, q0, s.Tq, s.HS, 1.f);
        if (threadIdx.x < kTile) {
            const int i = q0 + threadIdx.x;
            const float L = i < s.Tq ? lse_bh[i] : -INFINITY;
            lse_s[threadIdx.x] = L > -INFINITY ? L * kLog2e : INFINITY;
            D_s[threadIdx.x] = i < s.Tq ? D_bh[i] : 0.f;
        }
        __syncthreads();
        float sc[kRows], dp[kRows];
        dot_rows_lane(sc, Kw, Qs, LD, HSP, lane);   // lane = query q0 + lane
        dot_rows_lane(dp, Vw, dOs, LD, HSP, lane);
        const int i = q0 + lane;
        const int di = docs && i < s.Tq ? docs[i] : INT_MIN;
        const float L2 = lse_s[lane], Di = D_s[lane];
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const int j = row0 + r;
            const bool ok = i < s.Tq && j < s.Tk && (!s.causal || j <= i) && di <= kp[r];
            const float p = ok ? exp2f(sc[r] - L2) : 0.f;
            Pw[r * kTile + lane] = p;
            Sw[r * kTile + lane] = p * (dp[r] - Di);
        }
        __syncwarp();
        accum_rows<DPL>(dv_acc, Pw, dOs, LD, HSP, lane);
        accum_rows<DPL>(dk_acc, Sw, Qs, LD, HSP, lane);
    }
    }  // query heads of the group
    store_rows<kAcc, G, DPL>(dk + kvbase, s.kv_stride, row0, s.Tk, s.HS, dk_acc, (float)s.scale, lane);
    store_rows<kAcc, G, DPL>(dv + kvbase, s.kv_stride, row0, s.Tk, s.HS, dv_acc, 1.f, lane);
}

inline size_t forward_smem(const Geometry& g) { return sizeof(float) * (3 * kTile * g.LD + kWarps * kRows * kTile); }
inline size_t dq_smem(const Geometry& g) { return sizeof(float) * (4 * kTile * g.LD + kWarps * kRows * kTile); }
inline size_t dkdv_smem(const Geometry& g) {
    return sizeof(float) * (4 * kTile * g.LD + 2 * kWarps * kRows * kTile + 2 * kTile);
}

inline void check_shape(const AttnShape& s) {
    if (s.NKV < 0 || (s.NKV > 0 && s.NH % s.NKV != 0)) {
        std::fprintf(stderr, "attention: %d kv heads do not divide %d query heads\n", s.NKV, s.NH);
        std::exit(1);
    }
    if (s.HS < 1 || s.HS > kMaxHeadSize) {
        std::fprintf(stderr, "attention: head size %d not supported (1..%d)\n", s.HS, kMaxHeadSize);
        std::exit(1);
    }
    if (s.causal && s.Tq != s.Tk) {
        std::fprintf(stderr, "attention: causal needs Tq == Tk (got %d, %d)\n", s.Tq, s.Tk);
        std::exit(1);
    }
}

template <typename E, typename O, int DPL, bool kMerge>
void forward_launch(O* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s, cudaStream_t st) {
    const Geometry g = geometry(s.HS);
    const size_t smem = forward_smem(g);
    allow_smem(forward_kernel<E, O, DPL, kMerge>, smem);
    dim3 grid((unsigned)ceil_div(s.Tq, kTile), (unsigned)(s.B * s.NH));
    const float qmul = (float)(s.scale * 1.4426950408889634);
    forward_kernel<E, O, DPL, kMerge>
        <<<grid, kThreads, smem, st>>>(out, lse, q, k, v, s, strides(s), g.HSP, g.LD, qmul);
    CUDA_CHECK_LAUNCH();
}

template <typename E, typename O, bool kMerge>
void forward_dispatch(O* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s, cudaStream_t st) {
    switch (dpl_for(s.HS)) {
        case 1: forward_launch<E, O, 1, kMerge>(out, lse, q, k, v, s, st); break;
        case 2: forward_launch<E, O, 2, kMerge>(out, lse, q, k, v, s, st); break;
        case 4: forward_launch<E, O, 4, kMerge>(out, lse, q, k, v, s, st); break;
        default: forward_launch<E, O, 8, kMerge>(out, lse, q, k, v, s, st); break;
    }
}

template <typename E, typename G, int DPL, bool kAcc>
void backward_launch(G* dq, G* dk, G* dv, const E* dout, const E* q, const E* k, const E* v, const float* lse,
                     const float* D, const AttnShape& s, cudaStream_t st) {
    const Geometry g = geometry(s.HS);
    const float mul = (float)(s.scale * 1.4426950408889634);
    const size_t smem_q = dq_smem(g), smem_kv = dkdv_smem(g);
    const Strides bs = strides(s);
    allow_smem(backward_dq_kernel<E, G, DPL, kAcc>, smem_q);
    allow_smem(backward_dkdv_kernel<E, G, DPL, kAcc>, smem_kv);
    if (s.Tq > 0) {
        dim3 grid_q((unsigned)ceil_div(s.Tq, kTile), (unsigned)(s.B * s.NH));
        backward_dq_kernel<E, G, DPL, kAcc>
            <<<grid_q, kThreads, smem_q, st>>>(dq, dout, q, k, v, lse, D, s, bs, g.HSP, g.LD, mul);
        CUDA_CHECK_LAUNCH();
    }
    if (s.Tk > 0) {
        dim3 grid_kv((unsigned)ceil_div(s.Tk, kTile), (unsigned)(s.B * s.kv_heads()));  // one block per kv head
        backward_dkdv_kernel<E, G, DPL, kAcc>
            <<<grid_kv, kThreads, smem_kv, st>>>(dk, dv, dout, q, k, v, lse, D, s, bs, g.HSP, g.LD, mul);
        CUDA_CHECK_LAUNCH();
    }
}

// D = rowsum(dout ∘ out) into D (dense [B, NH, Tq]), then the two kernels.
template <typename E, typename G, bool kAcc>
void backward_run(G* dq, G* dk, G* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
                  const float* lse, const AttnShape& s, float* D, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.Tq * s.NH;
    if (rows > 0) {
        const int block = 256;
        dot_do_o_kernel<E><<<(unsigned)ceil_div(rows, block / 32), block, 0, st>>>(D, dout, out, s, strides(s));
        CUDA_CHECK_LAUNCH();
    }
    switch (dpl_for(s.HS)) {
        case 1: backward_launch<E, G, 1, kAcc>(dq, dk, dv, dout, q, k, v, lse, D, s, st); break;
        case 2: backward_launch<E, G, 2, kAcc>(dq, dk, dv, dout, q, k, v, lse, D, s, st); break;
        case 4: backward_launch<E, G, 4, kAcc>(dq, dk, dv, dout, q, k, v, lse, D, s, st); break;
        default: backward_launch<E, G, 8, kAcc>(dq, dk, dv, dout, q, k, v, lse, D, s, st); break;
    }
}

}  // namespace attn

// out, lse overwritten. lse is fp32 at the shape's lse strides.
template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s,
                       cudaStream_t stream) {
    attn::check_shape(s);
    if (s.B == 0 || s.NH == 0 || s.Tq == 0) return;
    attn::forward_dispatch<E, E, false>(out, lse, q, k, v, s, stream);
}

// Ring attention, one block (backend.h attention_block_forward): out_acc and
// lse_acc are fp32 (out_acc at the shape's ob()/o_stride, lse_acc at its lse
// strides). first: overwritten with the block's result; otherwise the block
// is merged into them by log-sum-exp.
template <typename E>
void attention_block_forward(float* out_acc, float* lse_acc, const E* q, const E* k, const E* v, const AttnShape& s,
                             bool first, cudaStream_t stream) {
    attn::check_shape(s);
    if (s.B == 0 || s.NH == 0 || s.Tq == 0) return;
    if (first)
        attn::forward_dispatch<E, float, false>(out_acc, lse_acc, q, k, v, s, stream);
    else
        attn::forward_dispatch<E, float, true>(out_acc, lse_acc, q, k, v, s, stream);
}

// fp32 scratch the backward needs (the D = rowsum(dout * out) vector); the
// block backward needs the same.
inline size_t attention_backward_scratch_floats(const AttnShape& s) { return (size_t)s.B * s.NH * s.Tq; }

// dq, dk, dv overwritten. scratch: attention_backward_scratch_floats(s) floats.
template <typename E>
void attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
                        const float* lse, const AttnShape& s, float* scratch, cudaStream_t stream) {
    attn::check_shape(s);
    if (s.B == 0 || s.NH == 0) return;
    attn::backward_run<E, E, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
}

// Ring attention, one block (backend.h attention_block_backward): dq (q's
// strides), dk and dv (k's strides) are fp32 and accumulated (+=); out and
// lse are the final (global) ones of the query rows. scratch:
// attention_backward_scratch_floats(s) floats.
template <typename E>
void attention_block_backward(float* dq, float* dk, float* dv, const E* dout, const E* q, const E* k, const E* v,
                              const E* out, const float* lse, const AttnShape& s, float* scratch,
                              cudaStream_t stream) {
    attn::check_shape(s);
    if (s.B == 0 || s.NH == 0 || s.Tq == 0 || s.Tk == 0) return;  // nothing to add
    attn::backward_run<E, float, true>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
}

}  // namespace llmc_cuda
