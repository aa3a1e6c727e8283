// dev/cuda/residual_layernorm_forward.cu: kernel lab for the fused
// residual = a + b; out = LayerNorm(residual) forward.
//   version 1: residual_forward kernel, then layernorm_forward (two kernels,
//              the unfused composition)
//   version 2: the previous production kernel (dev/cuda/previous.h: fused,
//              2-byte accesses, the residual row read back three times)
//   version 3: llmc/backend/cuda/layernorm.cuh residual_layernorm_forward
//              (production: a and b read once with 16-byte loads, the
//              rounded residual kept in registers for the statistics)
// Also checks the aliasing the contract allows (residual == a, residual == b).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/elementwise.cuh"
#include "llmc/backend/cuda/layernorm.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
void run(int version, E* res, E* out, float* mean, float* rstd, const E* a, const E* b, const E* w, const E* bias,
         int N, int C) {
    if (version == 1) {
        residual_forward<E>(res, a, b, (size_t)N * C, 0);
        layernorm_forward<E>(out, mean, rstd, res, w, bias, N, C, 0);
    } else if (version == 2) {
        llmc_prev::residual_layernorm_forward<E>(res, out, mean, rstd, a, b, w, bias, N, C, 0);
    } else {
        residual_layernorm_forward<E>(res, out, mean, rstd, a, b, w, bias, N, C, 0);
    }
}

// alias: 0 none, 1 residual == a, 2 residual == b.
template <typename E>
void check(int version, const char* label, const std::vector<float>& a, const std::vector<float>& b,
           const std::vector<float>& w, const std::vector<float>& bias, int N, int C, int alias, double tol) {
    std::vector<float> rres((size_t)N * C), rout((size_t)N * C), rmean(N), rrstd(N);
    cpu::residual_layernorm_forward(rres.data(), rout.data(), rmean.data(), rrstd.data(), a.data(), b.data(), w.data(),
                                    bias.data(), N, C);
    E* da = lab::to_device<E>(a);
    E* db = lab::to_device<E>(b);
    E* dw = lab::to_device<E>(w);
    E* dbias = lab::to_device<E>(bias);
    E* dres = alias == 1 ? da : alias == 2 ? db : lab::dev_alloc<E>(rres.size());
    E* dout = lab::dev_alloc<E>(rout.size());
    float* dmean = lab::dev_alloc<float>(N);
    float* drstd = lab::dev_alloc<float>(N);
    run<E>(version, dres, dout, dmean, drstd, da, db, dw, dbias, N, C);
    const std::string l(label);
    lab::validate((l + " residual").c_str(), lab::from_device(dres, rres.size()), rres, tol);
    lab::validate((l + " out").c_str(), lab::from_device(dout, rout.size()), rout, tol);
    lab::validate((l + " mean").c_str(), lab::from_device(dmean, N), rmean, tol);
    lab::validate((l + " rstd").c_str(), lab::from_device(drstd, N), rrstd, tol);
    if (!alias) lab::dev_free(dres);
    lab::dev_free(da), lab::dev_free(db), lab::dev_free(dw), lab::dev_free(dbias), lab::dev_free(dout),
        lab::dev_free(dmean), lab::dev_free(drstd);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768, N = B * T;
    std::vector<float> a = lab::rand_normal((size_t)N * C, 1.f, 1), b = lab::rand_normal((size_t)N * C, 0.5f, 2);
    std::vector<float> w = lab::rand_uniform(C, 0.5f, 1.5f, 3), bias = lab::rand_normal(C, 0.1f, 4);

    std::printf("validation (N=%d C=%d)\n", N, C);
    check<float>(1, "v1 fp32", a, b, w, bias, N, C, 0, lab::kTolF32);
    check<float>(2, "v2 fp32", a, b, w, bias, N, C, 0, lab::kTolF32);
    check<float>(2, "v2 fp32 residual aliases a", a, b, w, bias, N, C, 1, lab::kTolF32);
    check<float>(3, "v3 fp32", a, b, w, bias, N, C, 0, lab::kTolF32);
    check<float>(3, "v3 fp32 residual aliases a", a, b, w, bias, N, C, 1, lab::kTolF32);
    check<float>(3, "v3 fp32 residual aliases b", a, b, w, bias, N, C, 2, lab::kTolF32);
    // bf16: the residual is rounded before LayerNorm; the reference sees the
    // unrounded sum, hence the bf16 tolerance on every output.
    check<bf16>(2, "v2 bf16", a, b, w, bias, N, C, 0, lab::kTolBF16);
    check<bf16>(3, "v3 bf16", a, b, w, bias, N, C, 0, lab::kTolBF16);
    check<bf16>(3, "v3 bf16 residual aliases a", a, b, w, bias, N, C, 1, lab::kTolBF16);
    {
        const int Cs = 40, Ns = 777;  // C % 8 != 0 in bf16: the scalar kernel
        std::vector<float> a2(a.begin(), a.begin() + (size_t)Ns * Cs), b2(b.begin(), b.begin() + (size_t)Ns * Cs),
            w2(w.begin(), w.begin() + Cs), bias2(bias.begin(), bias.begin() + Cs);
        check<bf16>(3, "v3 bf16 C=40 (scalar kernel)", a2, b2, w2, bias2, Ns, Cs, 0, lab::kTolBF16);
        check<float>(3, "v3 fp32 C=40 (4-wide packs)", a2, b2, w2, bias2, Ns, Cs, 0, lab::kTolF32);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d C=%d)\n", N, C);
    bf16* da = lab::to_device<bf16>(a);
    bf16* db = lab::to_device<bf16>(b);
    bf16* dw = lab::to_device<bf16>(w);
    bf16* dbias = lab::to_device<bf16>(bias);
    bf16* dres = lab::dev_alloc<bf16>((size_t)N * C);
    bf16* dout = lab::dev_alloc<bf16>((size_t)N * C);
    float* dmean = lab::dev_alloc<float>(N);
    float* drstd = lab::dev_alloc<float>(N);
    const double bytes = 4.0 * N * C * sizeof(bf16);  // a, b in; residual, out out
    const char* names[] = {"", "v1 unfused", "v2 previous (fused)", "v3 production (fused, 16-byte)"};
    for (int v = 1; v <= 3; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dres, dout, dmean, drstd, da, db, dw, dbias, N, C); });
        lab::report_bw(names[v], ms, bytes);
    }
    lab::dev_free(da), lab::dev_free(db), lab::dev_free(dw), lab::dev_free(dbias), lab::dev_free(dres),
        lab::dev_free(dout), lab::dev_free(dmean), lab::dev_free(drstd);
    return lab::finish();
}
