// llmc/backend/cpu_gemm.h: the matrix product of the CPU backend, row-major:
// OpenBLAS's sgemm/dgemm, or (built without a BLAS) a blocked loop of our
// own. Called from inside OpenMP parallel regions too (attention's tiles):
// OpenBLAS built on OpenMP then runs on the calling thread alone, and the
// fallback's own parallel region is an inactive nested one, so one tile's
// product never spreads over threads another tile is using.
#pragma once
#ifndef LLMC_NO_BLAS
#include <cblas.h>
#endif

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace cpu {

#ifndef LLMC_NO_BLAS
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                      int ldb, float beta, float* C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                      int ldb, double beta, double* C, int ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

// OpenBLAS on one thread: the threads are cpu::gemm's (below). Left to
// itself OpenBLAS spreads a product over its threads, and with some of its
// kernels the bits depend on how many. Its pthreads build obeys this; its
// OpenMP build (which also sets OpenMP's thread count here: that is put
// back) stays on one thread inside a parallel region, where cpu::gemm
// makes every call.
inline void blas_one_thread() {
    const int threads = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(threads);
}

// Blocks of C, each one single-threaded BLAS call, that the threads take
// as they come free. Why: a thread that shares its core with another
// process then does fewer blocks instead of holding every other thread at
// the end of the product, and the thread count can change between steps
// without changing a bit (the blocks depend on the shape alone). Rows of C
// are cut when there are enough of them, else its columns; a small product
// is one block. Every call is made inside a parallel region, one block
// included: OpenBLAS built on OpenMP follows OpenMP's thread count outside
// one (openblas_set_num_threads notwithstanding) and runs on the calling
// thread alone inside.
constexpr int kGemmBlock = 64;
constexpr double kGemmSplitWork = 1 << 20;  // M·N·K below this: one block
template <typename F>
void gemm(bool ta, bool tb, int M, int N, int K, F alpha, const F* A, int lda, const F* B, int ldb, F beta, F* C,
          int ldc) {
    if (omp_in_parallel()) {  // (attention's tiles: already one thread's)
        blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const bool split = (double)M * N * K >= kGemmSplitWork;
    const bool by_rows = split && M >= 2 * kGemmBlock, by_cols = split && !by_rows && N >= 2 * kGemmBlock;
    // Unsplit: one block of all N columns.
    const int n = by_rows ? M : N, width = by_rows || by_cols ? kGemmBlock : std::max(1, N);
    const int blocks = (n + width - 1) / width;
#pragma omp parallel for schedule(dynamic, 1)
    for (int b = 0; b < blocks; b++) {
        const int o = b * width, w = std::min(width, n - o);
        if (by_rows)
            blas_gemm(ta, tb, w, N, K, alpha, ta ? A + o : A + (size_t)o * lda, lda, B, ldb, beta, C + (size_t)o * ldc,
                      ldc);
        else
            blas_gemm(ta, tb, M, w, K, alpha, A, lda, tb ? B + (size_t)o * ldb : B + o, ldb, beta, C + o, ldc);
    }
}
#else
inline void blas_one_thread() {}
// Without a BLAS (e.g. on a GPU machine whose image has none, where the CPU
// backend serves tests and references at real sizes): a blocked product.
// Each tile of C is owned by one thread; per block of KC inner elements the
// rows of op(A) and the columns of op(B) it needs are copied into contiguous
// panels, so the inner loop is a dot product over contiguous memory, four at
// a time (2x2 outputs share their loads). Every C element is summed in the
// same order whatever the thread count: deterministic, like the BLAS path.
template <typename F>
void gemm(bool ta, bool tb, int M, int N, int K, F alpha, const F* A, int lda, const F* B, int ldb, F beta, F* C,
          int ldc) {
    constexpr int MC = 64, NC = 64, KC = 256;
    const int mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC;
#pragma omp parallel
    {
        std::vector<F> ap((size_t)MC * KC), bp((size_t)NC * KC), acc((size_t)MC * NC);
#pragma omp for schedule(static) collapse(2)
        for (int ib = 0; ib < mt; ib++)
            for (int jb = 0; jb < nt; jb++) {
                const int i0 = ib * MC, j0 = jb * NC, mi = std::min(MC, M - i0), nj = std::min(NC, N - j0);
                std::fill(acc.begin(), acc.end(), F(0));
                for (int k0 = 0; k0 < K; k0 += KC) {
                    const int kk = std::min(KC, K - k0);
                    // ap[i][k] = op(A)[i0+i][k0+k], bp[j][k] = op(B)[k0+k][j0+j]
                    if (ta) {
                        for (int k = 0; k < kk; k++)
                            for (int i = 0; i < mi; i++) ap[(size_t)i * kk + k] = A[(size_t)(k0 + k) * lda + i0 + i];
                    } else {
                        for (int i = 0; i < mi; i++)
                            for (int k = 0; k < kk; k++) ap[(size_t)i * kk + k] = A[(size_t)(i0 + i) * lda + k0 + k];
                    }
                    if (tb) {
                        for (int j = 0; j < nj; j++)
                            for (int k = 0; k < kk; k++) bp[(size_t)j * kk + k] = B[(size_t)(j0 + j) * ldb + k0 + k];
                    } else {
                        for (int k = 0; k < kk; k++)
                            for (int j = 0; j < nj; j++) bp[(size_t)j * kk + k] = B[(size_t)(k0 + k) * ldb + j0 + j];
                    }
                    for (int i = 0; i < mi; i += 2)
                        for (int j = 0; j < nj; j += 2) {
                            // A last odd row or column repeats its neighbour; its sums are dropped.
                            const F* a0 = &ap[(size_t)i * kk];
                            const F* a1 = i + 1 < mi ? a0 + kk : a0;
                            const F* b0 = &bp[(size_t)j * kk];
                            const F* b1 = j + 1 < nj ? b0 + kk : b0;
                            F s00 = 0, s01 = 0, s10 = 0, s11 = 0;
#pragma omp simd reduction(+ : s00, s01, s10, s11)
                            for (int k = 0; k < kk; k++) {
                                s00 += a0[k] * b0[k];
                                s01 += a0[k] * b1[k];
                                s10 += a1[k] * b0[k];
                                s11 += a1[k] * b1[k];
                            }
                            F* r0 = &acc[(size_t)i * NC + j];
                            r0[0] += s00;
                            if (j + 1 < nj) r0[1] += s01;
                            if (i + 1 < mi) {
                                r0[NC] += s10;
                                if (j + 1 < nj) r0[NC + 1] += s11;
                            }
                        }
                }
                for (int i = 0; i < mi; i++)
                    for (int j = 0; j < nj; j++) {
                        F& c = C[(size_t)(i0 + i) * ldc + j0 + j];
                        c = alpha * acc[(size_t)i * NC + j] + (beta == F(0) ? F(0) : beta * c);
                    }
            }
    }
}
#endif

}  // namespace cpu
