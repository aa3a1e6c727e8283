// tests/unit/test_cpu_attention.cpp: the CPU attention (llmc/backend/cpu_attention.h,
// gemm on 64-row query tiles) and the CPU's float exp/tanh
// (llmc/backend/cpu_math.h) against independent truths:
//   - forward, backward and the ring-attention block forms, in float and
//     double, against the naive fp64 attention of tests/unit/attention_fp64.h,
//     at lengths that cross tile boundaries (150 = 64 + 64 + 22 rows, 70
//     queries against 150 keys), causal and not, grouped-query attention
//     2:1, padded rows and gaps between batches; elements outside the view
//     must stay untouched;
//   - two key blocks merged by log-sum-exp (the ring's forward) and their
//     gradients accumulated block by block equal one block over all keys;
//   - the document mask (each query sees only keys of its own document, key
//     positions given or implied), forward and backward against the same
//     truth, and its skipped tiles: a row of 32 documents computes about
//     1/32 of the causal score elements (at the tiles' granularity);
//   - vexp and vtanh against libm's double exp and tanh over their range,
//     with exp's edges (underflow to 0, NaN kept).
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "llmc/backend/cpu_ops.h"
#include "tests/lib/check.h"
#include "tests/lib/tolerances.h"
#include "tests/unit/attention_fp64.h"

// ‖a - b‖ / ‖b‖ (equal infinities, the lse of a row that sees no key, left out).
template <typename A, typename B>
static double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); i++) {
        if (std::isinf((double)b[i]) && (double)a[i] == (double)b[i]) continue;  // lse of a row that sees no key
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

static std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

template <typename F>
static std::vector<F> cast(const std::vector<float>& v) {
    return std::vector<F>(v.begin(), v.end());
}

// Forward and backward of one view in type F against the fp64 truth.
template <typename F>
static void check_view(const char* name, const View& w, double tol) {
    std::mt19937 g(7);
    const AttnShape& s = w.s;
    std::vector<float> q = randn(w.qn, g, 1.5f), kv = randn(w.kvn, g, 1.5f), dout = randn(w.on, g);
    std::vector<double> out_ref(w.on, 0), lse_ref(w.ln, 0);
    ref_forward(w, q, kv, out_ref, lse_ref);

    const F sentinel = F(12345);
    std::vector<F> out(w.on, sentinel), lse(w.ln, sentinel);
    std::vector<F> qf = cast<F>(q), kvf = cast<F>(kv), doutf = cast<F>(dout);
    cpu::attention_forward(out.data(), lse.data(), qf.data(), kvf.data() + w.koff, kvf.data() + w.voff, s);
    std::vector<F> out_v, lse_v;
    std::vector<double> out_rv, lse_rv;
    bool outside_ok = true;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++) {
                for (int c = 0; c < s.HS; c++) {
                    out_v.push_back(out[oi_(s, b, i, h) + c]);
                    out_rv.push_back(out_ref[oi_(s, b, i, h) + c]);
                    out[oi_(s, b, i, h) + c] = sentinel;
                }
                lse_v.push_back(lse[li_(s, b, i, h)]);
                lse_rv.push_back(lse_ref[li_(s, b, i, h)]);
                lse[li_(s, b, i, h)] = sentinel;
            }
    for (F x : out) outside_ok = outside_ok && x == sentinel;
    for (F x : lse) outside_ok = outside_ok && x == sentinel;
    double eo = rel_err(out_v, out_rv), el = rel_err(lse_v, lse_rv);
    CHECK(eo < tol, "%s forward out: rel err %.3g >= %.3g", name, eo, tol);
    CHECK(el < tol, "%s forward lse: rel err %.3g >= %.3g", name, el, tol);
    CHECK(outside_ok, "%s forward wrote outside the view", name);

    // Backward from the reference's out and lse (as the trainer's saved ones).
    std::vector<float> out32(out_ref.begin(), out_ref.end()), lse32(lse_ref.begin(), lse_ref.end());
    std::vector<double> dq_ref(w.qn, 0), dkv_ref(w.kvn, 0);
    ref_backward(w, q, kv, dout, out32, lse32, dq_ref, dkv_ref);
    std::vector<F> dq(w.qn, sentinel), dkv(w.kvn, sentinel);
    std::vector<F> outf = cast<F>(out32), lsef = cast<F>(lse32);
    cpu::attention_backward(dq.data(), dkv.data() + w.koff, dkv.data() + w.voff, doutf.data(), qf.data(),
                            kvf.data() + w.koff, kvf.data() + w.voff, outf.data(), lsef.data(), s);
    std::vector<F> dq_v, dk_v, dv_v;
    std::vector<double> dq_rv, dk_rv, dv_rv;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.Tq; i++)
                for (int c = 0; c < s.HS; c++) {
                    dq_v.push_back(dq[qi_(s, b, i, h) + c]);
                    dq_rv.push_back(dq_ref[qi_(s, b, i, h) + c]);
                }
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.kv_heads(); h++)
            for (int j = 0; j < s.Tk; j++)
                for (int c = 0; c < s.HS; c++) {
                    // ki_ takes a query head; head h * (NH / kv heads) reads kv head h.
                    const size_t o = ki_(s, b, j, h * (s.NH / s.kv_heads())) + c;
                    dk_v.push_back(dkv[w.koff + o]);
                    dk_rv.push_back(dkv_ref[w.koff + o]);
                    dv_v.push_back(dkv[w.voff + o]);
                    dv_rv.push_back(dkv_ref[w.voff + o]);
                }
    double eq = rel_err(dq_v, dq_rv), ek = rel_err(dk_v, dk_rv), ev = rel_err(dv_v, dv_rv);
    CHECK(eq < tol, "%s backward dq: rel err %.3g >= %.3g", name, eq, tol);
    CHECK(ek < tol, "%s backward dk: rel err %.3g >= %.3g", name, ek, tol);
    CHECK(ev < tol, "%s backward dv: rel err %.3g >= %.3g", name, ev, tol);
    std::printf("%-34s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", name, eo, el, eq, ek, ev);
}

// Two key blocks (keys 0..Tk/2-1 and Tk/2..Tk-1, non-causal) merged by the
// block forms equal one block over all keys, forward and backward, in double.
static void check_ring_blocks() {
    const int B = 2, NH = 4, NKV = 2, HS = 16, Tq = 100, Tk = 140, half = Tk / 2;
    View w = make_view(B, NH, HS, Tq, Tk, false, 3, false, NKV);
    std::mt19937 g(11);
    std::vector<double> q = cast<double>(randn(w.qn, g, 1.5f)), kv = cast<double>(randn(w.kvn, g, 1.5f));
    std::vector<double> dout = cast<double>(randn(w.on, g));
    const AttnShape& s = w.s;
    std::vector<double> out(w.on, 0), lse(w.ln, 0), out2(w.on, 0), lse2(w.ln, 0);
    cpu::attention_forward(out.data(), lse.data(), q.data(), kv.data() + w.koff, kv.data() + w.voff, s);
    AttnShape hs = s;
    hs.Tk = half;
    hs.kv_bstride = s.kb();  // the half block keeps the full buffer's batch stride
    const size_t second = (size_t)half * s.kv_stride;
    cpu::attention_block_forward(out2.data(), lse2.data(), q.data(), kv.data() + w.koff, kv.data() + w.voff, hs, true);
    cpu::attention_block_forward(out2.data(), lse2.data(), q.data(), kv.data() + w.koff + second,
                                 kv.data() + w.voff + second, hs, false);
    double eo = rel_err(out2, out), el = rel_err(lse2, lse);
    CHECK(eo < 1e-13, "ring forward: two blocks vs one, out rel err %.3g", eo);
    CHECK(el < 1e-13, "ring forward: two blocks vs one, lse rel err %.3g", el);

    std::vector<double> dq(w.qn, 0), dkv(w.kvn, 0), dq2(w.qn, 0), dkv2(w.kvn, 0);
    cpu::attention_backward(dq.data(), dkv.data() + w.koff, dkv.data() + w.voff, dout.data(), q.data(),
                            kv.data() + w.koff, kv.data() + w.voff, out.data(), lse.data(), s);
    for (size_t off : {(size_t)0, second})
        cpu::attention_block_backward(dq2.data(), dkv2.data() + w.koff + off, dkv2.data() + w.voff + off, dout.data(),
                                      q.data(), kv.data() + w.koff + off, kv.data() + w.voff + off, out.data(),
                                      lse.data(), hs);
    double eq = rel_err(dq2, dq), ek = rel_err(dkv2, dkv);
    CHECK(eq < 1e-13, "ring backward: two blocks vs one, dq rel err %.3g", eq);
    CHECK(ek < 1e-13, "ring backward: two blocks vs one, dk|dv rel err %.3g", ek);
    std::printf("%-34s out %.2e lse %.2e dq %.2e dkv %.2e\n", "ring: 2 key blocks vs 1 (fp64)", eo, el, eq, ek);
}

// Document starts of rows whose documents have the given lengths (cycled),
// for each of B rows of T tokens, the length list rotated per row.
static std::vector<int> doc_starts(int B, int T, const std::vector<int>& lens) {
    std::vector<int> d((size_t)B * T);
    for (int b = 0; b < B; b++) {
        int start = 0, k = b, left = lens[k % lens.size()];
        for (int t = 0; t < T; t++) {
            d[(size_t)b * T + t] = start;
            if (--left == 0) start = t + 1, left = lens[++k % lens.size()];
        }
    }
    return d;
}

// The document mask: causal views with documents of mixed lengths (some
// shorter than a tile, some crossing tiles), then a ring block (queries
// against earlier keys with explicit key positions), against the fp64
// truth; and the work the tiles do.
static void check_document_mask() {
    const double f32 = tol::kCpuFp32, f64 = tol::kCpuFp64;
    View w = make_view(2, 4, 16, 150, 150, true, 3, true, 2);
    std::vector<int> docs = doc_starts(2, 150, {5, 70, 1, 20, 90});
    w.s.doc_start = docs.data();
    check_view<float>("docmask causal T=150 gqa fp32", w, f32);
    check_view<double>("docmask causal T=150 gqa fp64", w, f64);
    // A ring block: 40 queries at positions 100..139 against 64 earlier keys
    // at positions 0..31 and 60..91 (two chunks), documents starting at 10,
    // 70 and 95 (some rows see none of these keys, some tiles none at all).
    View r = make_view(2, 2, 8, 40, 64, false, 0, false, 0);
    std::vector<int> kpos(64), rdocs(2 * 40);
    for (int j = 0; j < 64; j++) kpos[j] = j < 32 ? j : 28 + j;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 40; i++) rdocs[b * 40 + i] = b == 0 ? (i < 10 ? 10 : i < 25 ? 70 : 95) : 95;
    r.s.doc_start = rdocs.data();
    r.s.key_pos = kpos.data();
    check_view<double>("docmask ring block key_pos fp64", r, f64);
    check_view<float>("docmask ring block key_pos fp32", r, f32);

    // Work: one document of 4096 tokens against 32 of 128.
    AttnShape s{1, 1, 64, 4096, 4096, 64, 64, 64, true, 0.125};
    const size_t causal = cpu::attn_tile_work(s, 0);
    std::vector<int> d32 = doc_starts(1, 4096, {128});
    s.doc_start = d32.data();
    const size_t masked = cpu::attn_tile_work(s, 0);
    const double ratio = (double)masked / causal;
    // 64-row tiles: per document 64x64 + 64x128 of 128²/2 exact (1.5x), so
    // 1/32 · 1.5 · (4096²/2)/(64²·2080) = 1/21.7 of the causal tiles' work.
    CHECK(ratio < 1.0 / 20, "docmask work: 32 documents compute %.4f of one document's score elements", ratio);
    std::printf("%-34s %zu of %zu score elements (1/%.1f)\n", "docmask tile work 32x128 vs 4096", masked, causal,
                1 / ratio);
}

// vexp/vtanh against double libm: relative error of exp within a few float
// ulps over its range, tanh's absolute error near 1e-7.
static void check_math() {
    double worst_exp = 0, worst_tanh = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -87.0f + 175.0f * (float)i / 2000000.0f;  // to 88
        const double e = std::exp((double)x);
        worst_exp = std::max(worst_exp, std::fabs((double)cpu::vexp(x) - e) / e);
        const float u = -12.0f + 24.0f * (float)i / 2000000.0f;
        worst_tanh = std::max(worst_tanh, std::fabs((double)cpu::vtanh(u) - std::tanh((double)u)));
    }
    CHECK(worst_exp < 5e-7, "vexp: worst relative error %.3g over [-87, 88]", worst_exp);
    CHECK(worst_tanh < 3e-7, "vtanh: worst absolute error %.3g over [-12, 12]", worst_tanh);
    CHECK(cpu::vexp(-100.0f) == 0.0f && cpu::vexp(-INFINITY) == 0.0f, "vexp: far below range is not 0");
    CHECK(std::isnan(cpu::vexp(std::numeric_limits<float>::quiet_NaN())), "vexp: NaN not kept");
    CHECK(std::isfinite(cpu::vexp(1000.0f)) && cpu::vexp(1000.0f) > 1e38f, "vexp: far above range not large and finite");
    CHECK(cpu::vtanh(30.0f) == 1.0f && cpu::vtanh(-30.0f) == -1.0f, "vtanh: saturation");
    CHECK(cpu::vexp(0.0f) == 1.0f, "vexp(0) = %.9g", cpu::vexp(0.0f));
    std::printf("%-34s exp rel %.2e tanh abs %.2e\n", "vexp / vtanh vs libm double", worst_exp, worst_tanh);
}

int main() {
    const double f32 = tol::kCpuFp32, f64 = tol::kCpuFp64;
    struct Case {
        const char* name;
        int B, NH, HS, Tq, Tk;
        bool causal;
        int pad;
        bool odd;
        int NKV;
    };
    const Case cases[] = {
        {"causal T=150 gqa2:1 padded gaps", 2, 4, 16, 150, 150, true, 3, true, 2},
        {"causal T=64 one tile", 1, 2, 8, 64, 64, true, 0, false, 0},
        {"causal T=129", 2, 3, 12, 129, 129, true, 1, false, 0},
        {"full Tq=70 Tk=150 gqa4:1", 2, 4, 16, 70, 150, false, 2, true, 1},
    };
    for (const Case& c : cases) {
        View w = make_view(c.B, c.NH, c.HS, c.Tq, c.Tk, c.causal, c.pad, c.odd, c.NKV);
        char name[96];
        std::snprintf(name, sizeof name, "%s fp32", c.name);
        check_view<float>(name, w, f32);
        std::snprintf(name, sizeof name, "%s fp64", c.name);
        check_view<double>(name, w, f64);
    }
    check_ring_blocks();
    check_document_mask();
    check_math();
    return check_summary();
}
