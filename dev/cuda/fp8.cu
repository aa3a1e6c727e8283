// dev/cuda/fp8.cu: kernel lab for the FP8 products (docs/fp8.md,
// llmc/backend/cuda/fp8.cuh) against the CPU's exact emulation
// (llmc/backend/cpu_fp8.h):
//   amax       the largest magnitude of a tensor (exact: a max), and NaN wins
//   quantize   bytes of x · scale by the conversion instruction (satfinite)
//              against fp8.h's rounding of the same fp32 values, e4m3 and
//              e5m2, plain, transposed (rows padded to 16 with zero bytes)
//              and both in one pass (exact: every byte)
//   products   forward, input gradient and weight gradient (+=) through
//              cuBLASLt's FP8 matmul with the descale pointers, against the
//              CPU's product of the rounded copies (fp32 accumulation on both
//              sides, different orders: a relative tolerance), bf16 and fp32
//              outputs, with a bias
//   activation GELU and SwiGLU forward and backward measuring the amax of
//              what they write (Backend::activation_amax): the same bytes
//              as the plain kernels, the amax exact
//   cast       delayed scaling's fused cast: the activation writing the next
//              product's FP8 operand too (fp8k::cast_body), then that
//              product (fcproj forward, fc's backward whole and B alone):
//              the same output bits and the same product bits as the
//              activation followed by the product quantising its operand,
//              with a history holding an amax (the cast used) and empty
//              (the first step: the product quantises), and the backward's
//              output left unstored (the product's bits only); timed beside the uncast pair
//   norm cast  the same for a norm (LayerNorm, RMSNorm, with and without the
//              residual add) casting QKV's or fc's input and keeping its
//              transposed copy: statistics, output, amax, and the forward's
//              and weight gradient's bits as after the uncast norm
// Timing (bf16 outputs, N=8192 tokens, 1024 -> 4096, and d12's 768 -> 3072):
// TFLOP/s of the three products, and beside them the bf16 products
// (matmul.cuh) of the same shapes.
#include <cstring>
#include <type_traits>

#include "common.h"
#include "llmc/backend/cpu_fp8.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/fp8.cuh"
#include "llmc/backend/cuda/norms.cuh"

using namespace llmc_cuda;

static std::vector<uint8_t> bytes_from_device(const uint8_t* d, size_t n) {
    std::vector<uint8_t> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
}
static void count(bool ok, const std::string& what, const std::string& detail) {
    std::printf("  %-52s %s  %s\n", what.c_str(), detail.c_str(), ok ? "PASS" : "FAIL");
    (ok ? lab::g_passed : lab::g_failed)++;
}

// amax and the quantising kernel, exactly.
static void check_quantize(int rows, int cols) {
    std::vector<float> x = lab::rand_normal((size_t)rows * cols, 3.f, 21);
    x[7] = 1e6f;  // the amax: its scale maps it to fmax, the rest of the tensor far below (subnormals, zeros)
    float* dx = lab::to_device<float>(x);
    double* dam = lab::dev_alloc<double>(3);
    unsigned* bits = lab::dev_alloc<unsigned>(1);
    amax_to<float>(dam, dx, x.size(), bits, 0);
    double am = 0;
    CUDA_CHECK(cudaMemcpy(&am, dam, sizeof am, cudaMemcpyDeviceToHost));
    const double want = cpu::amax(x.data(), x.size());
    count(am == want, "amax " + std::to_string(rows) + "x" + std::to_string(cols), "got " + std::to_string(am));
    float* sc = lab::dev_alloc<float>(6);
    CUDA_CHECK(cudaMemcpy(dam + 1, &am, sizeof am, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dam + 2, &am, sizeof am, cudaMemcpyHostToDevice));
    fp8_scales_kernel<<<1, 32>>>(sc, dam, Fp8Delayed{}, nullptr);
    float s[6];
    CUDA_CHECK(cudaMemcpy(s, sc, sizeof s, cudaMemcpyDeviceToHost));
    // Transposed: [cols, ld], ld the rows padded to 16 with zero bytes; t == 2
    // also writes the plain bytes in the same pass (a backward's dy).
    const size_t ld = (size_t)fp8k::padded_k(rows), nt = (size_t)cols * ld;
    uint8_t *q = lab::dev_alloc<uint8_t>(nt), *plain = lab::dev_alloc<uint8_t>(x.size());
    for (int e5 = 0; e5 < 2; e5++)
        for (int t = 0; t < 3; t++) {
            CUDA_CHECK(cudaMemset(q, 0x55, nt));  // the padding must be written, not found
            CUDA_CHECK(cudaMemset(plain, 0x55, x.size()));
            fp8_quantize<float>(q, dx, rows, cols, sc + (e5 ? 2 : 0), e5 == 1, t >= 1, 0, t == 2 ? plain : nullptr);
            const std::vector<uint8_t> got = bytes_from_device(q, t ? nt : x.size());
            const std::vector<uint8_t> got_plain = bytes_from_device(plain, x.size());
            const fp8::Format f = e5 ? fp8::Format::e5m2 : fp8::Format::e4m3;
            size_t bad = 0;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) {
                    const float v = x[(size_t)r * cols + c] * s[e5 ? 2 : 0];  // the kernel's fp32 product
                    const uint8_t w = fp8::encode((double)v, f);
                    bad += got[t ? (size_t)c * ld + r : (size_t)r * cols + c] != w;
                    if (t == 2) bad += got_plain[(size_t)r * cols + c] != w;
                }
            if (t)
                for (int c = 0; c < cols; c++)
                    for (size_t r = rows; r < ld; r++) bad += got[(size_t)c * ld + r] != 0;
            const char* how[] = {"", " transposed", " transposed and plain"};
            count(bad == 0, std::string("quantize ") + (e5 ? "e5m2" : "e4m3") + how[t],
                  std::to_string(bad) + " of " + std::to_string(t ? nt : x.size()) + " bytes differ");
        }
    for (void* p : {(void*)dx, (void*)dam, (void*)bits, (void*)sc, (void*)q, (void*)plain}) lab::dev_free(p);
}

// The three products against the CPU's emulation (fp32 copies, cpu_fp8.h).
template <typename E>
static void check_products(int N, int IC, int OC, double tol) {
    const std::string l = std::string(std::is_same<E, float>::value ? "fp32" : "bf16") + " N=" + std::to_string(N) +
                          " " + std::to_string(IC) + "->" + std::to_string(OC);
    std::vector<float> x = lab::rand_normal((size_t)N * IC, 1.f, 31), w = lab::rand_normal((size_t)OC * IC, 0.05f, 32);
    std::vector<float> dy = lab::rand_normal((size_t)N * OC, 1e-3f, 33), b = lab::rand_normal(OC, 0.1f, 34);
    std::vector<float> dw0 = lab::rand_normal((size_t)OC * IC, 1e-3f, 35);
    if (!std::is_same<E, float>::value)
        for (auto* v : {&x, &w, &dy, &b, &dw0})
            for (float& t : *v) t = lab::round_bf16(t);
    const double am[3] = {cpu::amax(x.data(), x.size()), cpu::amax(w.data(), w.size()), cpu::amax(dy.data(), dy.size())};
    std::vector<float> xq(x.size()), wq(w.size()), dq(dy.size());
    cpu::fp8_round(xq.data(), x.data(), x.size(), am[0], 0);
    cpu::fp8_round(wq.data(), w.data(), w.size(), am[1], 0);
    cpu::fp8_round(dq.data(), dy.data(), dy.size(), am[2], 1);
    std::vector<float> y((size_t)N * OC), dx((size_t)N * IC), dw = dw0;
    cpu::matmul_forward(y.data(), xq.data(), wq.data(), b.data(), N, IC, OC);
    cpu::matmul_backward(dx.data(), dw.data(), (float*)nullptr, dq.data(), xq.data(), wq.data(), N, IC, OC);
    E *d_x = lab::to_device<E>(x), *d_w = lab::to_device<E>(w), *d_dy = lab::to_device<E>(dy), *d_b = lab::to_device<E>(b);
    E *d_y = lab::dev_alloc<E>(y.size()), *d_dx = lab::dev_alloc<E>(dx.size()), *d_dw = lab::to_device<E>(dw0);
    double* d_am = lab::dev_alloc<double>(3);
    CUDA_CHECK(cudaMemcpy(d_am, am, sizeof am, cudaMemcpyHostToDevice));
    Fp8Ops ops;
    ops.reserve(fp8k::product_sizes(N, IC, OC), 0);
    const bool fp32 = std::is_same<E, float>::value;
    ops.forward(fp32, d_y, d_x, d_w, d_b, N, IC, OC, d_am);
    ops.backward(fp32, d_dx, d_dw, nullptr, d_dy, d_x, d_w, N, IC, OC, d_am, nullptr);
    lab::validate((l + " forward").c_str(), lab::from_device(d_y, y.size()), y, tol);
    lab::validate((l + " input grad").c_str(), lab::from_device(d_dx, dx.size()), dx, tol);
    lab::validate((l + " weight grad").c_str(), lab::from_device(d_dw, dw.size()), dw, tol);
    // A split backward's halves: B (dy quantised as it is) then W (transposed).
    CUDA_CHECK(cudaMemset(d_dx, 0, dx.size() * sizeof(E)));
    lab::copy_to_device<E>(d_dw, dw0);
    ops.backward(fp32, d_dx, nullptr, nullptr, d_dy, d_x, d_w, N, IC, OC, d_am, nullptr);
    ops.backward(fp32, nullptr, d_dw, nullptr, d_dy, d_x, d_w, N, IC, OC, d_am, nullptr);
    lab::validate((l + " input grad, B alone").c_str(), lab::from_device(d_dx, dx.size()), dx, tol);
    lab::validate((l + " weight grad, W alone").c_str(), lab::from_device(d_dw, dw.size()), dw, tol);
    // The weight's copies made once per step (Fp8Weight): a forward and a
    // backward making them, then a pair reusing them, each as above; the
    // weight's amax is the copies' (the layer-slot's is NaN).
    const size_t wbytes = ((size_t)OC * IC + 255) / 256 * 256;
    uint8_t* d_wq = lab::dev_alloc<uint8_t>(2 * wbytes);
    double *d_wam = lab::dev_alloc<double>(1), *d_am_nan = lab::dev_alloc<double>(3);
    const double am_nan[3] = {am[0], NAN, am[2]};
    CUDA_CHECK(cudaMemcpy(d_am_nan, am_nan, sizeof am_nan, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_wam, &am[1], sizeof(double), cudaMemcpyHostToDevice));
    for (int makes = 1; makes >= 0; makes--) {
        const Fp8Weight q{d_wq, d_wq + wbytes, d_wam, makes == 1, makes == 1};
        const std::string how = makes ? ", making the weight's copies" : ", reusing the weight's copies";
        lab::copy_to_device<E>(d_dw, dw0);
        ops.forward(fp32, d_y, d_x, d_w, d_b, N, IC, OC, d_am_nan, nullptr, &q);
        ops.backward(fp32, d_dx, d_dw, nullptr, d_dy, d_x, d_w, N, IC, OC, d_am_nan, nullptr, nullptr, nullptr, &q);
        lab::validate((l + " forward" + how).c_str(), lab::from_device(d_y, y.size()), y, tol);
        lab::validate((l + " input grad" + how).c_str(), lab::from_device(d_dx, dx.size()), dx, tol);
        lab::validate((l + " weight grad" + how).c_str(), lab::from_device(d_dw, dw.size()), dw, tol);
    }
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_dy, (void*)d_b, (void*)d_y, (void*)d_dx, (void*)d_dw, (void*)d_am,
                    (void*)d_wq, (void*)d_wam, (void*)d_am_nan})
        lab::dev_free(p);
}

// Backend::activation_amax: GELU and SwiGLU, forward and backward, writing
// exactly what the plain kernels write, the amax exactly the max of |what
// they wrote| (read back and taken on the host); then the time beside the
// plain kernel followed by a separate amax pass.
template <typename E>
static void check_activation_amax(int N, int H, bool timing) {
    const std::string t = std::is_same<E, float>::value ? "fp32" : "bf16";
    const std::vector<float> a = lab::rand_normal((size_t)N * 2 * H, 2.f, 51), d = lab::rand_normal((size_t)N * 2 * H, 1.f, 52);
    E *da = lab::to_device<E>(a), *dd = lab::to_device<E>(d), *o1 = lab::dev_alloc<E>(a.size()), *o2 = lab::dev_alloc<E>(a.size());
    double* am = lab::dev_alloc<double>(1);
    Fp8Ops ops;
    ops.reserve(fp8k::forward_sizes(1, 1, 1), 0);  // (the amax bits alone)
    const bool fp32 = std::is_same<E, float>::value;
    for (int k = 0; k < 4; k++) {
        const bool swiglu = k >= 2, back = k % 2 == 1;
        const size_t n = (size_t)N * H * (swiglu && back ? 2 : 1);
        auto plain = [&] {
            if (swiglu && back) swiglu_backward<E>(o1, da, dd, N, H, 0);
            else if (swiglu) swiglu_forward<E>(o1, da, N, H, 0);
            else if (back) gelu_backward<E>(o1, da, dd, n, 0);
            else gelu_forward<E>(o1, da, n, 0);
        };
        auto fused = [&] { ops.activation(fp32, swiglu, o2, da, back ? dd : nullptr, N, H, am); };
        plain(), fused();
        const std::vector<float> w1 = lab::from_device(o1, n), w2 = lab::from_device(o2, n);
        double want = 0, got = 0;
        for (float v : w1) want = std::max(want, (double)std::fabs(v));
        CUDA_CHECK(cudaMemcpy(&got, am, sizeof got, cudaMemcpyDeviceToHost));
        const std::string what = t + (swiglu ? " swiglu" : " gelu") + (back ? " backward" : " forward");
        count(std::memcmp(w1.data(), w2.data(), n * sizeof(float)) == 0 && got == want, "activation_amax " + what,
              "amax " + std::to_string(got) + " want " + std::to_string(want));
        if (!timing) continue;
        const float ms_fused = lab::time_ms(fused);
        const float ms_two = lab::time_ms([&] { plain(), ops.amax(fp32, am, o1, n); });
        std::printf("figure activation_amax_%s_over_separate %g ratio\n", lab::slug(what.c_str()).c_str(),
                    ms_two / ms_fused);
    }
    for (void* p : {(void*)da, (void*)dd, (void*)o1, (void*)o2, (void*)am}) lab::dev_free(p);
}

// Delayed scaling's cast (Fp8Ops::activation with an Fp8Cast): for each
// activation, the output and its amax as the plain kernel's, and the next
// product (fcproj forward, fc's backward whole and B alone) bit for bit as
// after the uncast activation, its history holding an amax or empty; a
// forward keeping fcproj's input transposed (Fp8Cast::kept), and a
// recompute writing that copy alone, then fcproj's weight gradient reading
// it (Fp8Kept) bit for bit as from the stored input. The products' other
// operands are random; C is the model width.
template <typename E>
static void check_activation_cast(int N, int H, int C, bool timing) {
    const std::string t = std::is_same<E, float>::value ? "fp32" : "bf16";
    const bool fp32 = std::is_same<E, float>::value;
    const std::vector<float> a = lab::rand_normal((size_t)N * 2 * H, 2.f, 61), d = lab::rand_normal((size_t)N * 2 * H, 0.1f, 62);
    const std::vector<float> x = lab::rand_normal((size_t)N * C, 1.f, 63), w = lab::rand_normal((size_t)2 * H * C, 0.05f, 64);
    E *da = lab::to_device<E>(a), *dd = lab::to_device<E>(d), *dx = lab::to_device<E>(x), *dw = lab::to_device<E>(w);
    E *o1 = lab::dev_alloc<E>(a.size()), *o2 = lab::dev_alloc<E>(a.size());
    E *y1 = lab::dev_alloc<E>((size_t)N * 2 * H), *y2 = lab::dev_alloc<E>((size_t)N * 2 * H);
    E *g1 = lab::dev_alloc<E>(w.size()), *g2 = lab::dev_alloc<E>(w.size());
    double *am = lab::dev_alloc<double>(1), *hist = lab::dev_alloc<double>(2), *amax3 = lab::dev_alloc<double>(3);
    uint8_t* xt = lab::dev_alloc<uint8_t>((size_t)fp8k::padded_k(N) * H);  // fcproj's input kept transposed
    Fp8Ops ops;
    ops.reserve(fp8k::product_sizes(N, C, 2 * H).cover(fp8k::product_sizes(N, 2 * H, C)), 0);
    // forward: cast as it is, keeping x^T too, a recompute's x^T alone;
    // backward: whole, B alone, whole with nothing kept
    for (int k = 0; k < 4; k++)
        for (int mode = 0; mode < 3; mode++)
            for (int holds = 0; holds < 2; holds++) {
                const bool swiglu = k >= 2, back = k % 2 == 1, whole = back && mode != 1;
                const bool kept = !back && mode > 0, recompute = !back && mode == 2;
                const bool keep = back ? mode != 2 : !kept;
                const int cols = swiglu && back ? 2 * H : H;
                const size_t n = (size_t)N * cols;
                // The activation uncast first: its output's amax, then the history (half of it: saturating).
                ops.activation(fp32, swiglu, o1, da, back ? dd : nullptr, N, H, am);
                double own = 0;
                CUDA_CHECK(cudaMemcpy(&own, am, sizeof own, cudaMemcpyDeviceToHost));
                const double h[2] = {holds ? own / 2 : 0, 0}, sc = holds ? own / 2 : own;
                CUDA_CHECK(cudaMemcpy(hist, h, sizeof h, cudaMemcpyHostToDevice));
                double amx[3] = {5.0, 0.3, 1.0};  // x's and w's (any: the same in both runs)
                amx[back ? 2 : 0] = sc;  // what fp8_delayed leaves: the history's amax, or the operand's own
                CUDA_CHECK(cudaMemcpy(amax3, amx, sizeof amx, cudaMemcpyHostToDevice));
                Fp8Cast cast{hist, 2, whole, keep};  // (not kept: the output is not stored once the history holds)
                if (kept) cast.kept = xt, cast.plain = !recompute;
                const Fp8Kept kp{xt, hist, 2};
                // fcproj forward (and with a kept x^T its weight gradient, dy
                // from x), or fc's backward (g: dW, zeroed first)
                auto product = [&](E* op, E* y, E* g, bool cast_run) {
                    if (!back) {
                        if (!recompute) ops.forward(fp32, y, op, dw, nullptr, N, H, C, amax3);
                        if (!kept) return;
                        CUDA_CHECK(cudaMemset(g, 0, w.size() * sizeof(E)));
                        return ops.backward(fp32, nullptr, g, nullptr, dx, op, dw, N, H, C, amax3, nullptr,
                                            cast_run ? &kp : nullptr);
                    }
                    CUDA_CHECK(cudaMemset(g, 0, w.size() * sizeof(E)));
                    ops.backward(fp32, y, whole ? g : nullptr, nullptr, op, dx, dw, N, C, cols, amax3, nullptr);
                };
                auto uncast = [&] {
                    ops.activation(fp32, swiglu, o1, da, back ? dd : nullptr, N, H, am), product(o1, y1, g1, false);
                };
                auto cast_run = [&] {
                    ops.activation(fp32, swiglu, o2, da, back ? dd : nullptr, N, H, recompute ? nullptr : am, &cast);
                    product(o2, y2, g2, true);
                };
                uncast(), cast_run();
                const size_t yn = (size_t)N * C;  // fcproj's output, or fc's input gradient
                double got = 0;
                CUDA_CHECK(cudaMemcpy(&got, am, sizeof got, cudaMemcpyDeviceToHost));
                const std::vector<float> w1 = lab::from_device(o1, n), w2 = lab::from_device(o2, n);
                const std::vector<float> p1 = lab::from_device(y1, yn), p2 = lab::from_device(y2, yn);
                const std::vector<float> q1 = lab::from_device(g1, w.size()), q2 = lab::from_device(g2, w.size());
                const bool same = (keep || !holds ? w1 == w2 : true) && got == own && (recompute || p1 == p2) &&
                                  (!(whole || kept) || q1 == q2);
                const std::string what = t + (swiglu ? " swiglu" : " gelu") +
                                         (!back       ? (recompute ? " recompute x^T" : kept ? " forward kept x^T" : " forward")
                                          : !whole    ? " B"
                                          : keep      ? " backward"
                                                      : " backward unkept");
                count(same, "cast " + what + (holds ? " (history)" : " (no history)"),
                      "output, amax and the product's bits as uncast");
                if (!timing || !holds) continue;
                const float ms_cast = lab::time_ms(cast_run), ms_uncast = lab::time_ms(uncast);
                std::printf("figure fp8_cast_%s_over_uncast %g ratio (%.3f ms against %.3f)\n",
                            lab::slug(what.c_str()).c_str(), ms_uncast / ms_cast, ms_cast, ms_uncast);
            }
    for (void* p : {(void*)da, (void*)dd, (void*)dx, (void*)dw, (void*)o1, (void*)o2, (void*)y1, (void*)y2, (void*)g1,
                    (void*)g2, (void*)am, (void*)hist, (void*)amax3, (void*)xt})
        lab::dev_free(p);
}

// The norms measuring what they write (Backend::norm_amax /
// norm_backward_amax, cuda/norms.cuh with amax bits): the bytes equal to
// the plain kernels' and the amax to the host's max of what they wrote;
// C = 768 takes the vector kernels, C = 100 the scalar or looped ones.
template <typename E>
static void check_norm_amax(int N, int C, bool timing) {
    const std::string t = std::is_same<E, float>::value ? "fp32" : "bf16";
    const size_t n = (size_t)N * C;
    const std::vector<float> a = lab::rand_normal(n, 1.f, 61), b = lab::rand_normal(n, 1.f, 62),
                             g = lab::rand_normal(n, 0.1f, 63), w = lab::rand_normal(C, 1.f, 64);
    E *da = lab::to_device<E>(a), *db = lab::to_device<E>(b), *dg = lab::to_device<E>(g), *dw = lab::to_device<E>(w),
      *bias = lab::to_device<E>(b), *o1 = lab::dev_alloc<E>(n), *o2 = lab::dev_alloc<E>(n), *r1 = lab::dev_alloc<E>(n),
      *r2 = lab::dev_alloc<E>(n), *gw = lab::dev_alloc<E>(2 * (size_t)C);
    float *mean = lab::dev_alloc<float>(N), *rstd = lab::dev_alloc<float>(N);
    float* scratch = lab::dev_alloc<float>(std::max(norm_backward_scratch_floats(true, N, C),
                                                    norm_backward_scratch_floats(false, N, C)));
    double* am = lab::dev_alloc<double>(1);
    Fp8Ops ops;
    ops.reserve(fp8k::forward_sizes(1, 1, 1), 0);  // (the amax bits alone)
    for (int k = 0; k < 6; k++) {  // LayerNorm, RMSNorm x (plain, after the residual add, backward)
        const bool rms = k >= 3, res = k % 3 == 1, back = k % 3 == 2;
        auto run = [&](E* out, E* resid, unsigned* bits) {
            if (back) {  // dinp (out, preset to a) += the norm's gradient of dout = g
                CUDA_CHECK(cudaMemcpy(out, da, n * sizeof(E), cudaMemcpyDeviceToDevice));
                norm_backward<E>(rms, out, gw, rms ? nullptr : gw + C, dg, db, dw, mean, rstd, N, C, scratch, 0, bits);
            } else {
                norm_forward<E>(rms, resid, out, mean, rstd, da, res ? db : nullptr, dw, bias, N, C, 1e-5, 0, bits);
            }
        };
        if (back) norm_forward<E>(rms, nullptr, o1, mean, rstd, db, nullptr, dw, bias, N, C, 1e-5, 0, nullptr);
        run(o1, r1, nullptr);
        ops.measured(am, [&](unsigned* bits) { run(o2, r2, bits); });
        const std::vector<float> w1 = lab::from_device(o1, n), w2 = lab::from_device(o2, n);
        double want = 0, got = 0;
        for (float v : w1) want = std::max(want, (double)std::fabs(v));
        CUDA_CHECK(cudaMemcpy(&got, am, sizeof got, cudaMemcpyDeviceToHost));
        const std::string what = t + (rms ? " rmsnorm" : " layernorm") + (back ? " backward" : res ? " residual" : "") +
                                 " C=" + std::to_string(C);
        count(std::memcmp(w1.data(), w2.data(), n * sizeof(float)) == 0 && got == want, "norm_amax " + what,
              "amax " + std::to_string(got) + " want " + std::to_string(want));
        if (!timing) continue;
        const float ms_fused = lab::time_ms([&] { ops.measured(am, [&](unsigned* bits) { run(o2, r2, bits); }); });
        const float ms_two = lab::time_ms([&] { run(o1, r1, nullptr), ops.amax(std::is_same<E, float>::value, am, o1, n); });
        std::printf("figure norm_amax_%s_over_separate %g ratio\n", lab::slug(what.c_str()).c_str(), ms_two / ms_fused);
    }
    for (void* p : {(void*)da, (void*)db, (void*)dg, (void*)dw, (void*)bias, (void*)o1, (void*)o2, (void*)r1,
                    (void*)r2, (void*)gw, (void*)mean, (void*)rstd, (void*)scratch, (void*)am})
        lab::dev_free(p);
}

// Delayed scaling's cast by a norm (Fp8Ops::norm_cast, what the CUDA
// backend's norm_amax runs with an Fp8Cast): LayerNorm and RMSNorm, of the
// input and after the residual add, the norm's kernel leaving the residual
// and the statistics, the cast the output (stored only while the history is
// empty), its amax, the plain copy for QKV's (or fc's) forward and the kept
// transposed one for its weight gradient, in the output's own buffer as the
// model keeps it: the residual, statistics, output (where stored; else the
// buffer untouched past the kept bytes) and amax as the uncast norm's, and
// the forward and the weight gradient bit for bit as after the uncast norm.
// OC: the product's width (QKV's, fc's).
template <typename E>
static void check_norm_cast(int N, int C, int OC, bool timing) {
    const std::string t = std::is_same<E, float>::value ? "fp32" : "bf16";
    const bool fp32 = std::is_same<E, float>::value;
    const size_t n = (size_t)N * C;
    const std::vector<float> a = lab::rand_normal(n, 1.f, 71), b = lab::rand_normal(n, 1.f, 72),
                             g = lab::rand_normal(C, 1.f, 73), w = lab::rand_normal((size_t)OC * C, 0.05f, 74),
                             dy = lab::rand_normal((size_t)N * OC, 1e-3f, 75);
    E *da = lab::to_device<E>(a), *db = lab::to_device<E>(b), *dg = lab::to_device<E>(g), *bias = lab::to_device<E>(b),
      *dw = lab::to_device<E>(w), *ddy = lab::to_device<E>(dy);
    E *o1 = lab::dev_alloc<E>(n), *o2 = lab::dev_alloc<E>(n), *r1 = lab::dev_alloc<E>(n), *r2 = lab::dev_alloc<E>(n);
    E *y1 = lab::dev_alloc<E>((size_t)N * OC), *y2 = lab::dev_alloc<E>((size_t)N * OC);
    E *g1 = lab::dev_alloc<E>(w.size()), *g2 = lab::dev_alloc<E>(w.size());
    float *m1 = lab::dev_alloc<float>(N), *m2 = lab::dev_alloc<float>(N), *s1 = lab::dev_alloc<float>(N),
          *s2 = lab::dev_alloc<float>(N);
    double *am = lab::dev_alloc<double>(1), *hist = lab::dev_alloc<double>(2), *amax3 = lab::dev_alloc<double>(3);
    Fp8Ops ops;
    ops.reserve(fp8k::product_sizes(N, C, OC), 0);
    for (int k = 0; k < 4; k++)  // LayerNorm, RMSNorm x (of the input, after the residual add)
        for (int holds = 0; holds < 2; holds++) {
            const bool rms = k >= 2, res = k % 2 == 1;
            const E* src = res ? db : nullptr;
            ops.measured(am, [&](unsigned* bits) {
                norm_forward<E>(rms, r1, o1, m1, s1, da, src, dg, bias, N, C, 1e-5, 0, bits);
            });
            double own = 0;
            CUDA_CHECK(cudaMemcpy(&own, am, sizeof own, cudaMemcpyDeviceToHost));
            const double h[2] = {holds ? own * 1.5 : 0, 0};
            CUDA_CHECK(cudaMemcpy(hist, h, sizeof h, cudaMemcpyHostToDevice));
            const double amx[3] = {holds ? own * 1.5 : own, 0.3, 1e-3};  // what fp8_delayed leaves for the input
            CUDA_CHECK(cudaMemcpy(amax3, amx, sizeof amx, cudaMemcpyHostToDevice));
            Fp8Cast cast{hist, 2, false, false};
            cast.kept = o2;  // in the output's own buffer, as the model keeps it
            const Fp8Kept kp{o2, hist, 2};
            auto product = [&](E* in, E* y, E* gw, bool kept) {  // the forward, then the weight gradient alone
                ops.forward(fp32, y, in, dw, nullptr, N, C, OC, amax3);
                CUDA_CHECK(cudaMemset(gw, 0, w.size() * sizeof(E)));
                ops.backward(fp32, nullptr, gw, nullptr, ddy, in, dw, N, C, OC, amax3, nullptr, kept ? &kp : nullptr);
            };
            auto uncast = [&] {
                norm_forward<E>(rms, r1, o1, m1, s1, da, src, dg, bias, N, C, 1e-5, 0, nullptr);
                product(o1, y1, g1, false);
            };
            auto cast_norm = [&] {
                ops.norm_cast(fp32, rms, o2, res ? r2 : da, m2, s2, dg, rms ? nullptr : bias, N, C, am,
                              cast, [&] {
                                  norm_forward<E>(rms, r2, nullptr, m2, s2, da, src, dg, bias, N, C, 1e-5, 0, nullptr);
                              });
            };
            auto cast_run = [&] { cast_norm(), product(o2, y2, g2, true); };
            uncast();
            CUDA_CHECK(cudaMemset(o2, 0xFF, n * sizeof(E)));  // (NaN: what an unstored output reads as)
            cast_norm();
            // the output as the cast left it (the backward then writes x^T there while the history is empty)
            const std::vector<uint8_t> out2 = bytes_from_device(reinterpret_cast<uint8_t*>(o2), n * sizeof(E));
            product(o2, y2, g2, true);
            double got = 0;
            CUDA_CHECK(cudaMemcpy(&got, am, sizeof got, cudaMemcpyDeviceToHost));
            auto same = [&](const void* p, const void* q, size_t bytes) {
                std::vector<uint8_t> u(bytes), v(bytes);
                CUDA_CHECK(cudaMemcpy(u.data(), p, bytes, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(v.data(), q, bytes, cudaMemcpyDeviceToHost));
                return u == v;
            };
            bool unstored = true;  // past the kept copy's bytes
            for (size_t i = (size_t)C * fp8k::padded_k(N); i < out2.size(); i++) unstored &= out2[i] == 0xFF;
            const bool ok = (holds ? unstored : out2 == bytes_from_device(reinterpret_cast<uint8_t*>(o1), out2.size())) &&
                            got == own &&
                            (!res || same(r1, r2, n * sizeof(E))) && same(s1, s2, N * sizeof(float)) &&
                            (rms || same(m1, m2, N * sizeof(float))) &&
                            same(y1, y2, (size_t)N * OC * sizeof(E)) && same(g1, g2, w.size() * sizeof(E));
            const std::string what = t + (rms ? " rmsnorm" : " layernorm") + (res ? " residual" : "") + " C=" +
                                     std::to_string(C);
            count(ok, "norm cast " + what + (holds ? " (history)" : " (no history)"),
                  "statistics, output, amax and the products' bits as uncast");
            if (!timing || !holds) continue;
            const float ms_cast = lab::time_ms(cast_run), ms_uncast = lab::time_ms(uncast);
            std::printf("figure fp8_norm_cast_%s_over_uncast %g ratio (%.3f ms against %.3f)\n",
                        lab::slug(what.c_str()).c_str(), ms_uncast / ms_cast, ms_cast, ms_uncast);
        }
    for (void* p : {(void*)da, (void*)db, (void*)dg, (void*)bias, (void*)dw, (void*)ddy, (void*)o1, (void*)o2,
                    (void*)r1, (void*)r2, (void*)y1, (void*)y2, (void*)g1, (void*)g2, (void*)m1, (void*)m2, (void*)s1,
                    (void*)s2, (void*)am, (void*)hist, (void*)amax3})
        lab::dev_free(p);
}

static void time_shape(int N, int IC, int OC) {
    bf16 *x = lab::to_device<bf16>(lab::rand_normal((size_t)N * IC, 1.f, 41)),
         *w = lab::to_device<bf16>(lab::rand_normal((size_t)OC * IC, 0.02f, 42)),
         *dy = lab::to_device<bf16>(lab::rand_normal((size_t)N * OC, 1e-3f, 43));
    bf16 *y = lab::dev_alloc<bf16>((size_t)N * OC), *dx = lab::dev_alloc<bf16>((size_t)N * IC),
         *dw = lab::dev_alloc<bf16>((size_t)OC * IC);
    double* am = lab::dev_alloc<double>(3);
    const double h[3] = {4.0, 0.1, 5e-3};
    CUDA_CHECK(cudaMemcpy(am, h, sizeof h, cudaMemcpyHostToDevice));
    Fp8Ops ops;
    ops.reserve(fp8k::product_sizes(N, IC, OC), 0);
    MatmulContext mm;
    mm.init(0);
    float* scratch = lab::dev_alloc<float>(matmul_backward_scratch_floats(N, OC));
    const double flop = 2.0 * N * IC * OC;
    const std::string shp = std::to_string(N) + "x" + std::to_string(IC) + "->" + std::to_string(OC);
    float f8f = lab::time_ms([&] { ops.forward(false, y, x, w, nullptr, N, IC, OC, am); });
    float f8b = lab::time_ms([&] { ops.backward(false, dx, dw, nullptr, dy, x, w, N, IC, OC, am, nullptr); });
    // ... and a micro-batch after the step's first: the weight's copies reused (Fp8Weight)
    const size_t wbytes = ((size_t)OC * IC + 255) / 256 * 256;
    uint8_t* wq = lab::dev_alloc<uint8_t>(2 * wbytes);
    const Fp8Weight make{wq, wq + wbytes, am + 1, true, true}, reuse{wq, wq + wbytes, am + 1, false, false};
    ops.forward(false, y, x, w, nullptr, N, IC, OC, am, nullptr, &make);
    ops.backward(false, dx, dw, nullptr, dy, x, w, N, IC, OC, am, nullptr, nullptr, nullptr, &make);
    float f8f_r = lab::time_ms([&] { ops.forward(false, y, x, w, nullptr, N, IC, OC, am, nullptr, &reuse); });
    float f8b_r = lab::time_ms(
        [&] { ops.backward(false, dx, dw, nullptr, dy, x, w, N, IC, OC, am, nullptr, nullptr, nullptr, &reuse); });
    float bff = lab::time_ms([&] { matmul_forward<bf16>(mm, y, x, w, nullptr, N, IC, OC); });
    float bfb = lab::time_ms([&] { matmul_backward<bf16>(mm, dx, dw, nullptr, dy, x, w, N, IC, OC, scratch); });
    lab::report_tflops(("fp8 forward " + shp).c_str(), f8f, flop);
    lab::report_tflops(("fp8 backward (input + weight) " + shp).c_str(), f8b, 2 * flop);
    lab::report_tflops(("bf16 forward " + shp).c_str(), bff, flop);
    lab::report_tflops(("bf16 backward " + shp).c_str(), bfb, 2 * flop);
    std::printf("figure fp8_products_over_bf16_%s %g ratio\n", lab::slug(shp.c_str()).c_str(), (bff + bfb) / (f8f + f8b));
    std::printf("figure fp8_products_reused_weights_over_bf16_%s %g ratio\n", lab::slug(shp.c_str()).c_str(),
                (bff + bfb) / (f8f_r + f8b_r));
    lab::dev_free(wq);
    mm.destroy();
    for (void* p : {(void*)x, (void*)w, (void*)dy, (void*)y, (void*)dx, (void*)dw, (void*)am, (void*)scratch})
        lab::dev_free(p);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major * 10 + minor < 89) {
        std::printf("no FP8 tensor cores here (compute capability %d.%d)\n", major, minor);
        return lab::finish();
    }
    std::printf("validation\n");
    check_quantize(64, 96);
    check_quantize(1000, 130);
    check_products<float>(64, 48, 80, 1e-5);
    check_products<bf16>(256, 128, 384, 1e-2);
    check_products<float>(1024, 768, 3072, 1e-5);
    // A Mixtral expert's block: any row count (the weight gradient pads K).
    check_products<float>(37, 48, 80, 1e-5);
    check_products<bf16>(5, 128, 96, 1e-2);
    check_activation_amax<float>(37, 96, false);
    check_activation_amax<bf16>(64, 200, false);
    check_activation_cast<float>(37, 96, 64, false);
    check_activation_cast<bf16>(64, 208, 128, false);
    check_norm_amax<float>(37, 768, false);
    check_norm_amax<float>(37, 100, false);
    check_norm_amax<bf16>(64, 768, false);
    check_norm_amax<bf16>(64, 100, false);
    check_norm_cast<float>(37, 768, 96, false);
    check_norm_cast<float>(37, 112, 48, false);
    check_norm_cast<bf16>(64, 4096, 64, false);  // (rows past the registers: the scalar and looped kernels)
    check_norm_cast<bf16>(64, 768, 128, false);
    check_norm_cast<bf16>(64, 96, 48, false);
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16 outputs)\n");
    time_shape(8192, 768, 3072);
    time_shape(8192, 1024, 4096);
    check_activation_amax<bf16>(4096, 8960, true);  // Qwen2.5-1.5B's MLP width
    check_activation_cast<bf16>(4096, 8960, 1536, true);
    check_activation_cast<bf16>(8192, 3072, 768, true);  // d12's
    check_norm_amax<bf16>(65536, 768, true);         // d12's norms, B x T = 64 x 1024
    check_norm_cast<bf16>(32768, 768, 2304, true);   // d12's ln1 before QKV, B x T = 32 x 1024
    check_norm_cast<bf16>(16384, 1536, 2048, true);  // Qwen2.5-1.5B's, 16 x 1024
    return lab::finish();
}
