// dev/cuda/matmul_backward.cu: kernel lab for the Linear backward:
// dinp = dout · W (overwrite, optional), dweight (+=) = dout^T · inp,
// dbias (+=) = column sums of dout.
//   version 1: one thread per output element for each of the three (naive)
//   version 2: llmc/backend/cuda/matmul.cuh (production: cuBLASLt with beta = 1 for
//              dweight, the 16-byte column-sum kernel for dbias, whose
//              old and new versions dev/cuda/bias.cu compares)
//   version 3: version 2 with the bias gradient from cuBLASLt's BGRADB
//              epilogue on the dweight product (LLMC_BIAS_GRAD_EPILOGUE=1)
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/matmul.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void dinp_v1(E* dinp, const E* dout, const E* w, int N, int IC, int OC) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (i >= IC) return;
    float acc = 0.f;
    for (int o = 0; o < OC; o++) acc += to_float(dout[(size_t)n * OC + o]) * to_float(w[(size_t)o * IC + i]);
    dinp[(size_t)n * IC + i] = from_float<E>(acc);
}
template <typename E>
__global__ void dweight_v1(E* dw, const E* dout, const E* inp, int N, int IC, int OC) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, o = blockIdx.y;
    if (i >= IC) return;
    float acc = 0.f;
    for (int n = 0; n < N; n++) acc += to_float(dout[(size_t)n * OC + o]) * to_float(inp[(size_t)n * IC + i]);
    dw[(size_t)o * IC + i] = from_float<E>(to_float(dw[(size_t)o * IC + i]) + acc);
}
template <typename E>
__global__ void dbias_v1(E* db, const E* dout, int N, int OC) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float acc = 0.f;
    for (int n = 0; n < N; n++) acc += to_float(dout[(size_t)n * OC + o]);
    db[o] = from_float<E>(to_float(db[o]) + acc);
}

template <typename E>
void run(int version, MatmulContext& ctx, E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, int N,
         int IC, int OC, float* scratch) {
    if (version == 1) {
        if (dinp) dinp_v1<E><<<dim3((unsigned)ceil_div(IC, 128), N), 128>>>(dinp, dout, w, N, IC, OC);
        dweight_v1<E><<<dim3((unsigned)ceil_div(IC, 128), OC), 128>>>(dw, dout, inp, N, IC, OC);
        if (db) dbias_v1<E><<<(unsigned)ceil_div(OC, 128), 128>>>(db, dout, N, OC);
        CUDA_CHECK_LAUNCH();
    } else {
        ctx.bias_grad_epilogue = version == 3;
        matmul_backward<E>(ctx, dinp, dw, db, dout, inp, w, N, IC, OC, scratch);
        ctx.bias_grad_epilogue = false;
    }
}

template <typename E>
void check(int version, MatmulContext& ctx, const char* label, int N, int IC, int OC, bool with_dinp, bool with_bias,
           double tol) {
    const std::vector<float> dout = lab::rand_normal((size_t)N * OC, 1.f, 1), inp = lab::rand_normal((size_t)N * IC, 1.f, 2);
    const std::vector<float> w = lab::rand_normal((size_t)OC * IC, 0.05f, 3);
    const std::vector<float> dw0 = lab::rand_normal((size_t)OC * IC, 1.f, 4), db0 = lab::rand_normal(OC, 1.f, 5);
    std::vector<float> rdinp((size_t)N * IC), rdw = dw0, rdb = db0;
    cpu::matmul_backward(with_dinp ? rdinp.data() : nullptr, rdw.data(), with_bias ? rdb.data() : nullptr, dout.data(),
                         inp.data(), w.data(), N, IC, OC);
    E* ddout = lab::to_device<E>(dout);
    E* dinp_in = lab::to_device<E>(inp);
    E* dwt = lab::to_device<E>(w);
    // dinp starts as garbage: it must be overwritten.
    E* ddinp = with_dinp ? lab::to_device<E>(lab::rand_normal((size_t)N * IC, 5.f, 6)) : nullptr;
    E* ddw = lab::to_device<E>(dw0);
    E* ddb = with_bias ? lab::to_device<E>(db0) : nullptr;
    float* scratch = lab::dev_alloc<float>(matmul_backward_scratch_floats(N, OC));
    run<E>(version, ctx, ddinp, ddw, ddb, ddout, dinp_in, dwt, N, IC, OC, scratch);
    char l[160];
    std::snprintf(l, sizeof l, "%s N=%d IC=%d OC=%d", label, N, IC, OC);
    const std::string s(l);
    if (with_dinp) lab::validate((s + " dinp").c_str(), lab::from_device(ddinp, rdinp.size()), rdinp, tol);
    lab::validate((s + " dweight").c_str(), lab::from_device(ddw, rdw.size()), rdw, tol);
    if (with_bias) lab::validate((s + " dbias").c_str(), lab::from_device(ddb, OC), rdb, tol);
    lab::dev_free(ddout), lab::dev_free(dinp_in), lab::dev_free(dwt), lab::dev_free(ddinp), lab::dev_free(ddw),
        lab::dev_free(ddb), lab::dev_free(scratch);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    MatmulContext ctx;
    ctx.init(0);
    struct Shape {
        int N, IC, OC;
        bool dinp, bias;
    };
    const Shape shapes[] = {{512, 768, 2304, true, true}, {512, 3072, 768, true, true}, {128, 768, 50304, true, false},
                            {300, 48, 97, true, true},    {1000, 64, 192, false, true}};
    std::printf("validation\n");
    for (const Shape& s : shapes) {
        check<float>(1, ctx, "v1 fp32", s.N, s.IC, s.OC, s.dinp, s.bias, lab::kTolF32);
        check<float>(2, ctx, "v2 fp32", s.N, s.IC, s.OC, s.dinp, s.bias, lab::kTolF32);
        check<bf16>(2, ctx, "v2 bf16", s.N, s.IC, s.OC, s.dinp, s.bias, lab::kTolBF16);
        if (s.bias) {
            check<float>(3, ctx, "v3 fp32 BGRADB", s.N, s.IC, s.OC, s.dinp, s.bias, lab::kTolF32);
            check<bf16>(3, ctx, "v3 bf16 BGRADB", s.N, s.IC, s.OC, s.dinp, s.bias, lab::kTolBF16);
        }
    }

    const int N = 8 * 1024;
    const Shape timed[] = {{N, 768, 2304, true, true}, {N, 768, 768, true, true}, {N, 768, 3072, true, true},
                           {N, 3072, 768, true, true}, {N, 768, 50304, true, false}};
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16; FLOPs of dinp + dweight)\n");
    for (const Shape& s : timed) {
        bf16* dout = lab::to_device<bf16>(lab::rand_normal((size_t)s.N * s.OC, 1.f, 7));
        bf16* inp = lab::to_device<bf16>(lab::rand_normal((size_t)s.N * s.IC, 1.f, 8));
        bf16* w = lab::to_device<bf16>(lab::rand_normal((size_t)s.OC * s.IC, 0.05f, 9));
        bf16* dinp = lab::dev_alloc<bf16>((size_t)s.N * s.IC);
        bf16* dw = lab::dev_alloc<bf16>((size_t)s.OC * s.IC);
        bf16* db = s.bias ? lab::dev_alloc<bf16>(s.OC) : nullptr;
        float* scratch = lab::dev_alloc<float>(matmul_backward_scratch_floats(s.N, s.OC));
        const double flops = 4.0 * s.N * s.IC * (double)s.OC;
        for (int v = 1; v <= (s.bias ? 3 : 2); v++) {
            float ms = lab::time_ms([&] { run<bf16>(v, ctx, dinp, dw, db, dout, inp, w, s.N, s.IC, s.OC, scratch); },
                                    v == 1 ? 2 : 20);
            char l[96];
            const char* name = v == 1 ? "v1 naive" : v == 2 ? "v2 cuBLASLt" : "v3 cuBLASLt BGRADB";
            std::snprintf(l, sizeof l, "%s %dx%d->%d", name, s.N, s.IC, s.OC);
            lab::report_flops(l, ms, flops);
        }
        lab::dev_free(dout), lab::dev_free(inp), lab::dev_free(w), lab::dev_free(dinp), lab::dev_free(dw),
            lab::dev_free(db), lab::dev_free(scratch);
    }
    ctx.destroy();
    return lab::finish();
}
