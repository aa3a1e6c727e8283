// tests/unit/test_fp8_kernels.cpp: the GPU's FP8 products run on the CPU.
// llmc/backend/cuda/fp8_kernels.h holds the CUDA kernels' bodies (amax,
// scales, the quantising and transposing copy) and the order of a
// product's launches; here the same code runs on an emulated GPU
// (tests/unit/fp8_emu.h): one host thread per CUDA thread, __syncthreads a
// barrier, the shared tile filled with garbage first, warp maxima and
// atomicMax under a mutex, the conversion instruction as fp8.h's
// rounding. The products go to a
// transcription of cuBLASLt's FP8 "TN" contract (C[M, N] = A[M, K] ·
// B[N, K]^T, both K-contiguous, K and N multiples of 16, the descales
// multiplied in), which also checks that every operand sits inside its
// scratch buffer as sized by fp8k::forward_sizes / backward_sizes.
//
// Checked against independent truths:
//   - amax: the max of |x| over the data (NaN wins), on the kernel's own
//     grid and on a grid smaller than the data (the stride loop);
//   - the quantising copy: every byte where the layout says (plain,
//     transposed with its rows padded to 16 by zeros, both ways at once),
//     nothing written outside, for ragged shapes in both formats;
//   - the products: forward, the whole backward, B alone and W alone
//     (accumulating), against the CPU backend's exact emulation
//     (matmul_forward_fp8 / matmul_backward_fp8) on the same operands: in
//     fp64 with scales that are powers of two both compute the same
//     values, so they agree to the last bits of a sum's rounding; in fp32
//     to fp32 accumulation.
// What this cannot check: cuBLASLt itself (its descriptors in cuda/fp8.cuh)
// and the conversion instruction; dev/cuda/fp8.cu does on a GPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/backend/backends.h"
#include "llmc/backend/cpu_fp8.h"
#include "llmc/backend/cuda/fp8_kernels.h"
#include "tests/lib/check.h"
#include "tests/unit/fp8_emu.h"

namespace {
using namespace fp8emu;

// ---- amax ------------------------------------------------------------------------------
unsigned emu_amax(const float* x, size_t n, unsigned blocks) {
    unsigned bits = 0;
    if (n > 0)
        run_grid(blocks, 1, fp8k::kAmaxThreads, 1, [&](EmuCtx& c) { fp8k::amax_body(c, &bits, x, n); });
    return bits;
}

void test_amax() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    for (size_t n : {(size_t)0, (size_t)1, (size_t)31, (size_t)257, (size_t)3000}) {
        std::vector<float> x(n);
        for (float& v : x) v = u(rng);
        if (n > 40) x[n / 3] = -7.25f;  // the largest magnitude, negative
        const float want = (float)cpu::amax(x.data(), n);
        const float got = fp8::float_of_bits(emu_amax(x.data(), n, fp8k::amax_blocks(n)));
        CHECK(got == want, "amax n=%zu on its grid: %g, want %g", n, got, want);
        if (n > 1000) {  // 2 blocks of 256 for 3000 elements: each thread strides
            const float g2 = fp8::float_of_bits(emu_amax(x.data(), n, 2));
            CHECK(g2 == want, "amax n=%zu on 2 blocks: %g, want %g", n, g2, want);
        }
    }
    std::vector<float> x(600, 1.f);
    x[599] = -INFINITY;
    CHECK(std::isinf(fp8::float_of_bits(emu_amax(x.data(), x.size(), 3))), "amax: an infinity");
    x[5] = NAN;
    CHECK(std::isnan(fp8::float_of_bits(emu_amax(x.data(), x.size(), 3))), "amax: NaN wins over an infinity");
    x.assign(300, -0.f);
    CHECK(emu_amax(x.data(), x.size(), 2) == 0u, "amax of -0: the bits of +0");
}

// ---- scales ------------------------------------------------------------------------------
void test_scales() {
    const double amax[3] = {3.5, 0.0, 1e-3};
    float sc[6];
    for (int i = 0; i < 32; i++) fp8k::scales_one(sc, amax, i);
    CHECK(sc[0] == 128.f && sc[3] == 1.f / 128, "scales: e4m3 448/3.5 = 128 and its inverse");
    CHECK(sc[1] == 1.f && sc[4] == 1.f, "scales: an amax of 0 leaves the values as they are");
    CHECK(sc[2] == (float)(57344.0 / 1e-3) && sc[5] == (float)(1e-3 / 57344.0), "scales: e5m2 from 57344");
    // Delayed scaling in the same launch: operand 0's history holds 7 (its
    // scale 64, its own amax 3.5 recorded), operand 1's is empty (its own
    // amax, 0: scale 1; not recorded), operand 2's holds 2e-3 (not recorded:
    // the step max stays); and a NaN in a history scales by 1.
    const double hist[3][2] = {{7.0, 1.0}, {0.0, 0.0}, {2e-3, 0.0}};
    double step[3] = {1.0, 5.0, 9.0};
    for (int i = 0; i < 32; i++) fp8k::scales_one(sc, amax, i, Fp8Delayed{step, &hist[0][0], 2, 1u});
    CHECK(sc[0] == 64.f && sc[3] == 1.f / 64, "delayed scales: the history's amax (7: 448/7 = 64), got %g", sc[0]);
    CHECK(sc[1] == 1.f && sc[2] == (float)(57344.0 / 2e-3), "delayed scales: an empty history's own amax, a "
          "holding one's (got %g, %g)", sc[1], sc[2]);
    CHECK(step[0] == 3.5 && step[1] == 5.0 && step[2] == 9.0, "delayed scales: only operand 0 recorded (step max "
          "%g %g %g, want 3.5 5 9)", step[0], step[1], step[2]);
    const double nan_hist[3][1] = {{NAN}, {0.0}, {0.0}};
    for (int i = 0; i < 32; i++) fp8k::scales_one(sc, amax, i, Fp8Delayed{step, &nan_hist[0][0], 1, 6u});
    CHECK(sc[0] == 1.f && step[1] == 5.0 && step[2] == 9.0, "delayed scales: a NaN history scales by 1; operands 1 "
          "and 2 recorded below their step max (got %g; %g %g)", sc[0], step[1], step[2]);
}

// ---- the quantising copy -------------------------------------------------------------
void test_quantize() {
    struct Shape {
        int rows, cols;
    };
    const Shape shapes[] = {{1, 1}, {5, 40}, {33, 31}, {64, 64}, {100, 37}, {17, 130}};
    std::mt19937 rng(11);
    for (const Shape& sh : shapes)
        for (int e5 = 0; e5 < 2; e5++)
            for (int mode = 0; mode < 3; mode++) {  // plain, transposed, both ways
                const int R = sh.rows, C = sh.cols, ld = fp8k::padded_k(R);
                const bool tr = mode >= 1;
                std::normal_distribution<float> nd(0.f, e5 ? 0.02f : 1.5f);
                std::vector<float> x((size_t)R * C);
                for (float& v : x) v = nd(rng);
                x[0] = e5 ? 3e-6f : 1e-4f;  // a subnormal of the scaled grid
                if (x.size() > 2) x[2] = e5 ? 9.f : 900.f;  // saturates
                const float scale = (float)fp8::scale_for(cpu::amax(x.data(), x.size()) / 8,
                                                          e5 ? fp8::Format::e5m2 : fp8::Format::e4m3);
                const size_t qn = tr ? (size_t)C * ld : (size_t)R * C;
                std::vector<uint8_t> q(qn + 2 * kGuard, kCanary), plain((size_t)R * C + 2 * kGuard, kCanary);
                emu_quantize(q.data() + kGuard, x.data(), R, C, &scale, e5 == 1, tr,
                             mode == 2 ? plain.data() + kGuard : nullptr);
                auto want = [&](int r, int c) {
                    const float v = x[(size_t)r * C + c] * scale;  // in float, as the kernel
                    return fp8::encode((double)v, e5 ? fp8::Format::e5m2 : fp8::Format::e4m3);
                };
                int bad = 0, bad_pad = 0, bad_plain = 0, canary_hits = 0;
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++) {
                        const uint8_t w = want(r, c);
                        canary_hits += w == kCanary;
                        bad += q[kGuard + (tr ? (size_t)c * ld + r : (size_t)r * C + c)] != w;
                        if (mode == 2) bad_plain += plain[kGuard + (size_t)r * C + c] != w;
                    }
                if (tr)
                    for (int c = 0; c < C; c++)
                        for (int r = R; r < ld; r++) bad_pad += q[kGuard + (size_t)c * ld + r] != 0;
                bool guards = true;
                for (size_t i = 0; i < kGuard; i++)
                    guards &= q[i] == kCanary && q[kGuard + qn + i] == kCanary && plain[i] == kCanary &&
                              plain[kGuard + (size_t)R * C + i] == kCanary;
                if (mode != 2)
                    for (size_t i = kGuard; i < kGuard + (size_t)R * C; i++) guards &= plain[i] == kCanary;
                const char* mn = mode == 0 ? "plain" : mode == 1 ? "transposed" : "both ways";
                CHECK(canary_hits == 0, "quantize %dx%d: the canary byte occurs in the data (pick another)", R, C);
                CHECK(bad == 0, "quantize %dx%d %s %s: %d bytes differ from fp8(x * scale) at the layout's place",
                      R, C, e5 ? "e5m2" : "e4m3", mn, bad);
                CHECK(bad_pad == 0, "quantize %dx%d %s: %d padding bytes (rows %d..%d) not zero", R, C, mn, bad_pad,
                      R, ld - 1);
                CHECK(bad_plain == 0, "quantize %dx%d both ways: %d plain bytes differ", R, C, bad_plain);
                CHECK(guards, "quantize %dx%d %s %s: a byte written outside its buffer", R, C,
                      e5 ? "e5m2" : "e4m3", mn);
            }
}

// ---- the products ------------------------------------------------------------------------
// One shape, forward and every backward mode, the emulated GPU path against
// the CPU backend of the same precision.
template <class E>
void test_product(Backend& cpu_be, int N, int IC, int OC, bool saturate, double tol) {
    std::mt19937 rng(N * 131 + IC * 7 + OC);
    auto fill = [&](std::vector<E>& v, size_t n, float sd) {
        std::normal_distribution<float> nd(0.f, sd);
        v.resize(n);
        for (E& e : v) e = (E)nd(rng);  // float values: exact in either E
    };
    std::vector<E> x, w, dy, bias, dw0;
    fill(x, (size_t)N * IC, 1.f), fill(w, (size_t)OC * IC, 0.3f), fill(dy, (size_t)N * OC, 0.01f);
    fill(bias, OC, 0.1f), fill(dw0, (size_t)OC * IC, 0.05f);
    // Powers of two: x at scale 16 (or 256, saturating its tails), w at 64, dy at 2^16.
    const double amax[3] = {448.0 / (saturate ? 256 : 16), 448.0 / 64, 57344.0 / 65536};
    const char* tn = sizeof(E) == 8 ? "fp64" : "fp32";

    auto run_emu = [&](const char* what, const fp8k::Scratch::Sizes& z, auto op, std::string& err) {
        std::vector<uint8_t> buf(fp8k::Scratch::bytes(z), kCanary);
        EmuExec<E> ex{fp8k::Scratch::carve(buf.data(), z), z, &err};
        op(ex);
        if (!err.empty()) std::printf("  (%s %dx%dx%d: %s)\n", what, N, IC, OC, err.c_str());
    };
    // forward, with and without the bias
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        std::vector<E> out_emu((size_t)N * OC), out_cpu((size_t)N * OC);
        const E* b = with_bias ? bias.data() : nullptr;
        std::string err;
        run_emu("forward", fp8k::forward_sizes(N, IC, OC), [&](EmuExec<E>& ex) {
            fp8k::forward(ex, ex.s, out_emu.data(), x.data(), w.data(), b, N, IC, OC, amax);
        }, err);
        cpu_be.matmul_forward_fp8(out_cpu.data(), x.data(), w.data(), b, N, IC, OC, amax);
        const double d = rel_diff(out_emu, out_cpu);
        CHECK(err.empty() && d <= tol, "%s forward N=%d IC=%d OC=%d bias=%d%s: rel diff %.3g (tol %.1g) %s", tn, N,
              IC, OC, with_bias, saturate ? " saturating" : "", d, tol, err.c_str());
    }
    // backward: whole, B alone, W alone (dW accumulates onto dw0)
    for (int mode = 0; mode < 3; mode++) {
        const bool want_dx = mode != 2, want_dw = mode != 1;
        std::vector<E> dx_emu((size_t)N * IC, (E)7), dx_cpu((size_t)N * IC, (E)7);
        std::vector<E> dw_emu = dw0, dw_cpu = dw0;
        std::string err;
        run_emu("backward", fp8k::backward_sizes(N, IC, OC), [&](EmuExec<E>& ex) {
            fp8k::backward(ex, ex.s, want_dx ? dx_emu.data() : nullptr, want_dw ? dw_emu.data() : nullptr, dy.data(),
                           x.data(), w.data(), N, IC, OC, amax);
        }, err);
        cpu_be.matmul_backward_fp8(want_dx ? dx_cpu.data() : nullptr, want_dw ? dw_cpu.data() : nullptr, nullptr,
                                   dy.data(), x.data(), w.data(), N, IC, OC, amax);
        const char* mn = mode == 0 ? "whole" : mode == 1 ? "B (dx alone)" : "W (dW alone)";
        const double ddx = rel_diff(dx_emu, dx_cpu), ddw = rel_diff(dw_emu, dw_cpu);
        CHECK(err.empty() && ddx <= tol && ddw <= tol,
              "%s backward %s N=%d IC=%d OC=%d%s: dx rel diff %.3g, dW %.3g (tol %.1g) %s", tn, mn, N, IC, OC,
              saturate ? " saturating" : "", ddx, ddw, tol, err.c_str());
        if (mode == 1) CHECK(dw_emu == dw0, "backward B alone leaves dW as it was");
        if (mode == 2) CHECK(dx_emu == std::vector<E>((size_t)N * IC, (E)7), "backward W alone leaves dx alone");
    }
}

// Delayed scaling inside the product (Backend::Fp8Delayed):
// the emulated GPU's scales launch and the CPU backend agree on the
// products and on the step maxima they record (forward: input and weight;
// backward: the output gradient), the histories holding powers of two
// for x and dy and nothing for w.
void test_delayed_products(Backend& cpu_be) {
    const int N = 37, IC = 48, OC = 80;
    const Operands ops(N, IC, OC, 41);
    const std::vector<double>& x = ops.x, &w = ops.w, &dy = ops.dy;
    const double amax[3] = {cpu::amax(x.data(), x.size()), 448.0 / 64, cpu::amax(dy.data(), dy.size())};
    const double hist[3][2] = {{448.0 / 32, 1.0}, {0.0, 0.0}, {57344.0 / 65536, 0.0}};
    for (int back = 0; back < 2; back++) {
        double step_emu[3] = {0.5, 0.5, 0.5}, step_cpu[3] = {0.5, 0.5, 0.5};
        const unsigned record = back ? 4u : 3u;
        const Fp8Delayed de{step_emu, &hist[0][0], 2, record};
        const Fp8Delayed dc{step_cpu, &hist[0][0], 2, record};
        const fp8k::Scratch::Sizes elems = fp8k::product_sizes(N, IC, OC);
        std::vector<uint8_t> buf(fp8k::Scratch::bytes(elems), kCanary);
        std::string err;
        EmuExec<double> ex{fp8k::Scratch::carve(buf.data(), elems), elems, &err};
        std::vector<double> o_emu((size_t)N * std::max(IC, OC), 7.0), o_cpu = o_emu;
        std::vector<double> dw_emu((size_t)OC * IC, 0.5), dw_cpu = dw_emu;
        if (!back) {
            fp8k::forward(ex, ex.s, o_emu.data(), x.data(), w.data(), (const double*)nullptr, N, IC, OC, amax, nullptr,
                          &de);
            cpu_be.matmul_forward_fp8(o_cpu.data(), x.data(), w.data(), nullptr, N, IC, OC, amax, &dc);
        } else {
            fp8k::backward(ex, ex.s, o_emu.data(), dw_emu.data(), dy.data(), x.data(), w.data(), N, IC, OC, amax,
                           nullptr, nullptr, &de);
            cpu_be.matmul_backward_fp8(o_cpu.data(), dw_cpu.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC,
                                       amax, nullptr, &dc);
        }
        // what each records: its own amax where measured, over the 0.5 before
        double want[3] = {0.5, 0.5, 0.5};
        for (int i = 0; i < 3; i++)
            if (record >> i & 1u) want[i] = std::max(0.5, amax[i]);
        const double d = std::max(rel_diff(o_emu, o_cpu), rel_diff(dw_emu, dw_cpu));
        bool steps = true;
        for (int i = 0; i < 3; i++) steps &= step_emu[i] == want[i] && step_cpu[i] == want[i];
        // and the history's scale is the one used: without it the product differs
        std::vector<double> o_cur = o_cpu, dw_cur((size_t)OC * IC, 0.5);
        if (!back) cpu_be.matmul_forward_fp8(o_cur.data(), x.data(), w.data(), nullptr, N, IC, OC, amax);
        else cpu_be.matmul_backward_fp8(o_cur.data(), dw_cur.data(), nullptr, dy.data(), x.data(), w.data(), N, IC,
                                        OC, amax);
        CHECK(err.empty() && d <= 1e-13 && steps && o_cur != o_cpu,
              "delayed %s: emulated GPU against the CPU rel diff %.3g, step maxima %g %g %g (want %g %g %g), "
              "differs from current scaling %d %s", back ? "backward" : "forward", d, step_emu[0], step_emu[1],
              step_emu[2], want[0], want[1], want[2], o_cur != o_cpu, err.c_str());
    }
}

void test_products() {
    std::string err;
    std::unique_ptr<Backend> f64(make_backend("cpu", "fp64", 0, &err)), f32(make_backend("cpu", "fp32", 0, &err));
    CHECK(f64 && f32, "the CPU backends: %s", err.c_str());
    if (!f64 || !f32) return;
    struct Shape {
        int N, IC, OC;
    };
    // Row counts not multiples of 16 (a weight gradient's padded K), a
    // Mixtral expert's block of 5 rows, a single row.
    const Shape shapes[] = {{37, 48, 80}, {16, 32, 16}, {5, 64, 32}, {1, 16, 16}, {70, 16, 48}};
    for (const Shape& s : shapes) {
        test_product<double>(*f64, s.N, s.IC, s.OC, false, 1e-13);
        test_product<float>(*f32, s.N, s.IC, s.OC, false, 2e-6);
    }
    test_product<double>(*f64, 37, 48, 80, true, 1e-13);
    test_delayed_products(*f64);
}

// ---- delayed scaling's fused cast ------------------------------------------------------
// The op's output, its amax, and the copies the quantiser would write from
// that output at the history's scale, byte for byte (nothing outside), or,
// while the history holds no amax, no copy at all; an output nothing else
// reads (keep false) stored only while the history is empty.
void test_cast_bytes() {
    std::mt19937 rng(23);
    const int shapes[][2] = {{5, 40}, {33, 31}, {17, 130}};
    for (const auto& sh : shapes)
        // forward (e4m3 as it is), B (e5m2 as it is), whole (e5m2 both ways), a forward keeping the
        // transposed copy (e4m3 both ways), a recompute's (e4m3 transposed alone)
        for (int mode = 0; mode < 5; mode++)
            for (int holds = 0; holds < 2; holds++)
                for (int halves = 1; halves <= (sh[1] % 2 == 0 ? 2 : 1); halves++) {
                    const int R = sh[0], C = sh[1], ld = fp8k::padded_k(R);
                    const bool keep = (R + halves + mode) % 2 == 0;  // both ways over the shapes and modes
                    const bool e5 = mode == 1 || mode == 2, tr = mode >= 2, with_plain = tr && mode != 4;
                    std::normal_distribution<float> nd(0.f, 2.f);
                    std::vector<float> x((size_t)R * C), y((size_t)R * C, -1.f);
                    for (float& v : x) v = nd(rng);
                    float want_max = 0;
                    for (float v : x) want_max = std::max(want_max, std::fabs(1.5f * v - 0.25f * v * v));
                    const double hist[3] = {0, holds ? want_max / 3.0 : 0, 0};  // a third: the tails saturate
                    const size_t qn = tr ? (size_t)C * ld : (size_t)R * C;
                    std::vector<uint8_t> q(qn + 2 * kGuard, kCanary), plain((size_t)R * C + 2 * kGuard, kCanary);
                    std::vector<uint8_t> wq = q, wplain = plain;
                    const unsigned bits = emu_cast(EmuOp<float>{y.data(), x.data(), C, halves}, R, C, hist, 3, e5,
                                                   q.data() + kGuard, tr, with_plain ? plain.data() + kGuard : nullptr,
                                                   keep);
                    bool out_ok = true;
                    for (size_t i = 0; i < x.size(); i++)
                        out_ok &= y[i] == (keep || !holds ? 1.5f * x[i] - 0.25f * x[i] * x[i] : -1.f);
                    const float scale = (float)fp8::scale_for(hist[1], e5 ? fp8::Format::e5m2 : fp8::Format::e4m3);
                    std::vector<float> y_want(x.size());  // the op's values, stored or not
                    for (size_t i = 0; i < x.size(); i++) y_want[i] = 1.5f * x[i] - 0.25f * x[i] * x[i];
                    if (holds)
                        emu_quantize(wq.data() + kGuard, y_want.data(), R, C, &scale, e5, tr,
                                     with_plain ? wplain.data() + kGuard : nullptr);
                    const char* mn = mode == 0   ? "forward"
                                     : mode == 1 ? "B"
                                     : mode == 2 ? "whole backward"
                                     : mode == 3 ? "forward keeping x^T"
                                                 : "recompute's x^T";
                    CHECK(out_ok, "cast %dx%d %s, %d halves, keep %d, history %s: the op's output (stored only "
                          "when kept or while the history is empty)", R, C, mn, halves, keep,
                          holds ? "holding" : "empty");
                    CHECK(fp8::float_of_bits(bits) == want_max, "cast %dx%d %s, %d halves: amax %g, want %g", R, C,
                          mn, halves, fp8::float_of_bits(bits), want_max);
                    CHECK(q == wq && plain == wplain, "cast %dx%d %s, %d halves, history %s: the copies differ from "
                          "the quantiser's of the output%s", R, C, mn, halves, holds ? "holding an amax" : "empty",
                          holds ? "" : " (an empty history must write none)");
                }
}

// A product after the cast: the same result as the product that quantises
// its operand itself, with that operand's conversions left out while the
// history holds an amax (and made when it holds none, or when the copy the
// product needs was not cast: a whole backward after a cast as it is).
void test_cast_products() {
    std::string err;
    const int N = 37, IC = 48, OC = 80;
    std::mt19937 rng(29);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<double> src((size_t)N * std::max(IC, OC)), w((size_t)OC * IC);
    for (double& v : src) v = nd(rng);
    for (double& v : w) v = 0.3 * nd(rng);
    for (int mode = 0; mode < 4; mode++)  // forward, B, whole backward, whole after a plain cast
        for (int holds = 0; holds < 2; holds++)
            for (int halves = 1; halves <= (mode ? 2 : 1); halves++) {  // the output gradient also as SwiGLU's
                const bool bwd = mode > 0, tr = mode == 2, want_dw = mode >= 2;
                const int R = N, C = bwd ? OC : IC;  // the cast operand: the input, or the output gradient
                std::vector<double> x((size_t)N * IC), dy((size_t)N * OC);
                for (size_t i = 0; i < x.size(); i++) x[i] = src[i] * 0.5;
                for (size_t i = 0; i < dy.size(); i++) dy[i] = src[i] * 1e-3;
                std::vector<double>& operand = bwd ? dy : x;
                const double own = cpu::amax(operand.data(), operand.size()) * 2;  // the op's output is up to 2x
                const double hist[2] = {holds ? own : 0, 0};
                double amax[3] = {cpu::amax(x.data(), x.size()), cpu::amax(w.data(), w.size()), 0};
                const fp8k::Scratch::Sizes elems = fp8k::product_sizes(N, IC, OC);
                std::vector<uint8_t> buf(fp8k::Scratch::bytes(elems), kCanary), buf2 = buf;
                EmuExec<double> ex{fp8k::Scratch::carve(buf.data(), elems), elems, &err};
                EmuExec<double> plain_ex{fp8k::Scratch::carve(buf2.data(), elems), elems, &err};
                const fp8k::Scratch& s = ex.s;
                std::vector<double> in = operand;  // the op's input; its output replaces the operand
                uint8_t* q = !bwd ? s.x : tr ? s.dyt : s.dy;  // where the product's quantiser would write
                emu_cast(EmuOp<double>{operand.data(), in.data(), C, halves}, R, C, hist, 2, bwd, q, tr,
                         tr ? s.dy : nullptr);
                // amax as fp8_delayed leaves it: the history's, or the operand's own
                amax[bwd ? 2 : 0] = holds ? own : cpu::amax(operand.data(), operand.size());
                const fp8k::Precast pre{hist, 2, tr};
                std::vector<double> out((size_t)N * std::max(IC, OC), 7.0), out2 = out;
                std::vector<double> dw((size_t)OC * IC, 0.5), dw2 = dw;
                g_conversions = 0;
                if (!bwd)
                    fp8k::forward(ex, s, out.data(), x.data(), w.data(), (const double*)nullptr, N, IC, OC, amax, &pre);
                else
                    fp8k::backward(ex, s, out.data(), want_dw ? dw.data() : nullptr, dy.data(), x.data(), w.data(), N,
                                   IC, OC, amax, &pre);
                const size_t conv = g_conversions;
                if (!bwd)
                    fp8k::forward(plain_ex, plain_ex.s, out2.data(), x.data(), w.data(), (const double*)nullptr, N, IC,
                                  OC, amax);
                else
                    fp8k::backward(plain_ex, plain_ex.s, out2.data(), want_dw ? dw2.data() : nullptr, dy.data(),
                                   x.data(), w.data(), N, IC, OC, amax);
                const size_t wconv = (size_t)OC * IC + (want_dw ? (size_t)N * IC : 0);  // W (or W^T), and x^T for dW
                const size_t skipped = holds && mode != 3 ? 0 : (size_t)R * C;
                const char* mn = mode == 0   ? "forward"
                                 : mode == 1 ? "B"
                                 : mode == 2 ? "whole backward"
                                             : "whole after a plain cast";
                CHECK(err.empty() && out == out2 && dw == dw2,
                      "cast then %s (history %s, %d halves): differs from the "
                      "product quantising its operand %s",
                      mn, holds ? "holding an amax" : "empty", halves, err.c_str());
                CHECK(conv == wconv + skipped, "cast then %s (history %s): %zu conversions, want %zu", mn,
                      holds ? "holding an amax" : "empty", conv, wconv + skipped);
            }
}

// An input kept from the forward (Fp8Kept): the cast of the op that
// writes it (the activation's, fcproj's input: EmuOp; a norm's, QKV's or
// fc's input: fp8k::NormCast, LayerNorm and RMSNorm) writes the plain copy
// for the forward's product and the transposed one into the kept buffer,
// without storing its output (keep false) while the history holds an amax;
// the forward, then the weight gradient (whole backward, or W alone)
// reading the kept copy, equal the products that quantise the op's output
// themselves, bit for bit, with x^T's conversions left out while the
// history holds an amax. While it is empty the output is stored and the
// backward writes x^T into the kept buffer from it. The unstored output is
// NaN: a product that read it would show it. make(out) gives the op
// writing into out; `want` is its output, every element.
template <class Make>
void kept_input_case(const char* name, int N, int IC, int OC, const Operands& ops, Make make,
                     const std::vector<double>& want) {
    std::string err;
    const int ld = fp8k::padded_k(N);
    const std::vector<double>& w = ops.w, &dy = ops.dy;
    const double own = cpu::amax(want.data(), want.size());
    // alias: the kept bytes are the op's output buffer itself, as the model keeps them (the
    // output is not stored there once the history holds an amax; the backward reads it whole
    // before it copies x^T there while the history is empty)
    for (int alias = 0; alias < 2; alias++)
        for (int holds = 0; holds < 2; holds++)
            for (int whole = 0; whole < 2; whole++) {
                const double hist[2] = {holds ? own * 1.5 : 0, 0};
                double amax[3] = {holds ? own * 1.5 : own, cpu::amax(w.data(), w.size()),
                                  cpu::amax(dy.data(), dy.size())};
                const fp8k::Scratch::Sizes elems = fp8k::product_sizes(N, IC, OC);
                std::vector<uint8_t> buf(fp8k::Scratch::bytes(elems), kCanary), buf2 = buf;
                std::vector<uint8_t> kept((size_t)IC * ld + 2 * kGuard, kCanary);
                std::vector<double> x((size_t)N * IC, NAN);  // the op's output where it is stored
                uint8_t* kb = alias ? reinterpret_cast<uint8_t*>(x.data()) : kept.data() + kGuard;
                EmuExec<double> ex{fp8k::Scratch::carve(buf.data(), elems), elems, &err, kb,
                                   alias ? x.size() * sizeof(double) : (size_t)IC * ld};
                EmuExec<double> plain_ex{fp8k::Scratch::carve(buf2.data(), elems), elems, &err};
                const unsigned bits = emu_cast(make(x.data()), N, IC, hist, 2, false, kb, true, ex.s.x, false);
                bool stored = true, untouched = true;
                for (size_t i = alias && holds ? (size_t)IC * ld / sizeof(double) + 1 : 0; i < x.size(); i++)
                    stored &= holds ? std::isnan(x[i]) : x[i] == want[i];
                for (size_t i = kGuard; i < kGuard + (size_t)IC * ld; i++) untouched &= kept[i] == kCanary;
                const std::string nm = std::string(name) + (alias ? " (in the output's buffer)" : "");
                CHECK(stored, "%s kept x^T, history %s: the op's output %s", nm.c_str(), holds ? "holding" : "empty",
                      holds ? "stored though only the FP8 copies are read" : "not stored while the history is empty");
                CHECK(alias || untouched == !holds, "%s kept x^T, history %s: the cast %s the kept copy", nm.c_str(),
                      holds ? "holding" : "empty", holds ? "did not write" : "wrote (its scale is not known yet)");
                CHECK(fp8::float_of_bits(bits) == own, "%s kept x^T: the cast's amax %g, want %g", nm.c_str(),
                      fp8::float_of_bits(bits), own);
                const fp8k::Precast pre{hist, 2, false};
                const Fp8Kept k{kb, hist, 2};
                std::vector<double> out((size_t)N * OC), out2 = out, dx((size_t)N * IC, 7.0), dx2 = dx;
                std::vector<double> dw((size_t)OC * IC, 0.5), dw2 = dw;
                fp8k::forward(ex, ex.s, out.data(), x.data(), w.data(), (const double*)nullptr, N, IC, OC, amax, &pre);
                fp8k::forward(plain_ex, plain_ex.s, out2.data(), want.data(), w.data(), (const double*)nullptr, N, IC,
                              OC, amax);
                g_conversions = 0;
                fp8k::backward(ex, ex.s, whole ? dx.data() : nullptr, dw.data(), dy.data(), x.data(), w.data(), N, IC,
                               OC, amax, nullptr, &k);
                const size_t conv = g_conversions;
                g_conversions = 0;
                fp8k::backward(plain_ex, plain_ex.s, whole ? dx2.data() : nullptr, dw2.data(), dy.data(), want.data(),
                               w.data(), N, IC, OC, amax);
                const size_t wconv = g_conversions - (holds ? (size_t)N * IC : 0);
                bool pad = true;  // the kept copy's padding rows: zero bytes, as the quantiser's
                for (int c = 0; c < IC; c++)
                    for (int r = N; r < ld; r++) pad &= kb[(size_t)c * ld + r] == 0;
                bool guards = true;
                for (size_t i = 0; i < kGuard; i++)
                    guards &= kept[i] == kCanary && kept[kGuard + (size_t)IC * ld + i] == kCanary;
                const char* mn = whole ? "whole backward" : "W";
                CHECK(err.empty() && out == out2, "%s kept x^T, history %s: the forward after the cast differs %s",
                      nm.c_str(), holds ? "holding" : "empty", err.c_str());
                CHECK(err.empty() && dw == dw2 && dx == dx2 && pad && guards,
                      "%s kept x^T then %s, history %s: differs from the product quantising x itself (pad %d, guards "
                      "%d) %s", nm.c_str(), mn, holds ? "holding" : "empty", pad, guards, err.c_str());
                CHECK(conv == wconv, "%s kept x^T then %s, history %s: %zu conversions, want %zu", nm.c_str(), mn,
                      holds ? "holding" : "empty", conv, wconv);
            }
}

void test_kept_input() {
    const int N = 37, IC = 48, OC = 80;
    const Operands ops(N, IC, OC, 31);
    const std::vector<double>& in = ops.x;
    std::vector<double> want((size_t)N * IC);  // the op's output (EmuOp's, in double)
    for (size_t i = 0; i < in.size(); i++) want[i] = (double)(1.5f * (float)in[i] - 0.25f * (float)in[i] * (float)in[i]);
    kept_input_case("activation", N, IC, OC, ops, [&](double* out) { return EmuOp<double>{out, in.data(), IC, 1}; },
                    want);
    // The norms (QKV's and fc's inputs): the row statistics as the norm's
    // kernel leaves them, the op's output against the formula in double.
    std::vector<double> g(IC), b(IC);
    for (int c = 0; c < IC; c++) g[c] = 1.0 + 0.1 * in[c], b[c] = 0.2 * in[IC + c];
    for (int rms = 0; rms < 2; rms++) {
        std::vector<float> mean(N), rstd(N);
        for (int r = 0; r < N; r++) {
            double m = 0, v = 0;
            for (int c = 0; c < IC; c++) m += in[(size_t)r * IC + c];
            m = rms ? 0 : m / IC;
            for (int c = 0; c < IC; c++) v += (in[(size_t)r * IC + c] - m) * (in[(size_t)r * IC + c] - m);
            mean[r] = (float)m, rstd[r] = (float)(1.0 / std::sqrt(v / IC + 1e-5));
        }
        auto make = [&](double* out) {
            return fp8k::NormCast<double, HostCvt<double>>{out, in.data(), rms ? nullptr : mean.data(), rstd.data(),
                                                           g.data(), rms ? nullptr : b.data(), IC};
        };
        std::vector<double> nw((size_t)N * IC);
        const auto op = make(nw.data());
        float f[2];
        double worst = 0;
        for (int r = 0; r < N; r++)
            for (int c = 0; c < IC; c++) {
                op(r, c, f, true);
                const double x = in[(size_t)r * IC + c];
                const double exact = rms ? x * rstd[r] * g[c] : (x - mean[r]) * rstd[r] * g[c] + b[c];
                worst = std::max(worst, std::fabs(nw[(size_t)r * IC + c] - exact) / (std::fabs(exact) + 1.0));
            }
        CHECK(worst < 1e-6, "%s's cast (fp8k::NormCast): its output off the formula by %g", rms ? "RMSNorm" : "LayerNorm",
              worst);
        kept_input_case(rms ? "rmsnorm" : "layernorm", N, IC, OC, ops, make, nw);
    }
}

// The weight's copies made once per step (Fp8Weight): a forward that
// makes the plain copy and one that reuses it, a backward that makes the
// transposed copy and one that reuses it, each bit for bit as the product
// quantising the weight itself, the reuses converting none of the weight,
// and the weight's amax read from the copies' (the layer-slot's amax[1] is
// NaN: a product that read it would show it).
void test_weight_copies() {
    std::string err;
    const int N = 37, IC = 48, OC = 80;
    const Operands ops(N, IC, OC, 43);
    const double wamax = cpu::amax(ops.w.data(), ops.w.size());
    const double amax[3] = {cpu::amax(ops.x.data(), ops.x.size()), wamax, cpu::amax(ops.dy.data(), ops.dy.size())};
    const double slot[3] = {amax[0], NAN, amax[2]};
    const fp8k::Scratch::Sizes elems = fp8k::product_sizes(N, IC, OC);
    std::vector<uint8_t> buf(fp8k::Scratch::bytes(elems), kCanary), buf2 = buf;
    std::vector<uint8_t> wq((size_t)OC * IC, kCanary), wqt = wq;
    EmuExec<double> ex{fp8k::Scratch::carve(buf.data(), elems), elems, &err};
    ex.wq = wq.data(), ex.wqt = wqt.data(), ex.wq_bytes = wq.size();
    EmuExec<double> plain_ex{fp8k::Scratch::carve(buf2.data(), elems), elems, &err};
    for (int back = 0; back < 2; back++)
        for (int makes = 1; makes >= 0; makes--) {
            const Fp8Weight q{wq.data(), wqt.data(), &wamax, !back && makes, back && makes};
            std::vector<double> o((size_t)N * std::max(IC, OC), 7.0), o2 = o, dw((size_t)OC * IC, 0.5), dw2 = dw;
            g_conversions = 0;
            if (!back)
                fp8k::forward(ex, ex.s, o.data(), ops.x.data(), ops.w.data(), (const double*)nullptr, N, IC, OC, slot,
                              nullptr, nullptr, &q);
            else
                fp8k::backward(ex, ex.s, o.data(), dw.data(), ops.dy.data(), ops.x.data(), ops.w.data(), N, IC, OC,
                               slot, nullptr, nullptr, nullptr, &q);
            const size_t conv = g_conversions;
            g_conversions = 0;
            if (!back)
                fp8k::forward(plain_ex, plain_ex.s, o2.data(), ops.x.data(), ops.w.data(), (const double*)nullptr, N,
                              IC, OC, amax);
            else
                fp8k::backward(plain_ex, plain_ex.s, o2.data(), dw2.data(), ops.dy.data(), ops.x.data(), ops.w.data(),
                               N, IC, OC, amax);
            const size_t want = g_conversions - (makes ? 0 : (size_t)OC * IC);
            const char* what = back ? "backward" : "forward";
            CHECK(err.empty() && o == o2 && dw == dw2, "weight copies, %s %s them: differs from the product "
                  "quantising the weight %s", what, makes ? "making" : "reusing", err.c_str());
            CHECK(conv == want, "weight copies, %s %s them: %zu conversions, want %zu", what,
                  makes ? "making" : "reusing", conv, want);
        }
}

}  // namespace

int main() {
    test_amax();
    test_scales();
    test_quantize();
    test_products();
    test_cast_bytes();
    test_cast_products();
    test_kept_input();
    test_weight_copies();
    return check_summary();
}
