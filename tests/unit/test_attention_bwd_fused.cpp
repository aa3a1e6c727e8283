// tests/unit/test_attention_bwd_fused.cpp: CPU check of the one-kernel tensor-core
// attention backward (llmc/backend/cuda/attention_tc_kernels_bwd_fused.h, the
// LLMC_ATTN_BWD=5 path), compiled by g++ without CUDA. Its body runs on the
// emulated GPU of tests/unit/mma_emulator.h (one host thread per CUDA
// thread, shared memory starting as NaN, cp.async landing only at the
// issuing thread's wait_group, atomics under a mutex) for head size 64:
// causal and non-causal, Tq not a multiple of the 128-query tile, B = 2
// and NH = 2, padded rows and batch gaps, grouped-query attention 2:1, the ring
// attention block form (fp32 +=, dq added atomically into dq itself), and
// the tuning variants (2 stages, D read from a precomputed vector). dq, dk
// and dv are compared with the naive fp64 attention (tests/unit/attention_fp64.h)
// at the two-kernel backward's tolerance, and with that backward's own
// results on the same emulator (they must agree closely: same algebra, five
// products instead of seven). Elements outside the view must stay untouched.
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/backend/cuda/attention_tc_kernels_bwd_fused.h"
#include "tests/unit/attention_emu.h"
#include "tests/unit/attention_fp64.h"
#include "tests/unit/mma_emulator.h"

// The new backward on the emulator. Plain (kAcc false): bf16 dq through the
// fp32 accumulator (zeroed, as the launcher's memset) and the conversion
// pass; ring (kAcc): fp32 dq, dk, dv +=, dq's own strides for the atomics.
template <int STAGES, bool kFoldD, typename G, bool kAcc>
static bool run_bwd_fused(const View& w, size_t kv_row0, const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kvb,
                     const std::vector<uint16_t>& dob, const std::vector<uint16_t>& outb, const std::vector<float>& lse,
                     const std::vector<float>& Dv, std::vector<G>& dq, std::vector<G>& dkv) {
    using C = attn_tc::Bwd5Cfg<64, 128, STAGES, kFoldD>;
    const TcParams p = attn_tc::tc_params(w.s);
    const size_t o = kv_row0 * w.s.kv_stride;
    std::vector<float> acc;
    float* dq_acc;
    size_t bs, rs;
    if constexpr (kAcc) {
        dq_acc = dq.data(), bs = p.qb, rs = p.q_stride;
    } else {
        acc.assign(attn_tc::bwd_fused_dq_acc_floats(p, 64), 0.f);
        dq_acc = acc.data(), rs = (size_t)p.NH * 64, bs = (size_t)p.Tq * rs;
    }
    const bool ok = run_grid((w.s.Tk + C::BN - 1) / C::BN, w.s.B * w.s.kv_heads(), C::smem_bytes, [&](HostCtx& cx) {
        attn_tc::bwd_fused_body<HostCtx, 64, 128, STAGES, kFoldD, G, kAcc>(
            cx, dq_acc, bs, rs, dkv.data() + w.koff + o, dkv.data() + w.voff + o, dob.data(), qb.data(),
            kvb.data() + w.koff + o, kvb.data() + w.voff + o, outb.data(), lse.data(), Dv.data(), p);
    });
    if constexpr (!kAcc)
        for (size_t i = 0; i < acc.size() / 2; i++) attn_tc::dq_convert_elem(dq.data(), acc.data(), p, 64, i);
    return ok;
}

// Relative L2 distance of two results over the in-view elements.
template <typename T>
static double rel_diff(const std::vector<T>& a, const std::vector<T>& b, const std::vector<char>& in_view) {
    std::vector<double> x, y;
    for (size_t i = 0; i < a.size(); i++)
        if (in_view[i]) {
            if constexpr (std::is_same<T, uint16_t>::value)
                x.push_back(b2f(a[i])), y.push_back(b2f(b[i]));
            else
                x.push_back(a[i]), y.push_back(b[i]);
        }
    return rel_err(x, y);
}

// Masks of a view: dq (q rows) and dk|dv (k and v head blocks).
static std::vector<char> dq_mask(const View& w) {
    const AttnShape& s = w.s;
    return mask_rows(w.qn, s.B, s.Tq, s.NH, s.HS, s.qb(), s.q_stride, 0);
}
static std::vector<char> dkv_mask(const View& w) {
    const AttnShape& s = w.s;
    std::vector<char> m = mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, 0);
    const std::vector<char> v =
        mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, (size_t)s.kv_heads() * s.HS);
    for (size_t i = 0; i < m.size(); i++) m[i] |= v[i];
    return m;
}

// Plain backward (bf16, overwrite) from the fp64 forward's out (rounded to
// bf16) and lse: new path against fp64, and against the two kernels.
template <int STAGES, bool kFoldD>
static void test_plain(const char* name, const View& w, uint32_t seed) {
    const AttnShape& s = w.s;
    const std::vector<float> q = rand_bf16(w.qn, 1.f, seed), kv = rand_bf16(w.kvn, 1.f, seed + 1),
                             dout = rand_bf16(w.on, 1.f, seed + 2);
    std::vector<double> rout(w.on, 0.0), rlse(w.ln, 0.0);
    ref_forward(w, q, kv, rout, rlse);
    std::vector<float> outf(w.on), lse(w.ln);
    for (size_t i = 0; i < outf.size(); i++) outf[i] = b2f(f2b((float)rout[i]));
    for (size_t i = 0; i < lse.size(); i++) lse[i] = std::isfinite(rlse[i]) ? (float)rlse[i] : 0.f;
    std::vector<double> rdq(w.qn, 0.0), rdkv(w.kvn, 0.0);
    ref_backward(w, q, kv, dout, outf, lse, rdq, rdkv);
    const std::vector<uint16_t> qb = to_bits(q), kvb = to_bits(kv), dob = to_bits(dout), outb = to_bits(outf);
    const std::vector<float> Dv = d_vector(s, dout, outf);
    const std::vector<uint16_t> dq_init(w.qn, 0x7fc1), dkv_init(w.kvn, 0x7fc1);  // NaN: all must be written
    std::vector<uint16_t> dq = dq_init, dkv = dkv_init, odq = dq_init, odkv = dkv_init;
    const bool ok = run_bwd_fused<STAGES, kFoldD, uint16_t, false>(w, 0, qb, kvb, dob, outb, lse, Dv, dq, dkv);
    const std::string n = std::string("bwd_fused HS=64 ") + name;
    check(ok, n + ": shared-memory accesses in range and aligned");
    compare(n + ": dq", dq, rdq, dq_mask(w), dq_init, 1e-2);
    compare(n + ": dk|dv", dkv, rdkv, dkv_mask(w), dkv_init, 1e-2);
    run_backward<64, uint16_t, false>(w, 0, qb, kvb, dob, lse, Dv, odq, odkv);
    const double eq = rel_diff(dq, odq, dq_mask(w)), ekv = rel_diff(dkv, odkv, dkv_mask(w));
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: equals the two kernels (dq %.1e, dk|dv %.1e; tol 4e-3)", n.c_str(), eq, ekv);
    check(eq <= 4e-3 && ekv <= 4e-3, buf);
}

// Ring attention: the block backward of two key blocks ([0, T1), [T1, Tk))
// adds into random fp32 dq, dk, dv.
static void test_ring(const char* name, const View& full, int T1, uint32_t seed) {
    const AttnShape& s = full.s;
    const RingCase rc = ring_case(full, T1, seed);
    const std::vector<float>&q = rc.q, &kv = rc.kv, &dout = rc.dout;
    const std::vector<double>&rout = rc.rout, &rlse = rc.rlse;
    const View &b1 = rc.b1, &b2 = rc.b2;
    std::vector<float> outf(full.on), lse(full.ln);
    for (size_t i = 0; i < outf.size(); i++) outf[i] = b2f(f2b((float)rout[i]));
    for (size_t i = 0; i < lse.size(); i++) lse[i] = std::isfinite(rlse[i]) ? (float)rlse[i] : 0.f;
    const std::vector<float> dq0 = rand_bf16(full.qn, 0.1f, seed + 5), dkv0 = rand_bf16(full.kvn, 0.1f, seed + 6);
    std::vector<double> rdq(dq0.begin(), dq0.end()), rdkv(dkv0.begin(), dkv0.end());
    ref_backward(full, q, kv, dout, outf, lse, rdq, rdkv);
    const std::vector<uint16_t> qb = to_bits(q), kvb = to_bits(kv), dob = to_bits(dout), outb = to_bits(outf);
    const std::vector<float> Dv = d_vector(s, dout, outf);
    std::vector<float> dq = dq0, dkv = dkv0, odq = dq0, odkv = dkv0;
    bool ok = run_bwd_fused<3, true, float, true>(b1, 0, qb, kvb, dob, outb, lse, Dv, dq, dkv);
    ok &= run_bwd_fused<3, true, float, true>(b2, T1, qb, kvb, dob, outb, lse, Dv, dq, dkv);
    const std::string n = std::string("bwd_fused HS=64 ") + name;
    check(ok, n + ": shared-memory accesses in range and aligned");
    compare(n + ": block dq (fp32 +=, atomics)", dq, rdq, dq_mask(full), dq0, 1e-2);
    compare(n + ": block dk|dv (fp32 +=)", dkv, rdkv, dkv_mask(full), dkv0, 1e-2);
    run_backward<64, float, true>(b1, 0, qb, kvb, dob, lse, Dv, odq, odkv);
    run_backward<64, float, true>(b2, T1, qb, kvb, dob, lse, Dv, odq, odkv);
    const double eq = rel_diff(dq, odq, dq_mask(full)), ekv = rel_diff(dkv, odkv, dkv_mask(full));
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: equals the two kernels (dq %.1e, dk|dv %.1e; tol 4e-3)", n.c_str(), eq, ekv);
    check(eq <= 4e-3 && ekv <= 4e-3, buf);
}

int main() {
    std::printf("one-kernel backward on the emulated GPU (against fp64 and the two kernels)\n");
    // Causal, T = 200: two 128-query tiles from the diagonal, the last partial.
    test_plain<3, true>("causal B=2 NH=2 T=200", make_view(2, 2, 64, 200, 200, true, 0, false), 10);
    // Non-causal Tq != Tk, padded rows, gaps between sequences, strided lse.
    test_plain<3, true>("non-causal B=2 NH=1 Tq=200 Tk=130 strided", make_view(2, 1, 64, 200, 130, false, 8, true),
                        20);
    // GQA 2:1: a block loops over both query heads of its kv head.
    test_plain<3, true>("GQA 2:1 causal B=1 NH=2 NKV=1 T=150", make_view(1, 2, 64, 150, 150, true, 0, false, 1), 30);
    // Tuning variants: 2 stages; D from the precomputed vector.
    test_plain<2, true>("2 stages causal B=1 NH=1 T=140", make_view(1, 1, 64, 140, 140, true, 0, false), 40);
    test_plain<3, false>("D not folded, non-causal B=1 NH=1 Tq=130 Tk=70",
                         make_view(1, 1, 64, 130, 70, false, 8, true), 50);
    // Ring blocks (fp32 +=), with GQA 2:1.
    test_ring("ring GQA 2:1 B=1 NH=2 NKV=1 Tq=140 Tk=64+50", make_view(1, 2, 64, 140, 114, false, 8, true, 1), 64,
              60);
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
