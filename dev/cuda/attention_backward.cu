// dev/cuda/attention_backward.cu: kernel lab for softmax attention backward
// (dq, dk, dv overwritten; P recomputed from q, k and the forward's lse).
//   version 1: one thread per query row, atomicAdd into dk, dv (naive; fp32
//              only: bf16 atomics would round at every add)
//   version 2: llmc/backend/cuda/attention.cuh (production for fp32 and odd head
//              sizes: a dq kernel per query tile and a dk/dv kernel per key
//              tile on CUDA cores, no atomics)
//   version 3: llmc/backend/cuda/attention_tc.cuh (production for bf16 with HS 64 or
//              128: the same two-kernel split on tensor cores, mma.sync)
//   version 4: llmc/backend/cuda/attention_wg.cuh (Hopper, sm_90a; what
//              LLMC_ATTN_WG=1 selects there): TMA, mbarriers, wgmma, a
//              producer and two consumer warpgroups of 64 keys each over
//              128-key blocks, 5 products, dq by fp32 atomics then a
//              conversion pass (dq not bitwise reproducible); the same
//              cases as version 3, timed beside it
//   version 6: version 4 with dq added in a fixed order (LLMC_ATTN_WG=det:
//              the key blocks take turns per query tile), reproducible; the
//              price of the turns is its time against version 4's
//   version 5: llmc/backend/cuda/attention_tc_kernels_bwd_fused.h (bf16, HS 64; what
//              LLMC_ATTN_BWD=5 selects): one kernel per 64-key tile looping
//              over 128-query tiles, 5 products, D folded in, dq by fp32
//              atomics then a conversion pass (dq not bitwise reproducible)
// Same cases as attention_forward.cu (and attention_tc_cases() for version
// 3, attention_masked_cases(), the document mask, for versions 1 and 2),
// grouped-query attention included (dk, dv sum over each group's query
// heads). The output buffers start as garbage to check that they are
// overwritten, not accumulated. Timing: d12 shapes (B=4, 8, 16; NH=12,
// HS=64, T=1024, causal), HS=128 and non-causal, FLOPs counted as 2.5x the
// forward's (4·B·NH·Tq·Tk·HS, halved when causal), with the fraction of the
// device's dense bf16 peak. Version 3 does 3.5x the forward's products (S and
// dP twice, for determinism), so its counted rate is at most 2.5/3.5 of the
// tensor cores' real rate; versions 4 and 5 do 2.5x, so their counted rate
// is their executed rate. The record shapes (d12's batch: B=32, 12 heads
// of 64, T=1024; heads of 128 at T=4096) print "figure attn_bwd_*" lines
// that scripts/gpu/steps.sh records beside PyTorch's at the same shapes. Flags as attention_forward.cu's (--small: the
// small cases, for compute-sanitizer).
#include "attention_cases.h"
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc.cuh"

#include <algorithm>
#include <type_traits>

using namespace llmc_cuda;

__global__ void attention_backward_v1(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                      const float* k, const float* v, const float* out, const float* lse,
                                      AttnShape s) {
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i)
    if (row >= (size_t)s.B * s.NH * s.Tq) return;
    const int i = (int)(row % s.Tq), h = (int)(row / s.Tq % s.NH), b = (int)(row / s.Tq / s.NH);
    const size_t qo = ((size_t)b * s.Tq + i) * s.q_stride + (size_t)h * s.HS;
    const size_t oo = ((size_t)b * s.Tq + i) * s.o_stride + (size_t)h * s.HS;
    const float L = lse[((size_t)b * s.NH + h) * s.Tq + i];
    const int kvh = s.NKV ? h / (s.NH / s.NKV) : h;  // grouped-query attention: dk, dv sum the group (atomics)
    float D = 0.f;
    for (int c = 0; c < s.HS; c++) D += dout[oo + c] * out[oo + c];
    for (int c = 0; c < s.HS; c++) dq[qo + c] = 0.f;
    const int nk = s.causal ? i + 1 : s.Tk;
    const int d0 = s.doc_start ? s.doc_start[(size_t)b * s.Tq + i] : INT_MIN;  // document mask
    for (int j = 0; j < nk; j++) {
        if ((s.key_pos ? s.key_pos[j] : j) < d0) continue;
        const size_t ko = ((size_t)b * s.Tk + j) * s.kv_stride + (size_t)kvh * s.HS;
        float dot = 0.f, dp = 0.f;
        for (int c = 0; c < s.HS; c++) {
            dot += q[qo + c] * k[ko + c];
            dp += dout[oo + c] * v[ko + c];
        }
        const float p = expf(dot * (float)s.scale - L);
        const float ds = p * (dp - D) * (float)s.scale;
        for (int c = 0; c < s.HS; c++) {
            dq[qo + c] += ds * k[ko + c];
            atomicAdd(&dk[ko + c], ds * q[qo + c]);
            atomicAdd(&dv[ko + c], p * dout[oo + c]);
        }
    }
}

// Inputs shared by all versions: q/k/v buffers, dout, and out/lse from the
// CPU forward (out rounded to bf16 so both precisions see the same values).
struct Data {
    std::vector<float> qbuf, kvbuf, dout, out, lse;
};

Data make_data(const Case& c, uint64_t seed) {
    const AttnShape s = host_shape(c);
    Data d;
    d.qbuf = lab::rand_normal(c.qbuf_n, 1.f, seed);
    d.kvbuf = c.packed ? d.qbuf : lab::rand_normal(c.kvbuf_n, 1.f, seed + 1);
    d.dout = lab::rand_normal(c.out_n, 1.f, seed + 2);
    d.out.assign(c.out_n, 0.f);
    d.lse.assign((size_t)s.B * s.NH * s.Tq, 0.f);
    cpu::attention_forward(d.out.data(), d.lse.data(), d.qbuf.data(), d.kvbuf.data() + c.koff,
                           d.kvbuf.data() + c.voff, s);
    for (float& x : d.out) x = lab::round_bf16(x);
    return d;
}

template <typename E>
void run(int version, E* dq, E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
         const float* lse, const AttnShape& s, float* scratch) {
    if (version == 1) {
        if constexpr (std::is_same<E, float>::value) {
            // dk, dv accumulate: clear them (only the head slices; the packed
            // layout interleaves them with dq, which the kernel overwrites).
            for (int b = 0; b < s.B; b++)
                for (int j = 0; j < s.Tk; j++) {
                    const size_t o = ((size_t)b * s.Tk + j) * s.kv_stride;
                    CUDA_CHECK(cudaMemsetAsync(dk + o, 0, (size_t)s.kv_heads() * s.HS * sizeof(float)));
                    CUDA_CHECK(cudaMemsetAsync(dv + o, 0, (size_t)s.kv_heads() * s.HS * sizeof(float)));
                }
            const size_t rows = (size_t)s.B * s.NH * s.Tq;
            attention_backward_v1<<<(unsigned)ceil_div(rows, 128), 128>>>(dq, dk, dv, dout, q, k, v, out, lse, s);
            CUDA_CHECK_LAUNCH();
        }
    } else if (version == 2) {
        attention_backward<E>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, 0);
    } else if constexpr (std::is_same<E, bf16>::value) {
        if (version == 5) {  // called directly: the environment switch is read once per process
            if (s.B > 0 && s.NH > 0)
                attn_tc_dev::bwd_fused_launch<bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, 0);
        } else if (version == 4 || version == 6) {  // whatever LLMC_ATTN_WG says
            if (s.B > 0 && s.NH > 0)
                attn_wg_dev::wg_backward<bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, version == 6, 0);
        } else {
            attention_backward_tc(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, 0);
        }
    }
}

// Scratch floats of every version: the D vector, or version 5's fp32 dq
// accumulator, or version 4's D and accumulator.
size_t scratch_floats(const AttnShape& s) {
    return std::max({attention_backward_scratch_floats(s), attn_tc::bwd_fused_dq_acc_floats(attn_tc::tc_params(s), 64),
                     attn_wg_dev::wg_bwd_scratch_floats(s)});
}
// Whether version 4 runs here (sm_90 with the sm_90a code built in).
bool wg_here() { return attn_wg_dev::device_has_wgmma(); }

// Whether version 3 takes this case (the backend's dispatch test).
bool tc_takes(const Case& c) {
    bf16* probe = lab::dev_alloc<bf16>(8);  // cudaMalloc: 256-byte aligned, as the lab's buffers
    const bool ok = attention_tc_supported(
        c.s, {probe, probe + c.koff, probe + c.voff, probe + (c.packed ? 0 : c.koff), probe + c.voff});
    lab::dev_free(probe);
    return ok;
}
// Version 5: the tensor-core cases of head size 64.
bool v5_takes(const Case& c) {
    return c.s.HS == 64 && tc_takes(c) &&
           attn_tc_dev::device_smem_optin() >= attn_tc::Bwd5Cfg<64, 128, TC_BWD5_STAGES, true>::smem_bytes;
}

template <typename E>
void check(int version, const Case& c, const char* label, double tol) {
    const AttnShape s = host_shape(c);
    const Data d = make_data(c, 1);
    std::vector<float> rdq(c.qbuf_n, 0.f), rdkv(c.kvbuf_n, 0.f);  // packed: rdq == rdkv (one dqkv)
    float* rdk = (c.packed ? rdq.data() : rdkv.data()) + c.koff;
    float* rdv = (c.packed ? rdq.data() : rdkv.data()) + c.voff;
    cpu::attention_backward(rdq.data(), rdk, rdv, d.dout.data(), d.qbuf.data(), d.kvbuf.data() + c.koff,
                            d.kvbuf.data() + c.voff, d.out.data(), d.lse.data(), s);
    E* q = lab::to_device<E>(d.qbuf);
    E* kv = c.packed ? q : lab::to_device<E>(d.kvbuf);
    E* dout = lab::to_device<E>(d.dout);
    E* out = lab::to_device<E>(d.out);
    float* lse = lab::to_device<float>(d.lse);
    // Packed: one dqkv buffer filled with garbage (every element is written).
    E* dq = c.packed ? lab::to_device<E>(lab::rand_normal(c.qbuf_n, 3.f, 99)) : lab::dev_alloc<E>(c.qbuf_n);
    E* dkv = c.packed ? dq : lab::dev_alloc<E>(c.kvbuf_n);
    float* scratch = lab::dev_alloc<float>(scratch_floats(s));
    std::vector<int*> mask;  // the document mask's device copies
    const AttnShape ds = device_shape(c, lab::ints_to_device, &mask);
    run<E>(version, dq, dkv + c.koff, dkv + c.voff, dout, q, kv + c.koff, kv + c.voff, out, lse, ds, scratch);
    for (int* p : mask) lab::dev_free(p);
    const std::string l = std::string(label) + " " + c.name;
    if (c.packed) {
        lab::validate((l + " dqkv").c_str(), lab::from_device(dq, c.qbuf_n), rdq, tol);
    } else {
        lab::validate((l + " dq").c_str(), lab::from_device(dq, c.qbuf_n), rdq, tol);
        lab::validate((l + " dk|dv").c_str(), lab::from_device(dkv, c.kvbuf_n), rdkv, tol);
        lab::dev_free(kv), lab::dev_free(dkv);
    }
    lab::dev_free(q), lab::dev_free(dout), lab::dev_free(out), lab::dev_free(lse), lab::dev_free(dq),
        lab::dev_free(scratch);
}

int main(int argc, char** argv) {
    const lab::RunFlags flags = lab::parse_flags(argc, argv);
    const bool timing = flags.timing, quick = flags.quick;
    if (!lab::have_gpu()) return lab::finish();
    const std::vector<Case> cases = flags.small ? attention_small_cases() : attention_cases();
    // The backward sums P·(dP - D), which cancels: fp32 needs a little more room.
    const double tol32 = tol::kFp32AttentionBackward;
    std::printf("validation\n");
    for (const Case& c : cases) {
        if (!flags.small) check<float>(1, c, "v1 fp32", tol32);
        check<float>(2, c, "v2 fp32", tol32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
        if (tc_takes(c)) check<bf16>(3, c, "v3 tc bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(4, c, "v4 wgmma bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(6, c, "v6 wgmma in turns bf16", lab::kTolBF16);
        if (v5_takes(c)) check<bf16>(5, c, "v5 one-kernel bf16", lab::kTolBF16);
    }
    for (const Case& c : attention_masked_cases()) {  // the document mask (not the one-kernel backward)
        if (!flags.small) check<float>(1, c, "v1 fp32", tol32);
        check<float>(2, c, "v2 fp32", tol32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
        if (tc_takes(c)) check<bf16>(3, c, "v3 tc bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(4, c, "v4 wgmma bf16", lab::kTolBF16);
        if (tc_takes(c) && wg_here()) check<bf16>(6, c, "v6 wgmma in turns bf16", lab::kTolBF16);
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
        if (wg_here()) check<bf16>(6, c, "v6 wgmma in turns bf16", lab::kTolBF16);
        if (v5_takes(c)) check<bf16>(5, c, "v5 one-kernel bf16", lab::kTolBF16);
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
    std::printf("timing (FLOPs counted as 2.5x the forward's 4*B*NH*Tq*Tk*HS, halved when causal)\n");
    for (const Shape& sh : shapes) {
        const Case c = make_case("timing", sh.B, sh.NH, sh.HS, sh.Tq, sh.Tk, sh.causal, true, 4, sh.NKV);
        const double flops = 2.5 * 4.0 * sh.B * sh.NH * sh.HS * (double)sh.Tq * sh.Tk / (sh.causal ? 2 : 1);
        std::printf(" B=%d NH=%d NKV=%d HS=%d Tq=%d Tk=%d %s\n", sh.B, sh.NH, sh.NKV ? sh.NKV : sh.NH, sh.HS, sh.Tq,
                    sh.Tk, sh.causal ? "causal" : "non-causal");
        const Data d = make_data(c, 7);
        bf16* q = lab::to_device<bf16>(d.qbuf);
        bf16* dout = lab::to_device<bf16>(d.dout);
        bf16* out = lab::to_device<bf16>(d.out);
        float* lse = lab::to_device<float>(d.lse);
        bf16* dqkv = lab::dev_alloc<bf16>(c.qbuf_n);
        float* scratch = lab::dev_alloc<float>(scratch_floats(c.s));
        auto call = [&](int version) {
            run<bf16>(version, dqkv, dqkv + c.koff, dqkv + c.voff, dout, q, q + c.koff, q + c.voff, out, lse, c.s,
                      scratch);
        };
        float ms2 = 0;
        if (sh.B <= 8 && sh.Tq <= 2048) {
            ms2 = lab::time_ms([&] { call(2); }, 3);
            lab::report_tflops("v2 CUDA cores bf16", ms2, flops);
        }
        const float ms3 = lab::time_ms([&] { call(3); }, 10);
        lab::report_tflops("v3 tensor cores bf16", ms3, flops);
        if (ms2 > 0) std::printf("  %-44s %9.2fx\n", "v3 speedup over v2", ms2 / ms3);
        // The two shapes the records name (scripts/gpu/torch_attention.py times PyTorch at the same).
        const bool rec = sh.causal && !sh.NKV && ((sh.B == 32 && sh.NH == 12 && sh.HS == 64 && sh.Tq == 1024) ||
                                                  (sh.B == 8 && sh.NH == 16 && sh.HS == 128 && sh.Tq == 4096));
        if (rec) std::printf("figure attn_bwd_mma_hs%d_t%d_tflops %.6g TFLOP/s\n", sh.HS, sh.Tq, flops / (ms3 * 1e-3) / 1e12);
        if (wg_here()) {
            const float ms4 = lab::time_ms([&] { call(4); }, 10);
            lab::report_tflops("v4 wgmma bf16 (sm_90a)", ms4, flops);
            std::printf("  %-44s %9.2fx\n", "v4 speedup over v3", ms3 / ms4);
            if (rec) std::printf("figure attn_bwd_hs%d_t%d_tflops %.6g TFLOP/s\n", sh.HS, sh.Tq, flops / (ms4 * 1e-3) / 1e12);
            const float ms6 = lab::time_ms([&] { call(6); }, 10);
            lab::report_tflops("v6 wgmma, dq in turns (LLMC_ATTN_WG=det)", ms6, flops);
            std::printf("  %-44s %9.2fx\n", "v6 time over v4 (the price of the turns)", ms6 / ms4);
            if (rec) std::printf("figure attn_bwd_det_hs%d_t%d_tflops %.6g TFLOP/s\n", sh.HS, sh.Tq, flops / (ms6 * 1e-3) / 1e12);
        }
        if (v5_takes(c)) {
            const float ms5 = lab::time_ms([&] { call(5); }, 10);
            lab::report_tflops("v5 one kernel bf16 (LLMC_ATTN_BWD=5)", ms5, flops);
            std::printf("  %-44s %9.2fx\n", "v5 speedup over v3", ms3 / ms5);
        }
        lab::dev_free(q), lab::dev_free(dout), lab::dev_free(out), lab::dev_free(lse), lab::dev_free(dqkv),
            lab::dev_free(scratch);
    }
    return lab::finish();
}
