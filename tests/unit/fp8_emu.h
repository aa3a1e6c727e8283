// tests/unit/fp8_emu.h: the emulated GPU the FP8 kernels' test runs
// llmc/backend/cuda/fp8_kernels.h on (tests/unit/test_fp8_kernels.cpp): one
// host thread per CUDA thread, __syncthreads a barrier, the shared tile
// filled with garbage first, warp maxima and atomicMax under a mutex, the
// conversion instruction as fp8.h's rounding (counted: a skipped quantiser
// runs none); the products' executor, whose gemm transcribes cuBLASLt's FP8
// "TN" contract and refuses an operand outside its scratch buffer; an
// elementwise op for the cast; random operands.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "llmc/backend/cuda/fp8_kernels.h"
#include "tests/unit/emu_barrier.h"

namespace fp8emu {

// ---- the emulated GPU ----------------------------------------------------------------
struct EmuBlock {
    int n;
    Barrier block;
    std::vector<std::unique_ptr<Barrier>> warps;
    std::vector<unsigned> lane_value;
    uint8_t tile[fp8k::kTile][fp8k::kTile + 1];
    explicit EmuBlock(int threads) : n(threads), block(threads), lane_value(threads) {
        for (int w = 0; w * 32 < n; w++) warps.push_back(std::make_unique<Barrier>(std::min(32, n - 32 * w)));
        std::memset(tile, 0xA5, sizeof tile);  // what an unwritten shared byte reads as
    }
};
inline std::mutex g_atomic;
inline std::atomic<size_t> g_conversions{0};  // conversion instructions run: a skipped quantiser runs none

struct EmuCtx {
    EmuBlock* b;
    int tx_, ty_, bx_, by_, bdx_, gdx_;
    using Tile = uint8_t[fp8k::kTile + 1];
    int tx() const { return tx_; }
    int ty() const { return ty_; }
    int bx() const { return bx_; }
    int by() const { return by_; }
    int bdx() const { return bdx_; }
    int gdx() const { return gdx_; }
    void sync() { b->block.wait(); }
    Tile* tile() { return b->tile; }
    float to_f(float e) const { return e; }
    float to_f(double e) const { return (float)e; }
    uint8_t fp8(float v, bool e5m2) const {
        g_conversions++;
        return fp8::encode((double)v, e5m2 ? fp8::Format::e5m2 : fp8::Format::e4m3);
    }
    void warp_max_commit(unsigned* p, unsigned m) {
        const int lin = tx_ + ty_ * bdx_, w = lin / 32;
        b->lane_value[lin] = m;
        b->warps[w]->wait();
        if (lin % 32 == 0) {
            unsigned best = 0;
            for (int i = 32 * w; i < std::min(32 * w + 32, b->n); i++) best = std::max(best, b->lane_value[i]);
            std::lock_guard<std::mutex> lk(g_atomic);
            *p = std::max(*p, best);
        }
        b->warps[w]->wait();
    }
};

// body(ctx) for every thread of a gx x gy grid of bdx x bdy blocks.
template <class Body>
void run_grid(unsigned gx, unsigned gy, int bdx, int bdy, Body body) {
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            EmuBlock blk(bdx * bdy);
            std::vector<std::thread> th;
            for (int ty = 0; ty < bdy; ty++)
                for (int tx = 0; tx < bdx; tx++)
                    th.emplace_back([&, tx, ty] {
                        EmuCtx c{&blk, tx, ty, (int)bx, (int)by, bdx, (int)gx};
                        body(c);
                    });
            for (auto& t : th) t.join();
        }
}

template <class E>
void emu_quantize(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2, bool transpose,
                  uint8_t* plain, const fp8k::Precast* pre = nullptr) {
    if (rows <= 0 || cols <= 0) return;
    const fp8k::QuantizeGrid g = fp8k::quantize_grid(rows, cols, transpose);
    run_grid(g.gx, g.gy, fp8k::kTile, fp8k::kTileRows, [&](EmuCtx& c) {
        fp8k::quantize_body(c, q, x, rows, cols, scale, e5m2, transpose, g.ld, transpose ? plain : nullptr,
                            pre ? pre->hist : nullptr, pre ? pre->len : 0);
    });
}

constexpr uint8_t kCanary = 0xFF;  // NaN in both formats: never a byte of these data (checked below)
constexpr size_t kGuard = 64;

// fp8k's executor on the emulated GPU; gemm transcribes cuBLASLt's TN FP8 product.
template <class E>
struct EmuExec {
    fp8k::Scratch s;
    fp8k::Scratch::Sizes z;  // what each buffer of s holds
    std::string* err;
    const uint8_t* kept = nullptr;  // a kept copy's buffer (Fp8Kept) and its bytes
    size_t kept_bytes = 0;
    const uint8_t *wq = nullptr, *wqt = nullptr;  // the weight's copies (Fp8Weight), of wq_bytes each
    size_t wq_bytes = 0;
    bool inside(const uint8_t* p, size_t n) const {
        if (kept && p == kept) return n <= kept_bytes;
        if (wq && (p == wq || p == wqt)) return n <= wq_bytes;
        const std::pair<const uint8_t*, size_t> bufs[6] = {{s.x, z.x},   {s.w, z.w},   {s.dy, z.dy},
                                                           {s.xt, z.xt}, {s.wt, z.wt}, {s.dyt, z.dyt}};
        for (const auto& b : bufs)
            if (p == b.first) return n <= b.second;
        return false;
    }
    void fail(const std::string& what) {
        if (err->empty()) *err = what;
    }
    void scales(float* sc, const double* amax, const Fp8Delayed* d, const double* wamax) {
        run_grid(1, 1, 32, 1,
                 [&](EmuCtx& c) { fp8k::scales_one(sc, amax, c.tx(), d ? *d : Fp8Delayed{}, wamax); });
    }
    void quantize(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2, bool transpose,
                  uint8_t* plain, const fp8k::Precast* pre) {
        const size_t n = transpose ? (size_t)cols * fp8k::padded_k(rows) : (size_t)rows * cols;
        if (!inside(q, n)) fail("a quantised copy of " + std::to_string(n) + " bytes outside its scratch buffer");
        if (plain && !inside(plain, (size_t)rows * cols)) fail("the plain copy outside its scratch buffer");
        if (!err->empty()) return;
        emu_quantize(q, x, rows, cols, scale, e5m2, transpose, plain, pre);
    }
    void kept_copy(uint8_t* dst, const uint8_t* src, size_t n, const fp8k::Precast* pre) {
        if (!inside(dst, n) || !inside(src, n)) fail("the kept copy's bytes outside their buffers");
        if (!err->empty()) return;
        run_grid(fp8k::amax_blocks(n), 1, fp8k::kAmaxThreads, 1,
                 [&](EmuCtx& c) { fp8k::kept_copy_body(c, dst, src, n, pre->hist, pre->len); });
    }
    void gemm(E* C, const uint8_t* A, bool a5, const uint8_t* B, bool b5, int M, int N, int K, const float* da,
              const float* db, bool accumulate, const E* bias) {
        if (K % 16 || N % 16 || M <= 0) fail("a product cuBLASLt refuses: M N K = " + std::to_string(M) + " " +
                                             std::to_string(N) + " " + std::to_string(K));
        if (!inside(A, (size_t)M * K) || !inside(B, (size_t)N * K)) fail("a product's operand outside its buffer");
        if (!err->empty()) return;
        const fp8::Format fa = a5 ? fp8::Format::e5m2 : fp8::Format::e4m3;
        const fp8::Format fb = b5 ? fp8::Format::e5m2 : fp8::Format::e4m3;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += fp8::decode(A[(size_t)m * K + k], fa) * fp8::decode(B[(size_t)n * K + k], fb);
                double v = acc * (double)*da * (double)*db;
                if (bias) v += (double)bias[n];
                if (accumulate) v += (double)C[(size_t)m * N + n];
                C[(size_t)m * N + n] = (E)v;
            }
    }
};

// max |a - b| over the largest |b| (or 1e-30).
template <class E>
double rel_diff(const std::vector<E>& a, const std::vector<E>& b) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < a.size(); i++) {
        d = std::max(d, std::fabs((double)a[i] - (double)b[i]));
        m = std::max(m, std::fabs((double)b[i]));
    }
    return d / m;
}

// A product's random operands: x [N, IC], w [OC, IC], dy [N, OC].
struct Operands {
    std::vector<double> x, w, dy;
    Operands(int N, int IC, int OC, unsigned seed) : x((size_t)N * IC), w((size_t)OC * IC), dy((size_t)N * OC) {
        std::mt19937 rng(seed);
        std::normal_distribution<double> nd(0.0, 1.0);
        for (double& v : x) v = nd(rng);
        for (double& v : w) v = 0.3 * nd(rng);
        for (double& v : dy) v = 1e-3 * nd(rng);
    }
};

// ---- the cast ----------------------------------------------------------------------
// An elementwise op as cast_body takes one: y = 1.5x - 0.25x² rounded to E,
// stored when asked, returned as rounded; with 2 halves each call gives
// element c of both halves of the row (as SwiGLU's backward gives dgate
// and dup).
template <class E>
struct EmuOp {
    E* out;
    const E* x;
    int cols, halves_ = 1;
    int halves() const { return halves_; }
    void operator()(int r, int c, float* f, bool store) const {
        for (int k = 0; k < halves_; k++) {
            const size_t i = (size_t)r * cols + c + (size_t)k * (cols / halves_);
            const float v = (float)x[i];
            const E e = (E)(1.5f * v - 0.25f * v * v);
            if (store) out[i] = e;
            f[k] = (float)e;
        }
    }
};
// The host's conversions for fp8k::NormCast (E float or double).
template <class E>
struct HostCvt {
    static float f(E e) { return (float)e; }
    static E e(float v) { return (E)v; }
};

// cast_body of an op (EmuOp, fp8k::NormCast) on the emulated GPU; its amax bits.
template <class Op>
unsigned emu_cast(const Op& op, int rows, int cols, const double* hist, int len, bool e5m2, uint8_t* q, bool tr,
                  uint8_t* plain, bool keep = true) {
    unsigned bits = 0;
    const fp8k::QuantizeGrid g = fp8k::quantize_grid(rows, cols / op.halves(), tr);
    run_grid(g.gx, g.gy, fp8k::kTile, fp8k::kTileRows, [&](EmuCtx& c) {
        fp8k::cast_body(c, op, rows, cols, hist, len, e5m2, q, tr, g.ld, plain, keep, &bits);
    });
    return bits;
}

}  // namespace fp8emu
