// tests/unit/test_mma_layout.cpp: CPU check of the tensor-core attention kernels'
// index logic (llmc/backend/cuda/mma_layout.h, llmc/backend/cuda/attention_tc_kernels.h
// and attention_tc_kernels_bwd.h), compiled by g++ without CUDA, for a build
// machine that has no GPU.
//
// The PTX instructions are emulated from their definitions in the PTX ISA
// (section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
// type" and the ldmatrix section "Warp-level matrix load instruction:
// ldmatrix"), transcribed independently of mma_layout.h (in
// tests/unit/mma_emulator.h, with the emulated GPU of 4):
//   1. mma_layout.h's mappings equal the transcription, lane by lane, and
//      cover each tile exactly once; bf16 rounding is round-to-nearest-even.
//   2. ldmatrix row addresses are 16-byte aligned and, with the padded row
//      pitch, free of shared-memory bank conflicts.
//   3. One warp (32 emulated lanes) computes Q·K^T and P·V tiles with the
//      helpers, against naive products.
//   4. The real kernel bodies (forward, backward dq, backward dk/dv, ring
//      merge and accumulate) run on an emulated GPU: one host thread per CUDA
//      thread, __syncthreads as a barrier, ldmatrix/mma/shuffles as warp
//      collectives, cp.async landing only at the issuing thread's wait (so a
//      missing wait reads stale data). Shared memory starts as NaN; outputs
//      start as NaN (overwritten) or random (accumulated), and what lies
//      outside the attention's view must stay untouched. Results are
//      compared with a naive fp64 attention (tests/unit/attention_fp64.h),
//      with and without grouped-query attention (2:1 and 4:1 query heads
//      per key/value head).
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "llmc/backend/cuda/attention_tc_kernels_bwd.h"
#include "tests/unit/attention_emu.h"
#include "tests/unit/attention_fp64.h"
#include "tests/unit/mma_emulator.h"

using namespace mma_layout;

// ---- 1. mappings --------------------------------------------------------------------
static void test_mappings() {
    std::printf("fragment mappings against the PTX ISA\n");
    bool a_ok = true, b_ok = true, c_ok = true;
    int a_cover[16][16] = {}, b_cover[16][8] = {}, c_cover[16][8] = {};
    for (int L = 0; L < 32; L++) {
        for (int i = 0; i < 8; i++) {
            const RC h = a_elem(L, i), s = spec_a(L, i);
            a_ok &= h.row == s.row && h.col == s.col;
            a_cover[s.row][s.col]++;
        }
        for (int i = 0; i < 4; i++) {
            const RC h = b_elem(L, i), s = spec_b(L, i);
            b_ok &= h.row == s.row && h.col == s.col;
            b_cover[s.row][s.col]++;
            const RC hc = c_elem(L, i), sc = spec_c(L, i);
            c_ok &= hc.row == sc.row && hc.col == sc.col;
            c_cover[sc.row][sc.col]++;
        }
    }
    bool cover = true;
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) cover &= a_cover[r][c] == 1;
        for (int c = 0; c < 8; c++) cover &= b_cover[r][c] == 1 && c_cover[r][c] == 1;
    }
    check(a_ok, "A fragment (a_elem) = PTX m16n8k16 .bf16 A layout");
    check(b_ok, "B fragment (b_elem) = PTX m16n8k16 .bf16 B layout");
    check(c_ok, "C fragment (c_elem) = PTX m16n8k16 .f32 C/D layout");
    check(cover, "each layout covers its tile exactly once");
    // c_to_a: accumulator element i of tile n is A element (row, 8n + col).
    bool ca = true;
    for (int L = 0; L < 32; L++) {
        float c0[4], c1[4];
        for (int i = 0; i < 4; i++) c0[i] = (float)(L * 8 + i), c1[i] = (float)(L * 8 + 4 + i);
        uint32_t a[4];
        c_to_a(a, c0, c1);
        for (int i = 0; i < 8; i++) {
            const RC ra = spec_a(L, i);
            const int tile = ra.col / 8;
            // the value c_to_a put there must be the accumulator of the same (row, col)
            const float v = (i & 1) ? hi_of(a[i / 2]) : lo_of(a[i / 2]);
            const float* ct = tile ? c1 : c0;
            int found = -1;
            for (int e = 0; e < 4; e++) {
                const RC rc = spec_c(L, e);
                if (rc.row == ra.row && rc.col == ra.col % 8) found = e;
            }
            ca &= found >= 0 && v == ct[found];
        }
    }
    check(ca, "c_to_a: two C tiles are the A fragment of the 16x16 tile they form");
    // bf16 rounding: round to nearest, ties to even.
    bool rn = f2b(1.0f) == 0x3f80 && f2b(-2.0f) == 0xc000 && b2f(f2b(3.14159f)) == 3.140625f;
    float tie_even, tie_odd;
    uint32_t u = 0x3f808000u;  // 1 + 2^-8: exactly between 0x3f80 and 0x3f81 -> even 0x3f80
    std::memcpy(&tie_even, &u, 4);
    u = 0x3f818000u;  // between 0x3f81 and 0x3f82 -> even 0x3f82
    std::memcpy(&tie_odd, &u, 4);
    rn &= f2b(tie_even) == 0x3f80 && f2b(tie_odd) == 0x3f82 && f2b(INFINITY) == 0x7f80;
    check(rn, "bf16 rounding: nearest, ties to even");
}

// ---- 2. ldmatrix addressing ------------------------------------------------------------
static void test_addressing() {
    std::printf("ldmatrix addresses: alignment and bank conflicts\n");
    for (int D : {64, 128}) {
        const int ld = D + kSmemPad;
        bool aligned = true, conflict_free = true;
        RC (*fns[4])(int) = {ldsm_a_rc, ldsm_b_nk_rc, ldsm_b_kn_rc, ldsm_a_km_rc};
        for (auto fn : fns)
            for (int r0 = 0; r0 < 64; r0 += 16)
                for (int c0 = 0; c0 < D; c0 += 16) {
                    for (int m = 0; m < 4; m++) {  // one matrix = one 128-byte phase
                        bool used[8] = {};
                        for (int r = 0; r < 8; r++) {
                            const RC rc = fn(8 * m + r);
                            const int byte = 2 * smem_off(r0 + rc.row, c0 + rc.col, ld);
                            aligned &= byte % 16 == 0;
                            const int group = (byte / 16) % 8;  // 4 banks of 4 bytes
                            conflict_free &= !used[group];
                            used[group] = true;
                        }
                    }
                }
        check(aligned, "HS=" + std::to_string(D) + ": every ldmatrix row address is 16-byte aligned");
        check(conflict_free, "HS=" + std::to_string(D) + ": the 8 rows of each ldmatrix matrix hit 8 bank groups");
    }
    // The x4 patterns deliver what the kernels assume: for each pattern, the
    // lanes' registers must be the A / B fragments of the addressed tile.
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> dist(0, 0x7fff);
    const int ld = 24;
    std::vector<uint16_t> tile(16 * ld);
    for (auto& x : tile) x = (uint16_t)dist(rng);
    auto load = [&](RC (*fn)(int), bool trans, uint32_t (&out)[32][4]) {
        const uint16_t* rows[32];
        for (int L = 0; L < 32; L++) {
            const RC rc = fn(L);
            rows[L] = tile.data() + smem_off(rc.row, rc.col, ld);
        }
        emu_ldmatrix_x4(rows, trans, out);
    };
    auto at = [&](int r, int c) { return tile[smem_off(r, c, ld)]; };
    auto half = [](uint32_t reg, int i) { return (uint16_t)((i & 1) ? reg >> 16 : reg & 0xffffu); };
    uint32_t ra[32][4], rn[32][4], rk[32][4], rt[32][4];
    load(ldsm_a_rc, false, ra);
    load(ldsm_b_nk_rc, false, rn);
    load(ldsm_b_kn_rc, true, rk);
    load(ldsm_a_km_rc, true, rt);
    bool a_ok = true, nk_ok = true, kn_ok = true, km_ok = true;
    for (int L = 0; L < 32; L++) {
        for (int i = 0; i < 8; i++) {
            const RC rc = spec_a(L, i);  // tile stored [m][k]
            a_ok &= half(ra[L][i / 2], i) == at(rc.row, rc.col);
            km_ok &= half(rt[L][i / 2], i) == at(rc.col, rc.row);  // stored [k][m]
        }
        for (int nt = 0; nt < 2; nt++)
            for (int i = 0; i < 4; i++) {
                const RC rc = spec_b(L, i);  // (k, n) of n-tile nt
                nk_ok &= half(rn[L][2 * nt + i / 2], i) == at(8 * nt + rc.col, rc.row);  // stored [n][k]
                kn_ok &= half(rk[L][2 * nt + i / 2], i) == at(rc.row, 8 * nt + rc.col);  // stored [k][n]
            }
    }
    check(a_ok, "ldsm_a_rc x4 gives the A fragment of a [m][k] tile");
    check(nk_ok, "ldsm_b_nk_rc x4 gives the B fragments of two n-tiles of a [n][k] tile");
    check(kn_ok, "ldsm_b_kn_rc x4 .trans gives the B fragments of two n-tiles of a [k][n] tile");
    check(km_ok, "ldsm_a_km_rc x4 .trans gives the A fragment of a [k][m] tile");
}

// ---- 3. one warp, one tile -------------------------------------------------------------
static void test_warp_tile() {
    std::printf("one warp: S = Q K^T (16x64, d=64) and O = P V with the helpers\n");
    const int M = 16, N = 64, D = 64, ld = D + kSmemPad;
    const std::vector<float> qf = rand_bf16(M * D, 1.f, 1), kf = rand_bf16(N * D, 1.f, 2), vf = rand_bf16(N * D, 1.f, 3);
    std::vector<uint16_t> Qs(M * ld), Ks(N * ld), Vs(N * ld);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < D; c++) Qs[smem_off(r, c, ld)] = f2b(qf[r * D + c]);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < D; c++) Ks[smem_off(r, c, ld)] = f2b(kf[r * D + c]), Vs[smem_off(r, c, ld)] = f2b(vf[r * D + c]);
    auto ldsm = [&](const std::vector<uint16_t>& t, int r0, int c0, RC (*fn)(int), bool trans, uint32_t (&out)[32][4]) {
        const uint16_t* rows[32];
        for (int L = 0; L < 32; L++) {
            const RC rc = fn(L);
            rows[L] = t.data() + smem_off(r0 + rc.row, c0 + rc.col, ld);
        }
        emu_ldmatrix_x4(rows, trans, out);
    };
    // S[lane][nt][e]
    static float S[32][N / 8][4];
    std::memset(S, 0, sizeof(S));
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[32][4], bk[32][4];
        ldsm(Qs, 0, kk * 16, ldsm_a_rc, false, a);
        for (int np = 0; np < N / 16; np++) {
            ldsm(Ks, np * 16, kk * 16, ldsm_b_nk_rc, false, bk);
            for (int half = 0; half < 2; half++) {
                uint32_t b[32][2];
                float c[32][4], d[32][4];
                for (int L = 0; L < 32; L++) {
                    b[L][0] = bk[L][2 * half], b[L][1] = bk[L][2 * half + 1];
                    for (int e = 0; e < 4; e++) c[L][e] = S[L][2 * np + half][e];
                }
                emu_mma(d, a, b, c);
                for (int L = 0; L < 32; L++)
                    for (int e = 0; e < 4; e++) S[L][2 * np + half][e] = d[L][e];
            }
        }
    }
    std::vector<double> got(M * N), ref(M * N, 0.0);
    for (int L = 0; L < 32; L++)
        for (int nt = 0; nt < N / 8; nt++)
            for (int e = 0; e < 4; e++) {
                const RC rc = c_elem(L, e);
                got[rc.row * N + nt * 8 + rc.col] = S[L][nt][e];
            }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            for (int c = 0; c < D; c++) ref[i * N + j] += (double)qf[i * D + c] * kf[j * D + c];
    check(rel_err(got, ref) < 1e-6, "Q K^T through ldsm_a_rc, ldsm_b_nk_rc, mma, c_elem");

    // O = P V with P = S / 16 taken from the accumulators by c_to_a.
    static float O[32][D / 8][4];
    std::memset(O, 0, sizeof(O));
    for (int kk = 0; kk < N / 16; kk++) {
        uint32_t a[32][4], bv[32][4];
        for (int L = 0; L < 32; L++) {
            float c0[4], c1[4];
            for (int e = 0; e < 4; e++) c0[e] = S[L][2 * kk][e] / 16, c1[e] = S[L][2 * kk + 1][e] / 16;
            c_to_a(a[L], c0, c1);
        }
        for (int dp = 0; dp < D / 16; dp++) {
            ldsm(Vs, kk * 16, dp * 16, ldsm_b_kn_rc, true, bv);
            for (int half = 0; half < 2; half++) {
                uint32_t b[32][2];
                float c[32][4], d[32][4];
                for (int L = 0; L < 32; L++) {
                    b[L][0] = bv[L][2 * half], b[L][1] = bv[L][2 * half + 1];
                    for (int e = 0; e < 4; e++) c[L][e] = O[L][2 * dp + half][e];
                }
                emu_mma(d, a, b, c);
                for (int L = 0; L < 32; L++)
                    for (int e = 0; e < 4; e++) O[L][2 * dp + half][e] = d[L][e];
            }
        }
    }
    std::vector<double> gotO(M * D), refO(M * D, 0.0);
    for (int L = 0; L < 32; L++)
        for (int dt = 0; dt < D / 8; dt++)
            for (int e = 0; e < 4; e++) {
                const RC rc = c_elem(L, e);
                gotO[rc.row * D + dt * 8 + rc.col] = O[L][dt][e];
            }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const double pij = b2f(f2b((float)(got[i * N + j] / 16)));  // P rounded to bf16, as c_to_a does
            for (int c = 0; c < D; c++) refO[i * D + c] += pij * vf[j * D + c];
        }
    check(rel_err(gotO, refO) < 1e-6, "P V through c_to_a, ldsm_b_kn_rc (.trans), mma, c_elem");
}

// ---- 4. the kernels on an emulated GPU -------------------------------------------------
// (the GPU: tests/unit/mma_emulator.h; the fp64 truth: tests/unit/attention_fp64.h)

// (the helpers and runners: tests/unit/attention_emu.h)

// Plain forward and backward (bf16 outputs, overwrite) on one view.
template <int D>
static void test_plain(const char* name, const View& w, uint32_t seed) {
    const AttnShape& s = w.s;
    const std::vector<float> q = rand_bf16(w.qn, 1.f, seed), kv = rand_bf16(w.kvn, 1.f, seed + 1),
                             dout = rand_bf16(w.on, 1.f, seed + 2);
    std::vector<double> rout(w.on, 0.0), rlse(w.ln, 0.0);
    ref_forward(w, q, kv, rout, rlse);
    const std::vector<uint16_t> out_init(w.on, 0x7fc1);  // NaN: every in-view element must be written
    const std::vector<float> lse_init(w.ln, NAN);
    std::vector<uint16_t> out = out_init;
    std::vector<float> lse = lse_init;
    bool ok;
    run_forward<D>(w, q, kv, out, lse, &ok);
    const std::string n = std::string("HS=") + std::to_string(D) + " " + name;
    check(ok, n + ": forward shared-memory accesses in range and aligned");
    const size_t KC = (size_t)s.kv_heads() * s.HS;
    compare(n + ": forward out", out, rout, mask_rows(w.on, s.B, s.Tq, s.NH, s.HS, s.ob(), s.o_stride, 0), out_init, 1e-2);
    compare(n + ": forward lse", lse, rlse, mask_lse(s, w.ln), lse_init, 1e-5);

    // Backward from the kernel's own out (bf16) and lse, as training runs it.
    const std::vector<float> outf = bits_to_f(out);
    std::vector<float> lse_in = lse;
    for (size_t i = 0; i < lse_in.size(); i++)
        if (!std::isfinite(lse_in[i])) lse_in[i] = 0.f;  // outside the view: never read
    std::vector<double> rdq(w.qn, 0.0), rdkv(w.kvn, 0.0);
    ref_backward(w, q, kv, dout, outf, lse_in, rdq, rdkv);
    const std::vector<uint16_t> dq_init(w.qn, 0x7fc1), dkv_init(w.kvn, 0x7fc1);
    std::vector<uint16_t> dq = dq_init, dkv = dkv_init;
    const std::vector<float> Dv = d_vector(s, dout, outf);
    ok = run_backward<D, uint16_t, false>(w, 0, to_bits(q), to_bits(kv), to_bits(dout), lse_in, Dv, dq, dkv);
    check(ok, n + ": backward shared-memory accesses in range and aligned");
    compare(n + ": backward dq", dq, rdq, mask_rows(w.qn, s.B, s.Tq, s.NH, s.HS, s.qb(), s.q_stride, 0), dq_init, 1e-2);
    std::vector<char> kvm = mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, 0);
    const std::vector<char> vm = mask_rows(w.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, KC);
    for (size_t i = 0; i < kvm.size(); i++) kvm[i] |= vm[i];
    compare(n + ": backward dk|dv", dkv, rdkv, kvm, dkv_init, 1e-2);
}

// Ring attention: queries against two key blocks (rows [0, T1) and [T1, Tk)
// of the k|v buffer), the second merged into the first's fp32 (out, lse);
// then the block backward adds both blocks' gradients into fp32 buffers.
template <int D>
static void test_ring(const char* name, const View& full, int T1, uint32_t seed) {
    const AttnShape& s = full.s;
    const RingCase rc = ring_case(full, T1, seed);
    const std::vector<float>&q = rc.q, &kv = rc.kv, &dout = rc.dout;
    const std::vector<double>&rout = rc.rout, &rlse = rc.rlse;
    const View& b1 = rc.b1;
    View b2 = rc.b2;
    std::vector<int> kpos2;  // with the document mask: the second block's keys are at T1, T1+1, ...
    if (s.doc_start) {
        for (int j = T1; j < s.Tk; j++) kpos2.push_back(j);
        b2.s.key_pos = kpos2.data();
    }
    const std::vector<uint16_t> qb = to_bits(q), kvb = to_bits(kv);
    const std::vector<float> out_init = rand_bf16(full.on, 3.f, seed + 3), lse_init = rand_bf16(full.ln, 3.f, seed + 4);
    std::vector<float> out = out_init, lse = lse_init;
    bool ok = run_block_forward<D, false>(b1, qb, kvb, 0, out, lse);
    ok &= run_block_forward<D, true>(b2, qb, kvb, T1, out, lse);
    const std::string n = std::string("HS=") + std::to_string(D) + " " + name;
    check(ok, n + ": block forward shared-memory accesses in range and aligned");
    compare(n + ": block forward out (fp32, first + merge)", out, rout,
            mask_rows(full.on, s.B, s.Tq, s.NH, s.HS, s.ob(), s.o_stride, 0), out_init, 1e-2);
    compare(n + ": block forward lse", lse, rlse, mask_lse(s, full.ln), lse_init, 1e-5);

    // Backward with the global out (bf16-rounded reference) and lse.
    std::vector<float> outf(full.on), lse_in(full.ln);
    for (size_t i = 0; i < outf.size(); i++) outf[i] = b2f(f2b((float)rout[i]));
    for (size_t i = 0; i < lse_in.size(); i++) lse_in[i] = std::isfinite(rlse[i]) ? (float)rlse[i] : 0.f;
    const std::vector<float> dq0 = rand_bf16(full.qn, 0.1f, seed + 5), dkv0 = rand_bf16(full.kvn, 0.1f, seed + 6);
    std::vector<double> rdq(dq0.begin(), dq0.end()), rdkv(dkv0.begin(), dkv0.end());
    ref_backward(full, q, kv, dout, outf, lse_in, rdq, rdkv);
    std::vector<float> dq = dq0, dkv = dkv0;
    const std::vector<float> Dv = d_vector(s, dout, outf);
    const std::vector<uint16_t> dob = to_bits(dout);
    ok = run_backward<D, float, true>(b1, 0, qb, kvb, dob, lse_in, Dv, dq, dkv);
    ok &= run_backward<D, float, true>(b2, T1, qb, kvb, dob, lse_in, Dv, dq, dkv);
    check(ok, n + ": block backward shared-memory accesses in range and aligned");
    const size_t KC = (size_t)s.kv_heads() * s.HS;
    compare(n + ": block backward dq (fp32 +=)", dq, rdq, mask_rows(full.qn, s.B, s.Tq, s.NH, s.HS, s.qb(), s.q_stride, 0), dq0,
            1e-2);
    std::vector<char> kvm = mask_rows(full.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, 0);
    const std::vector<char> vm = mask_rows(full.kvn, s.B, s.Tk, s.kv_heads(), s.HS, s.kb(), s.kv_stride, KC);
    for (size_t i = 0; i < kvm.size(); i++) kvm[i] |= vm[i];
    compare(n + ": block backward dk|dv (fp32 +=)", dkv, rdkv, kvm, dkv0, 1e-2);
}

// The document mask: causal rows of documents of mixed lengths (shorter and
// longer than the tiles), and ring blocks whose queries come after all keys
// (rows whose document starts after the last key see none: lse -inf).
template <int D>
static void plain_with_docs(const char* name, View w, int mean, unsigned seed) {
    with_doc_mask(w, 0, mean, seed, [&](const View& v) { test_plain<D>(name, v, 120 + 10 * seed); });
}
template <int D>
static void ring_with_docs(const char* name, View w, int T1, int mean, unsigned seed) {  // queries after all keys
    with_doc_mask(w, w.s.Tk + 4, mean, seed, [&](const View& v) { test_ring<D>(name, v, T1, 120 + 10 * seed); });
}
static void test_document_mask() {
    std::printf("the document mask\n");
    plain_with_docs<64>("docmask causal B=1 NH=2 T=200 (mean 30)", make_view(1, 2, 64, 200, 200, true, 0, false), 30, 1);
    plain_with_docs<128>("docmask causal B=1 NH=1 T=150 (mean 6)", make_view(1, 1, 128, 150, 150, true, 0, false), 6, 2);
    plain_with_docs<64>("docmask GQA 2:1 causal B=2 NH=2 T=140 strided (mean 90)",
                        make_view(2, 2, 64, 140, 140, true, 0, true, 1), 90, 3);
    ring_with_docs<64>("docmask ring B=2 NH=1 Tq=72 Tk=40+60 (mean 40)", make_view(2, 1, 64, 72, 100, false, 8, true), 40,
                       40, 4);
    ring_with_docs<128>("docmask GQA 4:1 ring B=1 NH=4 Tq=40 Tk=64+66 (mean 60)",
                        make_view(1, 4, 128, 40, 130, false, 0, false, 1), 64, 60, 5);
}

int main() {
    test_mappings();
    test_addressing();
    test_warp_tile();
    std::printf("kernel bodies on the emulated GPU (against fp64 attention)\n");
    // Causal, T not a multiple of any tile, several query tiles (skips, diagonal masks).
    test_plain<64>("causal B=1 NH=2 T=200", make_view(1, 2, 64, 200, 200, true, 0, false), 10);
    test_plain<128>("causal B=1 NH=1 T=150", make_view(1, 1, 128, 150, 150, true, 0, false), 20);
    // Non-causal Tq != Tk, padded rows, gaps between sequences, strided lse.
    test_plain<64>("non-causal B=2 NH=2 Tq=70 Tk=130 strided", make_view(2, 2, 64, 70, 130, false, 8, true), 30);
    test_plain<128>("non-causal B=2 NH=1 Tq=40 Tk=90 strided", make_view(2, 1, 128, 40, 90, false, 16, true), 40);
    // Ring blocks: keys split in two, merged (forward) and accumulated (backward).
    test_ring<64>("ring B=2 NH=1 Tq=72 Tk=40+60", make_view(2, 1, 64, 72, 100, false, 8, true), 40, 50);
    test_ring<128>("ring B=1 NH=2 Tq=33 Tk=64+17", make_view(1, 2, 128, 33, 81, false, 0, false), 64, 60);
    // Grouped-query attention (2:1 and 4:1): the forward and dq read the
    // shared kv head; dk/dv blocks loop over the group's query heads (the
    // double buffering running on across heads), summing them.
    test_plain<64>("GQA 2:1 causal B=1 NH=4 NKV=2 T=130", make_view(1, 4, 64, 130, 130, true, 0, false, 2), 70);
    test_plain<128>("GQA 4:1 causal B=1 NH=4 NKV=1 T=70", make_view(1, 4, 128, 70, 70, true, 0, false, 1), 80);
    test_plain<64>("GQA 4:1 non-causal B=2 NH=8 NKV=2 Tq=40 Tk=100 strided",
                   make_view(2, 8, 64, 40, 100, false, 8, true, 2), 90);
    test_ring<64>("GQA 2:1 ring B=1 NH=2 NKV=1 Tq=50 Tk=64+30", make_view(1, 2, 64, 50, 94, false, 8, true, 1), 64,
                  100);
    test_ring<128>("GQA 4:1 ring B=1 NH=4 NKV=1 Tq=20 Tk=30+40", make_view(1, 4, 128, 20, 70, false, 0, false, 1), 30,
                   110);
    test_document_mask();
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
