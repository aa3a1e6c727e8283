// llmc/backend/cuda/fp8_kernels.h: the FP8 products' kernels (an operand's
// amax, the scales, the quantising and transposing copy, and delayed
// scaling's cast of an operand by the op that writes it) and the order of
// launches of a product's forward and backward, written once for two
// executors. cuda/fp8.cuh runs them on the GPU: the bodies as __global__
// kernels through a context of CUDA built-ins, the products through
// cuBLASLt. tests/unit/test_fp8_kernels.cpp runs the very same code on the
// CPU: the bodies on an emulated block of host threads (one per CUDA
// thread, __syncthreads a barrier, the shared tile pre-filled with garbage,
// every byte outside an operand's buffer watched), the products by a
// transcription of cuBLASLt's "TN" contract, and checks the result against
// the CPU backend's exact emulation (docs/fp8.md). Compiles without CUDA.
//
// A context Ctx provides, per thread:
//   tx(), ty(), bx(), by()     threadIdx.x, threadIdx.y, blockIdx.x, blockIdx.y
//   bdx(), gdx()               blockDim.x, gridDim.x
//   sync()                     __syncthreads()
//   tile()                     the block's shared uint8_t[kTile][kTile + 1]
//   to_f(e)                    an element (float or bf16) as float
//   fp8(v, e5m2)               the conversion instruction: v to an e4m3 or e5m2
//                              byte, saturating, to nearest even (fp8.h's rounding)
//   warp_max_commit(p, m)      the max of m over the warp into *p (one atomicMax
//                              by its first lane); every lane of the warp calls it
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmc/backend/fp8.h"
#include "llmc/backend/fp8_args.h"

#if defined(__CUDACC__)
#define FP8K_BODY __device__ __forceinline__
#define FP8K_UNROLL _Pragma("unroll")
#else
#define FP8K_BODY inline
#define FP8K_UNROLL
#endif

namespace fp8k {

// ---- the kernels' bodies ------------------------------------------------------------

// amax: a grid-stride max of |x| as float bits (fp8.h's abs_bits: exact,
// NaN wins) into *bits, which the caller zeroes first. Blocks of
// kAmaxThreads (1-D), amax_blocks(n) of them.
constexpr int kAmaxThreads = 256;
inline unsigned amax_blocks(size_t n) { return (unsigned)std::min<size_t>((n + kAmaxThreads - 1) / kAmaxThreads, 1024); }
template <class Ctx, class E>
FP8K_BODY void amax_body(Ctx& c, unsigned* bits, const E* x, size_t n) {
    unsigned m = 0;
    for (size_t i = (size_t)c.bx() * c.bdx() + c.tx(); i < n; i += (size_t)c.gdx() * c.bdx()) {
        const unsigned b = fp8::abs_bits(c.to_f(x[i]));
        m = b > m ? b : m;
    }
    c.warp_max_commit(bits, m);
}

// sc[i] = the scale of operand i (0 input e4m3, 1 weight e4m3, 2 output
// gradient e5m2) from amax[i], or under delayed scaling from its history's
// (Fp8Delayed, by value into the launch; history null: none;
// fp8::delayed_amax, recording the operands d.record names); the weight's
// amax at wamax when given (Fp8Weight), else amax[1];
// sc[3 + i] = 1 / sc[i], the product's descale. Thread i of one block
// (i < 3 do the work, each its own operand's step max).
FP8K_BODY void scales_one(float* sc, const double* amax, int i, Fp8Delayed d = Fp8Delayed{},
                          const double* wamax = nullptr) {
    if (i >= 3) return;
    const double own = i == 1 && wamax ? *wamax : amax[i];
    const double* hist = static_cast<const double*>(d.history);
    const double a = !hist ? own
                           : fp8::delayed_amax(own, static_cast<double*>(d.step_max) + i, hist + (size_t)i * d.len,
                                               d.len, (d.record >> i) & 1u);
    const double s = fp8::scale_for(a, i == 2 ? fp8::Format::e5m2 : fp8::Format::e4m3);
    sc[i] = (float)s;
    sc[3 + i] = (float)(1.0 / s);
}

// q[r, c] = fp8(x[r, c] · scale) for a rows x cols matrix; with transpose,
// q is written [cols, ld] (q[c, r]), its columns rows..ld-1 zero (ld: rows
// rounded up to 16, the K a weight gradient's product needs), and `plain`,
// when given, gets the bytes as they are too: a backward's output
// gradient, needed both ways, is read once. Blocks of kTile x kTileRows
// threads, one kTile x kTile tile each, through shared memory when
// transposing (quantize_grid: the grid and ld).
constexpr int kTile = 32, kTileRows = 8;
// The K of a weight gradient's product over `rows` rows: a multiple of 16
// (cuBLASLt's FP8 rule), the padding zero bytes (+0 in both formats), which
// add nothing to the sums. A Mixtral expert's block takes any row count.
inline int padded_k(int rows) { return (rows + 15) / 16 * 16; }
struct QuantizeGrid {
    unsigned gx, gy;  // tiles along the columns, along the rows
    int ld;           // q's row length when transposed (rows otherwise)
};
inline QuantizeGrid quantize_grid(int rows, int cols, bool transpose) {
    // (padded_k adds at most 15 rows, all inside the last tile's 32)
    return {(unsigned)((cols + kTile - 1) / kTile), (unsigned)((rows + kTile - 1) / kTile),
            transpose ? padded_k(rows) : rows};
}
// The tile pass under both. The operand is `halves` (1 or 2) blocks of
// columns side by side, cw = cols / halves wide; v(r, col, f) gives element
// (r, col + k·cw) of each block k in f[k] (a load; or an op that writes its
// output and returns the values as written, SwiGLU's backward both its
// gradients from one read of its inputs). With q, each value's byte at
// scale s goes where the layout says, the transposed one through the tile,
// block after block. Returns the max of |v| over the thread's elements
// (fp8.h's abs_bits). The grid: quantize_grid(rows, cw, transpose).
constexpr int kTilePer = kTile / kTileRows;  // a thread's rows of the tile
template <class Ctx, class V>
FP8K_BODY unsigned tile_body(Ctx& c, uint8_t* q, V v, int rows, int cols, int halves, float s, bool e5m2,
                             bool transpose, int ld, uint8_t* plain) {
    uint8_t(*tile)[kTile + 1] = c.tile();
    const int cw = cols / halves, c0 = c.bx() * kTile, r0 = c.by() * kTile;
    uint8_t b8[kTilePer][2];
    unsigned m = 0;
    for (int i = 0; i < kTilePer; i++) {
        const int r = r0 + c.ty() + i * kTileRows, col = c0 + c.tx();
        if (r >= rows || col >= cw) continue;
        float f[2];
        v(r, col, f);
        FP8K_UNROLL  // (constant indices: f and b8 stay in registers)
        for (int k = 0; k < 2; k++) {
            if (k >= halves) break;
            const unsigned b = fp8::abs_bits(f[k]);
            m = b > m ? b : m;
            if (!q) continue;
            b8[i][k] = c.fp8(f[k] * s, e5m2);
            const size_t at = (size_t)r * cols + col + (size_t)k * cw;
            if (!transpose) q[at] = b8[i][k];
            else if (plain) plain[at] = b8[i][k];
        }
    }
    if (!q || !transpose) return m;  // (the same for the whole block)
    FP8K_UNROLL
    for (int k = 0; k < 2; k++) {
        if (k >= halves) break;
        if (k) c.sync();  // the tile's last reads of the block before
        for (int i = 0; i < kTilePer; i++) {
            const int j = c.ty() + i * kTileRows;
            if (r0 + j < rows && c0 + c.tx() < cw) tile[j][c.tx()] = b8[i][k];
        }
        c.sync();
        for (int i = 0; i < kTilePer; i++) {
            const int j = c.ty() + i * kTileRows, col = c0 + j, r = r0 + c.tx();
            if (col < cw && r < ld) q[(size_t)(col + k * cw) * ld + r] = r < rows ? tile[c.tx()][j] : (uint8_t)0;
        }
    }
    return m;
}

// skip_hist (null: none): the operand's history when the op that wrote it
// cast it too (cast_body, below): while the history holds an amax, the
// copies are already there, at this very scale, and the body does nothing.
template <class Ctx, class E>
FP8K_BODY void quantize_body(Ctx& c, uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2,
                             bool transpose, int ld, uint8_t* plain, const double* skip_hist, int skip_len) {
    if (skip_hist && fp8::history_amax(skip_hist, skip_len) != 0) return;
    tile_body(c, q, [&](int r, int col, float* f) { f[0] = c.to_f(x[(size_t)r * cols + col]); }, rows, cols, 1,
              *scale, e5m2, transpose, ld, plain);
}

// Delayed scaling's fused cast: an op whose output is the next product's
// operand, the scale of which its history fixes before the op runs
// (fp8::history_amax), writes that operand's FP8 copies as it writes the
// output, where quantize_body would, so the product's quantiser need not
// read it again. op(r, col, f, store), as tile_body's v, computes the
// elements, rounds them to the compute type, stores them there when
// `store`, and returns them as rounded (Op::halves blocks of columns); the
// max of their magnitudes goes to *bits (the op's amax, as
// Backend::activation_amax measures it). While the history holds no amax
// (the first step) the scale is that amax, not known yet: the op writes no
// copy and the product quantises as without the cast, from the output,
// which is then always stored; otherwise only when `keep` (something else
// reads it).
// The grid: quantize_grid(rows, cols / Op::halves, transpose).
template <class Ctx, class Op>
FP8K_BODY void cast_body(Ctx& c, const Op& op, int rows, int cols, const double* hist, int len, bool e5m2, uint8_t* q,
                         bool transpose, int ld, uint8_t* plain, bool keep, unsigned* bits) {
    const double h = fp8::history_amax(hist, len);
    const float s = (float)fp8::scale_for(h, e5m2 ? fp8::Format::e5m2 : fp8::Format::e4m3);  // as scales_one
    const bool store = keep || h == 0;
    c.warp_max_commit(bits, tile_body(c, h != 0 ? q : nullptr, [&](int r, int col, float* f) { op(r, col, f, store); },
                                      rows, cols, op.halves(), s, e5m2, transpose, ld, plain));
}

// A block's norm as cast_body's op: element (r, col) of LayerNorm's output,
// (x - mean) · rstd · w + b, or RMSNorm's, x · rstd · w, from the row
// statistics and the (residual) input the norm's kernel left (it wrote
// neither the output nor its amax: cuda/layernorm.cuh, rmsnorm.cuh with out
// null), computed as those kernels compute it in fp32, rounded to the
// compute type E by Cvt (Cvt::e(float) to E, Cvt::f(E) back), stored when
// `store`. One block of columns.
template <class E, class Cvt>
struct NormCast {
    E* out;
    const E* x;                  // [rows, C]: the norm's input, or the residual sum it wrote
    const float *mean, *rstd;    // [rows] (mean: LayerNorm's; null for RMSNorm)
    const E *w, *b;              // [C] (b: LayerNorm's bias)
    int C;
    FP8K_BODY int halves() const { return 1; }
    FP8K_BODY void operator()(int r, int col, float* f, bool store) const {
        const size_t i = (size_t)r * C + col;
        const float v = mean ? (Cvt::f(x[i]) - mean[r]) * rstd[r] * Cvt::f(w[col]) + Cvt::f(b[col])
                             : Cvt::f(x[i]) * rstd[r] * Cvt::f(w[col]);
        const E e = Cvt::e(v);
        if (store) out[i] = e;
        f[0] = Cvt::f(e);
    }
};

// The kept copy's bytes from the scratch, n of them, while the history
// (hist, len) holds no amax (the first step: the op that wrote the input
// could not cast it, so the backward quantised it); a grid-stride copy of
// 1-D blocks, nothing at all once the history holds one.
template <class Ctx>
FP8K_BODY void kept_copy_body(Ctx& c, uint8_t* dst, const uint8_t* src, size_t n, const double* hist, int len) {
    if (fp8::history_amax(hist, len) != 0) return;
    for (size_t i = (size_t)c.bx() * c.bdx() + c.tx(); i < n; i += (size_t)c.gdx() * c.bdx()) dst[i] = src[i];
}

// ---- a product's launches -----------------------------------------------------------

// The operands' scratch: six byte buffers, each of its own size (Sizes:
// the input, weight and output gradient, and their transposes), the amax
// bits and the six scales, carved from one block of memory, each buffer
// 256-byte aligned and at least 256 bytes (so no two share an address).
struct Scratch {
    struct Sizes {  // bytes (FP8 elements) of each buffer
        size_t x = 0, w = 0, dy = 0, xt = 0, wt = 0, dyt = 0;
        Sizes& cover(const Sizes& o) {  // each the larger of the two
            x = std::max(x, o.x), w = std::max(w, o.w), dy = std::max(dy, o.dy);
            xt = std::max(xt, o.xt), wt = std::max(wt, o.wt), dyt = std::max(dyt, o.dyt);
            return *this;
        }
        bool holds(const Sizes& o) const {
            return o.x <= x && o.w <= w && o.dy <= dy && o.xt <= xt && o.wt <= wt && o.dyt <= dyt;
        }
        bool any() const { return x || w || dy || xt || wt || dyt; }
        static Sizes of(const size_t* e) { return {e[0], e[1], e[2], e[3], e[4], e[5]}; }  // (Workspace::fp8_elems)
    };
    uint8_t *x, *w, *dy, *xt, *wt, *dyt;
    unsigned* bits;
    float* scales;  // [scale x, w, dy, descale x, w, dy]
    static size_t round_up(size_t n) { return std::max<size_t>(256, (n + 255) / 256 * 256); }
    static size_t bytes(const Sizes& z) {
        return round_up(z.x) + round_up(z.w) + round_up(z.dy) + round_up(z.xt) + round_up(z.wt) + round_up(z.dyt) + 256;
    }
    static Scratch carve(void* base, const Sizes& z) {
        uint8_t* p = static_cast<uint8_t*>(base);
        Scratch s;
        s.x = p, p += round_up(z.x);
        s.w = p, p += round_up(z.w);
        s.dy = p, p += round_up(z.dy);
        s.xt = p, p += round_up(z.xt);
        s.wt = p, p += round_up(z.wt);
        s.dyt = p, p += round_up(z.dyt);
        s.bits = reinterpret_cast<unsigned*>(p);
        s.scales = reinterpret_cast<float*>(p + 16);
        return s;
    }
};
// What each operand buffer must hold for a product's forward (x and W as
// they are) and backward (dy as it is and transposed, W^T, x^T; the
// transposed copies' K padded to 16, below).
inline Scratch::Sizes forward_sizes(int N, int IC, int OC) {
    Scratch::Sizes z;
    z.x = (size_t)N * IC, z.w = (size_t)OC * IC;
    return z;
}
inline Scratch::Sizes backward_sizes(int N, int IC, int OC) {
    Scratch::Sizes z;
    z.dy = (size_t)N * OC, z.dyt = (size_t)padded_k(N) * OC;
    z.xt = (size_t)padded_k(N) * IC, z.wt = (size_t)IC * padded_k(OC);
    return z;
}
inline Scratch::Sizes product_sizes(int N, int IC, int OC) {  // both
    return forward_sizes(N, IC, OC).cover(backward_sizes(N, IC, OC));
}

// An operand the op before the product cast (cast_body): its history, and
// whether the transposed copy was written too (a whole backward's output
// gradient, both ways) or the plain one alone.
struct Precast {
    const double* hist;
    int len;
    bool transposed;
};

// An executor X (the GPU's in fp8.cuh, the test's emulated one) provides:
//   scales(sc, amax, d, wamax)                    the scales body, one block (d: an
//                                                 Fp8Delayed, or null; wamax: the
//                                                 weight's amax, or null: amax[1])
//   quantize(q, x, rows, cols, scale, e5m2, transpose, plain, pre)
//                                                 the quantise body on quantize_grid,
//                                                 skipped on the device where pre (or
//                                                 null) says the copy is there
//   kept_copy(dst, src, n, pre)                   kept_copy_body: n bytes, only while
//                                                 pre's history is empty
//   gemm(C, A, a_e5m2, B, b_e5m2, M, N, K, descale_a, descale_b, accumulate, bias)
//        row-major C[M, N] (+)= (A[M, K] · B[N, K]^T) · descale_a · descale_b
//        (+ bias[N]), A and B FP8 bytes contiguous along K, accumulated in
//        fp32; K and N multiples of 16 (cuBLASLt's "TN" FP8 product)
// cuBLASLt multiplies FP8 only as "TN", so every product here is
// C[M, N] = A[M, K] · B[N, K]^T with both operands K-contiguous:
//   forward         out[N, OC]  = x[N, IC]      · W[OC, IC]^T      (as stored)
//   input gradient  dx[N, IC]   = dy[N, OC]     · (W^T)[IC, OC]^T  (W transposed)
//   weight gradient dW[OC, IC] += (dy^T)[OC, N] · (x^T)[IC, N]^T   (dy, x transposed)
// amax [3] doubles: the model's (input, weight, output gradient); pre (or
// null): the input (forward) or the output gradient (backward) was cast into
// s.x, or s.dy (and s.dyt), by the op that wrote it. fp8_args.h's: kept
// (or null): the weight gradient's x^T is kept->bytes [IC, padded_k(N)],
// not s.xt, which the op that wrote the input filled while its history
// holds an amax (else the quantiser writes s.xt and kept_copy copies it
// there); d (or null): delayed
// scaling, in the scales' launch; wq (or null): the weight's copies, made
// by this call only where it says (the choice is the host's: the model
// knows when the weights change), and its amax.
template <class X, class E>
void forward(X& ex, const Scratch& s, E* out, const E* inp, const E* weight, const E* bias, int N, int IC, int OC,
             const double* amax, const Precast* pre = nullptr, const Fp8Delayed* d = nullptr,
             const Fp8Weight* wq = nullptr) {
    ex.scales(s.scales, amax, d, wq ? static_cast<const double*>(wq->amax) : nullptr);
    ex.quantize(s.x, inp, N, IC, s.scales + 0, false, false, nullptr, pre);
    uint8_t* wb = wq ? static_cast<uint8_t*>(wq->bytes) : s.w;
    if (!wq || wq->quantize) ex.quantize(wb, weight, OC, IC, s.scales + 1, false, false, nullptr, (const Precast*)nullptr);
    ex.gemm(out, s.x, false, wb, false, N, OC, IC, s.scales + 3, s.scales + 4, false, bias);
}

// dinp (overwritten) and dweight (+=), either may be null (a split
// backward's B, then its W); the bias gradient is the caller's (from the
// unrounded gradient).
template <class X, class E>
void backward(X& ex, const Scratch& s, E* dinp, E* dweight, const E* dout, const E* inp, const E* weight, int N,
              int IC, int OC, const double* amax, const Precast* pre = nullptr, const Fp8Kept* kept = nullptr,
              const Fp8Delayed* d = nullptr, const Fp8Weight* wq = nullptr) {
    const Precast* none = nullptr, *both = pre && pre->transposed ? pre : nullptr;
    ex.scales(s.scales, amax, d, wq ? static_cast<const double*>(wq->amax) : nullptr);
    // The output gradient both ways in one pass when both products run.
    if (dinp && dweight) ex.quantize(s.dyt, dout, N, OC, s.scales + 2, true, true, s.dy, both);
    if (dinp) {  // dx[N, IC] = dy[N, OC] · (W^T)[IC, OC]^T
        if (!dweight) ex.quantize(s.dy, dout, N, OC, s.scales + 2, true, false, nullptr, pre);
        uint8_t* wt = wq ? static_cast<uint8_t*>(wq->bytes_t) : s.wt;
        if (!wq || wq->quantize_t) ex.quantize(wt, weight, OC, IC, s.scales + 1, false, true, nullptr, none);
        // W^T's rows are OC long: padded_k(OC) = OC, the model's widths being multiples of 16
        ex.gemm(dinp, s.dy, true, wt, false, N, IC, OC, s.scales + 5, s.scales + 4, false, (const E*)nullptr);
    }
    if (!dweight) return;
    // dW[OC, IC] += (dy^T)[OC, Np] · (x^T)[IC, Np]^T, N padded to Np with zeros
    if (!dinp) ex.quantize(s.dyt, dout, N, OC, s.scales + 2, true, true, nullptr, both);
    // x^T kept: there already while the history holds an amax; while it is
    // empty, quantised into s.xt and copied there after (the kept bytes may
    // be the input's own buffer: read whole before they are written).
    const Precast in_kept{kept ? static_cast<const double*>(kept->history) : nullptr, kept ? kept->len : 0, true};
    uint8_t* xt = kept ? static_cast<uint8_t*>(kept->bytes) : s.xt;
    ex.quantize(s.xt, inp, N, IC, s.scales + 0, false, true, nullptr, kept ? &in_kept : none);
    if (kept) ex.kept_copy(xt, s.xt, (size_t)IC * padded_k(N), &in_kept);
    ex.gemm(dweight, s.dyt, true, xt, false, OC, IC, padded_k(N), s.scales + 5, s.scales + 3, true,
            (const E*)nullptr);
}

}  // namespace fp8k
