// llmc/backend/cuda/attention_tc_kernels_bwd.h: the bodies of the tensor-core
// attention backward (dq, and dk/dv), written once for two executors like the
// forward in attention_tc_kernels.h, whose context contract, helpers and tile
// configurations (TcParams, load_rows, TcConfig) these use.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmc/backend/cuda/attention_tc_kernels.h"

namespace attn_tc {

// A warp's finished dk and dv rows (its two rows of each 16-row fragment;
// dk scaled): overwritten, or added to the fp32 ones of ring attention (kAcc).
template <int DT, typename G, bool kAcc>
TC_BODY void store_dkdv(G* dk, G* dv, size_t kvoff, int wrow0, int lane, const TcParams& p, const float (&dka)[DT][4],
                        const float (&dva)[DT][4]) {
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const RC rc0 = c_elem(lane, 2 * hh);
        const int j = wrow0 + rc0.row;
        if (j >= p.Tk) continue;
        G* krow = dk + kvoff + (size_t)j * p.kv_stride;
        G* vrow = dv + kvoff + (size_t)j * p.kv_stride;
        TC_UNROLL
        for (int dt = 0; dt < DT; dt++) {
            const int c = dt * 8 + rc0.col;
            const float k0v = dka[dt][2 * hh] * p.scale, k1v = dka[dt][2 * hh + 1] * p.scale;
            const float v0v = dva[dt][2 * hh], v1v = dva[dt][2 * hh + 1];
            if constexpr (kAcc) {
                store_pair(krow + c, krow[c] + k0v, krow[c + 1] + k1v);
                store_pair(vrow + c, vrow[c] + v0v, vrow[c + 1] + v1v);
            } else {
                store_pair(krow + c, k0v, k1v);
                store_pair(vrow + c, v0v, v1v);
            }
        }
    }
}

// P^T and dS^T in place, for a warp's 16 keys (rows, from wrow0) by NQ·8
// queries (columns, from q0) of a transposed backward: sc holds S^T, dp
// dP^T. Lb, Db, Dcb: each query column's lse·log2(e) (+inf: no row, P = 0),
// D and document start. masked: some element may be a key after its query
// (causal) or, with kKeyEnd, past Tk (a kernel that stores nothing for
// those keys leaves them: fewer registers); dmask: some query's document
// starts after some key, whose position is kp[] (rows g, g + 8).
template <int NQ, bool kDoc, bool kKeyEnd>
TC_BODY void p_ds_transposed(float (&sc)[NQ][4], float (&dp)[NQ][4], int lane, const TcParams& p, int wrow0, int q0,
                             const float* Lb, const float* Db, const int* Dcb, const int (&kp)[2], bool masked,
                             bool dmask) {
    TC_UNROLL
    for (int nq = 0; nq < NQ; nq++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) {
            const RC rc = c_elem(lane, e);
            const int j = wrow0 + rc.row, ci = nq * 8 + rc.col, i = q0 + ci;
            float pe = fexp2(sc[nq][e] * p.sl2 - Lb[ci]);
            const bool cut = masked && ((kKeyEnd && j >= p.Tk) || (p.causal && j > i));
            if constexpr (kDoc) {
                if (cut || (dmask && Dcb[ci] > kp[e >> 1])) pe = 0.f;
            } else {
                if (cut) pe = 0.f;
            }
            sc[nq][e] = pe;
            dp[nq][e] = pe * (dp[nq][e] - Db[ci]);
        }
}

// ==== backward: dq =================================================================
// A block: 4 warps x 16 query rows = 64 rows; key tiles of BN. kARegs keeps
// the warp's Q and dO rows in registers as A fragments (D = 64); otherwise
// they are re-read from shared memory at every k-step (D = 128, registers).
template <int D, int BN>
struct DqCfg {
    static constexpr int BM = 64, LD = D + kSmemPad, KD = D / 16, NT = BN / 8, DT = D / 8;
    static constexpr size_t smem_bytes = (size_t)(2 * BM + 4 * BN) * LD * sizeof(uint16_t);
};

// dq (type G) = scale · Σ_j dS_ij k_j with dS = P ∘ (dP − D), P = exp(S − lse),
// dP = dout · v^T. kAcc adds to dq (fp32, ring attention) instead of
// overwriting. kDoc: with the document mask, as in the forward.
template <class Ctx, int D, int BN, bool kARegs, typename G, bool kAcc, bool kDoc = false>
TC_BODY void dq_body(Ctx& cx, G* dq, const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                     const float* lse, const float* Dvec, const TcParams& p) {
    using C = DqCfg<D, BN>;
    static_assert(!kAcc || std::is_same<G, float>::value, "accumulated gradients are fp32");
    constexpr int LD = C::LD, BM = C::BM;
    uint16_t* Qs = static_cast<uint16_t*>(cx.smem());
    uint16_t* dOs = Qs + BM * LD;
    uint16_t* Ks = dOs + BM * LD;  // two buffers
    uint16_t* Vs = Ks + 2 * BN * LD;
    const int tid = cx.tid(), warp = tid >> 5, lane = tid & 31;
    const int b = cx.by() / p.NH, h = cx.by() % p.NH;
    const int ntq = (p.Tq + BM - 1) / BM;
    const int q0 = (ntq - 1 - cx.bx()) * BM;
    const int kvh = h / p.group;  // GQA: this query head's key/value head
    const uint16_t* kg = k + (size_t)b * p.kb + (size_t)kvh * D;
    const uint16_t* vg = v + (size_t)b * p.kb + (size_t)kvh * D;
    const int kend = p.causal ? imin(p.Tk, q0 + BM) : p.Tk;
    const int nkt = (kend + BN - 1) / BN;
    // The document mask (kDoc), as in the forward: the block's first key
    // tile, the warp's range of document starts, this lane's rows' starts.
    const int* docs = kDoc ? p.doc + (size_t)b * p.db : nullptr;
    int kt0 = 0, wdlo = INT_MIN, wdhi = INT_MIN, dr[2] = {INT_MIN, INT_MIN};
    if constexpr (kDoc) {
        const int w0 = q0 + warp * 16;
        TC_UNROLL
        for (int hh = 0; hh < 2; hh++) {
            const int i = w0 + c_elem(lane, 2 * hh).row;
            dr[hh] = i < p.Tq ? docs[i] : INT_MIN;
        }
        int blo, bhi;
        doc_range(docs, p.Tq, q0, BM, &blo, &bhi);
        kt0 = blo == INT_MAX ? nkt : first_key_from(p, blo, kend) / BN;
        doc_range(docs, p.Tq, w0, 16, &wdlo, &wdhi);
    }
    load_rows<Ctx, BM, D>(cx, Qs, q + (size_t)b * p.qb + (size_t)h * D, p.q_stride, q0, p.Tq);
    load_rows<Ctx, BM, D>(cx, dOs, dout + (size_t)b * p.ob + (size_t)h * D, p.o_stride, q0, p.Tq);
    if (kt0 < nkt) {
        load_rows<Ctx, BN, D>(cx, Ks + (kt0 & 1) * BN * LD, kg, p.kv_stride, kt0 * BN, p.Tk);
        load_rows<Ctx, BN, D>(cx, Vs + (kt0 & 1) * BN * LD, vg, p.kv_stride, kt0 * BN, p.Tk);
    }
    cx.cp_commit();

    const int wrow0 = q0 + warp * 16;
    const float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
    const float* D_bh = Dvec + ((size_t)b * p.NH + h) * p.Tq;
    float lse2[2], Dr[2];  // rows g and g+8: lse in the log2 domain (+inf: no such row, P = 0), D
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const int i = wrow0 + c_elem(lane, 2 * hh).row;
        const float L = i < p.Tq ? lse_bh[i] : -INFINITY;
        lse2[hh] = L > -INFINITY ? L * kLog2e : INFINITY;
        Dr[hh] = i < p.Tq ? D_bh[i] : 0.f;
    }
    float acc[C::DT][4];
    TC_UNROLL
    for (int dt = 0; dt < C::DT; dt++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) acc[dt][e] = 0.f;
    constexpr int KR = kARegs ? C::KD : 1;
    uint32_t qf[KR][4], df[KR][4];
    const RC rca = ldsm_a_rc(lane), rcn = ldsm_b_nk_rc(lane), rck = ldsm_b_kn_rc(lane);

    for (int kt = kt0; kt < nkt; kt++) {
        cx.cp_wait_all();
        cx.sync();
        if (kARegs && kt == kt0) {
            TC_UNROLL
            for (int kk = 0; kk < KR; kk++) {
                cx.ldsm_x4(qf[kk], Qs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
                cx.ldsm_x4(df[kk], dOs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
            }
        }
        if (kt + 1 < nkt) {
            const int nb = (kt + 1) & 1;
            load_rows<Ctx, BN, D>(cx, Ks + nb * BN * LD, kg, p.kv_stride, (kt + 1) * BN, p.Tk);
            load_rows<Ctx, BN, D>(cx, Vs + nb * BN * LD, vg, p.kv_stride, (kt + 1) * BN, p.Tk);
            cx.cp_commit();
        }
        const int k0 = kt * BN;
        if (p.causal && k0 > wrow0 + 15) continue;
        if (docs && key_at(p, imin(k0 + BN, p.Tk) - 1) < wdlo) continue;  // every key before every row's document
        const uint16_t* Kb = Ks + (kt & 1) * BN * LD;
        const uint16_t* Vb = Vs + (kt & 1) * BN * LD;

        float sc[C::NT][4], dp[C::NT][4];  // S, then dS; dP
        TC_UNROLL
        for (int nt = 0; nt < C::NT; nt++)
            TC_UNROLL
            for (int e = 0; e < 4; e++) sc[nt][e] = 0.f, dp[nt][e] = 0.f;
        TC_UNROLL
        for (int kk = 0; kk < C::KD; kk++) {
            uint32_t aq[4], ad[4];
            if constexpr (kARegs) {
                TC_UNROLL
                for (int x = 0; x < 4; x++) aq[x] = qf[kk][x], ad[x] = df[kk][x];
            } else {
                cx.ldsm_x4(aq, Qs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
                cx.ldsm_x4(ad, dOs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
            }
            TC_UNROLL
            for (int np = 0; np < C::NT / 2; np++) {
                uint32_t bk[4], bv[4];
                cx.ldsm_x4(bk, Kb + smem_off(np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                cx.mma(sc[2 * np], aq, bk[0], bk[1]);
                cx.mma(sc[2 * np + 1], aq, bk[2], bk[3]);
                cx.ldsm_x4(bv, Vb + smem_off(np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                cx.mma(dp[2 * np], ad, bv[0], bv[1]);
                cx.mma(dp[2 * np + 1], ad, bv[2], bv[3]);
            }
        }
        const bool dmask = kDoc && key_at(p, k0) < wdhi;  // some key of the tile before some row's document
        const bool masked = (k0 + BN > p.Tk) || (p.causal && k0 + BN - 1 > wrow0) || dmask;
        TC_UNROLL
        for (int nt = 0; nt < C::NT; nt++)
            TC_UNROLL
            for (int e = 0; e < 4; e++) {
                const RC rc = c_elem(lane, e);
                const int i = wrow0 + rc.row, j = k0 + nt * 8 + rc.col, hh = e >> 1;
                float pe = fexp2(sc[nt][e] * p.sl2 - lse2[hh]);
                // (the plain kernel's test on its own: the same registers as before the mask)
                if constexpr (kDoc) {
                    if (masked && (j >= p.Tk || (p.causal && j > i) || (dmask && key_at(p, j) < dr[hh]))) pe = 0.f;
                } else {
                    if (masked && (j >= p.Tk || (p.causal && j > i))) pe = 0.f;
                }
                sc[nt][e] = pe * (dp[nt][e] - Dr[hh]);
            }
        // dq += dS K: dS's accumulators are the A operand; K via ldmatrix.trans.
        TC_UNROLL
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4];
            c_to_a(a, sc[2 * kk], sc[2 * kk + 1]);
            TC_UNROLL
            for (int dpp = 0; dpp < C::DT / 2; dpp++) {
                uint32_t bk[4];
                cx.ldsm_x4_t(bk, Kb + smem_off(kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                cx.mma(acc[2 * dpp], a, bk[0], bk[1]);
                cx.mma(acc[2 * dpp + 1], a, bk[2], bk[3]);
            }
        }
    }
    cx.cp_wait_all();
    G* dqb = dq + (size_t)b * p.qb + (size_t)h * D;
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const RC rc0 = c_elem(lane, 2 * hh);
        const int i = wrow0 + rc0.row;
        if (i >= p.Tq) continue;
        G* row = dqb + (size_t)i * p.q_stride;
        TC_UNROLL
        for (int dt = 0; dt < C::DT; dt++) {
            G* pp = row + dt * 8 + rc0.col;
            const float x0 = acc[dt][2 * hh] * p.scale, x1 = acc[dt][2 * hh + 1] * p.scale;
            if constexpr (kAcc)
                store_pair(pp, pp[0] + x0, pp[1] + x1);
            else
                store_pair(pp, x0, x1);
        }
    }
}

// ==== backward: dk, dv =============================================================
// A block: 4 warps x 16 key rows = 64 keys; query tiles of BQ (with their lse
// and D values staged in shared memory next to them).
template <int D, int BQ>
struct DkvCfg {
    static constexpr int BN = 64, LD = D + kSmemPad, KD = D / 16, NQ = BQ / 8, DT = D / 8;
    static constexpr size_t smem_bytes =
        (size_t)(2 * BN + 4 * BQ) * LD * sizeof(uint16_t) + (size_t)4 * BQ * sizeof(float) + (size_t)2 * BQ * sizeof(int);
};

// dv_j = Σ_i P_ij dout_i, dk_j = scale · Σ_i dS_ij q_i, computed transposed:
// S^T = K Q^T and dP^T = V dout^T give P^T and dS^T with the warp's keys as
// rows, which are the A operands of dv += P^T dout and dk += dS^T Q.
template <class Ctx, int D, int BQ, bool kARegs, typename G, bool kAcc, bool kDoc = false>
TC_BODY void dkdv_body(Ctx& cx, G* dk, G* dv, const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                       const uint16_t* v, const float* lse, const float* Dvec, const TcParams& p) {
    using C = DkvCfg<D, BQ>;
    static_assert(!kAcc || std::is_same<G, float>::value, "accumulated gradients are fp32");
    constexpr int LD = C::LD, BN = C::BN;
    uint16_t* Ks = static_cast<uint16_t*>(cx.smem());
    uint16_t* Vs = Ks + BN * LD;
    uint16_t* Qs = Vs + BN * LD;    // two buffers of BQ rows
    uint16_t* dOs = Qs + 2 * BQ * LD;  // two buffers
    float* Ls = reinterpret_cast<float*>(dOs + 2 * BQ * LD);  // [2][BQ] lse·log2(e) (+inf: no row)
    float* Ds = Ls + 2 * BQ;                                   // [2][BQ] D
    int* Dcs = reinterpret_cast<int*>(Ds + 2 * BQ);            // [2][BQ] document starts (INT_MAX: no row)
    const int tid = cx.tid(), warp = tid >> 5, lane = tid & 31;
    // by() = b * KVH + g over the key/value heads (GQA; KVH = NH, g = h
    // without it). The block's iterations run over (query head of g's group,
    // query tile) pairs, heads outer, flattened into one sequence so the
    // double buffering carries on from one head to the next: iteration it
    // is head g*group + it / nqt, tile it % nqt, and dk, dv sum over the
    // group in registers in that fixed order.
    const int b = cx.by() / p.KVH, g = cx.by() % p.KVH;
    const int k0 = cx.bx() * BN;  // causal: the first key tiles see the most queries, and start first
    const int qstart = p.causal ? (k0 / BQ) * BQ : 0;
    // The document mask: queries from the first whose document starts after
    // this block's last key see none of its keys, and neither do later ones
    // (document starts do not decrease along the queries), so the query
    // tiles end there.
    const int* docs = kDoc ? p.doc + (size_t)b * p.db : nullptr;
    int qend = p.Tq;
    if (docs) qend = first_query_past(docs, qstart, p.Tq, key_at(p, imin(k0 + BN, p.Tk) - 1));
    const int nqt = qend > qstart ? (qend - qstart + BQ - 1) / BQ : 0;
    const int nit = p.group * nqt;
    const size_t kvoff = (size_t)b * p.kb + (size_t)g * D;
    auto qhead = [&](int it) { return g * p.group + it / nqt; };
    auto qtile0 = [&](int it) { return qstart + (it % nqt) * BQ; };
    // Q and dout rows of iteration it's tile into buffer buf, and their lse
    // and D (plain loads; visible after the next barrier).
    auto load_iter = [&](int buf, int it) {
        const int h = qhead(it), q0 = qtile0(it);
        load_rows<Ctx, BQ, D>(cx, Qs + buf * BQ * LD, q + (size_t)b * p.qb + (size_t)h * D, p.q_stride, q0, p.Tq);
        load_rows<Ctx, BQ, D>(cx, dOs + buf * BQ * LD, dout + (size_t)b * p.ob + (size_t)h * D, p.o_stride, q0,
                              p.Tq);
        if (tid < BQ) {
            const float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
            const float* D_bh = Dvec + ((size_t)b * p.NH + h) * p.Tq;
            const int i = q0 + tid;
            const float L = i < p.Tq ? lse_bh[i] : -INFINITY;
            Ls[buf * BQ + tid] = L > -INFINITY ? L * kLog2e : INFINITY;
            Ds[buf * BQ + tid] = i < p.Tq ? D_bh[i] : 0.f;
            if (kDoc) Dcs[buf * BQ + tid] = i < p.Tq ? docs[i] : INT_MAX;
        }
    };
    load_rows<Ctx, BN, D>(cx, Ks, k + kvoff, p.kv_stride, k0, p.Tk);
    load_rows<Ctx, BN, D>(cx, Vs, v + kvoff, p.kv_stride, k0, p.Tk);
    if (nit > 0) load_iter(0, 0);
    cx.cp_commit();

    const int wrow0 = k0 + warp * 16;  // this warp's first key
    const int wkfirst = key_at(p, wrow0), wklast = key_at(p, imin(wrow0 + 16, p.Tk) - 1);
    int kp[2];  // this lane's keys' positions (rows g and g+8)
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) kp[hh] = key_at(p, wrow0 + c_elem(lane, 2 * hh).row);
    float dka[C::DT][4], dva[C::DT][4];
    TC_UNROLL
    for (int dt = 0; dt < C::DT; dt++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) dka[dt][e] = 0.f, dva[dt][e] = 0.f;
    constexpr int KR = kARegs ? C::KD : 1;
    uint32_t kf[KR][4], vf[KR][4];
    const RC rca = ldsm_a_rc(lane), rcn = ldsm_b_nk_rc(lane), rck = ldsm_b_kn_rc(lane);

    for (int it = 0; it < nit; it++) {
        const int q0 = qtile0(it), buf = it & 1;
        cx.cp_wait_all();
        cx.sync();  // iteration it's tile landed for everyone; everyone is done with it-1's buffer
        if (kARegs && it == 0) {
            TC_UNROLL
            for (int kk = 0; kk < KR; kk++) {
                cx.ldsm_x4(kf[kk], Ks + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
                cx.ldsm_x4(vf[kk], Vs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
            }
        }
        if (it + 1 < nit) {  // prefetch the next (head, tile) into the buffer it-1 used
            load_iter(buf ^ 1, it + 1);
            cx.cp_commit();
        }
        if (p.causal && q0 + BQ - 1 < wrow0) continue;  // every query before every key of this warp
        const int* Dcb = Dcs + buf * BQ;
        if (docs && Dcb[0] > wklast) continue;  // every query's document starts after this warp's keys
        const uint16_t* Qb = Qs + buf * BQ * LD;
        const uint16_t* dOb = dOs + buf * BQ * LD;
        const float* Lb = Ls + buf * BQ;
        const float* Db = Ds + buf * BQ;

        float sc[C::NQ][4], dp[C::NQ][4];  // S^T then P^T; dP^T then dS^T
        TC_UNROLL
        for (int nq = 0; nq < C::NQ; nq++)
            TC_UNROLL
            for (int e = 0; e < 4; e++) sc[nq][e] = 0.f, dp[nq][e] = 0.f;
        TC_UNROLL
        for (int kk = 0; kk < C::KD; kk++) {
            uint32_t ak[4], av[4];
            if constexpr (kARegs) {
                TC_UNROLL
                for (int x = 0; x < 4; x++) ak[x] = kf[kk][x], av[x] = vf[kk][x];
            } else {
                cx.ldsm_x4(ak, Ks + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
                cx.ldsm_x4(av, Vs + smem_off(warp * 16 + rca.row, kk * 16 + rca.col, LD));
            }
            TC_UNROLL
            for (int np = 0; np < C::NQ / 2; np++) {
                uint32_t bq[4], bo[4];
                cx.ldsm_x4(bq, Qb + smem_off(np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                cx.mma(sc[2 * np], ak, bq[0], bq[1]);
                cx.mma(sc[2 * np + 1], ak, bq[2], bq[3]);
                cx.ldsm_x4(bo, dOb + smem_off(np * 16 + rcn.row, kk * 16 + rcn.col, LD));
                cx.mma(dp[2 * np], av, bo[0], bo[1]);
                cx.mma(dp[2 * np + 1], av, bo[2], bo[3]);
            }
        }
        const bool masked = p.causal && q0 < wrow0 + 15;  // some query of the tile precedes some key
        const bool dmask = kDoc && Dcb[BQ - 1] > wkfirst;  // some query's document starts after some key
        p_ds_transposed<C::NQ, kDoc, false>(sc, dp, lane, p, wrow0, q0, Lb, Db, Dcb, kp, masked, dmask);
        // dv += P^T dout, dk += dS^T q: the B operands via ldmatrix.trans.
        TC_UNROLL
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t ap[4], as[4];
            c_to_a(ap, sc[2 * kk], sc[2 * kk + 1]);
            c_to_a(as, dp[2 * kk], dp[2 * kk + 1]);
            TC_UNROLL
            for (int dpp = 0; dpp < C::DT / 2; dpp++) {
                uint32_t bo[4], bq[4];
                cx.ldsm_x4_t(bo, dOb + smem_off(kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                cx.mma(dva[2 * dpp], ap, bo[0], bo[1]);
                cx.mma(dva[2 * dpp + 1], ap, bo[2], bo[3]);
                cx.ldsm_x4_t(bq, Qb + smem_off(kk * 16 + rck.row, dpp * 16 + rck.col, LD));
                cx.mma(dka[2 * dpp], as, bq[0], bq[1]);
                cx.mma(dka[2 * dpp + 1], as, bq[2], bq[3]);
            }
        }
    }
    cx.cp_wait_all();
    store_dkdv<C::DT, G, kAcc>(dk, dv, kvoff, wrow0, lane, p, dka, dva);
}

}  // namespace attn_tc
