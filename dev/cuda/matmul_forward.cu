// dev/cuda/matmul_forward.cu: kernel lab for the Linear forward,
// out[N,OC] = inp[N,IC] · W[OC,IC]^T + bias[OC] (bias optional).
//   version 1: one thread per output element, fp32 dot product (naive)
//   version 2: llmc/backend/cuda/matmul.cuh (production: cuBLASLt, bias in the
//              epilogue, alignment-aware algorithm choice)
// Cases include GPT-2's shapes, the LM head (no bias), odd sizes, and
// pointers only 4-byte (fp32) / 2-byte (bf16) aligned, as tensors at odd
// offsets of the flat parameter buffer are.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/matmul.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void matmul_forward_v1(E* out, const E* inp, const E* w, const E* bias, int N, int IC, int OC) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (o >= OC) return;
    float acc = bias ? to_float(bias[o]) : 0.f;
    for (int i = 0; i < IC; i++) acc += to_float(inp[(size_t)n * IC + i]) * to_float(w[(size_t)o * IC + i]);
    out[(size_t)n * OC + o] = from_float<E>(acc);
}

template <typename E>
void run(int version, MatmulContext& ctx, E* out, const E* inp, const E* w, const E* bias, int N, int IC, int OC) {
    if (version == 1) {
        matmul_forward_v1<E><<<dim3((unsigned)ceil_div(OC, 128), N), 128>>>(out, inp, w, bias, N, IC, OC);
        CUDA_CHECK_LAUNCH();
    } else {
        matmul_forward<E>(ctx, out, inp, w, bias, N, IC, OC);
    }
}

template <typename E>
void check(int version, MatmulContext& ctx, const char* label, int N, int IC, int OC, bool with_bias, int shift,
           double tol) {
    const std::vector<float> inp = lab::rand_normal((size_t)N * IC, 1.f, 1), w = lab::rand_normal((size_t)OC * IC, 0.05f, 2);
    const std::vector<float> bias = lab::rand_normal(OC, 0.5f, 3);
    std::vector<float> ref((size_t)N * OC);
    cpu::matmul_forward(ref.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC, OC);
    E *bi, *bw, *bb = nullptr, *bo;
    E* dinp = lab::to_device_shifted<E>(inp, shift, &bi);
    E* dw = lab::to_device_shifted<E>(w, shift, &bw);
    E* db = with_bias ? lab::to_device_shifted<E>(bias, shift, &bb) : nullptr;
    E* dout = lab::to_device_shifted<E>(std::vector<float>(ref.size(), 0.f), shift, &bo);
    run<E>(version, ctx, dout, dinp, dw, db, N, IC, OC);
    char l[160];
    std::snprintf(l, sizeof l, "%s N=%d IC=%d OC=%d%s%s", label, N, IC, OC, with_bias ? " bias" : "",
                  shift ? " misaligned" : "");
    lab::validate(l, lab::from_device(dout, ref.size()), ref, tol);
    lab::dev_free(bi), lab::dev_free(bw), lab::dev_free(bb), lab::dev_free(bo);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    MatmulContext ctx;
    ctx.init(0);
    struct Shape {
        int N, IC, OC;
        bool bias;
        int shift;
    };
    const Shape shapes[] = {{512, 768, 2304, true, 0},  {512, 3072, 768, true, 0}, {128, 768, 50304, false, 0},
                            {300, 48, 97, true, 0},     {300, 48, 97, true, 1},    {64, 768, 768, true, 3},
                            {77, 64, 192, false, 1}};
    std::printf("validation\n");
    for (const Shape& s : shapes) {
        if (s.shift == 0) check<float>(1, ctx, "v1 fp32", s.N, s.IC, s.OC, s.bias, 0, lab::kTolF32);
        check<float>(2, ctx, "v2 fp32", s.N, s.IC, s.OC, s.bias, s.shift, lab::kTolF32);
        check<bf16>(2, ctx, "v2 bf16", s.N, s.IC, s.OC, s.bias, s.shift, lab::kTolBF16);
    }

    const int N = 8 * 1024;
    const Shape timed[] = {{N, 768, 2304, true, 0}, {N, 768, 768, true, 0}, {N, 768, 3072, true, 0},
                           {N, 3072, 768, true, 0}, {N, 768, 50304, false, 0}};
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16; v1 naive in fp32 accumulate, same data)\n");
    for (const Shape& s : timed) {
        bf16* inp = lab::to_device<bf16>(lab::rand_normal((size_t)s.N * s.IC, 1.f, 5));
        bf16* w = lab::to_device<bf16>(lab::rand_normal((size_t)s.OC * s.IC, 0.05f, 6));
        bf16* b = s.bias ? lab::to_device<bf16>(lab::rand_normal(s.OC, 0.5f, 7)) : nullptr;
        bf16* out = lab::dev_alloc<bf16>((size_t)s.N * s.OC);
        const double flops = 2.0 * s.N * s.IC * (double)s.OC;
        for (int v = 1; v <= 2; v++) {
            float ms = lab::time_ms([&] { run<bf16>(v, ctx, out, inp, w, b, s.N, s.IC, s.OC); }, v == 1 ? 2 : 20);
            char l[96];
            std::snprintf(l, sizeof l, "%s %dx%d->%d", v == 1 ? "v1 naive" : "v2 cuBLASLt", s.N, s.IC, s.OC);
            lab::report_flops(l, ms, flops);
        }
        lab::dev_free(inp), lab::dev_free(w), lab::dev_free(b), lab::dev_free(out);
    }
    ctx.destroy();
    return lab::finish();
}
