// llmc/backend/cuda/attention_tc_kernels.h: the bodies of the tensor-core attention
// kernels, written once for two executors: here the forward and what every
// body shares (the context contract, TcParams, load_rows, the tile
// configurations); the backward (dq, dk/dv) is in attention_tc_kernels_bwd.h,
// the one-kernel backward (LLMC_ATTN_BWD=5) in attention_tc_kernels_bwd_fused.h.
// attention_tc.cuh runs them as CUDA kernels through a context
// whose operations are PTX (ldmatrix, mma.sync, cp.async, shuffles);
// tests/unit/test_mma_layout.cpp runs the very same code on the CPU, one host
// thread per CUDA thread, through a context that emulates those
// instructions from their PTX ISA definitions. The design (tiling, fragment
// layouts, online softmax) is explained at the top of attention_tc.cuh.
//
// A context Ctx provides, per thread:
//   tid(), bx(), by()            threadIdx.x, blockIdx.x, blockIdx.y (128 threads)
//   smem()                       the block's dynamic shared memory (16-byte aligned)
//   sync()                       __syncthreads()
//   cp_async16(s, g, ok)         16 bytes global -> shared, asynchronously; zeros when !ok
//   cp_commit(), cp_wait_all()   cp.async.commit_group / cp.async.wait_group 0
//   cp_wait(n)                   cp.async.wait_group n (n = 0, 1, 2): all but the n newest
//                                committed groups landed (uncommitted copies never waited on)
//   atomic_add(p, x)             atomicAdd on an fp32 in global memory
//   ldsm_x4(r, p), ldsm_x4_t(r, p)   ldmatrix .m8n8 .x4 (.trans) .b16, p = this lane's row
//   mma(d, a, b0, b1)            d += A·B, mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32
//   shfl_xor(x, m), shfl(x, src) warp shuffles of a float
// Every collective (ldmatrix, mma, shuffles) is reached by all 32 lanes of a
// warp: branches around them are warp-uniform.
//
// bf16 data is handled as raw uint16_t bits here (the CUDA wrappers cast
// __nv_bfloat16 pointers), so the code compiles without CUDA headers.
#pragma once
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/mma_layout.h"

#if defined(__CUDACC__)
#define TC_BODY __device__ __forceinline__
#define TC_UNROLL _Pragma("unroll")
#define TC_ROLLED _Pragma("unroll 1")
#else
#define TC_BODY inline
#define TC_UNROLL
#define TC_ROLLED
#endif

namespace attn_tc {

using namespace mma_layout;

constexpr int kThreads = 128;  // 4 warps per block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The shape, resolved on the host (strides in elements; batch strides and
// lse strides as AttnShape's accessors give them).
struct TcParams {
    int B, NH, Tq, Tk;
    size_t q_stride, kv_stride, o_stride;
    size_t qb, kb, ob, lb, lh;
    bool causal;
    float scale;  // softmax scale
    float sl2;    // scale * log2(e): scores go to the log2 domain in one multiply
    int group;    // grouped-query attention: query head h reads kv head h / group (1 without GQA)
    int KVH;      // key/value heads (NH / group)
    // The document mask (AttnShape::doc_start, key_pos): query i of batch
    // row b sees key j only if doc[b·db + i] <= the key's position (kpos[j],
    // or j when kpos is null). Null doc: no mask.
    const int* doc;
    size_t db;
    const int* kpos;
};
inline TcParams tc_params(const AttnShape& s) {
    TcParams p;
    p.B = s.B, p.NH = s.NH, p.Tq = s.Tq, p.Tk = s.Tk;
    p.q_stride = s.q_stride, p.kv_stride = s.kv_stride, p.o_stride = s.o_stride;
    p.qb = s.qb(), p.kb = s.kb(), p.ob = s.ob(), p.lb = s.lb(), p.lh = s.lh();
    p.causal = s.causal;
    p.scale = (float)s.scale;
    p.sl2 = (float)(s.scale * 1.4426950408889634);
    p.KVH = s.kv_heads();
    p.group = s.NH / p.KVH;
    p.doc = s.doc_start;
    p.db = s.db();
    p.kpos = s.key_pos;
    return p;
}

TC_BODY int imin(int a, int b) { return a < b ? a : b; }
TC_BODY int imax(int a, int b) { return a > b ? a : b; }

// ---- the document mask -------------------------------------------------------------
// Key j's position (INT_MAX past the keys: such a key is never stored).
TC_BODY int key_at(const TcParams& p, int j) { return j >= p.Tk ? INT_MAX : p.kpos ? p.kpos[j] : j; }
// The first key below n at position d or later (positions increase along
// the keys: a block of a zigzag ring chunk, or the whole sequence).
TC_BODY int first_key_from(const TcParams& p, int d, int n) {
    if (!p.kpos) return imin(imax(d, 0), n);
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (p.kpos[mid] < d)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
// The first query from q0 whose document starts after key position klast
// (Tq if none): it and every later query see no key up to klast (document
// starts do not decrease along the queries).
TC_BODY int first_query_past(const int* docs, int q0, int Tq, int klast) {
    int lo = q0, hi = Tq;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (docs[mid] <= klast)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
// The earliest and latest document start of rows r0..r0+n-1 (those below
// Tq) of one batch row's starts; (INT_MAX, INT_MIN) when there is none.
TC_BODY void doc_range(const int* docs, int Tq, int r0, int n, int* lo, int* hi) {
    *lo = INT_MAX, *hi = INT_MIN;
    for (int r = r0; r < r0 + n && r < Tq; r++) *lo = imin(*lo, docs[r]), *hi = imax(*hi, docs[r]);
}
TC_BODY float fexp2(float x) {
#if defined(__CUDA_ARCH__)
    return exp2f(x);
#else
    return std::exp2(x);
#endif
}
TC_BODY float flog2(float x) {
#if defined(__CUDA_ARCH__)
    return log2f(x);
#else
    return std::log2(x);
#endif
}
TC_BODY float fexp(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return std::exp(x);
#endif
}
TC_BODY float flog1p(float x) {
#if defined(__CUDA_ARCH__)
    return log1pf(x);
#else
    return std::log1p(x);
#endif
}

// Two adjacent output elements: bf16 (one 4-byte store) or fp32.
TC_BODY void store_pair(uint16_t* p, float a, float b) {
    const uint32_t v = pack_bf16x2(a, b);
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint32_t*>(p) = v;
#else
    std::memcpy(p, &v, 4);
#endif
}
TC_BODY void store_pair(float* p, float a, float b) {
    p[0] = a;
    p[1] = b;
}

// Rows row0.. of a [rows, stride] bf16 slab (those below nrows; zeros for
// the others) into a shared tile of R rows and pitch D + kSmemPad, 16 bytes
// per cp.async. Needs 16-byte aligned rows (checked by the dispatcher).
template <class Ctx, int R, int D>
TC_BODY void load_rows(Ctx& cx, uint16_t* sm, const uint16_t* g, size_t stride, int row0, int nrows) {
    constexpr int kCpr = D / 8, kN = R * kCpr, kLd = D + kSmemPad;
    static_assert(kN % kThreads == 0, "tile chunks must split evenly over the block");
    TC_UNROLL
    for (int it = 0; it < kN / kThreads; it++) {
        const int c = it * kThreads + cx.tid();
        const int r = c / kCpr, col = (c % kCpr) * 8;
        const int row = row0 + r;
        const bool ok = row < nrows;
        cx.cp_async16(sm + smem_off(r, col, kLd), ok ? g + (size_t)row * stride + col : g, ok);
    }
}

// Tile configuration per head size, shared by the CUDA launchers and the CPU
// test. Register budgets (ptxas -v, docs/attention.md) decided these; the
// macros let a GPU run try others without editing (e.g. -DTC_FWD64_BN=32:
// fewer registers, 207 instead of 255, twice the tiles).
#ifndef TC_FWD64_BN
#define TC_FWD64_BN 64
#endif
template <int D>
struct TcConfig;
template <>
struct TcConfig<64> {
    static constexpr int kFwdMT = 2, kFwdBN = TC_FWD64_BN;  // 128 query rows per block, 64-key tiles
    static constexpr int kDqBN = 64;                        // 64 query rows per block, 64-key tiles
    static constexpr int kDkvBQ = 64;                       // 64 keys per block, 64-query tiles
    static constexpr bool kDqARegs = true, kDkvARegs = true;  // Q, dO (dq) / K, V (dk/dv) stay in registers
};
template <>
struct TcConfig<128> {
    static constexpr int kFwdMT = 1, kFwdBN = 64;  // 64 query rows per block: O alone is 64 registers
    static constexpr int kDqBN = 64;
    static constexpr int kDkvBQ = 32;  // 64 would need more than 255 registers (dk, dv alone are 128)
    static constexpr bool kDqARegs = false, kDkvARegs = false;  // A operands re-read from shared memory
};

// ==== what both forwards share (this file's and attention_wg_kernels.h's) ==========
// The online softmax of one 16-row tile of scores sc[NT][4] (C fragments of
// NT 8-key tiles; rows r0 + c_elem's row, keys k0 + 8·nt + c_elem's col), in
// the log2 domain: masks (when `masked`: keys >= Tk, causal j > i, with
// `dmask` keys before the row's document start dr), m' = max(m, rowmax),
// o *= 2^(m - m'), sc = 2^(s - m') (P, still fp32), l = l·2^(m - m') + this
// lane's part of the row sum. A lane holds rows g and g+8 (c0,c1 and c2,c3);
// the other 3 lanes of its quad hold the rest of those rows, hence the
// xor-1/xor-2 shuffles.
template <class Ctx, int NT, int DT>
TC_BODY void softmax_update(Ctx& cx, int lane, float (&sc)[NT][4], float (&o)[DT][4], float (&m)[2], float (&l)[2],
                            const TcParams& p, int r0, int k0, bool masked, bool dmask, const int (&dr)[2]) {
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        float mx = -INFINITY;
        TC_UNROLL
        for (int nt = 0; nt < NT; nt++)
            TC_UNROLL
            for (int e = 2 * hh; e < 2 * hh + 2; e++) {
                const RC rc = c_elem(lane, e);
                const int i = r0 + rc.row, j = k0 + nt * 8 + rc.col;
                float x = sc[nt][e] * p.sl2;
                if (masked && (j >= p.Tk || (p.causal && j > i) || (dmask && key_at(p, j) < dr[hh]))) x = -INFINITY;
                sc[nt][e] = x;
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, cx.shfl_xor(mx, 1));
        mx = fmaxf(mx, cx.shfl_xor(mx, 2));
        const float mnew = fmaxf(m[hh], mx);
        const float msub = mnew == -INFINITY ? 0.f : mnew;  // no key seen yet: keep exp2 finite
        const float corr = fexp2(m[hh] - msub);             // 0 when m was -inf
        m[hh] = mnew;
        float ls = l[hh] * corr;
        TC_UNROLL
        for (int dt = 0; dt < DT; dt++) o[dt][2 * hh] *= corr, o[dt][2 * hh + 1] *= corr;
        TC_UNROLL
        for (int nt = 0; nt < NT; nt++)
            TC_UNROLL
            for (int e = 2 * hh; e < 2 * hh + 2; e++) {
                const float pe = fexp2(sc[nt][e] - msub);
                sc[nt][e] = pe;
                ls += pe;  // this lane's part of the row sum; the quad adds up at the end
            }
        l[hh] = ls;
    }
}

// The epilogue of one 16-row tile (rows r0 + c_elem's row, those below Tq):
// normalise by the row sum, write out (type O: bf16 bits or fp32) and lse
// (natural log), or with kMerge merge them into the running pair by
// log-sum-exp (ring attention). Shuffles first, stores guarded after.
template <class Ctx, int DT, typename O, bool kMerge>
TC_BODY void store_rows(Ctx& cx, int lane, const float (&o)[DT][4], const float (&m)[2], const float (&l)[2],
                        const TcParams& p, int r0, float* lse_bh, O* ob) {
    static_assert(!kMerge || std::is_same<O, float>::value, "the running output of a merge is fp32");
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        float L = l[hh];
        L += cx.shfl_xor(L, 1);
        L += cx.shfl_xor(L, 2);
        const RC rc0 = c_elem(lane, 2 * hh);
        const int i = r0 + rc0.row;
        const bool valid = i < p.Tq;
        const bool lead = thread_in_group(lane) == 0;
        const float lse_b = L > 0.f ? (m[hh] + flog2(L)) * kLn2 : -INFINITY;
        O* orow = ob + (size_t)(valid ? i : 0) * p.o_stride;
        if constexpr (!kMerge) {
            const float inv = L > 0.f ? 1.f / L : 0.f;
            if (valid) {
                TC_UNROLL
                for (int dt = 0; dt < DT; dt++)
                    store_pair(orow + dt * 8 + rc0.col, o[dt][2 * hh] * inv, o[dt][2 * hh + 1] * inv);
                if (lead) lse_bh[i] = lse_b;
            }
        } else {
            // lse' = max + log(1 + exp(min - max)) of (lse, lse_b); out' =
            // out·exp(lse - lse') + out_b·exp(lse_b - lse'). The quad's
            // leader reads the running lse and alone writes it back.
            float la = (valid && lead) ? lse_bh[i] : 0.f;
            la = cx.shfl(la, lane & ~3);
            const float mx = fmaxf(la, lse_b);
            float lse_n = -INFINITY, wa = 0.f, wb = 0.f;
            if (mx > -INFINITY) {
                lse_n = mx + flog1p(fexp(fminf(la, lse_b) - mx));
                wa = fexp(la - lse_n);
                wb = L > 0.f ? fexp(lse_b - lse_n) / L : 0.f;  // folds out_b = o / L
            }
            if (valid) {
                TC_UNROLL
                for (int dt = 0; dt < DT; dt++) {
                    O* po = orow + dt * 8 + rc0.col;
                    store_pair(po, po[0] * wa + o[dt][2 * hh] * wb, po[1] * wa + o[dt][2 * hh + 1] * wb);
                }
                if (lead) lse_bh[i] = lse_n;
            }
        }
    }
}

// ==== forward ======================================================================
// A block: 4 warps x MT m-tiles of 16 query rows = BM rows; key tiles of BN.
template <int D, int MT, int BN>
struct FwdCfg {
    static constexpr int BM = 4 * 16 * MT, LD = D + kSmemPad;
    static constexpr int KD = D / 16;  // k-steps of S = Q K^T
    static constexpr int NT = BN / 8;  // 8-column tiles of S
    static constexpr int DT = D / 8;   // 8-column tiles of O
    static constexpr size_t smem_bytes = (size_t)(BM + 4 * BN) * LD * sizeof(uint16_t);
    static_assert(D % 16 == 0 && BN % 16 == 0, "tile sizes");
};

// out (type O: bf16 bits or fp32) and lse. kMerge: merge into the running
// (out, lse) by log-sum-exp instead of overwriting (ring attention). kDoc:
// with the document mask (p.doc set); without it the mask's code folds away
// and the registers are those of the plain kernel.
template <class Ctx, int D, int MT, int BN, typename O, bool kMerge, bool kDoc = false>
TC_BODY void fwd_body(Ctx& cx, O* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      const TcParams& p) {
    using C = FwdCfg<D, MT, BN>;
    static_assert(!kMerge || std::is_same<O, float>::value, "the running output of a merge is fp32");
    constexpr int LD = C::LD;
    uint16_t* Qs = static_cast<uint16_t*>(cx.smem());
    uint16_t* Ks = Qs + C::BM * LD;  // two buffers of BN rows
    uint16_t* Vs = Ks + 2 * BN * LD;
    const int tid = cx.tid(), warp = tid >> 5, lane = tid & 31;
    const int b = cx.by() / p.NH, h = cx.by() % p.NH;
    const int ntq = (p.Tq + C::BM - 1) / C::BM;
    const int q0 = (ntq - 1 - cx.bx()) * C::BM;  // causal: the longest rows start first
    const int kvh = h / p.group;                 // GQA: this query head's key/value head
    const uint16_t* qg = q + (size_t)b * p.qb + (size_t)h * D;
    const uint16_t* kg = k + (size_t)b * p.kb + (size_t)kvh * D;
    const uint16_t* vg = v + (size_t)b * p.kb + (size_t)kvh * D;
    const int kend = p.causal ? imin(p.Tk, q0 + C::BM) : p.Tk;
    const int nkt = (kend + BN - 1) / BN;
    const int wrow0 = q0 + warp * 16 * MT;  // this warp's first query row

    // The document mask: the block starts at the key tile of the first key
    // any of its rows sees (earlier tiles are never loaded); a warp skips
    // the tiles before its own rows' documents, and tests elements only in
    // tiles that start before its latest document start.
    const int* docs = kDoc ? p.doc + (size_t)b * p.db : nullptr;
    int kt0 = 0, wdlo = INT_MIN, wdhi = INT_MIN;
    int dr[MT][2];  // this lane's rows' document starts (INT_MIN: no mask)
    TC_UNROLL
    for (int mt = 0; mt < MT; mt++)
        TC_UNROLL
        for (int hh = 0; hh < 2; hh++) {
            const int i = wrow0 + mt * 16 + c_elem(lane, 2 * hh).row;
            dr[mt][hh] = docs && i < p.Tq ? docs[i] : INT_MIN;
        }
    if (docs) {
        int blo, bhi;
        doc_range(docs, p.Tq, q0, C::BM, &blo, &bhi);
        kt0 = blo == INT_MAX ? nkt : first_key_from(p, blo, kend) / BN;
        doc_range(docs, p.Tq, wrow0, 16 * MT, &wdlo, &wdhi);
    }

    load_rows<Ctx, C::BM, D>(cx, Qs, qg, p.q_stride, q0, p.Tq);
    if (kt0 < nkt) {
        load_rows<Ctx, BN, D>(cx, Ks + (kt0 & 1) * BN * LD, kg, p.kv_stride, kt0 * BN, p.Tk);
        load_rows<Ctx, BN, D>(cx, Vs + (kt0 & 1) * BN * LD, vg, p.kv_stride, kt0 * BN, p.Tk);
    }
    cx.cp_commit();
    float o[MT][C::DT][4], m[MT][2], l[MT][2];
    TC_UNROLL
    for (int mt = 0; mt < MT; mt++) {
        TC_UNROLL
        for (int dt = 0; dt < C::DT; dt++)
            TC_UNROLL
            for (int e = 0; e < 4; e++) o[mt][dt][e] = 0.f;
        TC_UNROLL
        for (int hh = 0; hh < 2; hh++) m[mt][hh] = -INFINITY, l[mt][hh] = 0.f;
    }
    uint32_t qf[MT][C::KD][4];  // the warp's Q rows as A fragments, loaded once

    for (int kt = kt0; kt < nkt; kt++) {
        cx.cp_wait_all();
        cx.sync();  // tile kt (and Q) landed for everyone; everyone is done with tile kt-1
        if (kt == kt0) {
            const RC rc = ldsm_a_rc(lane);
            TC_UNROLL
            for (int mt = 0; mt < MT; mt++)
                TC_UNROLL
                for (int kk = 0; kk < C::KD; kk++)
                    cx.ldsm_x4(qf[mt][kk], Qs + smem_off(warp * 16 * MT + mt * 16 + rc.row, kk * 16 + rc.col, LD));
        }
        if (kt + 1 < nkt) {  // prefetch tile kt+1 into the buffer tile kt-1 used
            const int nb = (kt + 1) & 1;
            load_rows<Ctx, BN, D>(cx, Ks + nb * BN * LD, kg, p.kv_stride, (kt + 1) * BN, p.Tk);
            load_rows<Ctx, BN, D>(cx, Vs + nb * BN * LD, vg, p.kv_stride, (kt + 1) * BN, p.Tk);
            cx.cp_commit();
        }
        const int k0 = kt * BN;
        if (p.causal && k0 > wrow0 + 16 * MT - 1) continue;  // every key after every row of this warp
        if (docs && key_at(p, imin(k0 + BN, p.Tk) - 1) < wdlo) continue;  // every key before every row's document
        const uint16_t* Kb = Ks + (kt & 1) * BN * LD;
        const uint16_t* Vb = Vs + (kt & 1) * BN * LD;

        // S = Q K^T (fp32), two 8-key tiles per ldmatrix.
        float sc[MT][C::NT][4];
        TC_UNROLL
        for (int mt = 0; mt < MT; mt++)
            TC_UNROLL
            for (int nt = 0; nt < C::NT; nt++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) sc[mt][nt][e] = 0.f;
        {
            const RC rc = ldsm_b_nk_rc(lane);
            TC_UNROLL
            for (int kk = 0; kk < C::KD; kk++)
                TC_UNROLL
                for (int np = 0; np < C::NT / 2; np++) {
                    uint32_t bk[4];
                    cx.ldsm_x4(bk, Kb + smem_off(np * 16 + rc.row, kk * 16 + rc.col, LD));
                    TC_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        cx.mma(sc[mt][2 * np], qf[mt][kk], bk[0], bk[1]);
                        cx.mma(sc[mt][2 * np + 1], qf[mt][kk], bk[2], bk[3]);
                    }
                }
        }

        // Online softmax in the log2 domain (softmax_update).
        const bool dmask = docs && key_at(p, k0) < wdhi;  // some key of the tile before some row's document
        const bool masked = (k0 + BN > p.Tk) || (p.causal && k0 + BN - 1 > wrow0) || dmask;
        TC_UNROLL
        for (int mt = 0; mt < MT; mt++)
            softmax_update(cx, lane, sc[mt], o[mt], m[mt], l[mt], p, wrow0 + mt * 16, k0, masked, dmask, dr[mt]);

        // O += P V: P's accumulators are the A operand (c_to_a); V via ldmatrix.trans.
        {
            const RC rc = ldsm_b_kn_rc(lane);
            TC_UNROLL
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t pa[MT][4];
                TC_UNROLL
                for (int mt = 0; mt < MT; mt++) c_to_a(pa[mt], sc[mt][2 * kk], sc[mt][2 * kk + 1]);
                TC_UNROLL
                for (int dp = 0; dp < C::DT / 2; dp++) {
                    uint32_t bv[4];
                    cx.ldsm_x4_t(bv, Vb + smem_off(kk * 16 + rc.row, dp * 16 + rc.col, LD));
                    TC_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        cx.mma(o[mt][2 * dp], pa[mt], bv[0], bv[1]);
                        cx.mma(o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
                    }
                }
            }
        }
    }

    cx.cp_wait_all();  // no copy left in flight (Tk = 0 issues Q's and never waits in the loop)

    // Epilogue: normalise by the row sum, write out and lse, or merge (store_rows).
    float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
    O* ob = out + (size_t)b * p.ob + (size_t)h * D;
    TC_UNROLL
    for (int mt = 0; mt < MT; mt++) store_rows<Ctx, C::DT, O, kMerge>(cx, lane, o[mt], m[mt], l[mt], p, wrow0 + mt * 16, lse_bh, ob);
}

}  // namespace attn_tc
