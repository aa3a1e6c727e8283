// tests/unit/test_wgmma_attention.cpp: the Hopper attention kernels
// (llmc/backend/cuda/attention_wg_kernels.h, the forward: TMA, mbarriers,
// wgmma, two consumer warpgroups in ping-pong; attention_wg_kernels_bwd.h,
// the backward: 128-key blocks, dQ by atomics) on the CPU, against fp64
// attention.
//  1. wgmma_layout.h (what the kernels compute their indices and descriptors
//     with) against the PTX ISA's definitions as tests/unit/wgmma_emulator.h
//     transcribes them: the accumulator fragment, the swizzle, the
//     descriptor fields, and a TMA box written by the emulated copy engine
//     read back through the kernel's K-major and MN-major descriptors.
//  2. The kernel bodies on the emulated GPU (one host thread per CUDA
//     thread, asynchronous copies and products landing only where the
//     kernel waits) for every feature: heads of 64 and 128, causal and not,
//     T not a multiple of the tiles, strided and padded layouts, GQA 2:1 and
//     4:1, ring blocks (the forward's second block merged into the first's
//     fp32 out and lse; the backward's blocks added into fp32 dq, dk, dv),
//     the document mask with tiles that cross document starts and rows that
//     see no key. Each forward case runs the backward after it, from the
//     kernel's own out and lse. Outputs start as NaN: every in-view element
//     must be written, and nothing outside the view.
//  3. Planted faults (no zero fill past the tensor, an unswizzled copy, a
//     skipped wgmma wait, a wrong descriptor stride, a transposed operand
//     read K-major) must make a case fail.
#include <cstdio>

#include "tests/unit/attention_emu.h"
#include "tests/unit/wgmma_emulator.h"

using attn_wg::WgFwdCfg;

// ---- 1. layouts ---------------------------------------------------------------------
static void test_layouts() {
    std::printf("wgmma_layout.h against the PTX ISA\n");
    bool ok = true;
    for (int T = 0; T < 128; T++)
        for (int i = 0; i < 64; i++) {
            int r, c;
            wg_emu::spec_acc(T, i, &r, &c);
            const mma_layout::RC rc = wg_layout::acc_elem(T, i);
            ok &= rc.row == r && rc.col == c;
        }
    check(ok, "accumulator fragment m64n128 .f32 (acc_elem)");
    ok = true;
    for (int T = 0; T < 128; T++)
        for (int i = 0; i < 8; i++) {
            int r, c;
            wg_emu::spec_a_reg(T, i, &r, &c);
            const mma_layout::RC rc = mma_layout::a_elem(T % 32, i);
            ok &= rc.row + 16 * (T / 32) == r && rc.col == c;
        }
    check(ok, "A from registers: the mma.sync A fragment per warp (a_elem)");
    ok = true;
    for (uint32_t a = 0; a < 8192; a++) ok &= wg_layout::swizzle128(a) == wg_emu::swz(a);
    check(ok, "128-byte swizzle");
    const wg_emu::Desc d = wg_emu::decode(wg_layout::make_desc_sw128(0x2A40, 16384, 1024));
    check(d.start == 0x2A40 && d.lbo == 16384 && d.sbo == 1024 && d.base_off == 0 && d.swizzle == 1,
          "descriptor fields (start, LBO, SBO, base offset, swizzle)");

    // A 128 x 128 bf16 tile copied by the emulated TMA (two 64-column boxes)
    // and read back through the kernel's descriptors.
    const int R = 128, Cc = 128;
    std::vector<uint16_t> g((size_t)R * Cc);
    for (size_t i = 0; i < g.size(); i++) g[i] = (uint16_t)(0x3C00 + (i * 2654435761u >> 20) % 1024);
    wg_layout::TmaBox box{g.data(), {(uint64_t)Cc, (uint64_t)R, 1, 1}, {2 * (uint64_t)Cc, 2 * (uint64_t)Cc * R, 2 * (uint64_t)Cc * R}, {64, (uint32_t)R, 1, 1}};
    wg_emu::Block bk(4 * R * Cc, &box);
    wg_emu::MBar mb;
    for (int c0 = 0; c0 < Cc; c0 += 64) {
        wg_emu::Copy cp{wg_layout::tile_off(0, c0, R), 0, {c0, 0, 0, 0}};
        bk.do_copy(cp, mb);
    }
    bool kmaj = true, mnmaj = true;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < Cc; k++) {
            const float want = wg_emu::bf(g[(size_t)r * Cc + k]);
            // K-major (S = Q K^T's operands): rows r, k-step k/16
            const wg_emu::Desc dk =
                wg_emu::decode(wg_layout::make_desc_sw128(wg_layout::tile_off(r / 64 * 64, k / 16 * 16, R), 16, 1024));
            kmaj &= bk.bf_at(wg_emu::operand_addr(dk, false, r % 64, k % 16)) == want;
            // MN-major (P V's B = V): k index the row r in steps of 16, n the column k
            const wg_emu::Desc dv =
                wg_emu::decode(wg_layout::make_desc_sw128(wg_layout::tile_off(r / 16 * 16, 0, R), R * 128, 1024));
            mnmaj &= bk.bf_at(wg_emu::operand_addr(dv, true, k, r % 16)) == want;
        }
    check(kmaj && !bk.bad, "TMA box -> K-major descriptor reads (Q, K)");
    check(mnmaj && !bk.bad, "TMA box -> MN-major descriptor reads (V, two 64-column blocks)");
}

// ---- 2. the kernel on the emulated GPU ----------------------------------------------
template <int D, typename O, bool kMerge>
static bool run_wg(const View& w, const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kvb, size_t kv_row0,
                   std::vector<O>& out, std::vector<float>& lse) {
    using C = WgFwdCfg<D>;
    const TcParams p = attn_tc::tc_params(w.s);
    const size_t o = kv_row0 * w.s.kv_stride;
    const attn_wg::WgMaps maps = attn_wg::wg_maps<D>(p, qb.data(), kvb.data() + w.koff + o, kvb.data() + w.voff + o);
    return wg_emu::run_grid((w.s.Tq + C::BM - 1) / C::BM, w.s.B * w.s.NH, C::smem_bytes, maps, [&](wg_emu::Ctx& cx) {
        if (p.doc)
            attn_wg::wg_fwd_body<wg_emu::Ctx, D, O, kMerge, true>(cx, out.data(), lse.data(), p);
        else
            attn_wg::wg_fwd_body<wg_emu::Ctx, D, O, kMerge, false>(cx, out.data(), lse.data(), p);
    });
}

// The backward on the emulated GPU. Plain (G = bf16 bits): dq through the
// fp32 accumulator and its conversion (dq_convert_elem), dk and dv
// overwritten; ring (G = float, kAcc): everything added to.
// The backward on the emulated GPU. Plain (G = bf16 bits): dq through the
// fp32 accumulator (returned in *acc_out) and its conversion
// (dq_convert_elem), dk and dv overwritten; ring (G = float, kAcc):
// everything added to. kDet: dq added in turns; together: every block at
// once (run_grid), the last ones started first.
template <int D, typename G, bool kAcc, bool kDet = false>
static bool run_wg_bwd(const View& w, size_t kv_row0, const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kvb,
                       const std::vector<uint16_t>& dob, const std::vector<float>& lse, const std::vector<float>& Dv,
                       std::vector<G>& dq, std::vector<G>& dkv, bool together = false,
                       std::vector<float>* acc_out = nullptr) {
    using C = attn_wg::WgBwdCfg<D>;
    const TcParams p = attn_tc::tc_params(w.s);
    const size_t o = kv_row0 * w.s.kv_stride;
    const attn_wg::WgMaps maps =
        attn_wg::wg_bwd_maps<D>(p, qb.data(), dob.data(), kvb.data() + w.koff + o, kvb.data() + w.voff + o);
    std::vector<float> acc;
    std::vector<int> turns(attn_wg::wg_bwd_turn_ints(p), 0);
    float* dq_acc;
    size_t bs, rs;
    if constexpr (kAcc) {
        dq_acc = reinterpret_cast<float*>(dq.data()), bs = w.s.qb(), rs = w.s.q_stride;
    } else {
        acc.assign(attn_tc::bwd_fused_dq_acc_floats(p, D), 0.f);
        dq_acc = acc.data(), rs = (size_t)w.s.NH * D, bs = (size_t)w.s.Tq * rs;
    }
    G* dk = dkv.data() + w.koff + o;
    G* dv = dkv.data() + w.voff + o;
    const bool ok = wg_emu::run_grid(
        (w.s.Tk + C::BN - 1) / C::BN, w.s.B * w.s.kv_heads(), C::smem_bytes, maps,
        [&](wg_emu::Ctx& cx) {
            if (p.doc)
                attn_wg::wg_bwd_body<wg_emu::Ctx, D, G, kAcc, true, kDet>(cx, dq_acc, bs, rs, turns.data(), dk, dv,
                                                                          lse.data(), Dv.data(), p);
            else
                attn_wg::wg_bwd_body<wg_emu::Ctx, D, G, kAcc, false, kDet>(cx, dq_acc, bs, rs, turns.data(), dk, dv,
                                                                           lse.data(), Dv.data(), p);
        },
        together);
    if constexpr (!kAcc) {
        for (size_t i = 0; i < acc.size() / 2; i++) attn_tc::dq_convert_elem(dq.data(), acc.data(), p, D, i);
        if (acc_out) *acc_out = acc;
    }
    return ok;
}

// Plain forward (bf16 out, overwrite); returns whether every check passed.
// Elements of k|v in the view: the K and the V rows.
static std::vector<char> kv_mask(const View& w) {
    const AttnShape& s = w.s;
    const size_t KC = (size_t)s.kv_heads() * s.HS;
    std::vector<char> m = mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, 0);
    const std::vector<char> vm = mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, KC);
    for (size_t i = 0; i < m.size(); i++) m[i] |= vm[i];
    return m;
}

// with_bwd: then the backward from the kernel's out and lse; det: also the
// backward whose dq is added in turns.
template <int D>
static bool test_plain(const char* name, const View& w, uint32_t seed, bool with_bwd = true, bool det = false) {
    const AttnShape& s = w.s;
    const std::vector<float> q = rand_bf16(w.qn, 1.f, seed), kv = rand_bf16(w.kvn, 1.f, seed + 1);
    std::vector<double> rout(w.on, 0.0), rlse(w.ln, 0.0);
    ref_forward(w, q, kv, rout, rlse);
    const std::vector<uint16_t> out_init(w.on, 0x7fc1);
    const std::vector<float> lse_init(w.ln, NAN);
    std::vector<uint16_t> out = out_init;
    std::vector<float> lse = lse_init;
    const bool ok = run_wg<D, uint16_t, false>(w, to_bits(q), to_bits(kv), 0, out, lse);
    const std::string n = std::string("HS=") + std::to_string(D) + " " + name;
    const int f0 = g_fail;
    check(ok, n + ": no rule broken (alignment, ranges, barriers)");
    compare(n + ": out", out, rout, mask_rows(w.on, s.B, s.Tq, s.NH, s.HS, s.ob(), s.o_stride, 0), out_init, 1e-2);
    compare(n + ": lse", lse, rlse, mask_lse(s, w.ln), lse_init, 1e-5);
    if (!with_bwd) return g_fail == f0;

    // The backward from the kernel's own out (bf16) and lse, as training runs it.
    const std::vector<float> dout = rand_bf16(w.on, 1.f, seed + 2), outf = bits_to_f(out);
    std::vector<float> lse_in = lse;
    for (float& x : lse_in)
        if (!std::isfinite(x)) x = 0.f;  // outside the view: never read
    std::vector<double> rdq(w.qn, 0.0), rdkv(w.kvn, 0.0);
    ref_backward(w, q, kv, dout, outf, lse_in, rdq, rdkv);
    const std::vector<uint16_t> dq_init(w.qn, 0x7fc1), dkv_init(w.kvn, 0x7fc1);
    std::vector<uint16_t> dq = dq_init, dkv = dkv_init;
    const std::vector<uint16_t> qbits = to_bits(q), kvbits = to_bits(kv), dobits = to_bits(dout);
    const std::vector<float> Dv = d_vector(s, dout, outf);
    const bool bok = run_wg_bwd<D, uint16_t, false>(w, 0, qbits, kvbits, dobits, lse_in, Dv, dq, dkv);
    check(bok, n + ": backward: no rule broken");
    const std::vector<char> qm = mask_rows(w.qn, s.B, s.Tq, s.NH, s.HS, s.qb(), s.q_stride, 0);
    compare(n + ": backward dq", dq, rdq, qm, dq_init, 1e-2);
    compare(n + ": backward dk|dv", dkv, rdkv, kv_mask(w), dkv_init, 1e-2);
    if (det) {  // dq in turns: right, and the same bits whether the blocks run in order or all at once
        std::vector<uint16_t> dq1 = dq_init, dkv1 = dkv_init, dq2 = dq_init, dkv2 = dkv_init;
        std::vector<float> acc1, acc2;
        bool dok = run_wg_bwd<D, uint16_t, false, true>(w, 0, qbits, kvbits, dobits, lse_in, Dv, dq1, dkv1, false, &acc1);
        dok &= run_wg_bwd<D, uint16_t, false, true>(w, 0, qbits, kvbits, dobits, lse_in, Dv, dq2, dkv2, true, &acc2);
        check(dok, n + ": backward in turns: no rule broken, no wait left hanging");
        compare(n + ": backward in turns dq", dq1, rdq, qm, dq_init, 1e-2);
        check(acc1 == acc2 && dkv1 == dkv2, n + ": backward in turns: blocks in order and all at once agree bit for bit");
    }
    return g_fail == f0;
}

// Ring attention: the first key block overwrites fp32 (out, lse), the second merges.
template <int D>
static void test_ring(const char* name, const View& full, int T1, uint32_t seed) {
    const AttnShape& s = full.s;
    const RingCase rc = ring_case(full, T1, seed);
    View b2 = rc.b2;
    std::vector<int> kpos2;
    if (s.doc_start) {
        for (int j = T1; j < s.Tk; j++) kpos2.push_back(j);
        b2.s.key_pos = kpos2.data();
    }
    const std::vector<uint16_t> qb = to_bits(rc.q), kvb = to_bits(rc.kv);
    const std::vector<float> out_init = rand_bf16(full.on, 3.f, seed + 3), lse_init = rand_bf16(full.ln, 3.f, seed + 4);
    std::vector<float> out = out_init, lse = lse_init;
    bool ok = run_wg<D, float, false>(rc.b1, qb, kvb, 0, out, lse);
    ok &= run_wg<D, float, true>(b2, qb, kvb, T1, out, lse);
    const std::string n = std::string("HS=") + std::to_string(D) + " " + name;
    check(ok, n + ": no rule broken (alignment, ranges, barriers)");
    compare(n + ": block out (fp32, first + merge)", out, rc.rout, mask_rows(full.on, s.B, s.Tq, s.NH, s.HS, s.ob(), s.o_stride, 0),
            out_init, 1e-2);
    compare(n + ": block lse", lse, rc.rlse, mask_lse(s, full.ln), lse_init, 1e-5);

    // The block backward with the global out (bf16-rounded reference) and lse, += into fp32.
    std::vector<float> outf(full.on), lse_in(full.ln);
    for (size_t i = 0; i < outf.size(); i++) outf[i] = b2f(f2b((float)rc.rout[i]));
    for (size_t i = 0; i < lse_in.size(); i++) lse_in[i] = std::isfinite(rc.rlse[i]) ? (float)rc.rlse[i] : 0.f;
    const std::vector<float> dq0 = rand_bf16(full.qn, 0.1f, seed + 5), dkv0 = rand_bf16(full.kvn, 0.1f, seed + 6);
    std::vector<double> rdq(dq0.begin(), dq0.end()), rdkv(dkv0.begin(), dkv0.end());
    ref_backward(full, rc.q, rc.kv, rc.dout, outf, lse_in, rdq, rdkv);
    std::vector<float> dq = dq0, dkv = dkv0;
    const std::vector<float> Dv = d_vector(s, rc.dout, outf);
    const std::vector<uint16_t> dob = to_bits(rc.dout);
    ok = run_wg_bwd<D, float, true>(rc.b1, 0, qb, kvb, dob, lse_in, Dv, dq, dkv);
    ok &= run_wg_bwd<D, float, true>(b2, T1, qb, kvb, dob, lse_in, Dv, dq, dkv);
    check(ok, n + ": block backward: no rule broken");
    const std::vector<char> qm = mask_rows(full.qn, s.B, s.Tq, s.NH, s.HS, s.qb(), s.q_stride, 0);
    compare(n + ": block backward dq (fp32 +=)", dq, rdq, qm, dq0, 1e-2);
    compare(n + ": block backward dk|dv (fp32 +=)", dkv, rdkv, kv_mask(full), dkv0, 1e-2);
    // dq added in turns, the blocks all at once.
    std::vector<float> dqd = dq0, dkvd = dkv0;
    ok = run_wg_bwd<D, float, true, true>(rc.b1, 0, qb, kvb, dob, lse_in, Dv, dqd, dkvd, true);
    ok &= run_wg_bwd<D, float, true, true>(b2, T1, qb, kvb, dob, lse_in, Dv, dqd, dkvd, true);
    check(ok, n + ": block backward in turns: no rule broken, no wait left hanging");
    compare(n + ": block backward in turns dq (fp32 +=)", dqd, rdq, qm, dq0, 1e-2);
}

// ---- 3. planted faults --------------------------------------------------------------
static void test_faults() {
    std::printf("planted faults (each must make the case fail)\n");
    const View w = make_view(1, 2, 64, 100, 100, true, 0, false);  // one tile: past-the-end rows never held data
    auto planted = [&](const char* what, bool wg_emu::Faults::*f) {
        wg_emu::faults() = wg_emu::Faults();
        wg_emu::faults().*f = true;
        const int p0 = g_pass, f0 = g_fail;
        g_quiet = true;
        const bool passed = test_plain<64>(what, w, 7);
        g_quiet = false;
        g_pass = p0, g_fail = f0;  // the planted case's own checks do not count
        wg_emu::faults() = wg_emu::Faults();
        check(!passed, std::string("planted fault caught: ") + what);
    };
    planted("copies without the zero fill past the tensor", &wg_emu::Faults::no_zero_fill);
    planted("copies written unswizzled", &wg_emu::Faults::no_swizzle_tma);
    planted("wgmma wait_group skipped", &wg_emu::Faults::skip_wgmma_wait);
    planted("descriptor SBO 128 bytes short", &wg_emu::Faults::sbo_off);
    planted("a transposed shared A (dS for dQ) read K-major", &wg_emu::Faults::no_trans_a);
}

int main() {
    test_layouts();
    std::printf("the Hopper forward on the emulated GPU (against fp64 attention)\n");
    // Causal, several 128-row tiles, T not a multiple of a tile (zero-filled rows, masked keys).
    test_plain<64>("causal B=1 NH=2 T=300", make_view(1, 2, 64, 300, 300, true, 0, false), 10, true, true);
    test_plain<128>("causal B=1 NH=1 T=260", make_view(1, 1, 128, 260, 260, true, 0, false), 20, true, true);
    // Non-causal Tq != Tk, padded rows, gaps between sequences, strided lse.
    test_plain<64>("non-causal B=2 NH=2 Tq=70 Tk=290 strided", make_view(2, 2, 64, 70, 290, false, 8, true), 30, true, true);
    test_plain<128>("non-causal B=2 NH=1 Tq=150 Tk=90 strided", make_view(2, 1, 128, 150, 90, false, 16, true), 40);
    // Grouped-query attention.
    test_plain<64>("GQA 2:1 causal B=1 NH=4 NKV=2 T=200", make_view(1, 4, 64, 200, 200, true, 0, false, 2), 70);
    test_plain<128>("GQA 4:1 causal B=1 NH=4 NKV=1 T=140", make_view(1, 4, 128, 140, 140, true, 0, false, 1), 80, true, true);
    // Ring blocks.
    test_ring<64>("ring B=2 NH=1 Tq=72 Tk=140+60", make_view(2, 1, 64, 72, 200, false, 8, true), 140, 50);
    test_ring<128>("GQA 4:1 ring B=1 NH=4 NKV=1 Tq=20 Tk=30+140", make_view(1, 4, 128, 20, 170, false, 0, false, 1), 30, 110);
    // The document mask: documents of mixed lengths (shorter and longer than
    // the tiles), causal; ring blocks whose queries come after all keys (rows
    // whose document starts after the last key see none: lse -inf).
    with_doc_mask(make_view(1, 2, 64, 300, 300, true, 0, false), 0, 30, 1,
                  [](const View& v) { test_plain<64>("docmask causal B=1 NH=2 T=300 (mean 30)", v, 130, true, true); });
    with_doc_mask(make_view(1, 1, 128, 270, 270, true, 0, false), 0, 150, 2,
                  [](const View& v) { test_plain<128>("docmask causal B=1 NH=1 T=270 (mean 150)", v, 140, true, true); });
    with_doc_mask(make_view(2, 2, 64, 140, 140, true, 0, true, 1), 0, 90, 3,
                  [](const View& v) { test_plain<64>("docmask GQA 2:1 causal B=2 NH=2 T=140 strided (mean 90)", v, 150, true, true); });
    with_doc_mask(make_view(2, 1, 64, 72, 200, false, 8, true), 204, 40, 4,
                  [](const View& v) { test_ring<64>("docmask ring B=2 NH=1 Tq=72 Tk=140+60 (mean 40)", v, 140, 160); });
    test_faults();
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
