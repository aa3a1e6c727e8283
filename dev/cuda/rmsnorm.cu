// dev/cuda/rmsnorm.cu: kernel lab for RMSNorm (Llama): forward (out, rstd),
// the fused residual-add + RMSNorm forward (residual = a + b, out, rstd),
// and the backward (dinp +=, dw +=) from dout, inp, w and the forward's rstd.
//   version 1: one thread per row (forward, dinp), one thread per channel
//              for dw (naive)
//   version 2: llmc/backend/cuda/rmsnorm.cuh (production: warp per row, 16-byte
//              accesses, the row held in registers up to 32·8·pack channels
//              and a looped 16-byte kernel beyond (C = 4096 in bf16), an
//              element-wise loop for odd C or unaligned rows; dw summed per
//              warp, warps in warp order, blocks by a fixed-order column
//              sum: no atomics, the same bits every run)
// Checked against the CPU op (llmc/backend/cpu_ops.h) on odd shapes (C = 45: the
// element-wise loop; unaligned w), GPT-2 d12 (C = 768) and Llama-like rows
// (C = 2048 in registers, C = 4096 on the looped vector path, fp32 C = 2048
// looped), in place (residual over a) and for bit-identical backward runs.
// Timing (bf16): d12 (N = 8192, C = 768) and Llama-like (N = 8192, C = 4096),
// GB/s with bytes = each operand read once and each output written once.
#include <cstring>

#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/rmsnorm.cuh"

using namespace llmc_cuda;

constexpr double kEps = 1e-5;

template <typename E>
__global__ void rms_fwd_v1(E* residual, E* out, float* rstd, const E* a, const E* b, const E* w, int N, int C,
                           float eps) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t o = (size_t)n * C;
    const E* x = a + o;
    if (b) {  // fused residual
        for (int c = 0; c < C; c++) residual[o + c] = from_float<E>(to_float(a[o + c]) + to_float(b[o + c]));
        x = residual + o;
    }
    float ss = 0.f;
    for (int c = 0; c < C; c++) ss += to_float(x[c]) * to_float(x[c]);
    const float r = 1.f / sqrtf(ss / C + eps);
    for (int c = 0; c < C; c++) out[o + c] = from_float<E>(to_float(x[c]) * r * to_float(w[c]));
    rstd[n] = r;
}

template <typename E>
__global__ void rms_bwd_rows_v1(E* dinp, const E* dout, const E* inp, const E* w, const float* rstd, int N, int C) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t o = (size_t)n * C;
    const float r = rstd[n];
    float dot = 0.f;
    for (int c = 0; c < C; c++) dot += to_float(inp[o + c]) * to_float(w[c]) * to_float(dout[o + c]);
    dot /= C;
    for (int c = 0; c < C; c++)
        dinp[o + c] = from_float<E>(to_float(dinp[o + c]) + r * to_float(w[c]) * to_float(dout[o + c]) -
                                    to_float(inp[o + c]) * r * r * r * dot);
}

template <typename E>
__global__ void rms_bwd_cols_v1(E* dw, const E* dout, const E* inp, const float* rstd, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float g = 0.f;
    for (int n = 0; n < N; n++) g += to_float(inp[(size_t)n * C + c]) * rstd[n] * to_float(dout[(size_t)n * C + c]);
    dw[c] = from_float<E>(to_float(dw[c]) + g);
}

// b null: plain forward; otherwise the fused residual forward.
template <typename E>
void run_fwd(int version, E* residual, E* out, float* rstd, const E* a, const E* b, const E* w, int N, int C) {
    if (version == 1) {
        rms_fwd_v1<E><<<(unsigned)ceil_div(N, 128), 128>>>(residual, out, rstd, a, b, w, N, C, (float)kEps);
        CUDA_CHECK_LAUNCH();
    } else if (b) {
        residual_rmsnorm_forward<E>(residual, out, rstd, a, b, w, N, C, kEps, 0);
    } else {
        rmsnorm_forward<E>(out, rstd, a, w, N, C, kEps, 0);
    }
}

template <typename E>
void run_bwd(int version, E* dinp, E* dw, const E* dout, const E* inp, const E* w, const float* rstd, int N, int C,
             float* scratch) {
    if (version == 1) {
        rms_bwd_rows_v1<E><<<(unsigned)ceil_div(N, 128), 128>>>(dinp, dout, inp, w, rstd, N, C);
        CUDA_CHECK_LAUNCH();
        rms_bwd_cols_v1<E><<<(unsigned)ceil_div(C, 128), 128>>>(dw, dout, inp, rstd, N, C);
        CUDA_CHECK_LAUNCH();
    } else {
        rmsnorm_backward<E>(dinp, dw, dout, inp, w, rstd, N, C, scratch, 0);
    }
}

struct Inputs {
    int N, C;
    std::vector<float> a, b, w, dout, dinp0, dw0;
};

Inputs make_inputs(int N, int C, uint64_t seed) {
    Inputs in{N, C};
    in.a = lab::rand_normal((size_t)N * C, 1.f, seed);
    in.b = lab::rand_normal((size_t)N * C, 0.5f, seed + 1);
    in.w = lab::rand_uniform(C, 0.5f, 1.5f, seed + 2);
    in.dout = lab::rand_normal((size_t)N * C, 1.f, seed + 3);
    in.dinp0 = lab::rand_normal((size_t)N * C, 0.5f, seed + 4);
    in.dw0 = lab::rand_normal(C, 0.5f, seed + 5);
    return in;
}

// woff: element offset of w from its allocation (1: unaligned, element-wise reads).
template <typename E>
void check_forward(int version, const char* label, const Inputs& in, double tol, int woff = 0) {
    const int N = in.N, C = in.C;
    const size_t n = (size_t)N * C;
    std::vector<float> rout(n), rrstd(N), rres(n), rout2(n), rrstd2(N);
    cpu::rmsnorm_forward(rout.data(), rrstd.data(), in.a.data(), in.w.data(), N, C, kEps);
    // The fused reference rounds the residual to E, as the kernel stores it
    // (and normalises the rounded value): a no-op for fp32.
    cpu::residual_forward(rres.data(), in.a.data(), in.b.data(), n);
    if (sizeof(E) == 2)
        for (float& x : rres) x = lab::round_bf16(x);
    cpu::rmsnorm_forward(rout2.data(), rrstd2.data(), rres.data(), in.w.data(), N, C, kEps);

    E* a = lab::to_device<E>(in.a);
    E* b = lab::to_device<E>(in.b);
    std::vector<float> wp(woff, 0.f);
    wp.insert(wp.end(), in.w.begin(), in.w.end());
    E* w0 = lab::to_device<E>(wp);
    E* w = w0 + woff;
    E* out = lab::dev_alloc<E>(n);
    E* res = lab::dev_alloc<E>(n);
    float* rstd = lab::dev_alloc<float>(N);
    const std::string l(label);
    run_fwd<E>(version, nullptr, out, rstd, a, nullptr, w, N, C);
    lab::validate((l + " fwd out").c_str(), lab::from_device(out, n), rout, tol);
    lab::validate((l + " fwd rstd").c_str(), lab::from_device(rstd, N), rrstd, lab::kTolF32);
    run_fwd<E>(version, res, out, rstd, a, b, w, N, C);
    lab::validate((l + " residual fwd residual").c_str(), lab::from_device(res, n), rres, tol);
    lab::validate((l + " residual fwd out").c_str(), lab::from_device(out, n), rout2, tol);
    lab::validate((l + " residual fwd rstd").c_str(), lab::from_device(rstd, N), rrstd2, lab::kTolF32);
    if (version == 2) {  // in place: residual over a, as the model may call it
        run_fwd<E>(version, a, out, rstd, a, b, w, N, C);
        lab::validate((l + " residual fwd in place").c_str(), lab::from_device(a, n), rres, tol);
        lab::validate((l + " residual fwd in place out").c_str(), lab::from_device(out, n), rout2, tol);
    }
    lab::dev_free(a), lab::dev_free(b), lab::dev_free(w0), lab::dev_free(out), lab::dev_free(res), lab::dev_free(rstd);
}

template <typename E>
void check_backward(int version, const char* label, const Inputs& in, double tol, int woff = 0) {
    const int N = in.N, C = in.C;
    const size_t n = (size_t)N * C;
    std::vector<float> out(n), rs(N);
    cpu::rmsnorm_forward(out.data(), rs.data(), in.a.data(), in.w.data(), N, C, kEps);
    std::vector<float> rdinp = in.dinp0, rdw = in.dw0;
    cpu::rmsnorm_backward(rdinp.data(), rdw.data(), in.dout.data(), in.a.data(), in.w.data(), rs.data(), N, C);

    E* dout = lab::to_device<E>(in.dout);
    E* inp = lab::to_device<E>(in.a);
    std::vector<float> wp(woff, 0.f);
    wp.insert(wp.end(), in.w.begin(), in.w.end());
    E* w0 = lab::to_device<E>(wp);
    E* w = w0 + woff;
    float* rstd = lab::to_device<float>(rs);
    E* dinp = lab::to_device<E>(in.dinp0);
    E* dw = lab::to_device<E>(in.dw0);
    float* scratch = lab::dev_alloc<float>(rmsnorm_backward_scratch_floats(N, C));
    run_bwd<E>(version, dinp, dw, dout, inp, w, rstd, N, C, scratch);
    const std::string l(label);
    const std::vector<float> g_dinp = lab::from_device(dinp, n), g_dw = lab::from_device(dw, C);
    lab::validate((l + " bwd dinp").c_str(), g_dinp, rdinp, tol);
    lab::validate((l + " bwd dw").c_str(), g_dw, rdw, tol);
    if (version == 2) {  // deterministic: a second run from the same state gives the same bits
        lab::copy_to_device<E>(dinp, in.dinp0);
        lab::copy_to_device<E>(dw, in.dw0);
        run_bwd<E>(version, dinp, dw, dout, inp, w, rstd, N, C, scratch);
        const bool same = lab::from_device(dinp, n) == g_dinp && lab::from_device(dw, C) == g_dw;
        std::printf("  %-44s %s\n", (l + " bwd second run bit-identical").c_str(), same ? "PASS" : "FAIL");
        (same ? lab::g_passed : lab::g_failed)++;
    }
    lab::dev_free(dout), lab::dev_free(inp), lab::dev_free(w0), lab::dev_free(rstd), lab::dev_free(dinp),
        lab::dev_free(dw), lab::dev_free(scratch);
}

template <typename E>
void check_both(int version, const char* label, const Inputs& in, double tol, int woff = 0) {
    check_forward<E>(version, label, in, tol, woff);
    check_backward<E>(version, label, in, tol, woff);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    std::printf("validation (eps %.0e)\n", kEps);
    {
        const Inputs in = make_inputs(300, 45, 1);  // odd C: the element-wise loop
        check_both<float>(1, "v1 fp32 N=300 C=45", in, lab::kTolF32);
        check_both<float>(2, "v2 fp32 N=300 C=45", in, lab::kTolF32);
        check_both<bf16>(2, "v2 bf16 N=300 C=45", in, lab::kTolBF16);
    }
    {
        const Inputs in = make_inputs(8192, 768, 2);  // GPT-2 d12 rows: registers (3 packs bf16, 6 fp32)
        check_both<float>(1, "v1 fp32 N=8192 C=768", in, lab::kTolF32);
        check_both<float>(2, "v2 fp32 N=8192 C=768", in, lab::kTolF32);
        check_both<bf16>(2, "v2 bf16 N=8192 C=768", in, lab::kTolBF16);
        check_both<bf16>(2, "v2 bf16 N=8192 C=768 unaligned w", in, lab::kTolBF16, 1);
    }
    {
        const Inputs in = make_inputs(1000, 2048, 3);  // Llama 1B rows: 8 packs (bf16), looped (fp32)
        check_both<float>(2, "v2 fp32 N=1000 C=2048 (looped)", in, lab::kTolF32);
        check_both<bf16>(2, "v2 bf16 N=1000 C=2048", in, lab::kTolBF16);
    }
    {
        const Inputs in = make_inputs(777, 4096, 4);  // Llama 8B rows: looped 16-byte path
        check_both<float>(2, "v2 fp32 N=777 C=4096 (looped)", in, lab::kTolF32);
        check_both<bf16>(2, "v2 bf16 N=777 C=4096 (looped)", in, lab::kTolBF16);
        check_both<bf16>(2, "v2 bf16 N=777 C=4096 unaligned w", in, lab::kTolBF16, 1);
    }
    {
        const Inputs in = make_inputs(5, 8, 5);  // tiny: one pack per row, idle lanes
        check_both<float>(2, "v2 fp32 N=5 C=8", in, lab::kTolF32);
        check_both<bf16>(2, "v2 bf16 N=5 C=8", in, lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16; bytes = each operand read once, each output written once)\n");
    for (const int C : {768, 4096}) {
        const int N = 8192;
        const size_t n = (size_t)N * C;
        const Inputs in = make_inputs(N, C, 9);
        std::vector<float> out(n), rs(N);
        cpu::rmsnorm_forward(out.data(), rs.data(), in.a.data(), in.w.data(), N, C, kEps);
        bf16* a = lab::to_device<bf16>(in.a);
        bf16* b = lab::to_device<bf16>(in.b);
        bf16* w = lab::to_device<bf16>(in.w);
        bf16* o = lab::dev_alloc<bf16>(n);
        bf16* res = lab::dev_alloc<bf16>(n);
        bf16* dout = lab::to_device<bf16>(in.dout);
        bf16* dinp = lab::to_device<bf16>(in.dinp0);
        bf16* dw = lab::to_device<bf16>(in.dw0);
        float* rstd = lab::to_device<float>(rs);
        float* rstd2 = lab::dev_alloc<float>(N);
        float* scratch = lab::dev_alloc<float>(rmsnorm_backward_scratch_floats(N, C));
        std::printf(" N=%d C=%d\n", N, C);
        const char* names[] = {"", "v1 naive", "v2 production"};
        for (int v = 1; v <= 2; v++) {
            const std::string nm = std::string(names[v]) + " C=" + std::to_string(C);
            float ms = lab::time_ms([&] { run_fwd<bf16>(v, nullptr, o, rstd2, a, nullptr, w, N, C); });
            lab::report_bw(("forward " + nm).c_str(), ms, 2.0 * n * sizeof(bf16));
            ms = lab::time_ms([&] { run_fwd<bf16>(v, res, o, rstd2, a, b, w, N, C); });
            lab::report_bw(("residual forward " + nm).c_str(), ms, 4.0 * n * sizeof(bf16));
            ms = lab::time_ms([&] { run_bwd<bf16>(v, dinp, dw, dout, a, w, rstd, N, C, scratch); });
            lab::report_bw(("backward " + nm).c_str(), ms, 4.0 * n * sizeof(bf16));  // dout, inp, dinp read; dinp written
        }
        lab::dev_free(a), lab::dev_free(b), lab::dev_free(w), lab::dev_free(o), lab::dev_free(res),
            lab::dev_free(dout), lab::dev_free(dinp), lab::dev_free(dw), lab::dev_free(rstd), lab::dev_free(rstd2),
            lab::dev_free(scratch);
    }
    return lab::finish();
}
