// dev/cuda/layernorm_forward.cu: kernel lab for LayerNorm forward
// (out, mean, rstd; eps 1e-5, biased variance).
//   version 1: one thread per row, three passes (naive)
//   version 2: the previous production kernel (dev/cuda/previous.h: one
//              warp per row, the row read three times, 2-byte accesses)
//   version 3: llmc/backend/cuda/layernorm.cuh (production: one warp per row, the row
//              read once with 16-byte loads into registers, mean and variance
//              from the registers; scalar kernel for other shapes)
// Also checked: C = 1600 (d48, 7 packs per lane), weights at an unaligned
// offset (element-wise weight loads), an odd C (the scalar kernel).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/layernorm.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void layernorm_forward_v1(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N,
                                     int C) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const E* x = inp + (size_t)n * C;
    float m = 0.f;
    for (int c = 0; c < C; c++) m += to_float(x[c]);
    m /= C;
    float v = 0.f;
    for (int c = 0; c < C; c++) v += (to_float(x[c]) - m) * (to_float(x[c]) - m);
    const float s = 1.f / sqrtf(v / C + 1e-5f);
    for (int c = 0; c < C; c++)
        out[(size_t)n * C + c] = from_float<E>((to_float(x[c]) - m) * s * to_float(w[c]) + to_float(b[c]));
    mean[n] = m;
    rstd[n] = s;
}

template <typename E>
void run(int version, E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N, int C) {
    if (version == 1) {
        layernorm_forward_v1<E><<<(unsigned)ceil_div(N, 128), 128>>>(out, mean, rstd, inp, w, b, N, C);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::layernorm_forward<E>(out, mean, rstd, inp, w, b, N, C, 0);
    } else {
        layernorm_forward<E>(out, mean, rstd, inp, w, b, N, C, 0);
    }
}

// woff: element offset of w and b from their allocations (1: unaligned, as
// a LayerNorm weight may sit anywhere in the flat parameter buffer).
template <typename E>
void check(int version, const char* label, const std::vector<float>& inp, const std::vector<float>& w,
           const std::vector<float>& b, int N, int C, double tol, int woff = 0) {
    std::vector<float> rout((size_t)N * C), rmean(N), rrstd(N);
    cpu::layernorm_forward(rout.data(), rmean.data(), rrstd.data(), inp.data(), w.data(), b.data(), N, C);
    E* dinp = lab::to_device<E>(inp);
    std::vector<float> wp(woff, 0.f), bp(woff, 0.f);
    wp.insert(wp.end(), w.begin(), w.end());
    bp.insert(bp.end(), b.begin(), b.end());
    E* dw = lab::to_device<E>(wp);
    E* db = lab::to_device<E>(bp);
    E* dout = lab::dev_alloc<E>(rout.size());
    float* dmean = lab::dev_alloc<float>(N);
    float* drstd = lab::dev_alloc<float>(N);
    run<E>(version, dout, dmean, drstd, dinp, dw + woff, db + woff, N, C);
    const std::string l(label);
    lab::validate((l + " out").c_str(), lab::from_device(dout, rout.size()), rout, tol);
    lab::validate((l + " mean").c_str(), lab::from_device(dmean, N), rmean, lab::kTolF32);
    lab::validate((l + " rstd").c_str(), lab::from_device(drstd, N), rrstd, lab::kTolF32);
    lab::dev_free(dinp), lab::dev_free(dw), lab::dev_free(db), lab::dev_free(dout), lab::dev_free(dmean),
        lab::dev_free(drstd);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768, N = B * T;
    // A non-zero mean per row exercises the two-pass variance.
    std::vector<float> inp = lab::rand_normal((size_t)N * C, 1.f, 1);
    for (size_t i = 0; i < inp.size(); i++) inp[i] = lab::round_bf16(inp[i] + 0.5f);
    std::vector<float> w = lab::rand_uniform(C, 0.5f, 1.5f, 2), b = lab::rand_normal(C, 0.1f, 3);

    std::printf("validation (N=%d C=%d, and an odd C=45)\n", N, C);
    check<float>(1, "v1 fp32", inp, w, b, N, C, lab::kTolF32);
    check<float>(2, "v2 fp32", inp, w, b, N, C, lab::kTolF32);
    check<bf16>(2, "v2 bf16", inp, w, b, N, C, lab::kTolBF16);
    check<float>(3, "v3 fp32", inp, w, b, N, C, lab::kTolF32);
    check<bf16>(3, "v3 bf16", inp, w, b, N, C, lab::kTolBF16);
    check<bf16>(3, "v3 bf16 unaligned weights", inp, w, b, N, C, lab::kTolBF16, 1);
    {
        const int Cs = 45, Ns = 333;
        std::vector<float> i2(inp.begin(), inp.begin() + (size_t)Ns * Cs), w2(w.begin(), w.begin() + Cs),
            b2(b.begin(), b.begin() + Cs);
        check<float>(3, "v3 fp32 C=45 (scalar kernel)", i2, w2, b2, Ns, Cs, lab::kTolF32);
    }
    {
        const int Cs = 1600, Ns = 1000;  // d48: 7 packs per lane in bf16, the scalar kernel in fp32 (> 1024)
        std::vector<float> i2 = lab::rand_normal((size_t)Ns * Cs, 1.f, 7), w2 = lab::rand_uniform(Cs, 0.5f, 1.5f, 8),
                           b2 = lab::rand_normal(Cs, 0.1f, 9);
        check<float>(3, "v3 fp32 C=1600", i2, w2, b2, Ns, Cs, lab::kTolF32);
        check<bf16>(3, "v3 bf16 C=1600", i2, w2, b2, Ns, Cs, lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d C=%d)\n", N, C);
    bf16* dinp = lab::to_device<bf16>(inp);
    bf16* dw = lab::to_device<bf16>(w);
    bf16* db = lab::to_device<bf16>(b);
    bf16* dout = lab::dev_alloc<bf16>((size_t)N * C);
    float* dmean = lab::dev_alloc<float>(N);
    float* drstd = lab::dev_alloc<float>(N);
    const double bytes = 2.0 * N * C * sizeof(bf16) + 2.0 * N * sizeof(float);  // row in, row out, mean, rstd
    const char* names[] = {"", "v1 thread per row", "v2 previous", "v3 production"};
    for (int v = 1; v <= 3; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dout, dmean, drstd, dinp, dw, db, N, C); });
        lab::report_bw(names[v], ms, bytes);
    }
    lab::dev_free(dinp), lab::dev_free(dw), lab::dev_free(db), lab::dev_free(dout), lab::dev_free(dmean),
        lab::dev_free(drstd);
    return lab::finish();
}
