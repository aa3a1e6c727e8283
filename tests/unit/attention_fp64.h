// tests/unit/attention_fp64.h: naive fp64 attention (forward and backward,
// with grouped-query attention) over an AttnShape view of strided buffers:
// the truth tests/unit/test_mma_layout.cpp compares the emulated kernels with.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llmc/backend/backend.h"

// ---- naive fp64 attention over an AttnShape view -----------------------------------
struct View {
    AttnShape s;
    size_t qn, kvn, on, ln;  // buffer sizes (elements)
    size_t koff, voff;       // K and V within the kv buffer
};
inline size_t qi_(const AttnShape& s, int b, int i, int h) { return b * s.qb() + (size_t)i * s.q_stride + (size_t)h * s.HS; }
// h is a query head: its key/value head is s.kv_head(h) (grouped-query attention).
inline size_t ki_(const AttnShape& s, int b, int j, int h) {
    return b * s.kb() + (size_t)j * s.kv_stride + (size_t)s.kv_head(h) * s.HS;
}
inline size_t oi_(const AttnShape& s, int b, int i, int h) { return b * s.ob() + (size_t)i * s.o_stride + (size_t)h * s.HS; }
inline size_t li_(const AttnShape& s, int b, int i, int h) { return b * s.lb() + h * s.lh() + (size_t)i; }
// Key j visible to query i of row b: the causal rule, and with a document
// mask only keys at or after the query's document start (AttnShape).
inline bool visible(const AttnShape& s, int b, int i, int j) {
    if (s.causal && j > i) return false;
    if (!s.doc_start) return true;
    return s.doc_start[b * s.db() + i] <= (s.key_pos ? s.key_pos[j] : j);
}

inline void ref_forward(const View& w, const std::vector<float>& q, const std::vector<float>& kv, std::vector<double>& out,
                        std::vector<double>& lse) {
    const AttnShape& s = w.s;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++) {
                std::vector<double> sc(s.Tk, -INFINITY);
                double mx = -INFINITY;
                for (int j = 0; j < s.Tk; j++) {
                    if (!visible(s, b, i, j)) continue;
                    double d = 0;
                    for (int c = 0; c < s.HS; c++) d += (double)q[qi_(s, b, i, h) + c] * kv[w.koff + ki_(s, b, j, h) + c];
                    sc[j] = d * s.scale;
                    mx = std::max(mx, sc[j]);
                }
                double sum = 0;
                for (int j = 0; j < s.Tk; j++) sum += sc[j] == -INFINITY ? 0.0 : std::exp(sc[j] - mx);
                for (int c = 0; c < s.HS; c++) {
                    double acc = 0;
                    for (int j = 0; j < s.Tk; j++)
                        if (sc[j] != -INFINITY) acc += std::exp(sc[j] - mx) / sum * kv[w.voff + ki_(s, b, j, h) + c];
                    out[oi_(s, b, i, h) + c] = acc;
                }
                lse[li_(s, b, i, h)] = sum > 0 ? mx + std::log(sum) : -INFINITY;
            }
}
// dq (q's layout), dkv (k|v buffer) += the gradients, given out and lse.
inline void ref_backward(const View& w, const std::vector<float>& q, const std::vector<float>& kv, const std::vector<float>& dout,
                         const std::vector<float>& out, const std::vector<float>& lse, std::vector<double>& dq,
                         std::vector<double>& dkv) {
    const AttnShape& s = w.s;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++) {
                const size_t qo = qi_(s, b, i, h), oo = oi_(s, b, i, h);
                double D = 0;
                for (int c = 0; c < s.HS; c++) D += (double)dout[oo + c] * out[oo + c];
                const double L = lse[li_(s, b, i, h)];
                for (int j = 0; j < s.Tk; j++) {
                    if (!visible(s, b, i, j)) continue;
                    const size_t ko = w.koff + ki_(s, b, j, h), vo = w.voff + ki_(s, b, j, h);
                    double dot = 0, dp = 0;
                    for (int c = 0; c < s.HS; c++) dot += (double)q[qo + c] * kv[ko + c], dp += (double)dout[oo + c] * kv[vo + c];
                    const double p = std::exp(dot * s.scale - L), ds = p * (dp - D);
                    for (int c = 0; c < s.HS; c++) {
                        dq[qo + c] += ds * s.scale * kv[ko + c];
                        dkv[ko + c] += ds * s.scale * q[qo + c];
                        dkv[vo + c] += p * dout[oo + c];
                    }
                }
            }
}

// A view: q rows of q_stride (q first), k|v rows of kv_stride (k at 0, v at
// the head block after), out rows of o_stride; optional explicit batch and
// lse strides (what ring attention uses). NKV > 0: grouped-query attention,
// k and v hold NKV heads (the k|v rows are 2·NKV·HS + pad).
inline View make_view(int B, int NH, int HS, int Tq, int Tk, bool causal, int pad, bool odd_batch, int NKV = 0) {
    const size_t C = (size_t)NH * HS, KC = (size_t)(NKV ? NKV : NH) * HS;
    View w;
    w.s = AttnShape{B, NH, HS, Tq, Tk, C + pad, 2 * KC + pad, C + pad, causal, 0.8 / std::sqrt((double)HS)};
    w.s.NKV = NKV;
    if (odd_batch) {  // gaps between sequences, lse [B][NH] rows of Tq + 3
        w.s.q_bstride = (size_t)Tq * w.s.q_stride + 16;
        w.s.kv_bstride = (size_t)Tk * w.s.kv_stride + 8;
        w.s.o_bstride = (size_t)Tq * w.s.o_stride + 24;
        w.s.lse_hstride = (size_t)Tq + 3;
        w.s.lse_bstride = NH * w.s.lse_hstride + 5;
    }
    w.qn = B * w.s.qb();
    w.kvn = B * w.s.kb();
    w.on = B * w.s.ob();
    w.ln = B * w.s.lb();
    w.koff = 0;
    w.voff = KC;
    return w;
}
