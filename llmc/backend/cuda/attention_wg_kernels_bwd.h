// llmc/backend/cuda/attention_wg_kernels_bwd.h: the body of the Hopper
// (sm_90a) attention backward, written once for two executors like the
// forward in attention_wg_kernels.h, whose context contract, tensor maps and
// layouts it uses: attention_wg.cuh runs it as a CUDA kernel, and
// tests/unit/test_wgmma_attention.cpp runs the same code on the emulated GPU
// of tests/unit/wgmma_emulator.h against fp64 attention.
//
// The algebra is FlashAttention-2's (attention_tc.cuh says it in full):
// P = exp(S - lse) recomputed, dP = dO V^T, dS = P ∘ (dP - D) with D =
// rowsum(dO ∘ O) from the small pass that runs before (attention.cuh's
// dot_do_o), dV = P^T dO, dK = scale·dS^T Q, dQ = scale·dS K.
//
// A block owns BN = 128 keys of one key/value head and walks the query
// tiles of BQ = 64 rows that see them (every query head of the head's GQA
// group, tiles in order: the flattening of dkdv_body), with 3 warpgroups:
//  * warpgroup 0 is the producer. K and V of the block arrive once by TMA;
//    then per query tile one thread issues TMA copies of the Q and dO tiles
//    into a ring of kStages stages, while the 32 lanes of its first warp put
//    the tile's lse (log2 domain, +inf past Tq: P = 0), D and document
//    starts beside them with plain stores. The stage's "full" mbarrier
//    counts those 32 arrivals (the release that publishes the stores) and
//    the copies' bytes; its "empty" one the 8 consumer warps.
//  * warpgroups 1 and 2 are consumers of 64 keys each. Per query tile:
//      S^T = K Q^T and dP^T = V dO^T    wgmma, A and B from shared memory
//                                       (K-major), N = 64 queries: the
//                                       keys are the rows, as in dkdv_body
//      P^T, dS^T in registers           the masks, lse and D per column
//      dV += P^T dO, dK += dS^T Q        wgmma, A from registers (c_to_a, as
//                                       the forward's O += P V), B = dO or Q
//                                       MN-major; dK, dV stay in registers
//                                       across the whole walk
//      dS^T to shared memory            bf16, 128-byte swizzle, double
//                                       buffered; fence.proxy.async makes
//                                       the stores visible to wgmma
//      dQ = dS K                        wgmma with A = dS^T read transposed
//                                       (M-major) and B = K (MN-major), then
//                                       fp32 atomics into dq (see below)
//    Head size 128 splits dQ's columns between the two consumers (each
//    multiplies all 128 keys of dS by 64 columns of K, after a barrier of
//    both); head size 64 lets each consumer multiply its own 64 keys by all
//    64 columns (a barrier of its own warpgroup; twice the atomics, no
//    wait on the other consumer). Either way the product is 64 x 64: 32
//    accumulators per thread, next to 2·D/2 for dK and dV.
// dQ of a query tile gets a contribution from every key block, so it is
// added with fp32 atomics: into an accumulator that a second pass turns
// into bf16 (the plain backward), or straight into ring attention's fp32 dq.
// Their order depends on the scheduling of the blocks: dq is not bitwise
// reproducible run to run; dk and dv are (a fixed order in registers).
// kDet fixes the order instead: per (batch row, query head, query tile) a
// counter in global memory says whose turn it is, and consumer cw of key
// block n adds its part (plain loads and stores, through L2) when the
// counter reads 2n + cw, then counts one more. Every block before n covers
// every tile n covers (causal blocks start at their first key), so the
// turns run 0, 1, 2, ... without gaps; under the document mask a block that
// ends its walk early still takes its turns on the tiles it skips, adding
// nothing. A block waits only on blocks of lower index, which the GPU
// starts first, so the waits end.
//
// Masks, the document mask, GQA and ring blocks are those of dkdv_body: the
// same first query tile for causal blocks (the block's first key: no earlier
// query sees it), the same last one under the document mask (the first
// query whose document starts after the block's last key), the same
// element masks. Both consumers walk the same tiles (they share the stages
// and, at head size 128, the dS tile); a consumer whose keys all follow a
// tile's queries computes zeros there.
//
// A context Ctx provides what attention_wg_kernels.h lists, and:
//   wgmma_ss_t<N>(d, da, db, acc)    d (+)= A·B with A M-major (transposed) and B MN-major
//   fence_proxy_async()              fence.proxy.async.shared::cta
//   atomic_add(p, x)                 *p += x, atomically (red.global.add.f32)
//   sem_wait(p, v), sem_post(p)      wait until *p == v (ld.acquire.gpu); *p += 1 (red.release.gpu)
//   add_ordered(p, x)                *p += x, plain, through L2 (the turn makes it exclusive)
#pragma once
#include "llmc/backend/cuda/attention_tc_kernels_bwd.h"
#include "llmc/backend/cuda/attention_wg_kernels.h"

namespace attn_wg {

enum BwdMap { kBQ = 0, kBdO = 1, kBK = 2, kBV = 3 };  // the backward's four tensor maps
constexpr int kDsBarrier0 = 3;                          // named barriers 3 (both consumers) or 3, 4 (one each)
constexpr int kDqTurnBarrier0 = 5;                      // named barriers 5, 6: a consumer's dq turn (kDet)

template <int D>
struct WgBwdCfg {
    static_assert(D == 64 || D == 128, "head sizes 64 and 128");
    static constexpr int BN = 64 * kConsumers, BQ = 64, kStages = 2;
    static constexpr int KD = D / 16, NQ = BQ / 8, QK = BQ / 16;
    static constexpr bool kSplitCols = D == 128;            // dQ: columns split (128) or keys split (64)
    static constexpr int DQN = 64;                          // dQ columns per consumer
    static constexpr int DQK = kSplitCols ? BN / 16 : 4;    // dQ k-steps (keys / 16)
    static constexpr uint32_t kv_bytes = BN * D * 2, tile_bytes = BQ * D * 2, ds_bytes = BN * BQ * 2;
    static constexpr uint32_t vec_bytes = 3 * BQ * 4;       // per stage: lse·log2(e), D, document starts
    // Offsets from the 1024-byte aligned base (tiles whole swizzle atoms).
    static constexpr uint32_t k_off = 0, v_off = kv_bytes, q_off = 2 * kv_bytes,
                              do_off = q_off + kStages * tile_bytes, ds_off = do_off + kStages * tile_bytes,
                              vec_off = ds_off + 2 * ds_bytes, bar_off = vec_off + kStages * vec_bytes;
    static constexpr int kBars = 1 + 2 * kStages;  // K and V; full, empty per stage
    static constexpr size_t smem_bytes = bar_off + kBars * 8 + kAtomBytes;
    // setmaxnreg's split: a block starts with 168 registers per thread (the
    // launch bound: 64K / 384, in steps of 8), and the consumers can only
    // take what the producer gave back, so P + 2C <= 3·168. A consumer at
    // head size 128 (dK, dV: 128 accumulators) spills at 232.
    static constexpr int kProducerRegs = D == 128 ? 24 : 40, kConsumerRegs = D == 128 ? 240 : 232;
    static_assert(kProducerRegs + kConsumers * kConsumerRegs <= 3 * 168, "setmaxnreg would wait forever");
};

// The query tiles a key block walks: heads of the group outer, tiles inner.
struct WgBwdRange {
    int qstart, nqt, nit;
};
template <int D>
TC_BODY WgBwdRange wg_bwd_range(const TcParams& p, int k0, int b, bool doc) {
    using C = WgBwdCfg<D>;
    WgBwdRange r;
    r.qstart = p.causal ? k0 : 0;  // k0 is a multiple of BQ
    // Under the document mask, queries from the first whose document starts after the last key see none.
    const int qend =
        doc ? first_query_past(p.doc + (size_t)b * p.db, r.qstart, p.Tq, key_at(p, imin(k0 + C::BN, p.Tk) - 1)) : p.Tq;
    r.nqt = qend > r.qstart ? (qend - r.qstart + C::BQ - 1) / C::BQ : 0;
    r.nit = p.group * r.nqt;
    return r;
}

template <int D>
inline WgMaps wg_bwd_maps(const TcParams& p, const void* q, const void* dout, const void* k, const void* v) {
    using C = WgBwdCfg<D>;
    WgMaps m{};
    m.n = 4;
    wg_map(m, kBQ, q, D, p.Tq, p.NH, p.B, p.q_stride, p.qb, C::BQ);
    wg_map(m, kBdO, dout, D, p.Tq, p.NH, p.B, p.o_stride, p.ob, C::BQ);
    wg_map(m, kBK, k, D, p.Tk, p.KVH, p.B, p.kv_stride, p.kb, C::BN);
    wg_map(m, kBV, v, D, p.Tk, p.KVH, p.B, p.kv_stride, p.kb, C::BN);
    return m;
}

// The turn counters of kDet: [B][NH][query tiles of 64], zeroed before the kernel.
inline size_t wg_bwd_turn_ints(const TcParams& p) { return (size_t)p.B * p.NH * ((p.Tq + 63) / 64); }

// dk, dv (type G) overwritten, or added to (kAcc, fp32, ring attention);
// scale·dS K added to the fp32 dq at dq_acc + b·dq_bs + i·dq_rs + h·D,
// atomically, or in turns (kDet, turn: wg_bwd_turn_ints counters). Dvec: D
// as [B][NH][Tq].
template <class Ctx, int D, typename G, bool kAcc, bool kDoc, bool kDet>
TC_BODY void wg_bwd_body(Ctx& cx, float* dq_acc, size_t dq_bs, size_t dq_rs, int* turn, G* dk, G* dv,
                         const float* lse, const float* Dvec, const TcParams& p) {
    using C = WgBwdCfg<D>;
    static_assert(!kAcc || std::is_same<G, float>::value, "accumulated gradients are fp32");
    constexpr int S = C::kStages, BQ = C::BQ;
    uint8_t* raw = static_cast<uint8_t*>(cx.smem());
    uint8_t* base = raw + ((kAtomBytes - (cx.smem_u32(raw) & (kAtomBytes - 1))) & (kAtomBytes - 1));
    const uint32_t sbase = cx.smem_u32(base);
    uint64_t* bars = reinterpret_cast<uint64_t*>(base + C::bar_off);
    uint64_t* bar_kv = bars;
    uint64_t* full = bars + 1;
    uint64_t* empty = bars + 1 + S;
    auto vec = [&](int s) { return reinterpret_cast<float*>(base + C::vec_off + s * C::vec_bytes); };
    const int tid = cx.tid(), wg = cx.warp_uniform(tid >> 7), wtid = tid & 127;
    const int b = cx.by() / p.KVH, g = cx.by() % p.KVH;
    const int k0 = cx.bx() * C::BN;
    const WgBwdRange r = wg_bwd_range<D>(p, k0, b, kDoc);
    auto qhead = [&](int it) { return g * p.group + it / r.nqt; };
    auto qtile0 = [&](int it) { return r.qstart + (it % r.nqt) * BQ; };

    if (tid == 0) {
        cx.mbar_init(bar_kv, 1);
        for (int s = 0; s < S; s++) {
            cx.mbar_init(&full[s], 32);               // the producer warp's lanes
            cx.mbar_init(&empty[s], 4 * kConsumers);  // one arrival per consumer warp
        }
        cx.mbar_fence_init();
    }
    cx.sync();

    if (wg == 0) {  // ---- the producer ----
        cx.template reg_dealloc<C::kProducerRegs>();
        if (tid < 32 && r.nit > 0) {
            if (tid == 0) {
                cx.mbar_expect_tx(bar_kv, 2 * C::kv_bytes);
                for (int c = 0; c < D; c += kRowElems) {
                    cx.tma_load(base + C::k_off + tile_off(0, c, C::BN), kBK, c, k0, g, b, bar_kv);
                    cx.tma_load(base + C::v_off + tile_off(0, c, C::BN), kBV, c, k0, g, b, bar_kv);
                }
            }
            const int* docs = kDoc ? p.doc + (size_t)b * p.db : nullptr;
            for (int it = 0; it < r.nit; it++) {
                const int s = it % S, round = it / S, h = qhead(it), q0 = qtile0(it);
                if (round > 0) cx.mbar_wait(&empty[s], (round - 1) & 1);  // the consumers let go of tile it - S
                float* ls = vec(s);
                const float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
                const float* D_bh = Dvec + ((size_t)b * p.NH + h) * p.Tq;
                TC_ROLLED  // registers: the producer has 24 at head size 128
                for (int x = tid; x < BQ; x += 32) {
                    const int i = q0 + x;
                    const float L = i < p.Tq ? lse_bh[i] : -INFINITY;
                    ls[x] = L > -INFINITY ? L * kLog2e : INFINITY;
                    ls[BQ + x] = i < p.Tq ? D_bh[i] : 0.f;
                    reinterpret_cast<int*>(ls)[2 * BQ + x] = kDoc && i < p.Tq ? docs[i] : INT_MAX;
                }
                if (tid == 0) {
                    cx.mbar_expect_tx(&full[s], 2 * C::tile_bytes);
                    for (int c = 0; c < D; c += kRowElems) {
                        cx.tma_load(base + C::q_off + s * C::tile_bytes + tile_off(0, c, BQ), kBQ, c, q0, h, b, &full[s]);
                        cx.tma_load(base + C::do_off + s * C::tile_bytes + tile_off(0, c, BQ), kBdO, c, q0, h, b,
                                    &full[s]);
                    }
                } else {
                    cx.mbar_arrive(&full[s]);
                }
            }
        }
        return;
    }

    // ---- a consumer: 64 keys ----
    cx.template reg_alloc<C::kConsumerRegs>();
    const int cw = wg - 1, warp = wtid >> 5, lane = wtid & 31;
    const int kw0 = k0 + 64 * cw;         // this warpgroup's first key
    const int wrow0 = kw0 + 16 * warp;    // this warp's first key
    const int wkfirst = key_at(p, wrow0);
    int kp[2];  // this lane's keys' positions (rows g and g + 8)
    TC_UNROLL
    for (int hh = 0; hh < 2; hh++) kp[hh] = key_at(p, wrow0 + c_elem(lane, 2 * hh).row);
    float dka[C::KD * 2][4], dva[C::KD * 2][4];  // 64 x D each: [D/8][4]
    TC_UNROLL
    for (int dt = 0; dt < 2 * C::KD; dt++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) dka[dt][e] = 0.f, dva[dt][e] = 0.f;
    float sc[C::NQ][4], dp[C::NQ][4], dqa[C::DQN / 8][4];
    uint32_t pa[C::QK][4], da[C::QK][4];

    const uint32_t k_wg = sbase + C::k_off + tile_off(64 * cw, 0, C::BN);
    const uint32_t v_wg = sbase + C::v_off + tile_off(64 * cw, 0, C::BN);
    // dQ's operands: which keys of dS^T and K, which columns of K.
    const int dq_key0 = C::kSplitCols ? 0 : 64 * cw, dq_col0 = C::kSplitCols ? C::DQN * cw : 0;
    const int ds_bar = C::kSplitCols ? kDsBarrier0 : kDsBarrier0 + cw;
    const int ds_n = C::kSplitCols ? 128 * kConsumers : 128;
    // kDet: this consumer's turn on a tile's counter, and the counter.
    const int my_turn = kConsumers * cx.bx() + cw, ntq = (p.Tq + BQ - 1) / BQ;
    auto counter = [&](int h, int t) { return turn + ((size_t)b * p.NH + h) * ntq + t; };
    // Registers an asynchronous product writes or reads are pinned after
    // its wait (fence_acc, fence_frag): no access moves above the wait, and
    // none is given to another value before it. Only those: a fence keeps
    // what it names alive, and S^T, dP^T are dead across the dQ product.
    if (r.nit > 0) cx.mbar_wait(bar_kv, 0);
    for (int it = 0; it < r.nit; it++) {
        const int s = it % S, h = qhead(it), q0 = qtile0(it);
        const uint32_t q_s = sbase + C::q_off + s * C::tile_bytes, do_s = sbase + C::do_off + s * C::tile_bytes;
        const uint32_t ds_buf = C::ds_off + (it & 1) * C::ds_bytes;
        cx.mbar_wait(&full[s], (it / S) & 1);
        // S^T = K Q^T, dP^T = V dO^T (keys as rows, 64 queries as columns).
        cx.wg_fence();
        TC_UNROLL
        for (int kk = 0; kk < C::KD; kk++)
            cx.template wgmma_ss<BQ>(sc, make_desc_sw128(k_wg + tile_off(0, 16 * kk, C::BN), 16, kAtomBytes),
                                     make_desc_sw128(q_s + tile_off(0, 16 * kk, BQ), 16, kAtomBytes), kk > 0);
        TC_UNROLL
        for (int kk = 0; kk < C::KD; kk++)
            cx.template wgmma_ss<BQ>(dp, make_desc_sw128(v_wg + tile_off(0, 16 * kk, C::BN), 16, kAtomBytes),
                                     make_desc_sw128(do_s + tile_off(0, 16 * kk, BQ), 16, kAtomBytes), kk > 0);
        cx.wg_commit();
        cx.wg_wait0();
        cx.fence_acc(sc);
        cx.fence_acc(dp);

        // P^T and dS^T. Keys past Tk (zero rows of K, V; P would not be
        // zero) and causal queries before keys are masked; queries past Tq
        // have lse +inf (P = 0) and zero dO rows.
        const float* Lb = vec(s);
        const float* Db = Lb + BQ;
        const int* Dcb = reinterpret_cast<const int*>(Lb + 2 * BQ);
        const bool masked = (wrow0 + 15 >= p.Tk) || (p.causal && q0 < wrow0 + 15);
        const bool dmask = kDoc && Dcb[BQ - 1] > wkfirst;  // some query's document starts after some key
        p_ds_transposed<C::NQ, kDoc, true>(sc, dp, lane, p, wrow0, q0, Lb, Db, Dcb, kp, masked, dmask);
        TC_UNROLL
        for (int kk = 0; kk < C::QK; kk++) {
            c_to_a(pa[kk], sc[2 * kk], sc[2 * kk + 1]);
            c_to_a(da[kk], dp[2 * kk], dp[2 * kk + 1]);
        }
        // dS^T (the bf16 that dK multiplies) into this warpgroup's rows of
        // the swizzled [BN keys][BQ queries] tile: a[0..3] hold rows g, g+8
        // and columns 16kk + 2t (+8) (mma_layout.h c_to_a).
        {
            const int row = 64 * cw + 16 * warp + (lane >> 2), col = 2 * (lane & 3);
            TC_UNROLL
            for (int kk = 0; kk < C::QK; kk++)
                TC_UNROLL
                for (int x = 0; x < 4; x++) {
                    const uint32_t off = ds_buf + (uint32_t)((row + 8 * (x & 1)) * kSwizzleBytes + (16 * kk + col + 8 * (x >> 1)) * 2);
                    *reinterpret_cast<uint32_t*>(base + swizzle128(off)) = da[kk][x];
                }
        }
        cx.fence_proxy_async();  // the stores above, visible to wgmma (the async proxy)

        // dV += P^T dO, dK += dS^T Q (B MN-major: the tile's rows are k).
        cx.wg_fence();
        TC_UNROLL
        for (int kk = 0; kk < C::QK; kk++)
            cx.template wgmma_rs<D>(dva, pa[kk],
                                    make_desc_sw128(do_s + tile_off(16 * kk, 0, BQ), BQ * kSwizzleBytes, kAtomBytes), true);
        TC_UNROLL
        for (int kk = 0; kk < C::QK; kk++)
            cx.template wgmma_rs<D>(dka, da[kk],
                                    make_desc_sw128(q_s + tile_off(16 * kk, 0, BQ), BQ * kSwizzleBytes, kAtomBytes), true);
        cx.wg_commit();

        // dQ (64 queries x 64 columns) = dS K once the dS^T rows it reads are written.
        cx.bar_sync(ds_bar, ds_n);
        cx.wg_fence();
        TC_UNROLL
        for (int kk = 0; kk < C::DQK; kk++) {
            const int key = dq_key0 + 16 * kk;
            cx.template wgmma_ss_t<C::DQN>(
                dqa, make_desc_sw128(sbase + ds_buf + key * kSwizzleBytes, C::BN * kSwizzleBytes, kAtomBytes),
                make_desc_sw128(sbase + C::k_off + tile_off(key, dq_col0, C::BN), C::BN * kSwizzleBytes, kAtomBytes),
                kk > 0);
        }
        cx.wg_commit();
        cx.wg_wait0();
        cx.fence_acc(dka);
        cx.fence_acc(dva);
        cx.fence_acc(dqa);
        cx.fence_frag(pa);
        cx.fence_frag(da);
        if (lane == 0) cx.mbar_arrive(&empty[s]);  // Q, dO, lse, D of the stage no longer read

        // Atomic fp32 adds, the only unordered step (see the top); or, with
        // kDet, plain adds in this consumer's turn.
        if constexpr (kDet) {
            if (wtid == 0) cx.sem_wait(counter(h, q0 / BQ), my_turn);
            cx.bar_sync(kDqTurnBarrier0 + cw, 128);
        }
        float* dqh = dq_acc + (size_t)b * dq_bs + (size_t)h * D + dq_col0;
        TC_UNROLL
        for (int hh = 0; hh < 2; hh++) {
            const RC rc0 = c_elem(lane, 2 * hh);
            const int i = q0 + 16 * warp + rc0.row;
            if (i >= p.Tq) continue;
            float* row = dqh + (size_t)i * dq_rs;
            TC_UNROLL
            for (int nt = 0; nt < C::DQN / 8; nt++)
                TC_UNROLL
                for (int x = 0; x < 2; x++) {
                    if constexpr (kDet)
                        cx.add_ordered(row + nt * 8 + rc0.col + x, dqa[nt][2 * hh + x] * p.scale);
                    else
                        cx.atomic_add(row + nt * 8 + rc0.col + x, dqa[nt][2 * hh + x] * p.scale);
                }
        }
        if constexpr (kDet) {
            cx.bar_sync(kDqTurnBarrier0 + cw, 128);
            if (wtid == 0) cx.sem_post(counter(h, q0 / BQ));
        }
    }
    if constexpr (kDet && kDoc) {  // the turns on the tiles past the walk's end (nothing to add)
        if (wtid == 0)
            for (int hi = 0; hi < p.group; hi++)
                for (int t = r.qstart / BQ + r.nqt; t < ntq; t++) {
                    cx.sem_wait(counter(g * p.group + hi, t), my_turn);
                    cx.sem_post(counter(g * p.group + hi, t));
                }
    }
    const size_t kvoff = (size_t)b * p.kb + (size_t)g * D;
    store_dkdv<2 * C::KD, G, kAcc>(dk, dv, kvoff, wrow0, lane, p, dka, dva);
}

}  // namespace attn_wg
