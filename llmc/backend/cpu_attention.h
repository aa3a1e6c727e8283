// llmc/backend/cpu_attention.h: the CPU reference of softmax attention
// (part of cpu_ops.h, which includes it): forward and backward, and the
// ring-attention blocks, naive loops in the element type F, deterministic
// like the other CPU ops (each output written by one thread in a fixed
// order).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llmc/backend/backend.h"

namespace cpu {

// Visible keys for query i: all, or 0..i when causal.
inline int attn_keys(const AttnShape& s, int i) { return s.causal ? i + 1 : s.Tk; }

// Scores, softmax and weighted sum of one query row over its visible keys:
// writes the row's output (normalised) and returns its log-sum-exp.
template <typename F>
F attention_row(F* o, const F* qi, const F* k, const F* v, const AttnShape& s, int b, int h, int i, std::vector<F>& p) {
    int nk = attn_keys(s, i);
    const size_t kh = (size_t)s.kv_head(h) * s.HS;
    F mx = -INFINITY;
    for (int j = 0; j < nk; j++) {
        const F* kj = k + b * s.kb() + (size_t)j * s.kv_stride + kh;
        F dot = 0;
        for (int d = 0; d < s.HS; d++) dot += qi[d] * kj[d];
        p[j] = dot * F(s.scale);
        mx = std::max(mx, p[j]);
    }
    F sum = 0;
    for (int j = 0; j < nk; j++) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
    }
    for (int d = 0; d < s.HS; d++) o[d] = 0;
    for (int j = 0; j < nk; j++) {
        const F* vj = v + b * s.kb() + (size_t)j * s.kv_stride + kh;
        F pj = p[j] / sum;
        for (int d = 0; d < s.HS; d++) o[d] += pj * vj[d];
    }
    return mx + std::log(sum);
}

// Ring-attention block forward: the block's rows merged into (out, lse) by
// log-sum-exp (stable form of docs/design.md section 5's formula).
template <typename F>
void attention_block_forward(F* out, F* lse, const F* q, const F* k, const F* v, const AttnShape& s, bool first) {
#pragma omp parallel
    {
        std::vector<F> p(s.Tk), ob(s.HS);
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int i = 0; i < s.Tq; i++) {
                    const F* qi = q + b * s.qb() + (size_t)i * s.q_stride + (size_t)h * s.HS;
                    F* oi = out + b * s.ob() + (size_t)i * s.o_stride + (size_t)h * s.HS;
                    F& L = lse[b * s.lb() + h * s.lh() + i];
                    F lb = attention_row(ob.data(), qi, k, v, s, b, h, i, p);
                    if (first) {
                        for (int d = 0; d < s.HS; d++) oi[d] = ob[d];
                        L = lb;
                        continue;
                    }
                    F mx = std::max(L, lb);
                    F ln = mx + std::log(std::exp(L - mx) + std::exp(lb - mx));
                    F wa = std::exp(L - ln), wb = std::exp(lb - ln);
                    for (int d = 0; d < s.HS; d++) oi[d] = oi[d] * wa + ob[d] * wb;
                    L = ln;
                }
    }
}

// Full attention forward: one block, written rather than merged.
template <typename F>
void attention_forward(F* out, F* lse, const F* q, const F* k, const F* v, const AttnShape& s) {
    attention_block_forward(out, lse, q, k, v, s, true);
}

// Gradients of one block (dq with q's strides, dk/dv with k's), accumulated.
// Each (b, kv head) owns its slices of dk and dv, and the query heads of its
// group run one after the other inside it, so there are no races and every
// sum runs in a fixed order.
template <typename F>
void attention_block_backward(F* dq, F* dk, F* dv, const F* dout, const F* q, const F* k, const F* v, const F* out,
                              const F* lse, const AttnShape& s) {
    const int G = s.kv_heads(), per = s.NH / G;
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < s.B; b++)
        for (int g = 0; g < G; g++)
            for (int h = g * per; h < (g + 1) * per; h++)
                for (int i = 0; i < s.Tq; i++) {
                    size_t qo = b * s.qb() + (size_t)i * s.q_stride + (size_t)h * s.HS;
                    size_t oo = b * s.ob() + (size_t)i * s.o_stride + (size_t)h * s.HS;
                    const F* qi = q + qo;
                    const F* oi = out + oo;
                    const F* doi = dout + oo;
                    F* dqi = dq + qo;
                    F L = lse[b * s.lb() + h * s.lh() + i];
                    F D = 0;
                    for (int d = 0; d < s.HS; d++) D += doi[d] * oi[d];
                    int nk = attn_keys(s, i);
                    for (int j = 0; j < nk; j++) {
                        size_t kvo = b * s.kb() + (size_t)j * s.kv_stride + (size_t)g * s.HS;
                        const F* kj = k + kvo;
                        const F* vj = v + kvo;
                        F dot = 0, dp = 0;
                        for (int d = 0; d < s.HS; d++) {
                            dot += qi[d] * kj[d];
                            dp += doi[d] * vj[d];
                        }
                        F p = std::exp(dot * F(s.scale) - L);
                        F ds = p * (dp - D) * F(s.scale);
                        for (int d = 0; d < s.HS; d++) {
                            dqi[d] += ds * kj[d];
                            dk[kvo + d] += ds * qi[d];
                            dv[kvo + d] += p * doi[d];
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
