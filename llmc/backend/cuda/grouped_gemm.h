// llmc/backend/cuda/grouped_gemm.h: the body of the experts' products whose
// row groups are known only on the device (Backend::moe_expert_matmul_*,
// docs/moe.md), as plain __host__ __device__ functions: the kernels in
// moe.cuh run them on the GPU, and tests/unit/test_grouped_gemm.cpp (g++,
// no CUDA) runs the same functions block by block on the CPU against
// naive products, so the index logic written without a GPU at hand is
// checked before one runs it.
//
// One product C (+)= A · B over fp32 tiles in shared memory: a block of
// kThreads threads computes a kTile x kTile tile of C, each thread a 4 x 4
// patch, stepping through K kDepth at a time (load the two tiles, barrier,
// multiply-add, barrier). The operands are read through strides, so one
// body serves the three products of an expert's linear layer:
//   forward   C[r, o] = sum_i X[r, i] · W_e[o, i]        (rows of expert e)
//   input     C[r, i] = sum_o dY[r, o] · W_e[o, i]       (rows of expert e)
//   weight    dW_e[o, i] += sum_r dY[r, o] · X[r, i]     (r over e's rows)
// The grid of the first two covers the worst case of row tiles (every
// group's last tile partial: ceil(rows / kTile) + E); each block finds its
// expert and tile from the offsets (row_tile) and the spare blocks return.
// The third has one block per (o, i) tile and expert, and loops over the
// expert's rows.
//
// Every load is bounds-checked (zero outside), so any sizes work; the tile
// loads run along whichever index is contiguous in memory, so a warp reads
// consecutive addresses. Accumulation is fp32 in a fixed order: the same
// inputs give the same bits.
#pragma once
#include <cstddef>

#if defined(__CUDACC__)
#define GG_HD __host__ __device__ __forceinline__
#else
#define GG_HD inline
#endif

namespace grouped_gemm {

constexpr int kTile = 64;      // C tile: kTile x kTile
constexpr int kDepth = 16;     // K per step
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kPitch = kTile + 4;  // shared-memory row pitch (floats): [kDepth][kPitch] per operand
constexpr int kSmemFloats = 2 * kDepth * kPitch;

// Expert e's row tiles, in expert order: block row `by` is tile t of expert
// e, rows [row0, row0 + n) (n <= kTile); false for a spare block.
GG_HD bool row_tile(const int* off, int E, int by, int* e_out, int* row0, int* n) {
    int first = 0;  // the first block row of expert e
    for (int e = 0; e < E; e++) {
        const int rows = off[e + 1] - off[e];
        const int tiles = (rows + kTile - 1) / kTile;
        if (by < first + tiles) {
            const int t = by - first;
            *e_out = e;
            *row0 = off[e] + t * kTile;
            *n = rows - t * kTile < kTile ? rows - t * kTile : kTile;
            return true;
        }
        first += tiles;
    }
    return false;
}
// Block rows the first two products launch for `rows` grouped rows of E experts.
GG_HD int row_tiles_bound(int rows, int E) { return (rows + kTile - 1) / kTile + E; }

// An operand: element (i, j) at p[i·si + j·sj]; rows i < ni and columns j < nj are inside.
template <typename T>
struct Operand {
    const T* p;
    size_t si, sj;
    int ni, nj;
};

// Loads the k-step's tiles: As[k][m] = A(m0 + m, k0 + k) and Bs[k][n] =
// B(k0 + k, n0 + n), zero outside. Thread tid loads kTile·kDepth/kThreads
// elements of each, walking the contiguous index fastest.
template <typename T, typename Ld>
GG_HD void load_tiles(int tid, float* As, float* Bs, const Operand<T>& A, const Operand<T>& B, int m0, int n0, int k0,
                      Ld ld) {
    for (int x = tid; x < kTile * kDepth; x += kThreads) {
        // A(m, k): m along the tile, k along the depth.
        int m, k;
        if (A.sj == 1) m = x / kDepth, k = x % kDepth;
        else k = x / kTile, m = x % kTile;
        const int gm = m0 + m, gk = k0 + k;
        As[k * kPitch + m] = (gm < A.ni && gk < A.nj) ? ld(A.p + (size_t)gm * A.si + (size_t)gk * A.sj) : 0.f;
        // B(k, n)
        int n;
        if (B.si == 1) n = x / kDepth, k = x % kDepth;
        else k = x / kTile, n = x % kTile;
        const int bk = k0 + k, bn = n0 + n;
        Bs[k * kPitch + n] = (bk < B.ni && bn < B.nj) ? ld(B.p + (size_t)bk * B.si + (size_t)bn * B.sj) : 0.f;
    }
}

// Thread tid's 4 x 4 patch: rows 4·(tid / 16) + i, columns 4·(tid % 16) + j of the tile.
GG_HD void multiply_add(int tid, const float* As, const float* Bs, float (&acc)[4][4]) {
    const int ty = tid / 16, tx = tid % 16;
    for (int k = 0; k < kDepth; k++) {
        float a[4], b[4];
        for (int i = 0; i < 4; i++) a[i] = As[k * kPitch + 4 * ty + i];
        for (int j = 0; j < 4; j++) b[j] = Bs[k * kPitch + 4 * tx + j];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
}

// The patch to C (row pitch ldc; rows < M and columns < N written): with
// accumulate, C = C + acc (one rounding), else C = acc.
template <typename T, typename Ld, typename St>
GG_HD void store_patch(int tid, const float (&acc)[4][4], T* C, size_t ldc, int m0, int n0, int M, int N,
                       bool accumulate, Ld ld, St st) {
    const int ty = tid / 16, tx = tid % 16;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int m = m0 + 4 * ty + i, n = n0 + 4 * tx + j;
            if (m >= M || n >= N) continue;
            T* c = C + (size_t)m * ldc + n;
            st(c, accumulate ? ld(c) + acc[i][j] : acc[i][j]);
        }
}

// What a block of each product computes: A, B, C (with ldc), the tile's
// origin, C's extent and whether it accumulates. By block (bx, by, bz) of
// the grid the launcher made; false for a spare block. The offsets and
// sizes as in Backend::moe_expert_matmul_forward / _backward.
template <typename T>
struct BlockJob {
    Operand<T> A, B;
    T* C;
    size_t ldc;
    int m0, n0, M, N, K;
    bool accumulate;
};
// forward: out = inp · W_e^T (grid: ceil(OC / kTile) x row_tiles_bound).
template <typename T>
GG_HD bool forward_job(BlockJob<T>* j, T* out, const T* inp, const T* w, const int* off, int E, int IC, int OC, int bx,
                       int by) {
    int e, r0, n;
    if (!row_tile(off, E, by, &e, &r0, &n)) return false;
    j->A = {inp + (size_t)r0 * IC, (size_t)IC, 1, n, IC};
    j->B = {w + (size_t)e * OC * IC, 1, (size_t)IC, IC, OC};  // B(i, o) = W_e[o, i]
    j->C = out + (size_t)r0 * OC, j->ldc = (size_t)OC;
    j->m0 = 0, j->n0 = bx * kTile, j->M = n, j->N = OC, j->K = IC, j->accumulate = false;
    return true;
}
// input gradient: dinp = dout · W_e (grid: ceil(IC / kTile) x row_tiles_bound).
template <typename T>
GG_HD bool input_job(BlockJob<T>* j, T* dinp, const T* dout, const T* w, const int* off, int E, int IC, int OC, int bx,
                     int by) {
    int e, r0, n;
    if (!row_tile(off, E, by, &e, &r0, &n)) return false;
    j->A = {dout + (size_t)r0 * OC, (size_t)OC, 1, n, OC};
    j->B = {w + (size_t)e * OC * IC, (size_t)IC, 1, OC, IC};  // B(o, i) = W_e[o, i]
    j->C = dinp + (size_t)r0 * IC, j->ldc = (size_t)IC;
    j->m0 = 0, j->n0 = bx * kTile, j->M = n, j->N = IC, j->K = OC, j->accumulate = false;
    return true;
}
// weight gradient: dW_e += dout_e^T · inp_e (grid: ceil(IC / kTile) x
// ceil(OC / kTile) x E); an empty group writes nothing.
template <typename T>
GG_HD bool weight_job(BlockJob<T>* j, T* dw, const T* dout, const T* inp, const int* off, int IC, int OC, int bx,
                      int by, int e) {
    const int r0 = off[e], n = off[e + 1] - off[e];
    if (n <= 0) return false;
    j->A = {dout + (size_t)r0 * OC, 1, (size_t)OC, OC, n};  // A(o, r) = dout[r0 + r, o]
    j->B = {inp + (size_t)r0 * IC, (size_t)IC, 1, n, IC};   // B(r, i) = inp[r0 + r, i]
    j->C = dw + (size_t)e * OC * IC, j->ldc = (size_t)IC;
    j->m0 = by * kTile, j->n0 = bx * kTile, j->M = OC, j->N = IC, j->K = n, j->accumulate = true;
    return true;
}

}  // namespace grouped_gemm
