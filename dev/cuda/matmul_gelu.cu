// dev/cuda/matmul_gelu.cu: kernel lab for the MLP's GELU in cuBLASLt's
// epilogues (LLMC_GELU_FUSION, llmc/backend/cuda/switches.h):
//   forward   pre = inp·W^T + b, out = GELU(pre)        [N, OC]
//   backward  dpre = GELU'(pre) ∘ (dout·W2), dW2 (+=) = dout^T·h, db2 (+=)
//             (W2 [C, OC] the fcproj weight, h = GELU(pre) its input)
//   version 1: separate (the product, then the GELU kernels; today's path)
//   version 2: fused (GELU_AUX_BIAS on the forward, DGELU on the backward),
//              falling back to version 1 per call when the epilogue's rules
//              do not hold (the misaligned cases below take that path)
// Both are checked against the CPU reference (llmc/backend/cpu_ops.h, fp32
// from the same bf16-rounded inputs). The fused forward takes the GELU of
// the fp32 accumulator, the separate one of pre rounded to bf16, so the two
// differ by about one bf16 rounding; the CPU reference sits between them.
// Then both are timed at GPT-2 d12's MLP shapes.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/matmul.cuh"

using namespace llmc_cuda;

template <typename E>
void check(MatmulContext& ctx, int version, int N, int C, int OC, int shift, double tol) {
    const bool fuse = version == 2;
    const std::vector<float> inp = lab::rand_normal((size_t)N * C, 1.f, 11), w = lab::rand_normal((size_t)OC * C, 0.05f, 12);
    const std::vector<float> b = lab::rand_normal(OC, 0.5f, 13), w2 = lab::rand_normal((size_t)C * OC, 0.05f, 14);
    const std::vector<float> dout = lab::rand_normal((size_t)N * C, 1.f, 15);
    // CPU reference on the values the device holds (bf16-rounded in bf16 mode).
    auto held = [](std::vector<float> v) {
        if (std::is_same<E, bf16>::value)
            for (float& x : v) x = lab::round_bf16(x);
        return v;
    };
    const std::vector<float> hi = held(inp), hw = held(w), hb = held(b), hw2 = held(w2), hd = held(dout);
    std::vector<float> pre((size_t)N * OC), out(pre.size()), dh(pre.size()), dpre(pre.size());
    std::vector<float> dw2((size_t)C * OC, 0.f), db2(C, 0.f);
    cpu::matmul_forward(pre.data(), hi.data(), hw.data(), hb.data(), N, C, OC);
    cpu::gelu_forward(out.data(), pre.data(), pre.size());
    const std::vector<float> hpre = held(pre), hout = held(out);  // what the backward reads
    cpu::matmul_backward(dh.data(), dw2.data(), db2.data(), hd.data(), hout.data(), hw2.data(), N, OC, C);
    cpu::gelu_backward(dpre.data(), hpre.data(), dh.data(), dh.size());

    E *bi, *bw, *bb, *bw2, *bd, *bpre, *bout, *bdpre, *bdw2, *bdb2;
    E* d_inp = lab::to_device_shifted<E>(inp, shift, &bi);
    E* d_w = lab::to_device_shifted<E>(w, shift, &bw);
    E* d_b = lab::to_device_shifted<E>(b, shift, &bb);
    E* d_w2 = lab::to_device_shifted<E>(w2, shift, &bw2);
    E* d_dout = lab::to_device_shifted<E>(dout, shift, &bd);
    E* d_pre = lab::to_device_shifted<E>(std::vector<float>(pre.size(), 0.f), shift, &bpre);
    E* d_out = lab::to_device_shifted<E>(std::vector<float>(pre.size(), 0.f), shift, &bout);
    E* d_dpre = lab::to_device_shifted<E>(std::vector<float>(pre.size(), 0.f), shift, &bdpre);
    E* d_dw2 = lab::to_device_shifted<E>(std::vector<float>(dw2.size(), 0.f), shift, &bdw2);
    E* d_db2 = lab::to_device_shifted<E>(std::vector<float>(C, 0.f), shift, &bdb2);
    float* scratch = lab::dev_alloc<float>(matmul_backward_scratch_floats(N, C));
    matmul_gelu_forward<E>(ctx, fuse, d_pre, d_out, d_inp, d_w, d_b, N, C, OC);
    matmul_backward_gelu<E>(ctx, fuse, d_dpre, d_dw2, d_db2, d_dout, d_out, d_w2, d_pre, N, OC, C, scratch);
    char l[160];
    const char* name = version == 1 ? "v1 separate" : "v2 fused";
    const char* ty = std::is_same<E, bf16>::value ? "bf16" : "fp32";
    std::snprintf(l, sizeof l, "%s %s fwd pre N=%d OC=%d%s", name, ty, N, OC, shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(d_pre, pre.size()), pre, tol);
    std::snprintf(l, sizeof l, "%s %s fwd gelu N=%d OC=%d%s", name, ty, N, OC, shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(d_out, out.size()), out, tol);
    std::snprintf(l, sizeof l, "%s %s bwd dpre N=%d OC=%d%s", name, ty, N, OC, shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(d_dpre, dpre.size()), dpre, tol);
    std::snprintf(l, sizeof l, "%s %s bwd dW2 N=%d OC=%d%s", name, ty, N, OC, shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(d_dw2, dw2.size()), dw2, tol);
    std::snprintf(l, sizeof l, "%s %s bwd db2 N=%d OC=%d%s", name, ty, N, OC, shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(d_db2, db2.size()), db2, tol);
    for (E* p : {bi, bw, bb, bw2, bd, bpre, bout, bdpre, bdw2, bdb2}) lab::dev_free(p);
    lab::dev_free(scratch);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    MatmulContext ctx;
    ctx.init(0);
    struct Shape {
        int N, C, OC, shift;
    };
    // d12's MLP at a few rows; OC not a multiple of 8 (no epilogue: the
    // fallback); every pointer 2 elements off (the fallback again).
    const Shape shapes[] = {{256, 768, 3072, 0}, {300, 64, 256, 0}, {64, 48, 100, 0}, {128, 64, 256, 2}};
    std::printf("validation\n");
    for (const Shape& s : shapes) {
        for (int v = 1; v <= 2; v++) {
            check<float>(ctx, v, s.N, s.C, s.OC, s.shift, lab::kTolF32);
            check<bf16>(ctx, v, s.N, s.C, s.OC, s.shift, lab::kTolBF16);
        }
    }
    if (lab::check_only()) return ctx.destroy(), lab::finish();

    // d12, B·T = 8·1024 rows: fc 768 -> 3072 with its GELU; fcproj's backward
    // 3072 -> 768 with the GELU' (the weight gradient and the bias included,
    // as the model runs it).
    const int N = 8 * 1024, C = 768, OC = 3072;
    bf16* inp = lab::to_device<bf16>(lab::rand_normal((size_t)N * C, 1.f, 21));
    bf16* w = lab::to_device<bf16>(lab::rand_normal((size_t)OC * C, 0.05f, 22));
    bf16* b = lab::to_device<bf16>(lab::rand_normal(OC, 0.5f, 23));
    bf16* w2 = lab::to_device<bf16>(lab::rand_normal((size_t)C * OC, 0.05f, 24));
    bf16* dout = lab::to_device<bf16>(lab::rand_normal((size_t)N * C, 1.f, 25));
    bf16 *pre = lab::dev_alloc<bf16>((size_t)N * OC), *out = lab::dev_alloc<bf16>((size_t)N * OC);
    bf16 *dpre = lab::dev_alloc<bf16>((size_t)N * OC), *dw2 = lab::dev_alloc<bf16>((size_t)C * OC);
    bf16* db2 = lab::dev_alloc<bf16>(C);
    float* scratch = lab::dev_alloc<float>(matmul_backward_scratch_floats(N, C));
    std::printf("timing (bf16, d12 MLP, %d rows)\n", N);
    for (int v = 1; v <= 2; v++) {
        const bool fuse = v == 2;
        const char* name = fuse ? "v2 fused" : "v1 separate";
        char l[96];
        float ms = lab::time_ms([&] { matmul_gelu_forward<bf16>(ctx, fuse, pre, out, inp, w, b, N, C, OC); });
        std::snprintf(l, sizeof l, "%s fc+gelu fwd %dx%d->%d", name, N, C, OC);
        lab::report_tflops(l, ms, 2.0 * N * C * (double)OC);
        ms = lab::time_ms(
            [&] { matmul_backward_gelu<bf16>(ctx, fuse, dpre, dw2, db2, dout, out, w2, pre, N, OC, C, scratch); });
        std::snprintf(l, sizeof l, "%s fcproj+gelu bwd %dx%d->%d", name, N, OC, C);
        lab::report_tflops(l, ms, 4.0 * N * C * (double)OC);
    }
    for (bf16* p : {inp, w, b, w2, dout, pre, out, dpre, dw2, db2}) lab::dev_free(p);
    lab::dev_free(scratch);
    ctx.destroy();
    return lab::finish();
}
