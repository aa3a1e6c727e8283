// llmc/backend/cpu_gemm_bf16.cpp: the CPU bf16 backend's matrix product
// (cpu_gemm_bf16.h): AVX-512 BF16 dot products on packed bf16 panels, or
// the operands widened to fp32 and cpu::gemm.
//
// The AVX-512 BF16 path. vdpbf16ps multiplies pairs of bf16 (two neighbours
// along K) and adds both products into one fp32 lane. So op(A) and op(B)
// are packed as pairs along K, one pair in a 32-bit word (the even k in the
// low half), an odd K's last pair padded with a zero:
//   A: blocks of MR rows,    [block][pair p][row r]    (one word per row),
//   B: blocks of NR columns, [block][pair p][column c] (one word per column).
// The micro-kernel holds an MR x NR tile of C in fp32 registers (12 x 32:
// 24 zmm accumulators, 2 for B, 1 for A, within the 32 there are); per
// pair it loads NR columns of B (two zmm) and, per row, broadcasts the row's
// word of A into a vdpbf16ps per zmm. Rows and columns past M and N are
// zero in the panels, so edge tiles run the same kernel and only their
// valid part is stored.
//
// Its arithmetic differs from fp32 sgemm's in two ways (Intel's description
// of vdpbf16ps, and what this project measured on an AVX-512 BF16 AMD
// EPYC): each product (exact: 8-bit by 8-bit significands) is added into
// the accumulator with its own rounding to nearest even, whatever MXCSR
// says; and denormal inputs and results are flushed to zero. The first is
// fp32 accumulation as sgemm's, the second loses only values below 2^-126.
//
// Determinism: C is cut into MC x NC tiles, each computed and stored by one
// thread; within a tile each element's accumulator runs over the pairs in
// order, k blocks one after another (an accumulator stored to memory and
// loaded again is exact). So every element is the same sum in the same
// order whatever the thread count or schedule.
//
// The AVX-512 functions carry their own target attribute, so the rest of the
// build needs no -m flags and runs on CPUs without AVX-512; they are called
// only after cpu_bf16_dot_supported() says the CPU has it. Other
// architectures than x86-64 compile the widened path only.
#include "llmc/backend/cpu_gemm_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "llmc/backend/cpu_gemm.h"
#include "llmc/base/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LLMC_BF16_DOT 1
#define LLMC_TARGET_BF16 __attribute__((target("avx512f,avx512bf16")))
#else
#define LLMC_BF16_DOT 0
#endif

namespace {

// Scratch reused call to call (grown, never shrunk), aligned to 64 bytes so
// that the panels' zmm loads do not straddle cache lines.
template <typename T>
T* aligned_scratch(std::vector<T>& v, size_t n) {
    const size_t pad = 64 / sizeof(T);
    if (v.size() < n + pad) v.resize(n + pad);
    const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

// The rows x cols bf16 block at src (leading dimension ld) widened to fp32,
// compact (leading dimension cols).
void widen(float* dst, const uint16_t* src, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)r * cols + c] = bf16_to_f32(src[(size_t)r * ld + c]);
}

#if LLMC_BF16_DOT
constexpr int MR = 12, NR = 32;  // the micro-kernel's tile of C
constexpr int MC = 96, NC = 128;  // one thread's tile of C: 8 x 4 micro-tiles
// Pairs per k block: a B micro-panel (KCP x NR words, 16 KiB) stays in L1
// while the tile's A panels (MC x KCP words, 48 KiB) stream from L2.
constexpr int KCP = 128;

// Packs X (n rows of K) into pairs: dst[b][p][w] = X(b*W+w, 2p) in the low
// half, X(b*W+w, 2p+1) in the high half, zero past n rows or past K, where
// X(i, k) = trans ? src[k*ld + i] : src[i*ld + k].
void pack_pairs(uint32_t* dst, const uint16_t* src, int ld, bool trans, int n, int K, int W) {
    const int KP = (K + 1) / 2, nb = (n + W - 1) / W;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nb; b++) {
        const int i0 = b * W, valid = std::min(W, n - i0);
        for (int p = 0; p < KP; p++) {
            uint32_t* d = dst + ((size_t)b * KP + p) * W;
            const bool pair = 2 * p + 1 < K;  // false: the zero that pads an odd K
            if (trans) {  // the pair's two elements lie in rows 2p and 2p+1 of src
                const uint16_t* r0 = src + (size_t)(2 * p) * ld + i0;
                if (pair)
                    for (int w = 0; w < valid; w++) d[w] = r0[w] | (uint32_t)r0[(size_t)ld + w] << 16;
                else
                    for (int w = 0; w < valid; w++) d[w] = r0[w];
            } else {  // the pair is two neighbours in row i of src
                const uint16_t* r0 = src + (size_t)i0 * ld + 2 * p;
                if (pair)
                    for (int w = 0; w < valid; w++) d[w] = r0[(size_t)w * ld] | (uint32_t)r0[(size_t)w * ld + 1] << 16;
                else
                    for (int w = 0; w < valid; w++) d[w] = r0[(size_t)w * ld];
            }
            for (int w = valid; w < W; w++) d[w] = 0;
        }
    }
}

// acc (MR x NR fp32, row-major) = (first ? 0 : acc) + the products of kc
// pairs: a holds MR words per pair, b NR words per pair.
LLMC_TARGET_BF16 inline void micro_kernel(float* acc, const uint32_t* a, const uint32_t* b, int kc, bool first) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        c0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NR);
        c1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NR + 16);
    }
    for (int p = 0; p < kc; p++, a += MR, b += NR) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[r]);
            c0[r] = _mm512_dpbf16_ps(c0[r], ar, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], ar, b1);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(acc + r * NR, c0[r]);
        _mm512_storeu_ps(acc + r * NR + 16, c1[r]);
    }
}

// One thread's tile of C: rows i0..i0+mi, columns j0..j0+nj (i0 and j0 on
// micro-tile boundaries). acc holds its MC x NC sums as micro-tiles.
LLMC_TARGET_BF16 void tile_dot(const uint32_t* ap, const uint32_t* bp, int KP, int i0, int mi, int j0, int nj,
                               float alpha, float beta, float* C, int ldc, float* acc) {
    const int mb = (mi + MR - 1) / MR, nb = (nj + NR - 1) / NR;
    for (int p0 = 0; p0 < KP; p0 += KCP) {
        const int kc = std::min(KCP, KP - p0);
        for (int jr = 0; jr < nb; jr++) {
            const uint32_t* b = bp + ((size_t)(j0 / NR + jr) * KP + p0) * NR;
            for (int ir = 0; ir < mb; ir++)
                micro_kernel(acc + (size_t)(ir * nb + jr) * MR * NR, ap + ((size_t)(i0 / MR + ir) * KP + p0) * MR, b,
                             kc, p0 == 0);
        }
    }
    // C = alpha*sum + beta*C on the valid part (KP == 0: the sum is empty).
    for (int i = 0; i < mi; i++) {
        const float* arow = acc + (size_t)(i / MR) * nb * MR * NR + (size_t)(i % MR) * NR;
        float* crow = C + (size_t)(i0 + i) * ldc + j0;
        for (int j = 0; j < nj; j++) {
            const float s = KP ? arow[(size_t)(j / NR) * MR * NR + j % NR] : 0.f;
            crow[j] = alpha * s + (beta == 0.f ? 0.f : beta * crow[j]);
        }
    }
}
#endif

}  // namespace

bool cpu_bf16_dot_supported() {
#if LLMC_BF16_DOT
    // libgcc's check also asks the OS (XGETBV) whether it saves the zmm state.
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

bool cpu_bf16_dot_available() {
    const char* e = std::getenv("LLMC_CPU_BF16_DOT");
    if (e && std::strcmp(e, "0") == 0) return false;
    return cpu_bf16_dot_supported();
}

void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda, const uint16_t* B,
               int ldb, float beta, float* C, int ldc) {
    (cpu_bf16_dot_available() ? gemm_bf16_dot : gemm_bf16_widened)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                                                     ldc);
}

void gemm_bf16_dot(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                   const uint16_t* B, int ldb, float beta, float* C, int ldc) {
    if (!cpu_bf16_dot_supported()) throw std::logic_error("gemm_bf16_dot: this CPU has no AVX-512 BF16");
    if (M <= 0 || N <= 0) return;
#if LLMC_BF16_DOT
    const int KP = (std::max(K, 0) + 1) / 2;
    // The packed operands: belong to the calling thread, reused call to call.
    static thread_local std::vector<uint32_t> a_store, b_store;
    uint32_t* ap = aligned_scratch(a_store, (size_t)((M + MR - 1) / MR) * MR * KP);
    uint32_t* bp = aligned_scratch(b_store, (size_t)((N + NR - 1) / NR) * NR * KP);
    pack_pairs(ap, A, lda, ta, M, K, MR);
    pack_pairs(bp, B, ldb, !tb, N, K, NR);
    const int mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC;
#pragma omp parallel
    {
        static thread_local std::vector<float> acc_store;
        float* acc = aligned_scratch(acc_store, (size_t)MC * NC);
        // Dynamic: tiles go to whichever thread is free (the machine may be
        // loaded); the bits do not depend on which one.
#pragma omp for schedule(dynamic) collapse(2)
        for (int ti = 0; ti < mt; ti++)
            for (int tj = 0; tj < nt; tj++) {
                const int i0 = ti * MC, j0 = tj * NC;
                tile_dot(ap, bp, KP, i0, std::min(MC, M - i0), j0, std::min(NC, N - j0), alpha, beta, C, ldc, acc);
            }
    }
#else
    (void)ta, (void)tb, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
#endif
}

void gemm_bf16_widened(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                       const uint16_t* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    // op(A) is stored ar x ac, op(B) br x bc; widened compact, so their
    // leading dimensions become ac and bc (at least 1, as BLAS asks).
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    static thread_local std::vector<float> a_store, b_store;
    float* a = aligned_scratch(a_store, (size_t)ar * ac);
    float* b = aligned_scratch(b_store, (size_t)br * bc);
    widen(a, A, ar, ac, lda);
    widen(b, B, br, bc, ldb);
    cpu::gemm(ta, tb, M, N, K, alpha, a, std::max(ac, 1), b, std::max(bc, 1), beta, C, ldc);
}
