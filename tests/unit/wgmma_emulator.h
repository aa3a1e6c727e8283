// tests/unit/wgmma_emulator.h: the Hopper instructions of the warpgroup
// attention kernels (llmc/backend/cuda/attention_wg_kernels.h, forward;
// attention_wg_kernels_bwd.h, backward) and the GPU block they run on,
// emulated on the CPU: one host thread per CUDA thread (384 per block), the
// tensor memory accelerator's tiled copy with the 128-byte swizzle and zero
// fill, mbarriers (arrivals, transaction bytes, phases and parity waits),
// named barriers, wgmma.mma_async with its descriptors (K-major and
// transposed operands) and register fragments, fp32 atomics, asynchronous
// to the end: a wgmma runs
// only at the issuing warpgroup's wait_group, and a TMA copy lands only when
// a thread waits on its barrier's phase, so a kernel that reads before it
// waits reads stale data. Everything here is transcribed from the PTX ISA
// (and the CUDA driver's cuTensorMapEncodeTiled rules) independently of
// llmc/backend/cuda/wgmma_layout.h, which the test checks against it.
//
// Faults can be planted (Faults below) to show that the tests fail when
// the zero fill, the swizzle, a wait, a descriptor or a transpose is wrong.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llmc/backend/cuda/attention_tc_kernels_bwd_fused.h"
#include "llmc/backend/cuda/attention_wg_kernels.h"
#include "llmc/backend/cuda/attention_wg_kernels_bwd.h"
#include "tests/unit/mma_emulator.h"

namespace wg_emu {

inline float bf(uint16_t b) { return mma_layout::bf16_bits_to_float(b); }

// ---- the PTX ISA, transcribed -------------------------------------------------------
// wgmma .m64nNk16 .f32 accumulators: thread T of the warpgroup (warp w =
// T/32, lane L), register i in 0..N/2-1: row = 16w + L/4 + 8·((i%4) >= 2),
// col = 8·(i/4) + 2·(L%4) + (i%2).
inline void spec_acc(int T, int i, int* row, int* col) {
    const int w = T / 32, L = T % 32;
    *row = 16 * w + L / 4 + ((i % 4) >= 2 ? 8 : 0);
    *col = 8 * (i / 4) + 2 * (L % 4) + (i % 2);
}
// A from registers (.bf16, a0..a7 in 4 registers, low half first): per
// warp the layout of mma.m16n8k16's A, rows offset by 16w:
// row = L/4 (+8 for a2, a3, a6, a7), col = 2·(L%4) + (i%2) (+8 for i >= 4).
inline void spec_a_reg(int T, int i, int* row, int* col) {
    const int w = T / 32, L = T % 32;
    *row = 16 * w + L / 4 + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
    *col = 2 * (L % 4) + (i % 2) + (i >= 4 ? 8 : 0);
}
// The matrix descriptor's fields.
struct Desc {
    uint32_t start, lbo, sbo, base_off, swizzle;
};
inline Desc decode(uint64_t d) {
    return {(uint32_t)(d & 0x3FFF) << 4, (uint32_t)((d >> 16) & 0x3FFF) << 4, (uint32_t)((d >> 32) & 0x3FFF) << 4,
            (uint32_t)((d >> 49) & 7), (uint32_t)(d >> 62)};
}
// The 128-byte swizzle (Swizzle<3,4,3> on byte addresses): the 16-byte
// chunk index (address bits 4..6) XOR the row within the 1024-byte pattern
// (bits 7..9).
inline uint32_t swz(uint32_t a) { return a ^ (((a >> 7) & 7) << 4); }
// Byte address of element (mn, k) of a bf16 operand read through a 128-byte
// swizzled descriptor. K-major: ((8, m), (8 elements, 2)) : ((128 B, SBO),
// (2 B, 16 B)): rows of 128 bytes, groups of 8 rows SBO apart, the k index
// contiguous (LBO unused). MN-major: ((64 elements, m), (8, k)) : ((2 B, LBO),
// (128 B, SBO)): 64 mn-elements contiguous in a 128-byte row, blocks of 64
// LBO apart, k rows 128 bytes apart in groups of 8, groups SBO apart.
inline uint32_t operand_addr(const Desc& d, bool mn_major, int mn, int k) {
    uint32_t a;
    if (!mn_major)
        a = d.start + (mn / 8) * d.sbo + (mn % 8) * 128 + k * 2;
    else
        a = d.start + (k / 8) * d.sbo + (k % 8) * 128 + (mn / 64) * d.lbo + (mn % 64) * 2;
    return d.swizzle == 1 ? swz(a) : a;
}

// ---- planted faults (each must make some test fail) ---------------------------------
struct Faults {
    bool no_zero_fill = false;     // the copy engine leaves elements outside the tensor as they were
    bool no_swizzle_tma = false;   // the copy engine writes rows unswizzled
    bool skip_wgmma_wait = false;  // wait_group 0 does not wait (the products never land)
    bool sbo_off = false;          // descriptors' SBO read 128 bytes short
    bool no_trans_a = false;       // a shared A operand read K-major whatever its transpose flag says
};
inline Faults& faults() {
    static Faults f;
    return f;
}

// ---- the emulated block -------------------------------------------------------------
// (Barrier, emu_hang: tests/unit/mma_emulator.h)
using ::Barrier;
inline void hang(const char* what) { emu_hang(what); }
constexpr auto kHang = kEmuHang;

struct Copy {  // a TMA box copy in flight
    uint32_t dst;
    int map;
    int64_t coord[4];
};
struct MBar {
    int count = 0, pending = 0;
    int64_t tx = 0;
    unsigned phase = 0;  // completed phases
    std::vector<Copy> copies;
};
struct WgmmaOp {
    int N;
    bool rs, acc, ta, tb;  // A from registers; accumulate; A, B transposed (M-major A, N-major B)
    uint64_t da, db;
    float* d[128];
    const uint32_t* a[128];
};

struct Block {
    static constexpr int kT = attn_wg::kThreads;
    std::vector<unsigned char> mem;
    uint32_t origin;  // mem index of shared address 0 (1024-byte aligned in host memory too)
    size_t bytes;
    const wg_layout::TmaBox* boxes;
    Barrier block{kT};
    Barrier warp[kT / 32] = {Barrier(32), Barrier(32), Barrier(32), Barrier(32), Barrier(32), Barrier(32),
                             Barrier(32), Barrier(32), Barrier(32), Barrier(32), Barrier(32), Barrier(32)};
    Barrier wgb[kT / 128] = {Barrier(128), Barrier(128), Barrier(128)};
    float f[kT];
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint32_t, MBar> mbars;
    struct Named {
        int n = 0, count = 0;
        unsigned gen = 0;
    } named[16];
    WgmmaOp slot[kT / 128];
    std::vector<WgmmaOp> pending[kT / 128];
    std::vector<std::vector<WgmmaOp>> groups[kT / 128];
    bool bad = false;  // an access out of range, misaligned, or a rule broken
    std::string why;

    Block(size_t b, const wg_layout::TmaBox* bx) : mem(b + 2048), bytes(b), boxes(bx) {
        origin = (uint32_t)((1024 - ((uintptr_t)mem.data() & 1023)) & 1023);
        for (size_t i = 0; i + 1 < mem.size(); i += 2) mem[i] = 0xC1, mem[i + 1] = 0x7F;  // bf16 NaNs: never zeros
    }
    void fail(const std::string& w) {
        std::lock_guard<std::mutex> lk(mu);
        if (!bad) why = w;
        bad = true;
    }
    unsigned char* at(uint32_t addr, size_t n) {
        if ((size_t)addr + n > bytes + 16) {
            fail("shared access out of range");
            return &mem[origin];
        }
        return &mem[origin + addr];
    }
    float bf_at(uint32_t addr) {
        uint16_t v;
        std::memcpy(&v, at(addr, 2), 2);
        return bf(v);
    }

    // The copy engine: one box of bf16 into shared memory, 128-byte swizzle, zeros outside the tensor.
    void do_copy(const Copy& c, MBar& b) {
        const wg_layout::TmaBox& t = boxes[c.map];
        if ((uintptr_t)t.base % 16) fail("tensor map base not 16-byte aligned");
        for (int i = 0; i < 3; i++)
            if (t.stride[i] % 16) fail("tensor map stride not a multiple of 16 bytes");
        if (t.box[0] * 2 > 128) fail("box inner extent over the 128-byte swizzle span");
        if (c.dst % 1024) fail("swizzled TMA destination not 1024-byte aligned");
        const uint16_t* g = static_cast<const uint16_t*>(t.base);
        int64_t row = 0;
        for (uint32_t i3 = 0; i3 < t.box[3]; i3++)
            for (uint32_t i2 = 0; i2 < t.box[2]; i2++)
                for (uint32_t i1 = 0; i1 < t.box[1]; i1++, row++)
                    for (uint32_t i0 = 0; i0 < t.box[0]; i0++) {
                        const int64_t x[4] = {c.coord[0] + i0, c.coord[1] + i1, c.coord[2] + i2, c.coord[3] + i3};
                        bool in = true;
                        for (int k = 0; k < 4; k++) in &= x[k] >= 0 && x[k] < (int64_t)t.dim[k];
                        uint16_t v = 0;
                        if (in) {
                            const size_t byte = (size_t)x[0] * 2 + x[1] * t.stride[0] + x[2] * t.stride[1] + x[3] * t.stride[2];
                            v = g[byte / 2];
                        }
                        uint32_t a = c.dst + (uint32_t)(row * t.box[0] * 2 + i0 * 2);
                        if (!faults().no_swizzle_tma) a = swz(a);
                        if (in || !faults().no_zero_fill) std::memcpy(at(a, 2), &v, 2);
                    }
        b.tx -= (int64_t)t.box[0] * t.box[1] * t.box[2] * t.box[3] * 2;
    }
    void complete_if_done(MBar& b) {
        if (b.pending == 0 && b.tx == 0 && b.copies.empty()) {
            b.phase++;
            b.pending = b.count;
            cv.notify_all();
        }
        if (b.tx < 0) fail("mbarrier: more bytes arrived than expected");
    }

    // One wgmma (D[64][N] (+)= A[64][16] · B[16][N]) as the tensor cores do it.
    void run(const WgmmaOp& op) {
        Desc da = decode(op.da), db = decode(op.db);
        if (faults().sbo_off) da.sbo -= 128, db.sbo -= 128;
        double A[64][16], Bm[16][256];
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 16; k++) A[r][k] = 0;
        if (op.rs) {
            for (int T = 0; T < 128; T++)
                for (int i = 0; i < 8; i++) {
                    int r, c;
                    spec_a_reg(T, i, &r, &c);
                    const uint32_t reg = op.a[T][i / 2];
                    A[r][c] = bf((uint16_t)(i % 2 ? reg >> 16 : reg & 0xFFFF));
                }
        } else {
            const bool ta = op.ta && !faults().no_trans_a;
            for (int r = 0; r < 64; r++)
                for (int k = 0; k < 16; k++) A[r][k] = bf_at(operand_addr(da, ta, r, k));
        }
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < op.N; n++) Bm[k][n] = bf_at(operand_addr(db, op.tb, n, k));
        for (int T = 0; T < 128; T++)
            for (int i = 0; i < op.N / 2; i++) {
                int r, c;
                spec_acc(T, i, &r, &c);
                double s = op.acc ? op.d[T][i] : 0.0;
                for (int k = 0; k < 16; k++) s += A[r][k] * Bm[k][c];
                op.d[T][i] = (float)s;
            }
    }
};

// The host executor of attention_wg_kernels.h (one object per emulated thread).
struct Ctx {
    Block* bk;
    int t, bx_, by_;

    int tid() const { return t; }
    int bx() const { return bx_; }
    int by() const { return by_; }
    void* smem() const { return &bk->mem[bk->origin + 16]; }  // only 16-byte aligned, as on the GPU
    uint32_t smem_u32(const void* p) const {
        return (uint32_t)(static_cast<const unsigned char*>(p) - &bk->mem[bk->origin]);
    }
    void sync() { bk->block.wait(); }
    float shfl(float x, int src) {
        const int w = t / 32;
        bk->f[t] = x;
        bk->warp[w].wait();
        const float y = bk->f[w * 32 + (src & 31)];
        bk->warp[w].wait();
        return y;
    }
    float shfl_xor(float x, int m) { return shfl(x, (t % 32) ^ m); }

    // mbarriers (state kept beside shared memory, keyed by address)
    MBar& mb(uint64_t* b) {
        const uint32_t a = smem_u32(b);
        if (a % 8) bk->fail("mbarrier not 8-byte aligned");
        return bk->mbars[a];
    }
    void mbar_init(uint64_t* b, int n) {
        std::lock_guard<std::mutex> lk(bk->mu);
        MBar& m = mb(b);
        m = MBar();
        m.count = m.pending = n;
    }
    void mbar_fence_init() {}
    void arrive_locked(MBar& m) {
        if (m.count == 0) bk->fail("arrival on an uninitialised mbarrier");
        if (--m.pending < 0) bk->fail("mbarrier: more arrivals than its count");
        bk->complete_if_done(m);
        bk->cv.notify_all();
    }
    void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
        std::lock_guard<std::mutex> lk(bk->mu);
        MBar& m = mb(b);
        m.tx += bytes;
        arrive_locked(m);
    }
    void mbar_arrive(uint64_t* b) {
        std::lock_guard<std::mutex> lk(bk->mu);
        arrive_locked(mb(b));
    }
    // try_wait.parity P: returns once the phase of parity P has completed,
    // i.e. the current phase's parity differs from P. Copies land here.
    void mbar_wait(uint64_t* b, int parity) {
        std::unique_lock<std::mutex> lk(bk->mu);
        MBar& m = mb(b);
        const auto until = std::chrono::steady_clock::now() + kHang;
        while ((m.phase & 1) == (unsigned)parity) {
            if (m.pending == 0 && !m.copies.empty()) {
                for (const Copy& c : m.copies) bk->do_copy(c, m);
                m.copies.clear();
                bk->complete_if_done(m);
                continue;
            }
            if (bk->cv.wait_until(lk, until) == std::cv_status::timeout) hang("mbarrier wait");
        }
    }
    void tma_load(void* dst, int map, int c, int row, int head, int brow, uint64_t* b) {
        std::lock_guard<std::mutex> lk(bk->mu);
        Copy cp{smem_u32(dst), map, {c, 0, 0, 0}};
        cp.coord[pos_t[map]] = row, cp.coord[pos_h[map]] = head, cp.coord[pos_b[map]] = brow;
        MBar& m = mb(b);
        m.copies.push_back(cp);
        bk->cv.notify_all();  // a waiter may now land the copies
    }
    int pos_t[attn_wg::kMaxMaps], pos_h[attn_wg::kMaxMaps], pos_b[attn_wg::kMaxMaps];

    // named barriers
    void named(int id, int n, bool wait) {
        std::unique_lock<std::mutex> lk(bk->mu);
        Block::Named& nb = bk->named[id];
        if (n % 32 || n <= 0) bk->fail("named barrier count not a positive multiple of 32");
        if (nb.count == 0) nb.n = n;
        if (nb.n != n) bk->fail("named barrier used with two thread counts");
        const unsigned gen = nb.gen;
        if (++nb.count == nb.n) {
            nb.count = 0;
            nb.gen++;
            bk->cv.notify_all();
            return;
        }
        if (wait && !bk->cv.wait_for(lk, kHang, [&] { return nb.gen != gen; })) hang("named barrier");
    }
    void bar_sync(int id, int n) { named(id, n, true); }
    void bar_arrive(int id, int n) { named(id, n, false); }

    // wgmma: collectives of the 128 threads of a warpgroup
    template <int R>
    void reg_alloc() {}
    template <int R>
    void reg_dealloc() {}
    void wg_fence() {}
    int warp_uniform(int x) { return (int)shfl((float)x, 0); }
    template <int N>
    void fence_acc(float (&)[N][4]) {}
    template <int N>
    void fence_frag(uint32_t (&)[N][4]) {}
    void issue(int N, bool rs, bool acc, bool ta, bool tb, uint64_t da, uint64_t db, float* d, const uint32_t* a) {
        const int g = t / 128, T = t % 128;
        WgmmaOp& s = bk->slot[g];
        if (T == 0) s.N = N, s.rs = rs, s.acc = acc, s.ta = ta, s.tb = tb, s.da = da, s.db = db;
        bk->wgb[g].wait();
        if (s.N != N || s.rs != rs || s.acc != acc || s.ta != ta || s.tb != tb || s.da != da || s.db != db)
            bk->fail("wgmma operands differ across the warpgroup");
        s.d[T] = d, s.a[T] = a;
        bk->wgb[g].wait();
        if (T == 0) bk->pending[g].push_back(s);
        bk->wgb[g].wait();
    }
    template <int N>
    void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, bool acc) {
        issue(N, false, acc, false, false, da, db, &d[0][0], nullptr);
    }
    template <int N>
    void wgmma_ss_t(float (&d)[N / 8][4], uint64_t da, uint64_t db, bool acc) {
        issue(N, false, acc, true, true, da, db, &d[0][0], nullptr);
    }
    template <int N>
    void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db, bool acc) {
        issue(N, true, acc, false, true, 0, db, &d[0][0], a);
    }
    // Shared-memory stores are read by wgmma (the async proxy) only after
    // this fence; the emulated products read memory at the wait anyway.
    void fence_proxy_async() {}
    // red.global.add.f32: one lock for every block (blocks may run at once).
    void atomic_add(float* p, float x) {
        static std::mutex global;
        std::lock_guard<std::mutex> lk(global);
        *p += x;
    }
    // The turn counters: an acquire load until *p == v (another block, maybe
    // running at once, posts), a release increment; a plain add in between.
    void sem_wait(const int* p, int v) {
        const auto until = std::chrono::steady_clock::now() + kHang;
        while (__atomic_load_n(p, __ATOMIC_ACQUIRE) != v) {
            if (std::chrono::steady_clock::now() > until) hang("dq turn counter");
            std::this_thread::yield();
        }
    }
    void sem_post(int* p) { __atomic_fetch_add(p, 1, __ATOMIC_RELEASE); }
    void add_ordered(float* p, float x) { *p += x; }
    void wg_commit() {
        const int g = t / 128;
        bk->wgb[g].wait();
        if (t % 128 == 0) {
            bk->groups[g].push_back(bk->pending[g]);
            bk->pending[g].clear();
        }
        bk->wgb[g].wait();
    }
    void wg_wait0() {
        const int g = t / 128;
        bk->wgb[g].wait();
        if (t % 128 == 0 && !faults().skip_wgmma_wait) {
            for (auto& grp : bk->groups[g])
                for (auto& op : grp) bk->run(op);
            bk->groups[g].clear();
        }
        bk->wgb[g].wait();
    }
};

// Runs body(ctx) for every block of a gx x gy grid, 384 threads each;
// false when some block broke a rule (its reason printed). One block after
// another in the GPU's order (x fastest), or with `together` every block at
// once, the threads of the last blocks started first.
template <typename Body>
inline bool run_grid(int gx, int gy, size_t smem_bytes, const attn_wg::WgMaps& maps, Body body, bool together = false) {
    bool ok = true;
    const int nb = gx * gy;
    std::vector<std::unique_ptr<Block>> live;
    std::vector<std::thread> th;
    auto start = [&](int id) {
        live.push_back(std::make_unique<Block>(smem_bytes, maps.box));
        Block* bk = live.back().get();
        const int bx = id % gx, by = id / gx;
        for (int t = 0; t < Block::kT; t++)
            th.emplace_back([&, bk, bx, by, t] {
                Ctx cx{bk, t, bx, by, {}, {}, {}};
                for (int w = 0; w < maps.n; w++) cx.pos_t[w] = maps.pos_t[w], cx.pos_h[w] = maps.pos_h[w], cx.pos_b[w] = maps.pos_b[w];
                body(cx);
            });
    };
    auto finish = [&]() {
        for (auto& x : th) x.join();
        th.clear();
        for (auto& bk : live) {
            for (auto& [a, m] : bk->mbars)
                if (!m.copies.empty()) bk->fail("TMA copies never waited for");
            for (auto& g : bk->groups)
                if (!g.empty() && !faults().skip_wgmma_wait) bk->fail("wgmma groups never waited for");
            if (bk->bad) {
                std::printf("    block: %s\n", bk->why.c_str());
                ok = false;
            }
        }
        live.clear();
    };
    if (together) {
        for (int id = nb - 1; id >= 0; id--) start(id);
        finish();
    } else {
        for (int id = 0; id < nb; id++) {
            start(id);
            finish();
        }
    }
    return ok;
}

}  // namespace wg_emu
