// dev/cuda/attention_forward.cu: kernel lab for softmax attention forward
// (out and lse), over the strided layouts AttnShape allows.
//   version 1: one thread per query row, three passes over the keys, output
//              accumulated in a per-thread array (naive)
//   version 2: llmc/backend/cuda/attention.cuh (production for fp32, odd head sizes
//              and unaligned rows: flash-attention style on CUDA cores, 32x32
//              tiles in shared memory, online softmax)
//   version 3: llmc/backend/cuda/attention_tc.cuh (production for bf16 with HS 64 or
//              128: tensor cores, mma.sync m16n8k16, FlashAttention-2 style)
//   version 4: llmc/backend/cuda/attention_wg.cuh (Hopper, sm_90a: TMA, mbarriers,
//              wgmma, producer and two consumer warpgroups in ping-pong; what
//              LLMC_ATTN_WG=1 selects), where the device has it: the same
//              cases as version 3, timed beside it
// Cases: GPT-2's packed qkv layout (causal), the odd head sizes of the test
// models (16, 8), HS=128 and HS=200, T not a multiple of the tile, and
// non-causal Tq != Tk with padded strides and K, V packed in one buffer,
// grouped-query attention (2:1, 3:1, 4:1; Llama's [Q | K | V] rows);
// version 3 also on attention_tc_cases() (aligned strided layouts, d12-like
// T=1024); version 2 (and v1) also on attention_masked_cases(): the
// document mask, causal and ring-attention-like blocks. Timing: d12 shapes (B=4, 8, 16; NH=12, HS=64, T=1024, causal),
// HS=128 and a non-causal block, in TFLOP/s and as a fraction of the
// device's dense bf16 peak; FLOPs 4·B·NH·Tq·Tk·HS, halved when causal.
// Flags: --no-timing; --quick (no T=1024 case, no timing); --small (the
// small lists of attention_cases.h, versions 2 and 3 only: for
// compute-sanitizer).
#include "attention_cases.h"
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc.cuh"

#include <type_traits>

using namespace llmc_cuda;

template <typename E>
__global__ void attention_forward_v1(E* out, float* lse, const E* q, const E* k, const E* v, AttnShape s) {
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i)
    if (row >= (size_t)s.B * s.NH * s.Tq) return;
    const int i = (int)(row % s.Tq), h = (int)(row / s.Tq % s.NH), b = (int)(row / s.Tq / s.NH);
    const E* qi = q + ((size_t)b * s.Tq + i) * s.q_stride + (size_t)h * s.HS;
    const int nk = s.causal ? i + 1 : s.Tk;
    const int kvh = s.NKV ? h / (s.NH / s.NKV) : h;  // grouped-query attention
    // document mask: keys before the query's document start are invisible
    const int d0 = s.doc_start ? s.doc_start[(size_t)b * s.Tq + i] : INT_MIN;
    auto seen = [&](int j) { return (s.key_pos ? s.key_pos[j] : j) >= d0; };
    auto score = [&](int j) {
        const E* kj = k + ((size_t)b * s.Tk + j) * s.kv_stride + (size_t)kvh * s.HS;
        float d = 0.f;
        for (int c = 0; c < s.HS; c++) d += to_float(qi[c]) * to_float(kj[c]);
        return d * (float)s.scale;
    };
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++)
        if (seen(j)) mx = fmaxf(mx, score(j));
    float acc[attn::kMaxHeadSize];
    for (int c = 0; c < s.HS; c++) acc[c] = 0.f;
    float sum = 0.f;
    for (int j = 0; j < nk; j++) {
        if (!seen(j)) continue;
        const float p = expf(score(j) - mx);
        sum += p;
        const E* vj = v + ((size_t)b * s.Tk + j) * s.kv_stride + (size_t)kvh * s.HS;
        for (int c = 0; c < s.HS; c++) acc[c] += p * to_float(vj[c]);
    }
    E* oi = out + ((size_t)b * s.Tq + i) * s.o_stride + (size_t)h * s.HS;
    for (int c = 0; c < s.HS; c++) oi[c] = from_float<E>(sum > 0.f ? acc[c] / sum : 0.f);
    lse[((size_t)b * s.NH + h) * s.Tq + i] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

template <typename E>
void run(int version, E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s) {
    if (version == 1) {
        const size_t rows = (size_t)s.B * s.NH * s.Tq;
        attention_forward_v1<E><<<(unsigned)ceil_div(rows, 128), 128>>>(out, lse, q, k, v, s);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        attention_forward<E>(out, lse, q, k, v, s, 0);
    } else if constexpr (std::is_same<E, bf16>::value) {
        if (version == 3) {
            attention_forward_tc(out, lse, q, k, v, s, 0);
        } else if (s.B && s.NH && s.Tq) {  // version 4, whatever LLMC_ATTN_WG says
            if (s.HS == 64)
                attn_wg_dev::wg_forward_launch<64, bf16, false>(out, lse, q, k, v, s, 0);
            else
                attn_wg_dev::wg_forward_launch<128, bf16, false>(out, lse, q, k, v, s, 0);
        }
    }
}
// Whether version 4 runs here (sm_90 with the sm_90a code built in).
bool wg_here() { return attn_wg_dev::device_has_wgmma(); }

// Whether version 3 takes this case (the backend's dispatch test).
bool tc_takes(const Case& c) {
    bf16* probe = lab::dev_alloc<bf16>(8);  // cudaMalloc: 256-byte aligned, as the lab's buffers
    const bool ok = attention_tc_supported(c.s, {probe, probe + c.koff, probe + c.voff});
    lab::dev_free(probe);
    return ok;
}

template <typename E>
void check(int version, const Case& c, const char* label, double tol) {
    const AttnShape s = host_shape(c);
    std::vector<float> qbuf = lab::rand_normal(c.qbuf_n, 1.f, 1);
    std::vector<float> kvbuf = c.packed ? qbuf : lab::rand_normal(c.kvbuf_n, 1.f, 2);
    std::vector<float> rout(c.out_n, 0.f), rlse((size_t)s.B * s.NH * s.Tq);
    cpu::attention_forward(rout.data(), rlse.data(), qbuf.data(), kvbuf.data() + c.koff, kvbuf.data() + c.voff, s);
    E* dq = lab::to_device<E>(qbuf);
    E* dkv = c.packed ? dq : lab::to_device<E>(kvbuf);
    E* dout = lab::dev_alloc<E>(c.out_n);
    float* dlse = lab::dev_alloc<float>(rlse.size());
    std::vector<int*> mask;  // the document mask's device copies
    const AttnShape ds = device_shape(c, lab::ints_to_device, &mask);
    run<E>(version, dout, dlse, dq, dkv + c.koff, dkv + c.voff, ds);
    for (int* p : mask) lab::dev_free(p);
    const std::string l = std::string(label) + " " + c.name;
    lab::validate((l + " out").c_str(), lab::from_device(dout, c.out_n), rout, tol);
    lab::validate((l + " lse").c_str(), lab::from_device(dlse, rlse.size()), rlse, lab::kTolF32);
    if (!c.packed) lab::dev_free(dkv);
    lab::dev_free(dq), lab::dev_free(dout), lab::dev_free(dlse);
}

int main(int argc, char** argv) {
    const lab::RunFlags flags = lab::parse_flags(argc, argv);
    const bool timing = flags.timing, quick = flags.quick;
    if (!lab::have_gpu()) return lab::finish();
    const std::vector<Case> cases = flags.small ? attention_small_cases() : attention_cases();
    std::printf("validation\n");
    for (const Case& c : cases) {
        if (!flags.small) check<float>(1, c, "v1 fp32", lab::kTolF32);
        check<float>(2, c, "v2 fp32", lab::kTolF32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
        if (tc_takes(c)) check<bf16>(3, c, "v3 tc bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(4, c, "v4 wgmma bf16", lab::kTolBF16);
    }
    for (const Case& c : attention_masked_cases()) {  // the document mask
        if (!flags.small) check<float>(1, c, "v1 fp32", lab::kTolF32);
        check<float>(2, c, "v2 fp32", lab::kTolF32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
        if (tc_takes(c)) check<bf16>(3, c, "v3 tc bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(4, c, "v4 wgmma bf16", lab::kTolBF16);
    }
    for (const Case& c : flags.small ? attention_tc_small_cases() : attention_tc_cases()) {
        if (quick && c.s.Tq >= 1024) continue;
        if (!tc_takes(c)) {
            std::printf("  v3 tc bf16 %-40s not taken by the tensor-core dispatch  FAIL\n", c.name);
            lab::g_failed++;
            continue;
        }
        check<bf16>(3, c, "v3 tc bf16", lab::kTolBF16);
        if (wg_here()) check<bf16>(4, c, "v4 wgmma bf16", lab::kTolBF16);
    }

    if (!timing) return lab::finish();

    struct Shape {
        int B, NH, HS, Tq, Tk;
        bool causal;
        int NKV;
    };
    const Shape shapes[] = {{4, 12, 64, 1024, 1024, true, 0},  {8, 12, 64, 1024, 1024, true, 0},
                            {16, 12, 64, 1024, 1024, true, 0}, {8, 6, 128, 1024, 1024, true, 0},
                            {8, 12, 64, 512, 512, false, 0},   {8, 6, 128, 512, 512, false, 0},
                            {2, 32, 128, 2048, 2048, true, 8},  // Llama-8B-like heads, GQA 4:1
                            {32, 12, 64, 1024, 1024, true, 0},  // d12's training batch
                            {8, 16, 128, 4096, 4096, true, 0}};  // heads of 128 at long context
    if (lab::check_only()) return lab::finish();
    std::printf("timing (FLOPs 4*B*NH*Tq*Tk*HS, halved when causal)\n");
    for (const Shape& sh : shapes) {
        const Case c = make_case("timing", sh.B, sh.NH, sh.HS, sh.Tq, sh.Tk, sh.causal, true, 4, sh.NKV);
        const double flops = 4.0 * sh.B * sh.NH * sh.HS * (double)sh.Tq * sh.Tk / (sh.causal ? 2 : 1);
        std::printf(" B=%d NH=%d NKV=%d HS=%d Tq=%d Tk=%d %s\n", sh.B, sh.NH, sh.NKV ? sh.NKV : sh.NH, sh.HS, sh.Tq,
                    sh.Tk, sh.causal ? "causal" : "non-causal");
        std::vector<float> qkv = lab::rand_normal(c.qbuf_n, 1.f, 3);
        bf16* dqkv = lab::to_device<bf16>(qkv);
        bf16* dout = lab::dev_alloc<bf16>(c.out_n);
        float* dlse = lab::dev_alloc<float>((size_t)sh.B * sh.NH * sh.Tq);
        float ms2 = 0, ms3 = 0;
        if (sh.B <= 8) {  // the CUDA-core kernel for comparison (slow: once per shape size)
            ms2 = lab::time_ms([&] { run<bf16>(2, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); }, 5);
            lab::report_tflops("v2 CUDA cores bf16", ms2, flops);
        }
        ms3 = lab::time_ms([&] { run<bf16>(3, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); }, 20);
        lab::report_tflops("v3 tensor cores bf16", ms3, flops);
        if (ms2 > 0) std::printf("  %-44s %9.2fx\n", "v3 speedup over v2", ms2 / ms3);
        // The two shapes the records name (scripts/gpu/torch_attention.py times PyTorch at the same).
        const bool rec = sh.causal && !sh.NKV && ((sh.B == 32 && sh.NH == 12 && sh.HS == 64 && sh.Tq == 1024) ||
                                                  (sh.B == 8 && sh.NH == 16 && sh.HS == 128 && sh.Tq == 4096));
        if (rec) std::printf("figure attn_fwd_mma_hs%d_t%d_tflops %.6g TFLOP/s\n", sh.HS, sh.Tq, flops / (ms3 * 1e-3) / 1e12);
        if (wg_here()) {
            const float ms4 = lab::time_ms([&] { run<bf16>(4, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); }, 20);
            lab::report_tflops("v4 wgmma bf16 (sm_90a)", ms4, flops);
            std::printf("  %-44s %9.2fx\n", "v4 speedup over v3", ms3 / ms4);
            if (rec) std::printf("figure attn_fwd_hs%d_t%d_tflops %.6g TFLOP/s\n", sh.HS, sh.Tq, flops / (ms4 * 1e-3) / 1e12);
        }
        lab::dev_free(dqkv), lab::dev_free(dout), lab::dev_free(dlse);
    }
    {  // fp32 reference point for the CUDA-core kernel at the d12 size
        const Case c = make_case("d12", 8, 12, 64, 1024, 1024, true, true);
        const double flops = 4.0 * 8 * 12 * 64 * 1024.0 * 1024 / 2;
        std::vector<float> qkv = lab::rand_normal(c.qbuf_n, 1.f, 3);
        float* dqkv = lab::to_device<float>(qkv);
        float* dout = lab::dev_alloc<float>(c.out_n);
        float* dlse = lab::dev_alloc<float>((size_t)8 * 12 * 1024);
        std::printf(" B=8 NH=12 HS=64 T=1024 causal, fp32\n");
        float ms = lab::time_ms([&] { run<float>(1, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); }, 1);
        lab::report_tflops("v1 naive fp32", ms, flops);
        ms = lab::time_ms([&] { run<float>(2, dout, dlse, dqkv, dqkv + c.koff, dqkv + c.voff, c.s); }, 5);
        lab::report_tflops("v2 CUDA cores fp32", ms, flops);
        lab::dev_free(dqkv), lab::dev_free(dout), lab::dev_free(dlse);
    }
    return lab::finish();
}
