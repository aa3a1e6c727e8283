// tests/unit/test_optimizer_state.cpp: AdamW with its moments in bf16
// (--optimizer-dtype bf16, llmc/base/state_round.h), on the CPU backends.
//
//   1. Rounding against its definition: nearest equals the round-to-nearest
//      -even narrowing (f32_to_bf16); stochastic rounding, over every one of
//      the 2^16 random values, lands on one of the two bf16 neighbours and
//      rounds up exactly (dropped bits) times; the hashed bits of one value
//      over many steps give a mean within 5 sigma of the value.
//   2. The bound after N steps: with a fixed gradient sequence, the exact
//      trajectory is propagated in fp64 as intervals, each stored moment
//      widened by the rounding's relative error (2^-8 nearest, 2^-7
//      stochastic) and the step's arithmetic by a few fp32 ulps; every
//      parameter of the fp32, fp64 and bf16-mixed backends must lie in its
//      interval after 200 steps. The bound is printed as a fraction of N·lr.
//   3. A second moment that nearest rounding cannot move (beta2 = 0.999,
//      increments under half an ulp) stays put; with stochastic rounding
//      the mean over elements follows the exact v_t within 1%.
//   4. The same bits however the buffers are cut: one span against many
//      (ZeRO shards, tensors), and the multi-tensor call against single ones.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/base/state_round.h"
#include "tests/lib/check.h"

namespace {

uint32_t bits(float f) { return state_round::bits_of(f); }

// ---- 1. rounding -------------------------------------------------------------------------
void test_rounding() {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any;
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        const float x = state_round::float_of(any(rng));
        if (std::isnan(x)) continue;
        if (bits(state_round::nearest(x)) != (uint32_t)f32_to_bf16(x) << 16) bad++;
    }
    // Ties to even, both ways, and the largest values.
    const float ties[] = {state_round::float_of(0x3f808000u), state_round::float_of(0x3f818000u),
                          state_round::float_of(0x7f7fffffu), -1.5f, 0.f, -0.f, 1e-40f};
    for (float x : ties)
        if (bits(state_round::nearest(x)) != (uint32_t)f32_to_bf16(x) << 16) bad++;
    CHECK(bad == 0, "nearest differs from f32_to_bf16 on %d values", bad);
    CHECK(std::isinf(state_round::nearest(INFINITY)) && std::isnan(state_round::nearest(NAN)), "Inf/NaN kept");

    // Stochastic: every r, both signs, a subnormal, exact values.
    const uint32_t cases[] = {0x3f812345u, 0x3f80ffffu, 0x3f800001u, 0x00001234u, 0x3f800000u, 0x47ff8000u};
    for (uint32_t u : cases)
        for (int sign = 0; sign < 2; sign++) {
            const uint32_t su = u | (sign ? 0x80000000u : 0u);
            const float x = state_round::float_of(su);
            const uint32_t lo = su & 0xffff0000u, hi = lo + 0x10000u;
            int up = 0, other = 0;
            for (uint32_t r = 0; r < 65536; r++) {
                const uint32_t y = bits(state_round::stochastic(x, r));
                if (y == hi) up++;
                else if (y != lo) other++;
            }
            CHECK(other == 0 && up == (int)(su & 0xffffu), "stochastic(%08x): %d rounded up, expected %u (%d off)",
                  su, up, su & 0xffffu, other);
        }
    CHECK(std::isinf(state_round::stochastic(INFINITY, 0xffff)) && std::isnan(state_round::stochastic(NAN, 7)),
          "stochastic keeps Inf/NaN");

    // The hashed bits over steps: unbiased in the mean.
    const float xs[] = {1.0001f, 3.14159f, -2.7e-5f, 0.123456f};
    for (float x : xs) {
        const int N = 40000;
        double sum = 0;
        for (int s = 0; s < N; s++)
            sum += state_round::round_moment(x, true, state_round::step_key(1337, s));
        const uint32_t lo = bits(x) & 0xffff0000u;
        const double ulp = std::fabs((double)state_round::float_of(lo + 0x10000u) - state_round::float_of(lo));
        const double p = (bits(x) & 0xffffu) / 65536.0, sigma = ulp * std::sqrt(p * (1 - p) / N);
        CHECK(std::fabs(sum / N - x) <= 5 * sigma + 1e-12 * std::fabs(x),
              "stochastic mean of %g over %d steps is %.9g (sigma %.3g)", x, N, sum / N, sigma);
    }
}

// ---- 2. the bound after N steps ----------------------------------------------------------
struct Interval {
    double lo, hi;
};
// [lo, hi] widened by a relative error r of its largest magnitude.
Interval widen(Interval a, double r) {
    const double w = r * std::max(std::fabs(a.lo), std::fabs(a.hi));
    return {a.lo - w, a.hi + w};
}

// Runs N steps of AdamW on backend be (its compute type; the state bf16)
// from the same start and gradients, and checks each parameter against the
// interval propagated in fp64. Returns the largest distance of the
// backend's parameters from the exact (fp64, unrounded state) trajectory,
// over N·lr.
double bound_case(Backend& be, bool stochastic, int N, const char* label) {
    const size_t n = 2048;
    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    std::mt19937 rng(11);
    std::normal_distribution<double> nd;
    std::vector<double> p0(n), scale(n);
    for (size_t i = 0; i < n; i++) p0[i] = 0.02 * nd(rng), scale[i] = std::pow(10.0, -1 - (int)(i % 5));
    // Gradients: a per-element mean plus noise, fixed for the run (no model),
    // rounded to fp32 and bf16 so every backend sees the same values.
    std::vector<std::vector<float>> g(N, std::vector<float>(n));
    for (int t = 0; t < N; t++)
        for (size_t i = 0; i < n; i++)
            g[t][i] = state_round::nearest((float)(scale[i] * (0.3 * std::sin(0.01 * i) + nd(rng))));

    const Precision pr = be.precision();
    const bool mixed = pr.has_master;
    const DType ct = mixed ? pr.master : pr.param;  // the compute type of the update
    const size_t cs = dtype_size(ct);
    void* param = be.alloc(n * dtype_size(pr.param));
    void* master = mixed ? be.alloc(n * cs) : nullptr;
    void* grad = be.alloc(n * dtype_size(pr.grad));
    void* m = be.alloc(n * 2);
    void* v = be.alloc(n * 2);
    std::vector<double> host(n);
    for (size_t i = 0; i < n; i++) host[i] = (double)(float)p0[i];
    be.upload(mixed ? master : param, ct, host.data(), DType::F64, n);
    if (mixed) be.convert(param, pr.param, master, ct, n);
    be.zero(m, n * 2);
    be.zero(v, n * 2);

    std::vector<Interval> P(n), M(n, {0, 0}), V(n, {0, 0});
    std::vector<double> pe(n), me(n, 0), ve(n, 0);  // exact: fp64, state unrounded
    for (size_t i = 0; i < n; i++) P[i] = {host[i], host[i]}, pe[i] = host[i];
    const double r = stochastic ? std::ldexp(1.0, -7) : std::ldexp(1.0, -8);
    const double fr = std::ldexp(1.0, -21);  // a few fp32 ulps of the step's arithmetic
    for (int t = 0; t < N; t++) {
        for (size_t i = 0; i < n; i++) host[i] = g[t][i];
        be.upload(grad, pr.grad, host.data(), DType::F64, n);
        AdamArgs a{};
        a.lr = lr, a.beta1 = b1, a.beta2 = b2, a.eps = eps, a.weight_decay = wd, a.grad_scale = 1;
        a.bias_corr1 = 1 - std::pow(b1, t + 1), a.bias_corr2 = 1 - std::pow(b2, t + 1);
        a.bf16_state = true, a.stochastic = stochastic, a.round_key = state_round::step_key(42, t);
        be.adamw_update(param, master, grad, m, v, n, a);
        for (size_t i = 0; i < n; i++) {
            const double gi = g[t][i];
            // The unrounded moments the step uses, then what is stored.
            // (the arithmetic's error relative to the terms: they may cancel)
            const double mterms = b1 * std::max(std::fabs(M[i].lo), std::fabs(M[i].hi)) + (1 - b1) * std::fabs(gi);
            const double vterms = b2 * V[i].hi + (1 - b2) * gi * gi;
            Interval mi{b1 * M[i].lo + (1 - b1) * gi - fr * mterms, b1 * M[i].hi + (1 - b1) * gi + fr * mterms};
            Interval vi{b2 * V[i].lo + (1 - b2) * gi * gi - fr * vterms, b2 * V[i].hi + (1 - b2) * gi * gi + fr * vterms};
            vi.lo = std::max(vi.lo, 0.0);
            M[i] = widen(mi, r);
            V[i] = widen(vi, r);
            V[i].lo = std::max(V[i].lo, 0.0);
            // The ratio m̂/(√v̂ + eps) over the box: its extremes are at corners.
            double rmin = INFINITY, rmax = -INFINITY;
            for (double mm : {mi.lo, mi.hi})
                for (double vv : {vi.lo, vi.hi}) {
                    const double q = (mm / a.bias_corr1) / (std::sqrt(vv / a.bias_corr2) + eps);
                    rmin = std::min(rmin, q), rmax = std::max(rmax, q);
                }
            const double slack = fr * (lr * std::max(std::fabs(rmin), std::fabs(rmax)) +
                                       std::max(std::fabs(P[i].lo), std::fabs(P[i].hi)));
            P[i] = {P[i].lo * (1 - lr * wd) - lr * rmax - slack, P[i].hi * (1 - lr * wd) - lr * rmin + slack};
            me[i] = b1 * me[i] + (1 - b1) * gi;
            ve[i] = b2 * ve[i] + (1 - b2) * gi * gi;
            pe[i] -= lr * ((me[i] / a.bias_corr1) / (std::sqrt(ve[i] / a.bias_corr2) + eps) + wd * pe[i]);
        }
    }
    be.download(host.data(), DType::F64, mixed ? master : param, ct, n);
    int outside = 0;
    double worst = 0, width = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(host[i] >= P[i].lo && host[i] <= P[i].hi)) outside++;
        worst = std::max(worst, std::fabs(host[i] - pe[i]));
        width = std::max(width, P[i].hi - P[i].lo);
    }
    CHECK(outside == 0, "%s: %d of %zu parameters outside the propagated bound after %d steps", label, outside, n,
          N);
    // The state really is bf16: the run differs from the exact trajectory
    // by more than fp32 arithmetic would.
    CHECK(worst > 1e-7 * N * lr, "%s: no trace of bf16 rounding (%.3g)", label, worst);
    std::printf("  %-34s after %d steps: |p - exact| <= %.4f N.lr (bound's widest interval %.4f N.lr)\n", label, N,
                worst / (N * lr), width / (N * lr));
    be.release(param), be.release(grad), be.release(m), be.release(v);
    if (master) be.release(master);
    return worst / (N * lr);
}

void test_bound() {
    std::unique_ptr<Backend> f32(make_cpu_backend(DType::F32)), f64(make_cpu_backend(DType::F64)),
        bf(make_cpu_bf16_backend());
    for (bool sr : {false, true}) {
        const char* r = sr ? "stochastic" : "nearest";
        bound_case(*f32, sr, 200, (std::string("fp32, bf16 m/v ") + r).c_str());
        bound_case(*f64, sr, 200, (std::string("fp64, bf16 m/v ") + r).c_str());
        bound_case(*bf, sr, 200, (std::string("bf16 mixed, bf16 m/v ") + r).c_str());
    }
}

// ---- 3. a second moment nearest rounding cannot move -------------------------------------
void test_stagnation() {
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F32));
    // Each element its own target a_i = g_i^2 in [1.2, 2) (so each rounds on
    // its own bits): v_t = a - (a - 1)·0.999^t. One element's stochastic v
    // wanders (its rounding noise decays slowly at beta2 = 0.999); the mean
    // over elements follows the exact mean.
    const size_t n = 4096;
    const int N = 1000;
    std::vector<float> p(n, 0.f), g(n);
    double exact = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = std::sqrt(1.2f + 0.8f * (float)i / n);  // targets 1.2 to 2
        const double a = (double)g[i] * g[i];
        exact += a - (a - 1) * std::pow(0.999, N);
    }
    exact /= n;
    for (bool sr : {false, true}) {
        std::vector<uint16_t> m(n, f32_to_bf16(1.2f)), v(n, f32_to_bf16(1.0f));
        std::vector<float> pp = p;
        for (int t = 0; t < N; t++) {
            AdamArgs a{};
            a.lr = 0, a.beta1 = 0.9, a.beta2 = 0.999, a.eps = 1e-8, a.grad_scale = 1;
            a.bias_corr1 = a.bias_corr2 = 1;
            a.bf16_state = true, a.stochastic = sr, a.round_key = state_round::step_key(3, t);
            be->adamw_update(pp.data(), nullptr, g.data(), m.data(), v.data(), n, a);
        }
        double mean = 0;
        for (uint16_t x : v) mean += bf16_to_f32(x);
        mean /= n;
        if (!sr)
            CHECK(mean == 1.0, "nearest: v moved to %.5f (each increment is under half an ulp)", mean);
        else
            CHECK(std::fabs(mean - exact) <= 0.01 * exact, "stochastic: mean v %.5f, exact %.5f", mean, exact);
        std::printf("  beta2 0.999, v from 1 toward 1.2-2, %d steps: %s mean %.5f (exact %.5f)\n", N,
                    sr ? "stochastic" : "nearest   ", mean, exact);
    }
}

// ---- 4. the same bits however the buffers are cut ----------------------------------------
void test_cuts() {
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F32));
    const size_t n = 10007;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> p(n), g(n);
    std::vector<uint16_t> m(n), v(n);
    for (size_t i = 0; i < n; i++)
        p[i] = nd(rng), g[i] = nd(rng), m[i] = f32_to_bf16(0.1f * nd(rng)), v[i] = f32_to_bf16(0.01f * std::fabs(nd(rng)));
    AdamArgs a{};
    a.lr = 1e-2, a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.grad_scale = 0.5, a.weight_decay = 0.1;
    a.bias_corr1 = 0.5, a.bias_corr2 = 0.3;
    a.bf16_state = true, a.stochastic = true, a.round_key = state_round::step_key(9, 4);
    std::vector<float> p1 = p, p2 = p;
    std::vector<uint16_t> m1 = m, v1 = v, m2 = m, v2 = v;
    be->adamw_update(p1.data(), nullptr, g.data(), m1.data(), v1.data(), n, a);
    // Cut at uneven places, as shards and tensors cut the flat buffers.
    std::vector<AdamSpan> spans;
    for (size_t b = 0; b < n;) {
        const size_t len = std::min(n - b, (size_t)(1 + rng() % 1500));
        spans.push_back({&p2[b], nullptr, &g[b], &m2[b], &v2[b], len, true});
        b += len;
    }
    std::shuffle(spans.begin(), spans.end(), rng);
    be->adamw_update_multi(spans.data(), (int)spans.size(), a);
    CHECK(p1 == p2 && m1 == m2 && v1 == v2, "bf16 state: the cut buffers differ from the whole one");
    // And the rounding really is stochastic: a different key changes bits.
    std::vector<float> p3 = p;
    std::vector<uint16_t> m3 = m, v3 = v;
    a.round_key = state_round::step_key(9, 5);
    be->adamw_update(p3.data(), nullptr, g.data(), m3.data(), v3.data(), n, a);
    CHECK(m3 != m1 && p3 == p1, "another step's key rounds some moments differently (and the step is the same)");
}

}  // namespace

int main() {
    std::printf("rounding\n");
    test_rounding();
    std::printf("the bound after N steps (fixed gradients, parameters against the propagated intervals)\n");
    test_bound();
    std::printf("a second moment with beta2 = 0.999\n");
    test_stagnation();
    std::printf("cuts\n");
    test_cuts();
    return check_summary();
}
