// llmc/backend/cuda/attention_tc_kernels_bwd_fused.h: the body of the one-kernel
// tensor-core attention backward (selected by LLMC_ATTN_BWD=5, see
// attention_tc.cuh), written once for two executors like the bodies of
// attention_tc_kernels.h and attention_tc_kernels_bwd.h, whose context
// contract, helpers and conventions it uses; plus the per-element dq
// conversion of its plain (bf16) form.
//
// One block owns 64 keys of one key/value head (4 warps x 16 keys) and
// loops over 128-query tiles (every query head of the head's GQA group, then
// every tile: the flattening of dkdv_body). Per (query tile, key tile) it
// does five products instead of the two-kernel backward's seven:
//   S^T = K Q^T, dP^T = V dO^T           (keys as rows, as in dkdv_body)
//   dV += P^T dO, dK += dS^T Q            (P^T, dS^T straight from registers)
//   dQ  = dS K                            (dS^T through shared memory)
// dK and dV stay in registers across the whole loop and are written once.
// dQ of a query tile gets a contribution from every key-tile block, so it is
// added with fp32 atomics: into an fp32 accumulator that a conversion pass
// (dq_convert_elem) turns into bf16 dq (plain backward), or straight into
// ring attention's fp32 dq (block backward, +=). The order of those atomic
// adds depends on the scheduling of the blocks: dq is NOT bitwise
// reproducible from run to run (dk and dv are: fixed order in registers).
//
// D = rowsum(dO * O) is computed in the kernel (kFoldD) from the dO and O
// tiles in shared memory, 128 rows by 128 threads, instead of the separate
// dot_do_o pass; without kFoldD it is read from a precomputed vector like
// the two-kernel backward does (fewer shared-memory bytes: a tuning option).
//
// Shared memory, HS 64, 3 stages (the default): K, V (18 KB), per stage Q,
// dO, O tiles of 128 rows (55 KB), the dS^T tile (17 KB), lse and D (3 KB):
// about 203 KB, one block per SM. The Q/dO/O tiles stream through a
// STAGES-deep cp.async ring: the copy of tile it+STAGES-1 is issued when tile
// it starts, and each iteration commits exactly one group (empty past the
// end), so "tile it landed" is cp.async.wait_group STAGES-2.
//
// Per iteration (warp-uniform, three barriers): [A] tile it landed for all,
// tile it-1's buffers and the dS tile are free; issue the next copy; D of the
// tile (kFoldD), [B]; S^T and dP^T in two passes of 64 queries (registers:
// 32 + 32 fp32 per pass next to 64 for dK, dV and 16 for K's A
// fragments; V's are re-read from shared memory, 4 ldmatrix per pass), each pass updating dV, dK and writing its dS^T columns; [C];
// dQ: warp w multiplies query rows 32w..32w+31 of dS (ldmatrix .trans of
// dS^T, mma_layout.h ldsm_a_km_rc) by K and adds them to dq atomically.
//
// Head size 128 is not handled here (dK, dV alone would be 128 registers,
// the dQ tile 128 more): the dispatcher keeps the two-kernel backward there.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "llmc/backend/cuda/attention_tc_kernels_bwd.h"

namespace attn_tc {

// Stage count of the Q/dO/O ring; -DTC_BWD5_STAGES=2 to try fewer.
#ifndef TC_BWD5_STAGES
#define TC_BWD5_STAGES 3
#endif

template <int D, int BQ, int STAGES, bool kFoldD>
struct Bwd5Cfg {
    static_assert(D == 64, "the one-kernel backward is for head size 64 (HS 128 keeps the two kernels)");
    static_assert(BQ % 64 == 0 && STAGES >= 2 && STAGES <= 3, "tile shape");
    static constexpr int BN = 64, LD = D + kSmemPad, LDS = BQ + kSmemPad, KD = D / 16, DT = D / 8;
    static constexpr int QH = 64;                  // queries per S/dP pass
    static constexpr int NQ = QH / 8;              // 8-query column tiles per pass
    static constexpr int TILES = kFoldD ? 3 : 2;   // Q, dO (and O) per stage
    static constexpr int MT = BQ / 4 / 16;         // dQ m-tiles per warp
    static constexpr size_t stage_elems = (size_t)TILES * BQ * LD;
    static constexpr size_t smem_bytes = ((size_t)2 * BN * LD + STAGES * stage_elems + (size_t)BN * LDS) * 2 +
                                         (size_t)2 * STAGES * BQ * sizeof(float);
};

// Eight bf16 (16 bytes, 16-byte aligned, shared memory) as floats.
TC_BODY void load8(float (&f)[8], const uint16_t* p) {
    uint32_t w[4];
#if defined(__CUDA_ARCH__)
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
#else
    std::memcpy(w, p, 16);
#endif
    TC_UNROLL
    for (int x = 0; x < 4; x++) {
        f[2 * x] = bf16_bits_to_float((uint16_t)(w[x] & 0xffffu));
        f[2 * x + 1] = bf16_bits_to_float((uint16_t)(w[x] >> 16));
    }
}

// The fp32 dq accumulator of the plain backward: dense [B][Tq][NH][HS].
inline size_t bwd_fused_dq_acc_floats(const TcParams& p, int D) { return (size_t)p.B * p.Tq * p.NH * D; }

// Element pair idx (2 idx, 2 idx + 1 of the dense accumulator) into bf16
// dq with q's strides, times nothing: the kernel already applied the scale.
TC_BODY void dq_convert_elem(uint16_t* dq, const float* acc, const TcParams& p, int D, size_t idx) {
    const size_t e = 2 * idx;
    const size_t c = e % D, r = e / D;  // r = (b * Tq + i) * NH + h
    const size_t h = r % p.NH, bi = r / p.NH;
    const size_t i = bi % p.Tq, b = bi / p.Tq;
    store_pair(dq + b * p.qb + i * p.q_stride + h * D + c, acc[e], acc[e + 1]);
}

// dk, dv (type G) overwritten (or += with kAcc, fp32); scale · dS K added
// atomically to the fp32 dq at dq_acc + b * dq_bs + i * dq_rs + h * D.
// Dvec: the precomputed D [B][NH][Tq] when !kFoldD (unused otherwise); out:
// the forward's output (o_stride, ob) when kFoldD.
template <class Ctx, int D, int BQ, int STAGES, bool kFoldD, typename G, bool kAcc>
TC_BODY void bwd_fused_body(Ctx& cx, float* dq_acc, size_t dq_bs, size_t dq_rs, G* dk, G* dv, const uint16_t* dout,
                       const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* out,
                       const float* lse, const float* Dvec, const TcParams& p) {
    using C = Bwd5Cfg<D, BQ, STAGES, kFoldD>;
    static_assert(!kAcc || std::is_same<G, float>::value, "accumulated gradients are fp32");
    constexpr int LD = C::LD, LDS = C::LDS, BN = C::BN;
    uint16_t* Ks = static_cast<uint16_t*>(cx.smem());
    uint16_t* Vs = Ks + BN * LD;
    uint16_t* St = Vs + BN * LD;  // STAGES x {Q, dO, O} tiles of BQ rows
    uint16_t* dSs = St + STAGES * C::stage_elems;  // [BN keys][BQ queries] dS^T (bf16)
    float* Ls = reinterpret_cast<float*>(dSs + BN * LDS);  // [STAGES][BQ] lse·log2(e) (+inf: no row)
    float* Ds = Ls + STAGES * BQ;                          // [STAGES][BQ] D
    const int tid = cx.tid(), warp = tid >> 5, lane = tid & 31;
    const int b = cx.by() / p.KVH, g = cx.by() % p.KVH;
    const int k0 = cx.bx() * BN;
    // Causal: queries before k0 see none of these keys; tiles start at k0
    // itself (any row offset works: lse, D and dq are addressed by row), so
    // the first tile holds the diagonal and no 64-query pass is all masked.
    const int qstart = p.causal ? k0 : 0;
    const int nqt = p.Tq > qstart ? (p.Tq - qstart + BQ - 1) / BQ : 0;
    const int nit = p.group * nqt;
    const size_t kvoff = (size_t)b * p.kb + (size_t)g * D;
    auto qhead = [&](int it) { return g * p.group + it / nqt; };
    auto qtile0 = [&](int it) { return qstart + (it % nqt) * BQ; };
    auto qtile = [&](int buf) { return St + buf * C::stage_elems; };
    auto dotile = [&](int buf) { return St + buf * C::stage_elems + BQ * LD; };
    auto otile = [&](int buf) { return St + buf * C::stage_elems + 2 * BQ * LD; };
    // Iteration it's Q, dO (and O) rows into stage buf by cp.async; its lse
    // (and D without kFoldD) by plain loads, visible after the next barrier.
    auto load_iter = [&](int buf, int it) {
        const int h = qhead(it), q0 = qtile0(it);
        load_rows<Ctx, BQ, D>(cx, qtile(buf), q + (size_t)b * p.qb + (size_t)h * D, p.q_stride, q0, p.Tq);
        load_rows<Ctx, BQ, D>(cx, dotile(buf), dout + (size_t)b * p.ob + (size_t)h * D, p.o_stride, q0, p.Tq);
        if constexpr (kFoldD)
            load_rows<Ctx, BQ, D>(cx, otile(buf), out + (size_t)b * p.ob + (size_t)h * D, p.o_stride, q0, p.Tq);
        const float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
        for (int r = tid; r < BQ; r += kThreads) {
            const int i = q0 + r;
            const float L = i < p.Tq ? lse_bh[i] : -INFINITY;
            Ls[buf * BQ + r] = L > -INFINITY ? L * kLog2e : INFINITY;
            if constexpr (!kFoldD) Ds[buf * BQ + r] = i < p.Tq ? Dvec[((size_t)b * p.NH + h) * p.Tq + i] : 0.f;
        }
    };
    load_rows<Ctx, BN, D>(cx, Ks, k + kvoff, p.kv_stride, k0, p.Tk);
    load_rows<Ctx, BN, D>(cx, Vs, v + kvoff, p.kv_stride, k0, p.Tk);
    TC_UNROLL
    for (int s = 0; s < STAGES - 1; s++) {  // one group per stage (K and V ride with the first)
        if (s < nit) load_iter(s, s);
        cx.cp_commit();
    }

    const int wrow0 = k0 + warp * 16;  // this warp's first key
    float dka[C::DT][4], dva[C::DT][4];
    TC_UNROLL
    for (int dt = 0; dt < C::DT; dt++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) dka[dt][e] = 0.f, dva[dt][e] = 0.f;
    uint32_t kf[C::KD][4];  // K as A fragments; V's are re-read per k-step (registers: 255 otherwise)
    const RC rca = ldsm_a_rc(lane), rcn = ldsm_b_nk_rc(lane), rck = ldsm_b_kn_rc(lane), rct = ldsm_a_km_rc(lane);

    for (int it = 0; it < nit; it++) {
        const int q0 = qtile0(it), h = qhead(it), buf = it % STAGES;
        cx.cp_wait(STAGES - 2);  // this thread's copies of stage it (and K, V) landed
        cx.sync();               // [A] ... everyone's; everyone is done with iteration it-1
        if (it == 0) {
            TC_UNROLL
            for (int kk = 0; kk < C::KD; kk++) {
                cx.ldsm_x4(kf[kk], Ks + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
            }
        }
        if (it + STAGES - 1 < nit) load_iter((it + STAGES - 1) % STAGES, it + STAGES - 1);  // the buffer of it-1
        cx.cp_commit();  // always one group per iteration, so the wait count above holds
        const uint16_t* Qb = qtile(buf);
        const uint16_t* dOb = dotile(buf);
        const float* Lb = Ls + buf * BQ;
        const float* Db = Ds + buf * BQ;
        if constexpr (kFoldD) {
            const uint16_t* Ob = otile(buf);
            for (int r = tid; r < BQ; r += kThreads) {  // rows past Tq were zero-filled: D = 0
                float acc = 0.f;
                TC_UNROLL
                for (int c = 0; c < D; c += 8) {
                    float fd[8], fo[8];
                    load8(fd, dOb + smem_off(r, c, LD));
                    load8(fo, Ob + smem_off(r, c, LD));
                    TC_UNROLL
                    for (int x = 0; x < 8; x++) acc += fd[x] * fo[x];
                }
                Ds[buf * BQ + r] = acc;
            }
            cx.sync();  // [B] D of the tile visible
        }

        TC_ROLLED  // one pass's S and dP live at a time (unrolled: 255 registers and spills)
        for (int hp = 0; hp < BQ / C::QH; hp++) {  // 64-query passes
            const int qc0 = hp * C::QH;
            float sc[C::NQ][4], dp[C::NQ][4];  // S^T then P^T; dP^T then dS^T
            TC_UNROLL
            for (int nq = 0; nq < C::NQ; nq++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) sc[nq][e] = 0.f, dp[nq][e] = 0.f;
            TC_UNROLL
            for (int kk = 0; kk < C::KD; kk++) {
                uint32_t av[4];
                cx.ldsm_x4(av, Vs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
                TC_UNROLL
                for (int np = 0; np < C::NQ / 2; np++) {
                    uint32_t bq[4], bo[4];
                    cx.ldsm_x4(bq, Qb + smem_off(qc0 + np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                    cx.mma(sc[2 * np], kf[kk], bq[0], bq[1]);
                    cx.mma(sc[2 * np + 1], kf[kk], bq[2], bq[3]);
                    cx.ldsm_x4(bo, dOb + smem_off(qc0 + np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                    cx.mma(dp[2 * np], av, bo[0], bo[1]);
                    cx.mma(dp[2 * np + 1], av, bo[2], bo[3]);
                }
            }
            // Masks: keys past Tk (zero rows of K, V, but P would not be
            // zero), causal queries before keys. Queries past Tq have lse
            // +inf: P = 0.
            const bool masked = (wrow0 + 15 >= p.Tk) || (p.causal && q0 + qc0 < wrow0 + 15);
            TC_UNROLL
            for (int nq = 0; nq < C::NQ; nq++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const RC rc = c_elem(lane, e);
                    const int j = wrow0 + rc.row, ci = qc0 + nq * 8 + rc.col, i = q0 + ci;
                    float pe = fexp2(sc[nq][e] * p.sl2 - Lb[ci]);
                    if (masked && (j >= p.Tk || (p.causal && j > i))) pe = 0.f;
                    sc[nq][e] = pe;
                    dp[nq][e] = pe * (dp[nq][e] - Db[ci]);
                }
            // dv += P^T dout, dk += dS^T q (B operands via ldmatrix.trans),
            // and dS^T (rounded to bf16 as the A operand of dk is) to shared
            // memory for dQ: lane stores rows g, g+8, columns 2t, 2t+1 of
            // each 8-query tile (the 272-byte pitch keeps them conflict-free).
            TC_UNROLL
            for (int kk = 0; kk < C::QH / 16; kk++) {
                uint32_t ap[4], as[4];
                c_to_a(ap, sc[2 * kk], sc[2 * kk + 1]);
                c_to_a(as, dp[2 * kk], dp[2 * kk + 1]);
                TC_UNROLL
                for (int dpp = 0; dpp < C::DT / 2; dpp++) {
                    uint32_t bo[4], bq[4];
                    cx.ldsm_x4_t(bo, dOb + smem_off(qc0 + kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                    cx.mma(dva[2 * dpp], ap, bo[0], bo[1]);
                    cx.mma(dva[2 * dpp + 1], ap, bo[2], bo[3]);
                    cx.ldsm_x4_t(bq, Qb + smem_off(qc0 + kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                    cx.mma(dka[2 * dpp], as, bq[0], bq[1]);
                    cx.mma(dka[2 * dpp + 1], as, bq[2], bq[3]);
                }
            }
            TC_UNROLL
            for (int nq = 0; nq < C::NQ; nq++)
                TC_UNROLL
                for (int hh = 0; hh < 2; hh++) {
                    const RC rc = c_elem(lane, 2 * hh);
                    store_pair(dSs + smem_off(warp * 16 + rc.row, qc0 + nq * 8 + rc.col, LDS), dp[nq][2 * hh],
                               dp[nq][2 * hh + 1]);
                }
        }
        cx.sync();  // [C] the whole dS^T tile written

        // dQ rows 32·warp.. of the tile = dS (A: .trans of dS^T) · K (B: .trans of K).
        float qa[C::MT][C::DT][4];
        TC_UNROLL
        for (int mt = 0; mt < C::MT; mt++)
            TC_UNROLL
            for (int dt = 0; dt < C::DT; dt++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) qa[mt][dt][e] = 0.f;
        const int m0 = warp * (BQ / 4);
        TC_UNROLL
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[C::MT][4];
            TC_UNROLL
            for (int mt = 0; mt < C::MT; mt++)
                cx.ldsm_x4_t(a[mt], dSs + smem_off(kk * 16 + rct.row, m0 + mt * 16 + rct.col, LDS));
            TC_UNROLL
            for (int dpp = 0; dpp < C::DT / 2; dpp++) {
                uint32_t bk[4];
                cx.ldsm_x4_t(bk, Ks + smem_off(kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                TC_UNROLL
                for (int mt = 0; mt < C::MT; mt++) {
                    cx.mma(qa[mt][2 * dpp], a[mt], bk[0], bk[1]);
                    cx.mma(qa[mt][2 * dpp + 1], a[mt], bk[2], bk[3]);
                }
            }
        }
        // Atomic fp32 adds: the only unordered step (see the top).
        float* dqh = dq_acc + (size_t)b * dq_bs + (size_t)h * D;
        TC_UNROLL
        for (int mt = 0; mt < C::MT; mt++)
            TC_UNROLL
            for (int hh = 0; hh < 2; hh++) {
                const RC rc0 = c_elem(lane, 2 * hh);
                const int i = q0 + m0 + mt * 16 + rc0.row;
                if (i >= p.Tq) continue;
                float* row = dqh + (size_t)i * dq_rs;
                TC_UNROLL
                for (int dt = 0; dt < C::DT; dt++) {
                    cx.atomic_add(row + dt * 8 + rc0.col, qa[mt][dt][2 * hh] * p.scale);
                    cx.atomic_add(row + dt * 8 + rc0.col + 1, qa[mt][dt][2 * hh + 1] * p.scale);
                }
            }
    }
    cx.cp_wait(0);  // no copy left in flight
    store_dkdv<C::DT, G, kAcc>(dk, dv, kvoff, wrow0, lane, p, dka, dva);
}

}  // namespace attn_tc
