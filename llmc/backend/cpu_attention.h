// llmc/backend/cpu_attention.h: softmax attention on the CPU (part of
// cpu_ops.h, which includes it): forward and backward, and the
// ring-attention blocks, in the element type F. The block algorithm of the
// GPU kernels with its products done by gemm on tiles of 64 query rows;
// deterministic like the other CPU ops (each output written by one thread
// in a fixed order).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/backend/cpu_gemm.h"
#include "llmc/backend/cpu_math.h"

namespace cpu {

// Query rows per tile: the scores of one tile against every key it sees
// (kAttnTile x Tk) are one matrix product, so the work is done by sgemm/dgemm
// rather than by dot-product loops; 64 rows keep a tile's scores in the
// cache for T up to a few thousand.
constexpr int kAttnTile = 64;

// The first key whose global position is at least d (keys' positions
// increase, see AttnShape), among keys 0..n-1; n if none.
inline int attn_first_key(const AttnShape& s, int d, int n) {
    if (!s.key_pos) return std::min(std::max(d, 0), n);
    return (int)(std::lower_bound(s.key_pos, s.key_pos + n, d) - s.key_pos);
}

// One tile's geometry: rows i0..i0+mi-1 of query head h in batch b, which
// see keys k0..nk-1 at most (causal: the tile's last row sees up to key
// i0+mi-1; document mask: no key before the earliest document start of its
// rows). nk <= k0 means that no row of the tile sees any key of the block:
// the tile is skipped.
struct AttnTile {
    int i0, mi, k0, nk;
    const int* docs;  // the tile's rows' document starts (null: no mask)
    AttnTile(const AttnShape& s, int b, int tile) {
        i0 = tile * kAttnTile;
        mi = std::min(kAttnTile, s.Tq - i0);
        nk = s.causal ? i0 + mi : s.Tk;
        k0 = 0;
        docs = s.doc_start ? s.doc_start + b * s.db() + i0 : nullptr;
        if (docs) {
            int d = docs[0];
            for (int r = 1; r < mi; r++) d = std::min(d, docs[r]);
            k0 = attn_first_key(s, d, nk);
        }
    }
    int width() const { return nk - k0; }
    // Row r's visible keys, k0 + lo .. k0 + hi - 1 (lo >= hi: none).
    void row(const AttnShape& s, int r, int* lo, int* hi) const {
        *hi = (s.causal ? i0 + r + 1 : s.Tk) - k0;
        *lo = docs ? attn_first_key(s, docs[r], nk) - k0 : 0;
    }
};
inline int attn_tiles(const AttnShape& s) { return (s.Tq + kAttnTile - 1) / kAttnTile; }

// Score elements the tiles of one (row, head) compute: the work of a call,
// which the document mask cuts (tests and the benchmark count it).
inline size_t attn_tile_work(const AttnShape& s, int b) {
    size_t n = 0;
    for (int tile = 0; tile < attn_tiles(s); tile++) {
        const AttnTile t(s, b, tile);
        if (t.width() > 0) n += (size_t)t.mi * t.width();
    }
    return n;
}

// Ring-attention block forward: per tile, scores S = scale·Q·Kᵀ (one gemm),
// a row softmax over each row's visible keys (the rest set to 0), the
// block's output P·V (a second gemm) and its log-sum-exp; merged into
// (out, lse) by log-sum-exp (the stable form of docs/design.md section 5's
// formula) unless this is the first block. Every tile is written by one
// thread, so the result does not depend on the schedule.
template <typename F>
void attention_block_forward(F* out, F* lse, const F* q, const F* k, const F* v, const AttnShape& s, bool first) {
    const int tiles = attn_tiles(s);
#pragma omp parallel
    {
        std::vector<F> sc((size_t)kAttnTile * s.Tk), ob((size_t)kAttnTile * s.HS);
        F lb[kAttnTile];
#pragma omp for schedule(dynamic) collapse(3)
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int tile = 0; tile < tiles; tile++) {
                    const AttnTile t(s, b, tile);
                    const int w = t.width();
                    if (w <= 0 && !first) continue;  // no key of this block is visible: nothing to merge
                    const size_t kvo = b * s.kb() + (size_t)t.k0 * s.kv_stride + (size_t)s.kv_head(h) * s.HS;
                    const F* qt = q + b * s.qb() + (size_t)t.i0 * s.q_stride + (size_t)h * s.HS;
                    if (w > 0)
                        gemm(false, true, t.mi, w, s.HS, F(s.scale), qt, (int)s.q_stride, k + kvo, (int)s.kv_stride,
                             F(0), sc.data(), w);
                    for (int r = 0; r < t.mi; r++) {
                        F* p = sc.data() + (size_t)r * std::max(w, 0);
                        int lo, hi;
                        t.row(s, r, &lo, &hi);
                        F mx = -INFINITY;
                        for (int j = lo; j < hi; j++) mx = std::max(mx, p[j]);
                        for (int j = lo; j < hi; j++) p[j] = vexp(p[j] - mx);
                        F sum = 0;
                        for (int j = lo; j < hi; j++) sum += p[j];
                        const F inv = F(1) / sum;
                        for (int j = lo; j < hi; j++) p[j] *= inv;
                        for (int j = 0; j < std::min(lo, w); j++) p[j] = 0;
                        for (int j = std::max(hi, 0); j < w; j++) p[j] = 0;
                        lb[r] = hi > lo ? mx + std::log(sum) : F(-INFINITY);
                    }
                    if (w > 0)
                        gemm(false, false, t.mi, s.HS, w, F(1), sc.data(), w, v + kvo, (int)s.kv_stride, F(0),
                             ob.data(), s.HS);
                    else
                        std::fill(ob.begin(), ob.end(), F(0));
                    for (int r = 0; r < t.mi; r++) {
                        const int i = t.i0 + r;
                        F* oi = out + b * s.ob() + (size_t)i * s.o_stride + (size_t)h * s.HS;
                        const F* o = ob.data() + (size_t)r * s.HS;
                        F& L = lse[b * s.lb() + h * s.lh() + i];
                        if (first) {
                            for (int d = 0; d < s.HS; d++) oi[d] = o[d];
                            L = lb[r];
                            continue;
                        }
                        F mx = std::max(L, lb[r]);
                        F ln = mx + std::log(std::exp(L - mx) + std::exp(lb[r] - mx));
                        F wa = std::exp(L - ln), wb = std::exp(lb[r] - ln);
                        for (int d = 0; d < s.HS; d++) oi[d] = oi[d] * wa + o[d] * wb;
                        L = ln;
                    }
                }
    }
}

// Full attention forward: one block, written rather than merged.
template <typename F>
void attention_forward(F* out, F* lse, const F* q, const F* k, const F* v, const AttnShape& s) {
    attention_block_forward(out, lse, q, k, v, s, true);
}

// Gradients of one block (dq with q's strides, dk/dv with k's), accumulated.
// Per query tile: P = exp(scale·Q·Kᵀ - lse) recomputed, dP = dO·Vᵀ,
// dS = P∘(dP - rowsum(dO∘O))·scale, then dQ += dS·K, dK += dSᵀ·Q and
// dV += Pᵀ·dO, five gemms. Each (b, kv head) owns its slices of dk and dv,
// and the query heads of its group and their tiles run one after the other
// inside it, so there are no races and every sum runs in a fixed order.
template <typename F>
void attention_block_backward(F* dq, F* dk, F* dv, const F* dout, const F* q, const F* k, const F* v, const F* out,
                              const F* lse, const AttnShape& s) {
    const int G = s.kv_heads(), per = s.NH / G, tiles = attn_tiles(s);
    const int qs = (int)s.q_stride, ks = (int)s.kv_stride, os = (int)s.o_stride;
#pragma omp parallel
    {
        std::vector<F> pm((size_t)kAttnTile * s.Tk), ds((size_t)kAttnTile * s.Tk);
#pragma omp for schedule(dynamic) collapse(2)
        for (int b = 0; b < s.B; b++)
            for (int g = 0; g < G; g++) {
                const size_t kvo = b * s.kb() + (size_t)g * s.HS;
                for (int h = g * per; h < (g + 1) * per; h++)
                    for (int tile = 0; tile < tiles; tile++) {
                        const AttnTile t(s, b, tile);
                        const int w = t.width();
                        if (w <= 0) continue;  // no key of this block is visible to the tile
                        const size_t qo = b * s.qb() + (size_t)t.i0 * s.q_stride + (size_t)h * s.HS;
                        const size_t oo = b * s.ob() + (size_t)t.i0 * s.o_stride + (size_t)h * s.HS;
                        const size_t ko = kvo + (size_t)t.k0 * s.kv_stride;
                        gemm(false, true, t.mi, w, s.HS, F(s.scale), q + qo, qs, k + ko, ks, F(0), pm.data(), w);
                        gemm(false, true, t.mi, w, s.HS, F(1), dout + oo, os, v + ko, ks, F(0), ds.data(), w);
                        for (int r = 0; r < t.mi; r++) {
                            const int i = t.i0 + r;
                            int lo, hi;
                            t.row(s, r, &lo, &hi);
                            const F* oi = out + oo + (size_t)r * s.o_stride;
                            const F* doi = dout + oo + (size_t)r * s.o_stride;
                            const F L = lse[b * s.lb() + h * s.lh() + i];
                            F D = 0;
                            for (int d = 0; d < s.HS; d++) D += doi[d] * oi[d];
                            F* p = pm.data() + (size_t)r * w;
                            F* dsr = ds.data() + (size_t)r * w;
                            for (int j = lo; j < hi; j++) {
                                p[j] = vexp(p[j] - L);
                                dsr[j] = p[j] * (dsr[j] - D) * F(s.scale);
                            }
                            for (int j = 0; j < std::min(lo, w); j++) p[j] = dsr[j] = 0;
                            for (int j = std::max(hi, 0); j < w; j++) p[j] = dsr[j] = 0;
                        }
                        gemm(false, false, t.mi, s.HS, w, F(1), ds.data(), w, k + ko, ks, F(1), dq + qo, qs);
                        gemm(true, false, w, s.HS, t.mi, F(1), ds.data(), w, q + qo, qs, F(1), dk + ko, ks);
                        gemm(true, false, w, s.HS, t.mi, F(1), pm.data(), w, dout + oo, os, F(1), dv + ko, ks);
                    }
            }
    }
}

// Full attention backward: zero the gradients, then one block.
template <typename F>
void attention_backward(F* dq, F* dk, F* dv, const F* dout, const F* q, const F* k, const F* v, const F* out,
                        const F* lse, const AttnShape& s) {
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++)
                for (int d = 0; d < s.HS; d++) dq[b * s.qb() + (size_t)i * s.q_stride + (size_t)h * s.HS + d] = 0;
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < s.B; b++)
        for (int g = 0; g < s.kv_heads(); g++)
            for (int j = 0; j < s.Tk; j++)
                for (int d = 0; d < s.HS; d++) {
                    size_t o = b * s.kb() + (size_t)j * s.kv_stride + (size_t)g * s.HS + d;
                    dk[o] = 0;
                    dv[o] = 0;
                }
    attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
}

}  // namespace cpu
