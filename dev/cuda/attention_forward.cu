// dev/cuda/attention_forward.cu: kernel lab for softmax attention forward
// (out and lse), over the strided layouts AttnShape allows.
//   version 1: one thread per query row, three passes over the keys, output
//              accumulated in a per-thread array (naive)
//   version 2: llmc/cuda/attention.cuh (production: flash-attention style,
//              32x32 tiles in shared memory, online softmax)
// Cases: GPT-2's packed qkv layout (causal), the odd head sizes of the test
// models (16, 8), HS=128 and HS=200, T not a multiple of the tile, and
// non-causal Tq != Tk with padded strides and K, V packed in one buffer.
#include "attention_cases.h"
#include "common.h"
#include "llmc/cpu_ops.h"
#include "llmc/cuda/attention.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void attention_forward_v1(E* out, float* lse, const E* q, const E* k, const E* v, AttnShape s) {
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i)
    if (row >= (size_t)s.B * s.NH * s.Tq) return;
    const int i = (int)(row % s.Tq), h = (int)(row / s.Tq % s.NH), b = (int)(row / s.Tq / s.NH);
    const E* qi = q + ((size_t)b * s.Tq + i) * s.q_stride + (size_t)h * s.HS;
    const int nk = s.causal ? i + 1 : s.Tk;
    auto score = [&](int j) {
        const E* kj = k + ((size_t)b * s.Tk + j) * s.kv_stride + (size_t)h * s.HS;
        float d = 0.f;
        for (int c = 0; c < s.HS; c++) d += to_float(qi[c]) * to_float(kj[c]);
        return d * (float)s.scale;
    };
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) mx = fmaxf(mx, score(j));
    float acc[attn::kMaxHeadSize];
    for (int c = 0; c < s.HS; c++) acc[c] = 0.f;
    float sum = 0.f;
    for (int j = 0; j < nk; j++) {
        const float p = expf(score(j) - mx);
        sum += p;
        const E* vj = v + ((size_t)b * s.Tk + j) * s.kv_stride + (size_t)h * s.HS;
        for (int c = 0; c < s.HS; c++) acc[c] += p * to_float(vj[c]);
    }
    E* oi = out + ((size_t)b * s.Tq + i) * s.o_stride + (size_t)h * s.HS;
    for (int c = 0; c < s.HS; c++) oi[c] = from_float<E>(acc[c] / sum);
    lse[((size_t)b * s.NH + h) * s.Tq + i] = mx + logf(sum);
}

template <typename E>
void run(int version, E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s) {
    if (version == 1) {
        const size_t rows = (size_t)s.B * s.NH * s.Tq;
        attention_forward_v1<E><<<(unsigned)ceil_div(rows, 128), 128>>>(out, lse, q, k, v, s);
        CUDA_CHECK_LAUNCH();
    } else {
        attention_forward<E>(out, lse, q, k, v, s, 0);
    }
}

template <typename E>
void check(int version, const Case& c, const char* label, double tol) {
    const AttnShape& s = c.s;
    std::vector<float> qbuf = lab::rand_normal(c.qbuf_n, 1.f, 1);
    std::vector<float> kvbuf = c.packed ? qbuf : lab::rand_normal(c.kvbuf_n, 1.f, 2);
    std::vector<float> rout(c.out_n, 0.f), rlse((size_t)s.B * s.NH * s.Tq);
    cpu::attention_forward(rout.data(), rlse.data(), qbuf.data(), kvbuf.data() + c.koff, kvbuf.data() + c.voff, s);
    E* dq = lab::to_device<E>(qbuf);
    E* dkv = c.packed ? dq : lab::to_device<E>(kvbuf);
    E* dout = lab::dev_alloc<E>(c.out_n);
    float* dlse = lab::dev_alloc<float>(rlse.size());
    run<E>(version, dout, dlse, dq, dkv + c.koff, dkv + c.voff, s);
    const std::string l = std::string(label) + " " + c.name;
    lab::validate((l + " out").c_str(), lab::from_device(dout, c.out_n), rout, tol);
    lab::validate((l + " lse").c_str(), lab::from_device(dlse, rlse.size()), rlse, lab::kTolF32);
    if (!c.packed) lab::dev_free(dkv);
    lab::dev_free(dq), lab::dev_free(dout), lab::dev_free(dlse);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const std::vector<Case> cases = attention_cases();
    std::printf("validation\n");
    for (const Case& c : cases) {
        check<float>(1, c, "v1 fp32", lab::kTolF32);
        check<float>(2, c, "v2 fp32", lab::kTolF32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
    }

    const int B = 8, NH = 12, HS = 64, T = 1024;
    const Case c = make_case("d12", B, NH, HS, T, T, true, true);
    if (lab::check_only()) return lab::finish();
    std::printf("timing (B=%d NH=%d HS=%d T=%d causal)\n", B, NH, HS, T);
    const double flops = 4.0 * B * NH * HS * (double)T * T / 2;  // QK^T and PV over the causal half
    std::vector<float> qkv = lab::rand_normal(c.qbuf_n, 1.f, 3);
    for (int prec = 0; prec < 2; prec++) {
        auto bench = [&](auto tag) {
            using E = decltype(tag);
            E* dqkv = lab::to_device<E>(qkv);
            E* dout = lab::dev_alloc<E>(c.out_n);
            float* dlse = lab::dev_alloc<float>((size_t)B * NH * T);
            for (int v = 1; v <= 2; v++) {
                float ms = lab::time_ms([&] { run<E>(v, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); },
                                        v == 1 ? 1 : 20);
                std::string l = std::string(v == 1 ? "v1 naive" : "v2 production") + (prec ? " bf16" : " fp32");
                lab::report_flops(l.c_str(), ms, flops);
            }
            lab::dev_free(dqkv), lab::dev_free(dout), lab::dev_free(dlse);
        };
        if (prec == 0)
            bench(float{});
        else
            bench(bf16{});
    }
    return lab::finish();
}
