// llmc/backend/cuda/attention_wg_kernels.h: the body of the Hopper (sm_90a)
// attention forward, written once for two executors, like the mma.sync
// bodies of attention_tc_kernels.h: attention_wg.cuh runs it as a CUDA
// kernel through a context whose operations are PTX (TMA, mbarrier, wgmma,
// named barriers); tests/unit/test_wgmma_attention.cpp runs the very same
// code on the CPU, one host thread per CUDA thread, through a context that
// emulates those instructions from the PTX ISA (tests/unit/wgmma_emulator.h).
// The layouts are spelled out in wgmma_layout.h.
//
// The design (FlashAttention-3's, in our own words). A block holds 3
// warpgroups of 128 threads and computes BM = 128 query rows of one
// (batch row, head):
//  * warpgroup 0 is the producer: it gives up registers (setmaxnreg) and one
//    thread issues TMA copies: Q once, then K and V tiles of BN = 128 keys
//    into a ring of kStages shared-memory stages. Each stage has a "full"
//    mbarrier for K and one for V (the copy engine completes them with the
//    bytes it wrote) and an "empty" one the consumers arrive on when they
//    are done with the stage, which the producer waits on before it
//    overwrites it.
//  * warpgroups 1 and 2 are consumers, 64 query rows each, with the
//    registers the producer gave up. Per key tile i: S_i = Q K_i^T with
//    wgmma (A = Q and B = K from shared memory, K-major), then the online
//    softmax of S_i in registers (attention_tc_kernels.h softmax_update,
//    the same code as the mma.sync forward: the accumulator layout is the
//    mma C fragment per warp), P_i rounded to bf16 in registers (c_to_a),
//    and O += P_i V_i with wgmma (A = P from registers, B = V from shared
//    memory, MN-major).
//  * Overlap: each consumer issues, in one turn, S_i and O += P_{i-1} V_{i-1}
//    (the previous tile's product), then hands the turn to the other
//    consumer (named barriers, "ping-pong") and waits for its own products
//    while the other's run on the tensor cores; its softmax of S_i then
//    overlaps the other consumer's products. O is rescaled only after the
//    products that write it completed (wgmma.wait_group 0).
//  * Masks, the document mask, GQA, ring blocks (key positions, the merge
//    into a running fp32 (out, lse)) are those of the mma.sync forward: the
//    same TcParams, the same first key tile for the document mask, the same
//    element masks and epilogue (store_rows). The two consumers walk the same
//    key tiles (their turns must pair up); a consumer whose rows all precede
//    a tile's keys masks the whole tile.
//
// A context Ctx provides, per thread (beyond attention_tc_kernels.h's tid,
// bx, by, smem, sync, shfl_xor, shfl):
//   smem_u32(p)                      the shared-state address of p (cvta)
//   mbar_init(b, n), mbar_fence_init()  mbarrier.init with n arrivals; fence.mbarrier_init
//   mbar_expect_tx(b, bytes)         mbarrier.arrive.expect_tx (one arrival)
//   mbar_arrive(b)                   mbarrier.arrive
//   mbar_wait(b, parity)             mbarrier.try_wait.parity until the phase of that parity completed
//   tma_load(dst, map, c, t, h, b, bar)  cp.async.bulk.tensor of map (kQ, kK, kV) at
//                                    (column c, row t, head h, batch row b), completing on bar
//   wg_fence(), wg_commit(), wg_wait0()  wgmma.fence, commit_group, wait_group 0
//   wgmma_ss<N>(d, da, db, acc)      d[N/8][4] (+)= A·B, m64nNk16, A and B K-major descriptors
//   wgmma_rs<N>(d, a, db, acc)       d[N/8][4] (+)= A·B, A from registers a[4], B MN-major
//   bar_sync(id, n), bar_arrive(id, n)  named barriers (bar.sync, bar.arrive)
//   reg_dealloc<R>(), reg_alloc<R>() setmaxnreg.dec / .inc
//   warp_uniform(x)                  x as lane 0 has it (shfl): the compiler then knows it is warp-uniform
//   fence_acc(d), fence_frag(a)      pin registers: no access moves across (an empty asm with "+f"/"+r")
#pragma once
#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "llmc/backend/cuda/wgmma_layout.h"

namespace attn_wg {

using namespace attn_tc;
using namespace wg_layout;

constexpr int kConsumers = 2;                        // consumer warpgroups
constexpr int kThreads = 128 * (1 + kConsumers);     // the producer warpgroup first
constexpr int kTurnBarrier0 = 1;                     // named barriers 1, 2 (0 is __syncthreads)
enum Map { kQ = 0, kK = 1, kV = 2 };                 // the three tensor maps

template <int D>
struct WgFwdCfg {
    static_assert(D == 64 || D == 128, "head sizes 64 and 128");
    static constexpr int BM = 64 * kConsumers, BN = 128, kStages = 2;
    static constexpr int NT = BN / 8, DT = D / 8, KD = D / 16, KV = BN / 16;
    static constexpr uint32_t q_bytes = BM * D * 2, kv_bytes = BN * D * 2;
    // Offsets from the 1024-byte aligned base (every tile a whole number of swizzle atoms).
    static constexpr uint32_t q_off = 0, k_off = q_bytes, v_off = k_off + kStages * kv_bytes,
                              bar_off = v_off + kStages * kv_bytes;
    static constexpr int kBars = 1 + 3 * kStages;  // Q, full K, full V, empty per stage
    static constexpr size_t smem_bytes = bar_off + kBars * 8 + kAtomBytes;  // + the alignment slack
};

// The key tiles a block walks, the same for the producer and both consumers.
struct WgRange {
    int q0, kt0, nkt;
};
template <int D>
TC_BODY WgRange wg_range(const TcParams& p, int bx, int b, bool doc) {
    using C = WgFwdCfg<D>;
    WgRange r;
    const int ntq = (p.Tq + C::BM - 1) / C::BM;
    r.q0 = (ntq - 1 - bx) * C::BM;  // causal: the longest rows start first
    const int kend = p.causal ? imin(p.Tk, r.q0 + C::BM) : p.Tk;
    r.nkt = (kend + C::BN - 1) / C::BN;
    r.kt0 = 0;
    if (doc) {  // from the key tile of the first key any row of the block sees
        int blo, bhi;
        doc_range(p.doc + (size_t)b * p.db, p.Tq, r.q0, C::BM, &blo, &bhi);
        r.kt0 = blo == INT_MAX ? r.nkt : first_key_from(p, blo, kend) / C::BN;
    }
    return r;
}

// The TMA boxes of a kernel's operands (the forward's Q, K, V; the
// backward's Q, dO, K, V): the launcher encodes them, the emulator copies
// through them. pos[] says which box dimension holds rows, heads and batch
// rows.
constexpr int kMaxMaps = 4;
struct WgMaps {
    TmaBox box[kMaxMaps];
    int pos_t[kMaxMaps], pos_h[kMaxMaps], pos_b[kMaxMaps];
    int n;  // boxes in use
};

// One bf16 box: dimension 0 the head's D columns, then rows, heads and
// batch rows in increasing stride, 64 columns x box_rows rows.
inline void wg_map(WgMaps& m, int w, const void* base, int D, int rows_ext, int heads, int B, size_t row_stride,
                   size_t batch_stride, int box_rows) {
    const uint64_t ext[3] = {(uint64_t)rows_ext, (uint64_t)heads, (uint64_t)B};
    const uint64_t str[3] = {2 * (uint64_t)row_stride, 2 * (uint64_t)D, 2 * (uint64_t)batch_stride};
    const uint32_t bx[3] = {(uint32_t)box_rows, 1, 1};
    int order[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)  // a stable sort by stride
        for (int j = 0; j + 1 < 3 - i; j++)
            if (str[order[j]] > str[order[j + 1]]) {
                const int t = order[j];
                order[j] = order[j + 1], order[j + 1] = t;
            }
    TmaBox& t = m.box[w];
    t.base = base;
    t.dim[0] = (uint64_t)D, t.box[0] = kRowElems;
    for (int i = 0; i < 3; i++) {
        t.dim[1 + i] = ext[order[i]] ? ext[order[i]] : 1;
        t.stride[i] = str[order[i]];
        t.box[1 + i] = bx[order[i]];
        (order[i] == 0 ? m.pos_t : order[i] == 1 ? m.pos_h : m.pos_b)[w] = 1 + i;
    }
}

template <int D>
inline WgMaps wg_maps(const TcParams& p, const void* q, const void* k, const void* v) {
    using C = WgFwdCfg<D>;
    WgMaps m{};
    m.n = 3;
    wg_map(m, kQ, q, D, p.Tq, p.NH, p.B, p.q_stride, p.qb, C::BM);
    wg_map(m, kK, k, D, p.Tk, p.KVH, p.B, p.kv_stride, p.kb, C::BN);
    wg_map(m, kV, v, D, p.Tk, p.KVH, p.B, p.kv_stride, p.kb, C::BN);
    return m;
}

// out (bf16 bits or fp32) and lse, as attention_tc_kernels.h fwd_body.
template <class Ctx, int D, typename O, bool kMerge, bool kDoc = false>
TC_BODY void wg_fwd_body(Ctx& cx, O* out, float* lse, const TcParams& p) {
    using C = WgFwdCfg<D>;
    constexpr int S = C::kStages;
    uint8_t* raw = static_cast<uint8_t*>(cx.smem());
    uint8_t* base = raw + ((kAtomBytes - (cx.smem_u32(raw) & (kAtomBytes - 1))) & (kAtomBytes - 1));
    const uint32_t sbase = cx.smem_u32(base);
    uint64_t* bars = reinterpret_cast<uint64_t*>(base + C::bar_off);
    uint64_t* bar_q = bars;
    uint64_t* full_k = bars + 1;
    uint64_t* full_v = bars + 1 + S;
    uint64_t* empty = bars + 1 + 2 * S;
    const int tid = cx.tid(), wg = cx.warp_uniform(tid >> 7), wtid = tid & 127;  // the role, provably uniform per warp
    const int b = cx.by() / p.NH, h = cx.by() % p.NH, kvh = h / p.group;
    const WgRange r = wg_range<D>(p, cx.bx(), b, kDoc);
    const int n = r.nkt - r.kt0;  // key tiles to walk

    if (tid == 0) {
        cx.mbar_init(bar_q, 1);
        for (int s = 0; s < S; s++) {
            cx.mbar_init(&full_k[s], 1);
            cx.mbar_init(&full_v[s], 1);
            cx.mbar_init(&empty[s], 4 * kConsumers);  // one arrival per consumer warp
        }
        cx.mbar_fence_init();
    }
    cx.sync();

    if (wg == 0) {  // ---- the producer ----
        cx.template reg_dealloc<24>();
        if (tid == 0 && n > 0) {
            cx.mbar_expect_tx(bar_q, C::q_bytes);
            for (int c = 0; c < D; c += kRowElems)
                cx.tma_load(base + C::q_off + tile_off(0, c, C::BM), kQ, c, r.q0, h, b, bar_q);
            for (int i = 0; i < n; i++) {
                const int s = i % S, round = i / S, t0 = (r.kt0 + i) * C::BN;
                if (round > 0) cx.mbar_wait(&empty[s], (round - 1) & 1);  // the consumers let go of tile i - S
                uint8_t* ks = base + C::k_off + s * C::kv_bytes;
                uint8_t* vs = base + C::v_off + s * C::kv_bytes;
                cx.mbar_expect_tx(&full_k[s], C::kv_bytes);
                for (int c = 0; c < D; c += kRowElems)
                    cx.tma_load(ks + tile_off(0, c, C::BN), kK, c, t0, kvh, b, &full_k[s]);
                cx.mbar_expect_tx(&full_v[s], C::kv_bytes);
                for (int c = 0; c < D; c += kRowElems)
                    cx.tma_load(vs + tile_off(0, c, C::BN), kV, c, t0, kvh, b, &full_v[s]);
            }
        }
        return;
    }

    // ---- a consumer: 64 query rows ----
    cx.template reg_alloc<240>();
    const int cw = wg - 1, warp = wtid >> 5, lane = wtid & 31;
    const int wrow0 = r.q0 + 64 * cw + 16 * warp;  // this warp's first query row
    const int my_turn = kTurnBarrier0 + cw, their_turn = kTurnBarrier0 + (1 - cw);
    const int* docs = kDoc ? p.doc + (size_t)b * p.db : nullptr;
    int dr[2] = {INT_MIN, INT_MIN};  // this lane's rows' document starts (INT_MIN: no mask)
    int wdlo = INT_MIN, wdhi = INT_MIN;
    if (docs) {
        TC_UNROLL
        for (int hh = 0; hh < 2; hh++) {
            const int i = wrow0 + c_elem(lane, 2 * hh).row;
            dr[hh] = i < p.Tq ? docs[i] : INT_MIN;
        }
        doc_range(docs, p.Tq, wrow0, 16, &wdlo, &wdhi);
    }
    float o[C::DT][4], sc[C::NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    uint32_t pa[C::KV][4];  // P of the previous tile as A fragments
    TC_UNROLL
    for (int dt = 0; dt < C::DT; dt++)
        TC_UNROLL
        for (int e = 0; e < 4; e++) o[dt][e] = 0.f;

    // Descriptors: this warpgroup's 64 rows of Q; K and V of a stage.
    const uint32_t q_addr = sbase + C::q_off + tile_off(64 * cw, 0, C::BM);
    auto wait_k = [&](int i) { cx.mbar_wait(&full_k[i % S], (i / S) & 1); };
    auto wait_v = [&](int i) { cx.mbar_wait(&full_v[i % S], (i / S) & 1); };
    auto issue_s = [&](int i) {  // S_i = Q K_i^T (K_i landed: wait_k)
        const int s = i % S;
        const uint32_t k_addr = sbase + C::k_off + s * C::kv_bytes;
        TC_UNROLL
        for (int kk = 0; kk < C::KD; kk++)
            cx.template wgmma_ss<C::BN>(sc, make_desc_sw128(q_addr + tile_off(0, 16 * kk, C::BM), 16, kAtomBytes),
                                        make_desc_sw128(k_addr + tile_off(0, 16 * kk, C::BN), 16, kAtomBytes), kk > 0);
    };
    auto issue_pv = [&](int i) {  // O += P_i V_i (V_i landed: wait_v)
        const int s = i % S;
        const uint32_t v_addr = sbase + C::v_off + s * C::kv_bytes;
        TC_UNROLL
        for (int kk = 0; kk < C::KV; kk++)
            cx.template wgmma_rs<D>(
                o, pa[kk], make_desc_sw128(v_addr + tile_off(16 * kk, 0, C::BN), C::BN * kSwizzleBytes, kAtomBytes), true);
    };
    auto release = [&](int i) {  // tile i (K and V) no longer read
        if (lane == 0) cx.mbar_arrive(&empty[i % S]);
    };
    auto softmax = [&](int i) {  // S_i -> P_i (bf16 A fragments), m, l, O rescaled
        const int k0 = (r.kt0 + i) * C::BN;
        const bool dmask = docs && key_at(p, k0) < wdhi;  // some key of the tile before some row's document
        const bool masked = (k0 + C::BN > p.Tk) || (p.causal && k0 + C::BN - 1 > wrow0) || dmask;
        softmax_update(cx, lane, sc, o, m, l, p, wrow0, k0, masked, dmask, dr);
        TC_UNROLL
        for (int kk = 0; kk < C::KV; kk++) c_to_a(pa[kk], sc[2 * kk], sc[2 * kk + 1]);
    };
    // The accumulators and P pinned around the asynchronous products (the
    // compiler may not move their reads or writes across an issue or a wait).
    auto fence_regs = [&]() {
        cx.fence_acc(sc);
        cx.fence_acc(o);
        cx.fence_frag(pa);
    };
    // Turns: each consumer takes n + 1; consumer 1's first arrival opens
    // consumer 0's first turn, so consumer 1 skips its arrival after its last.
    // The products are issued in straight-line code (no wgmma under a branch).
    if (n > 0) {
        if (cw == 1) cx.bar_arrive(their_turn, 2 * 128);  // consumer 0 takes the first turn
        cx.mbar_wait(bar_q, 0);
        cx.bar_sync(my_turn, 2 * 128);
        wait_k(0);
        fence_regs();
        cx.wg_fence();
        issue_s(0);
        cx.wg_commit();
        cx.bar_arrive(their_turn, 2 * 128);
        cx.wg_wait0();
        fence_regs();
        softmax(0);
        for (int i = 1; i < n; i++) {
            cx.bar_sync(my_turn, 2 * 128);
            wait_k(i);
            wait_v(i - 1);
            fence_regs();
            cx.wg_fence();
            issue_s(i);
            issue_pv(i - 1);
            cx.wg_commit();
            cx.bar_arrive(their_turn, 2 * 128);
            cx.wg_wait0();
            fence_regs();
            release(i - 1);
            softmax(i);
        }
        cx.bar_sync(my_turn, 2 * 128);
        wait_v(n - 1);
        fence_regs();
        cx.wg_fence();
        issue_pv(n - 1);
        cx.wg_commit();
        if (cw == 0) cx.bar_arrive(their_turn, 2 * 128);
        cx.wg_wait0();
        fence_regs();
        release(n - 1);
    }

    float* lse_bh = lse + (size_t)b * p.lb + (size_t)h * p.lh;
    O* ob = out + (size_t)b * p.ob + (size_t)h * D;
    store_rows<Ctx, C::DT, O, kMerge>(cx, lane, o, m, l, p, wrow0, lse_bh, ob);
}

}  // namespace attn_wg
