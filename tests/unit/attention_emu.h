// tests/unit/attention_emu.h: what the tests that run the tensor-core attention
// bodies on the emulated GPU (tests/unit/mma_emulator.h) share: the check
// counter, random bf16 data, relative errors, the in-view masks and the
// comparison against the fp64 truth (tests/unit/attention_fp64.h), a
// ring-attention case, and the runners of the forward and the two-kernel
// backward on the emulator.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "llmc/backend/cuda/attention_tc_kernels_bwd.h"
#include "tests/unit/attention_fp64.h"
#include "tests/unit/mma_emulator.h"

using attn_tc::TcParams;

static int g_pass = 0, g_fail = 0;
static bool g_quiet = false;  // count, print nothing (a planted fault's own checks)
inline void check(bool ok, const std::string& what) {
    (ok ? g_pass : g_fail)++;
    if (!g_quiet) std::printf("  %-70s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

inline std::vector<float> rand_bf16(size_t n, float sd, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = b2f(f2b(dist(rng)));
    return v;
}
inline double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
    double d = 0, n = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        d += (got[i] - ref[i]) * (got[i] - ref[i]);
        n += ref[i] * ref[i];
    }
    return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// Element indices of a view's slices in a buffer (q-like, kv-like, out-like rows).
inline std::vector<char> mask_rows(size_t n, int B, int T, int NH, int HS, size_t bstride, size_t rstride, size_t off) {
    std::vector<char> m(n, 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int c = 0; c < HS; c++) m[off + b * bstride + (size_t)t * rstride + (size_t)h * HS + c] = 1;
    return m;
}
inline std::vector<char> mask_lse(const AttnShape& s, size_t n) {
    std::vector<char> m(n, 0);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++) m[li_(s, b, i, h)] = 1;
    return m;
}
// In-view elements against ref (relative L2 <= tol); others must equal init.
template <typename T>
inline void compare(const std::string& what, const std::vector<T>& got, const std::vector<double>& ref,
                    const std::vector<char>& in_view, const std::vector<T>& init, double tol) {
    std::vector<double> g, r;
    bool untouched = true;
    for (size_t i = 0; i < got.size(); i++) {
        if (in_view[i]) {
            double x;
            if constexpr (std::is_same<T, uint16_t>::value)
                x = b2f(got[i]);
            else
                x = got[i];
            if (std::isinf(ref[i]) && x == ref[i]) continue;  // equal infinities: the lse of a row that sees no key
            g.push_back(x);
            r.push_back(ref[i]);
        } else {
            untouched &= std::memcmp(&got[i], &init[i], sizeof(T)) == 0;
        }
    }
    const double e = rel_err(g, r);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: rel err %.2e (tol %.0e)%s", what.c_str(), e, tol, untouched ? "" : ", wrote outside its view");
    check(e <= tol && untouched, buf);
}
// A ring-attention case: random bf16 q, k|v and dout over the whole
// sequences, the fp64 forward of them, and the views of the two key blocks
// [0, T1) and [T1, Tk), which address rows of the whole sequences.
struct RingCase {
    std::vector<float> q, kv, dout;
    std::vector<double> rout, rlse;
    View b1, b2;
};
inline RingCase ring_case(const View& full, int T1, uint32_t seed) {
    RingCase c{rand_bf16(full.qn, 1.f, seed), rand_bf16(full.kvn, 1.f, seed + 1), rand_bf16(full.on, 1.f, seed + 2),
               std::vector<double>(full.on, 0.0), std::vector<double>(full.ln, 0.0), full, full};
    ref_forward(full, c.q, c.kv, c.rout, c.rlse);
    c.b1.s.Tk = T1;
    c.b2.s.Tk = full.s.Tk - T1;
    c.b1.s.kv_bstride = c.b2.s.kv_bstride = full.s.kb();
    return c;
}

// Document starts for B rows of queries at positions pos0, pos0+1, ...:
// documents of random lengths from 1 to 2·mean-1 over positions 0.. (the
// same draw as the kernel lab's masked cases).
inline std::vector<int> doc_starts(int B, int Tq, int pos0, int mean, unsigned seed) {
    std::vector<int> d((size_t)B * Tq);
    for (int b = 0; b < B; b++) {
        int st = 0, left = 0;
        for (int p = 0; p < pos0 + Tq; p++) {
            if (left == 0) {
                st = p;
                seed = seed * 1103515245u + 12345u + (unsigned)b;
                left = 1 + (int)((seed >> 8) % (unsigned)(2 * mean - 1));
            }
            if (p >= pos0) d[(size_t)b * Tq + p - pos0] = st;
            left--;
        }
    }
    return d;
}
// Calls f(view) with the document mask of doc_starts(B, Tq, pos0, mean,
// seed) on the view (queries at positions pos0, pos0+1, ...).
template <class F>
inline void with_doc_mask(View w, int pos0, int mean, unsigned seed, F f) {
    const std::vector<int> d = doc_starts(w.s.B, w.s.Tq, pos0, mean, seed);
    w.s.doc_start = d.data();
    f(w);
}
inline std::vector<uint16_t> to_bits(const std::vector<float>& x) {
    std::vector<uint16_t> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = f2b(x[i]);
    return y;
}
inline std::vector<float> bits_to_f(const std::vector<uint16_t>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = b2f(x[i]);
    return y;
}

template <int D>
inline void run_forward(const View& w, const std::vector<float>& q, const std::vector<float>& kv, std::vector<uint16_t>& out,
                        std::vector<float>& lse, bool* ok) {
    using Cfg = attn_tc::TcConfig<D>;
    using F = attn_tc::FwdCfg<D, Cfg::kFwdMT, Cfg::kFwdBN>;
    const TcParams p = attn_tc::tc_params(w.s);
    const std::vector<uint16_t> qb = to_bits(q), kvb = to_bits(kv);
    *ok = run_grid((w.s.Tq + F::BM - 1) / F::BM, w.s.B * w.s.NH, F::smem_bytes, [&](HostCtx& cx) {
        if (p.doc)
            attn_tc::fwd_body<HostCtx, D, Cfg::kFwdMT, Cfg::kFwdBN, uint16_t, false, true>(
                cx, out.data(), lse.data(), qb.data(), kvb.data() + w.koff, kvb.data() + w.voff, p);
        else
            attn_tc::fwd_body<HostCtx, D, Cfg::kFwdMT, Cfg::kFwdBN, uint16_t, false>(
                cx, out.data(), lse.data(), qb.data(), kvb.data() + w.koff, kvb.data() + w.voff, p);
    });
}
template <int D, bool kMerge>
inline bool run_block_forward(const View& w, const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kvb, size_t kv_row0,
                              std::vector<float>& out, std::vector<float>& lse) {
    using Cfg = attn_tc::TcConfig<D>;
    using F = attn_tc::FwdCfg<D, Cfg::kFwdMT, Cfg::kFwdBN>;
    const TcParams p = attn_tc::tc_params(w.s);
    const size_t o = kv_row0 * w.s.kv_stride;
    return run_grid((w.s.Tq + F::BM - 1) / F::BM, w.s.B * w.s.NH, F::smem_bytes, [&](HostCtx& cx) {
        if (p.doc)
            attn_tc::fwd_body<HostCtx, D, Cfg::kFwdMT, Cfg::kFwdBN, float, kMerge, true>(
                cx, out.data(), lse.data(), qb.data(), kvb.data() + w.koff + o, kvb.data() + w.voff + o, p);
        else
            attn_tc::fwd_body<HostCtx, D, Cfg::kFwdMT, Cfg::kFwdBN, float, kMerge>(
                cx, out.data(), lse.data(), qb.data(), kvb.data() + w.koff + o, kvb.data() + w.voff + o, p);
    });
}
// D vector as the CUDA path computes it (attention.cuh's dot_do_o_kernel): dense [B, NH, Tq].
inline std::vector<float> d_vector(const AttnShape& s, const std::vector<float>& dout, const std::vector<float>& out) {
    std::vector<float> Dv((size_t)s.B * s.NH * s.Tq);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++) {
                float acc = 0;
                for (int c = 0; c < s.HS; c++) acc += dout[oi_(s, b, i, h) + c] * out[oi_(s, b, i, h) + c];
                Dv[((size_t)b * s.NH + h) * s.Tq + i] = acc;
            }
    return Dv;
}
template <int D, typename G, bool kAcc>
inline bool run_backward(const View& w, size_t kv_row0, const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kvb,
                         const std::vector<uint16_t>& dob, const std::vector<float>& lse, const std::vector<float>& Dv,
                         std::vector<G>& dq, std::vector<G>& dkv) {
    using Cfg = attn_tc::TcConfig<D>;
    using Q = attn_tc::DqCfg<D, Cfg::kDqBN>;
    using K = attn_tc::DkvCfg<D, Cfg::kDkvBQ>;
    const TcParams p = attn_tc::tc_params(w.s);
    const size_t o = kv_row0 * w.s.kv_stride;
    // The document mask's instantiation when the view has one, as the CUDA launcher picks it.
    auto go = [&](auto doc) {
        constexpr bool kDoc = decltype(doc)::value;
        bool ok = run_grid((w.s.Tq + Q::BM - 1) / Q::BM, w.s.B * w.s.NH, Q::smem_bytes, [&](HostCtx& cx) {
            attn_tc::dq_body<HostCtx, D, Cfg::kDqBN, Cfg::kDqARegs, G, kAcc, kDoc>(
                cx, dq.data(), dob.data(), qb.data(), kvb.data() + w.koff + o, kvb.data() + w.voff + o, lse.data(),
                Dv.data(), p);
        });
        ok &= run_grid((w.s.Tk + K::BN - 1) / K::BN, w.s.B * w.s.kv_heads(), K::smem_bytes, [&](HostCtx& cx) {
            attn_tc::dkdv_body<HostCtx, D, Cfg::kDkvBQ, Cfg::kDkvARegs, G, kAcc, kDoc>(
                cx, dkv.data() + w.koff + o, dkv.data() + w.voff + o, dob.data(), qb.data(), kvb.data() + w.koff + o,
                kvb.data() + w.voff + o, lse.data(), Dv.data(), p);
        });
        return ok;
    };
    return p.doc ? go(std::true_type{}) : go(std::false_type{});
}
