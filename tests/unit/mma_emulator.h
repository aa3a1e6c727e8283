// tests/unit/mma_emulator.h: the tensor-core instructions and the GPU that
// tests/unit/test_mma_layout.cpp runs the attention kernel bodies on, on the
// CPU: ldmatrix .x4 and mma.sync m16n8k16 transcribed from the PTX ISA
// (independently of llmc/backend/cuda/mma_layout.h, which the test checks
// against them), and an emulated block: one host thread per CUDA thread,
// __syncthreads as a barrier, ldmatrix/mma/shuffles as warp collectives,
// cp.async landing only at the issuing thread's wait (by commit group),
// fp32 atomics under a mutex.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "tests/unit/emu_barrier.h"

using namespace mma_layout;

inline float b2f(uint16_t b) { return bf16_bits_to_float(b); }
inline uint16_t f2b(float x) { return bf16_bits_rn(x); }
inline float lo_of(uint32_t r) { return b2f((uint16_t)(r & 0xffffu)); }
inline float hi_of(uint32_t r) { return b2f((uint16_t)(r >> 16)); }

// ---- the PTX ISA, transcribed ---------------------------------------------------------
// groupID = %laneid >> 2, threadID_in_group = %laneid % 4.
// A (.bf16, a0..a7): row = groupID for ai where 0 <= i < 2 || 4 <= i < 6,
//   groupID + 8 otherwise; col = threadID_in_group * 2 + (i & 0x1) for i < 4,
//   threadID_in_group * 2 + (i & 0x1) + 8 for i >= 4.
inline RC spec_a(int lane, int i) {
    const int gid = lane >> 2, tig = lane % 4;
    const int row = ((0 <= i && i < 2) || (4 <= i && i < 6)) ? gid : gid + 8;
    const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
    return {row, col};
}
// B (.bf16, b0..b3): row = threadID_in_group * 2 + (i & 0x1) for bi where i < 2,
//   threadID_in_group * 2 + (i & 0x1) + 8 for i >= 2; col = groupID.
inline RC spec_b(int lane, int i) {
    const int gid = lane >> 2, tig = lane % 4;
    return {i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8, gid};
}
// C/D (.f32, c0..c3): row = groupID for c0 and c1, groupID + 8 for c2 and c3;
//   col = threadID_in_group * 2 + (i & 0x1).
inline RC spec_c(int lane, int i) {
    const int gid = lane >> 2, tig = lane % 4;
    return {i < 2 ? gid : gid + 8, tig * 2 + (i & 1)};
}
// ldmatrix .x4 .b16: threads 8m..8m+7 hold the addresses of rows 0..7 of
// matrix m. Without .trans "each thread in a warp holds a fragment of a row
// of the matrix ... a group of four threads holds an entire row": register m
// of lane L = row L/4 of matrix m, elements 2(L%4) and 2(L%4)+1. With .trans
// the matrix arrives transposed: element (r, c) of what the lanes hold is
// element (c, r) of the stored matrix.
inline void emu_ldmatrix_x4(const uint16_t* const (&rows)[32], bool trans, uint32_t (&out)[32][4]) {
    for (int L = 0; L < 32; L++)
        for (int m = 0; m < 4; m++) {
            const int r = L / 4, c = 2 * (L % 4);
            uint16_t e0, e1;
            if (!trans) {
                e0 = rows[8 * m + r][c];
                e1 = rows[8 * m + r][c + 1];
            } else {
                e0 = rows[8 * m + c][r];
                e1 = rows[8 * m + c + 1][r];
            }
            out[L][m] = (uint32_t)e0 | ((uint32_t)e1 << 16);
        }
}
// D = A·B + C for one warp, operands in the lanes' registers per the layouts above.
inline void emu_mma(float (&d)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], const float (&c)[32][4]) {
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        for (int i = 0; i < 8; i++) {
            const RC rc = spec_a(L, i);
            A[rc.row][rc.col] = (i & 1) ? hi_of(a[L][i / 2]) : lo_of(a[L][i / 2]);
        }
        for (int i = 0; i < 4; i++) {
            const RC rc = spec_b(L, i);
            B[rc.row][rc.col] = (i & 1) ? hi_of(b[L][i / 2]) : lo_of(b[L][i / 2]);
        }
    }
    for (int L = 0; L < 32; L++)
        for (int i = 0; i < 4; i++) {
            const RC rc = spec_c(L, i);
            double acc = c[L][i];
            for (int k = 0; k < 16; k++) acc += (double)A[rc.row][k] * B[k][rc.col];
            d[L][i] = (float)acc;
        }
}

// ---- the emulated GPU ----------------------------------------------------------------
struct alignas(16) Chunk {
    unsigned char b[16];
};

// What the 128 threads of one block share.
struct BlockState {
    std::vector<Chunk> smem;
    size_t smem_bytes;
    Barrier block{attn_tc::kThreads};
    Barrier warp[4] = {Barrier(32), Barrier(32), Barrier(32), Barrier(32)};
    const uint16_t* rows[4][32];
    uint32_t a[4][32][4], b[4][32][2];
    float c[4][32][4], f[4][32];
    bool bad_access = false;  // smem access out of range or misaligned
    explicit BlockState(size_t bytes) : smem((bytes + 15) / 16), smem_bytes(bytes) {
        uint16_t* p = reinterpret_cast<uint16_t*>(smem.data());
        for (size_t i = 0; i < smem.size() * 8; i++) p[i] = 0x7fc1;  // bf16 NaN (and NaN as fp32 pairs)
    }
    bool in_smem(const void* p, size_t n) const {
        const char* s = reinterpret_cast<const char*>(smem.data());
        const char* q = reinterpret_cast<const char*>(p);
        return q >= s && q + n <= s + smem_bytes;
    }
};

// The host executor of attention_tc_kernels.h (one object per emulated thread).
struct HostCtx {
    BlockState* bs;
    int t, bx_, by_;
    struct Copy {
        void* dst;
        const void* src;
        bool ok;
    };
    std::vector<Copy> pending;               // issued, not yet committed
    std::vector<std::vector<Copy>> groups;   // committed groups, oldest first

    int tid() const { return t; }
    int bx() const { return bx_; }
    int by() const { return by_; }
    void* smem() const { return bs->smem.data(); }
    void sync() { bs->block.wait(); }
    void cp_async16(void* s, const void* g, bool ok) {
        if (!bs->in_smem(s, 16) || ((uintptr_t)s & 15) || ((uintptr_t)g & 15)) bs->bad_access = true;
        pending.push_back({s, g, ok});  // lands at this thread's next wait
    }
    void cp_commit() {
        groups.push_back(pending);
        pending.clear();
    }
    // cp.async.wait_group n: the groups older than the n newest land (only
    // now, and only for this thread's copies); uncommitted copies stay in flight.
    void cp_wait(int n) {
        while ((int)groups.size() > n) {
            for (const Copy& c : groups.front()) {
                if (c.ok)
                    std::memcpy(c.dst, c.src, 16);
                else
                    std::memset(c.dst, 0, 16);
            }
            groups.erase(groups.begin());
        }
    }
    void cp_wait_all() { cp_wait(0); }
    // atomicAdd: one mutex for every emulated thread (the order of the adds
    // follows the threads' scheduling, as on the GPU).
    void atomic_add(float* p, float x) {
        static std::mutex mu;
        std::lock_guard<std::mutex> lk(mu);
        *p += x;
    }
    void ldsm(uint32_t (&r)[4], const uint16_t* p, bool trans) {
        const int w = t / 32, l = t % 32;
        if (!bs->in_smem(p, 16) || ((uintptr_t)p & 15)) {
            bs->bad_access = true;
            p = reinterpret_cast<const uint16_t*>(bs->smem.data());
        }
        bs->rows[w][l] = p;
        bs->warp[w].wait();
        static thread_local uint32_t out[32][4];
        emu_ldmatrix_x4(bs->rows[w], trans, out);
        for (int m = 0; m < 4; m++) r[m] = out[l][m];
        bs->warp[w].wait();
    }
    void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) { ldsm(r, p, false); }
    void ldsm_x4_t(uint32_t (&r)[4], const uint16_t* p) { ldsm(r, p, true); }
    void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        const int w = t / 32, l = t % 32;
        for (int i = 0; i < 4; i++) bs->a[w][l][i] = a[i], bs->c[w][l][i] = d[i];
        bs->b[w][l][0] = b0, bs->b[w][l][1] = b1;
        bs->warp[w].wait();
        static thread_local float out[32][4];
        emu_mma(out, bs->a[w], bs->b[w], bs->c[w]);
        for (int i = 0; i < 4; i++) d[i] = out[l][i];
        bs->warp[w].wait();
    }
    float shfl(float x, int src) {
        const int w = t / 32, l = t % 32;
        bs->f[w][l] = x;
        bs->warp[w].wait();
        const float y = bs->f[w][src & 31];
        bs->warp[w].wait();
        return y;
    }
    float shfl_xor(float x, int m) { return shfl(x, (t % 32) ^ m); }
};

// Runs body(ctx) for every block of a gx x gy grid, 128 threads each.
template <typename Body>
inline bool run_grid(int gx, int gy, size_t smem_bytes, Body body) {
    bool ok = true;
    for (int by = 0; by < gy; by++)
        for (int bx = 0; bx < gx; bx++) {
            BlockState bs(smem_bytes);
            std::vector<std::thread> th;
            for (int t = 0; t < attn_tc::kThreads; t++)
                th.emplace_back([&, t] {
                    HostCtx cx{&bs, t, bx, by, {}, {}};
                    body(cx);
                });
            for (auto& x : th) x.join();
            ok &= !bs.bad_access;
        }
    return ok;
}
