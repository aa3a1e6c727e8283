// dev/cuda/layernorm_backward.cu: kernel lab for LayerNorm backward:
// dinp (+=), dw (+=), db (+=) from dout, inp, w and the forward's mean/rstd.
//   version 1: one thread per row for dinp, one thread per channel for dw, db
//              (naive, two kernels)
//   version 2: the previous production kernel (dev/cuda/previous.h: warp
//              per row, 2-byte accesses, dw/db through shared-memory atomics,
//              so the last bits vary run to run)
//   version 3: llmc/backend/cuda/layernorm.cuh (production: warp per row, 16-byte
//              accesses, dw/db summed per warp in registers, warps added in
//              warp order, blocks by a fixed-order column sum: no atomics,
//              the same bits every run)
// Version 3 is also checked for bit-identical dinp, dw, db over two runs, on
// C = 1600 (d48), with unaligned weights, and on an odd C (scalar kernel).
#include <cstring>

#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/layernorm.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void ln_bwd_rows_v1(E* dinp, const E* dout, const E* inp, const E* w, const float* mean,
                               const float* rstd, int N, int C) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t o = (size_t)n * C;
    float a = 0.f, b = 0.f;
    for (int c = 0; c < C; c++) {
        const float xh = (to_float(inp[o + c]) - mean[n]) * rstd[n], dn = to_float(w[c]) * to_float(dout[o + c]);
        a += dn;
        b += dn * xh;
    }
    a /= C;
    b /= C;
    for (int c = 0; c < C; c++) {
        const float xh = (to_float(inp[o + c]) - mean[n]) * rstd[n], dn = to_float(w[c]) * to_float(dout[o + c]);
        dinp[o + c] = from_float<E>(to_float(dinp[o + c]) + (dn - a - xh * b) * rstd[n]);
    }
}

template <typename E>
__global__ void ln_bwd_cols_v1(E* dw, E* db, const E* dout, const E* inp, const float* mean, const float* rstd, int N,
                               int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float gw = 0.f, gb = 0.f;
    for (int n = 0; n < N; n++) {
        const float g = to_float(dout[(size_t)n * C + c]);
        gw += (to_float(inp[(size_t)n * C + c]) - mean[n]) * rstd[n] * g;
        gb += g;
    }
    dw[c] = from_float<E>(to_float(dw[c]) + gw);
    db[c] = from_float<E>(to_float(db[c]) + gb);
}

template <typename E>
void run(int version, E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, const float* mean,
         const float* rstd, int N, int C, float* scratch) {
    if (version == 1) {
        ln_bwd_rows_v1<E><<<(unsigned)ceil_div(N, 128), 128>>>(dinp, dout, inp, w, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH();
        ln_bwd_cols_v1<E><<<(unsigned)ceil_div(C, 128), 128>>>(dw, db, dout, inp, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::layernorm_backward<E>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, 0);
    } else {
        layernorm_backward<E>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, 0);
    }
}

struct Inputs {
    int N, C;
    std::vector<float> dout, inp, w, mean, rstd, dinp0, dw0, db0;
};

// Scratch for every version (the previous kernel's need is smaller).
inline size_t scratch_floats(int N, int C) {
    return std::max(layernorm_backward_scratch_floats(N, C), llmc_prev::layernorm_backward_scratch_floats(N, C));
}

// woff: element offset of w from its allocation (1: unaligned).
template <typename E>
void check(int version, const char* label, const Inputs& in, double tol, int woff = 0) {
    const int N = in.N, C = in.C;
    std::vector<float> rdinp = in.dinp0, rdw = in.dw0, rdb = in.db0;
    cpu::layernorm_backward(rdinp.data(), rdw.data(), rdb.data(), in.dout.data(), in.inp.data(), in.w.data(),
                            in.mean.data(), in.rstd.data(), N, C);
    E* ddout = lab::to_device<E>(in.dout);
    E* dinp = lab::to_device<E>(in.inp);
    std::vector<float> wp(woff, 0.f);
    wp.insert(wp.end(), in.w.begin(), in.w.end());
    E* dw0 = lab::to_device<E>(wp);
    E* dw = dw0 + woff;
    float* dmean = lab::to_device<float>(in.mean);
    float* drstd = lab::to_device<float>(in.rstd);
    E* ddinp = lab::to_device<E>(in.dinp0);
    E* ddw = lab::to_device<E>(in.dw0);
    E* ddb = lab::to_device<E>(in.db0);
    float* scratch = lab::dev_alloc<float>(scratch_floats(N, C));
    run<E>(version, ddinp, ddw, ddb, ddout, dinp, dw, dmean, drstd, N, C, scratch);
    const std::string l(label);
    const std::vector<float> g_dinp = lab::from_device(ddinp, rdinp.size()), g_dw = lab::from_device(ddw, C),
                             g_db = lab::from_device(ddb, C);
    lab::validate((l + " dinp").c_str(), g_dinp, rdinp, tol);
    lab::validate((l + " dw").c_str(), g_dw, rdw, tol);
    lab::validate((l + " db").c_str(), g_db, rdb, tol);
    if (version == 3) {  // deterministic: a second run from the same state gives the same bits
        lab::copy_to_device<E>(ddinp, in.dinp0);
        lab::copy_to_device<E>(ddw, in.dw0);
        lab::copy_to_device<E>(ddb, in.db0);
        run<E>(version, ddinp, ddw, ddb, ddout, dinp, dw, dmean, drstd, N, C, scratch);
        const bool same = lab::from_device(ddinp, rdinp.size()) == g_dinp && lab::from_device(ddw, C) == g_dw &&
                          lab::from_device(ddb, C) == g_db;
        std::printf("  %-44s %s\n", (l + " second run bit-identical").c_str(), same ? "PASS" : "FAIL");
        (same ? lab::g_passed : lab::g_failed)++;
    }
    lab::dev_free(ddout), lab::dev_free(dinp), lab::dev_free(dw0), lab::dev_free(dmean), lab::dev_free(drstd);
    lab::dev_free(ddinp), lab::dev_free(ddw), lab::dev_free(ddb), lab::dev_free(scratch);
}

Inputs make_inputs(int N, int C, uint64_t seed) {
    Inputs in{N, C};
    in.inp = lab::rand_normal((size_t)N * C, 1.f, seed);
    in.dout = lab::rand_normal((size_t)N * C, 1.f, seed + 1);
    in.w = lab::rand_uniform(C, 0.5f, 1.5f, seed + 2);
    std::vector<float> b(C, 0.f), out((size_t)N * C);
    in.mean.resize(N);
    in.rstd.resize(N);
    cpu::layernorm_forward(out.data(), in.mean.data(), in.rstd.data(), in.inp.data(), in.w.data(), b.data(), N, C);
    in.dinp0 = lab::rand_normal((size_t)N * C, 0.5f, seed + 3);
    in.dw0 = lab::rand_normal(C, 0.5f, seed + 4);
    in.db0 = lab::rand_normal(C, 0.5f, seed + 5);
    return in;
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768, N = B * T;
    const Inputs in = make_inputs(N, C, 1);
    std::printf("validation (N=%d C=%d, and N=100 C=48)\n", N, C);
    check<float>(1, "v1 fp32", in, lab::kTolF32);
    check<float>(2, "v2 fp32", in, lab::kTolF32);
    check<bf16>(2, "v2 bf16", in, lab::kTolBF16);
    check<float>(3, "v3 fp32", in, lab::kTolF32);
    check<bf16>(3, "v3 bf16", in, lab::kTolBF16);
    check<bf16>(3, "v3 bf16 unaligned w", in, lab::kTolBF16, 1);
    check<float>(3, "v3 fp32 small", make_inputs(100, 48, 11), lab::kTolF32);
    check<float>(3, "v3 fp32 C=45 (scalar kernel)", make_inputs(300, 45, 12), lab::kTolF32);
    {
        const Inputs big = make_inputs(2048, 1600, 13);  // d48: 7 packs per lane in bf16
        check<float>(3, "v3 fp32 C=1600 (scalar kernel)", big, lab::kTolF32);
        check<bf16>(3, "v3 bf16 C=1600", big, lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d C=%d)\n", N, C);
    bf16* ddout = lab::to_device<bf16>(in.dout);
    bf16* dinp = lab::to_device<bf16>(in.inp);
    bf16* dw = lab::to_device<bf16>(in.w);
    float* dmean = lab::to_device<float>(in.mean);
    float* drstd = lab::to_device<float>(in.rstd);
    bf16* ddinp = lab::to_device<bf16>(in.dinp0);
    bf16* ddw = lab::to_device<bf16>(in.dw0);
    bf16* ddb = lab::to_device<bf16>(in.db0);
    float* scratch = lab::dev_alloc<float>(scratch_floats(N, C));
    const double bytes = 4.0 * N * C * sizeof(bf16);  // dout, inp, dinp read + dinp written
    const char* names[] = {"", "v1 naive", "v2 previous (smem atomics)", "v3 production (deterministic)"};
    for (int v = 1; v <= 3; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, ddinp, ddw, ddb, ddout, dinp, dw, dmean, drstd, N, C, scratch); });
        lab::report_bw(names[v], ms, bytes);
    }
    lab::dev_free(ddout), lab::dev_free(dinp), lab::dev_free(dw), lab::dev_free(dmean), lab::dev_free(drstd);
    lab::dev_free(ddinp), lab::dev_free(ddw), lab::dev_free(ddb), lab::dev_free(scratch);
    return lab::finish();
}
