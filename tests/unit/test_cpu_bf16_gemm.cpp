// tests/unit/test_cpu_bf16_gemm.cpp: the CPU bf16 backend's matrix product
// (llmc/backend/cpu_gemm_bf16.h) against an fp64 product of the same bf16
// inputs, on both paths: AVX-512 BF16 dot products (where this CPU has
// them; elsewhere skipped with a printed line) and the operands widened to
// fp32 for sgemm (everywhere):
//   - all four (ta, tb); odd M, N and K, K = 0, 1 and 2, sizes one past the
//     kernel's tiles (13 = 12 + 1 rows, 33 = 32 + 1 columns, 97 = 96 + 1
//     rows, 129 = 128 + 1 columns, 257 = 2 * 128 pairs + 1); alpha and beta
//     not 1 and 0; leading dimensions wider than the matrices, the gaps
//     holding NaN that must not reach C, and C's gaps left untouched;
//     beta = 0 with C full of NaN (C is not read);
//   - gemm_bf16 takes the dot path exactly when cpu_bf16_dot_available(),
//     and LLMC_CPU_BF16_DOT=0 turns it off;
//   - the dot path: the same bits with 1 and 2 OpenMP threads (one owner per
//     C tile; the widened path is OpenBLAS's sgemm, not held to it);
//   - the dot path's documented difference: a product below fp32's normal
//     range is flushed to zero (the widened path keeps it).
// Last line: "N passed, N failed".
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/backend/cpu_gemm_bf16.h"
#include "llmc/base/dtype.h"
#include "tests/lib/check.h"

using GemmFn = void (*)(bool, bool, int, int, int, float, const uint16_t*, int, const uint16_t*, int, float, float*,
                        int);

namespace {

const uint16_t kNanBf16 = 0x7fc0;

struct Case {
    bool ta, tb;
    int M, N, K;
    float alpha, beta;
    int pad;  // extra columns in every leading dimension (A, B and C)
};

// A stored rows x cols matrix of bf16 with leading dimension cols + pad; the
// pad columns hold NaN.
std::vector<uint16_t> random_bf16(int rows, int cols, int pad, std::mt19937& g) {
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<uint16_t> v((size_t)rows * (cols + pad), kNanBf16);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) v[(size_t)r * (cols + pad) + c] = f32_to_bf16(d(g));
    return v;
}

struct Problem {
    Case c;
    int lda, ldb, ldc;
    std::vector<uint16_t> A, B;
    std::vector<float> C0;  // C before the product (its pad: a sentinel)
};

Problem make_problem(const Case& c, unsigned seed) {
    std::mt19937 g(seed);
    Problem p{c, 0, 0, c.N + c.pad, {}, {}, {}};
    const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K, br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
    p.lda = ac + c.pad;
    p.ldb = bc + c.pad;
    p.A = random_bf16(ar, ac, c.pad, g);
    p.B = random_bf16(br, bc, c.pad, g);
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    p.C0.assign((size_t)c.M * p.ldc, 777.f);
    for (int i = 0; i < c.M; i++)
        for (int j = 0; j < c.N; j++)
            p.C0[(size_t)i * p.ldc + j] = c.beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : d(g);
    return p;
}

std::vector<float> run(GemmFn fn, const Problem& p) {
    std::vector<float> C = p.C0;
    const Case& c = p.c;
    fn(c.ta, c.tb, c.M, c.N, c.K, c.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, c.beta, C.data(), p.ldc);
    return C;
}

// C against the fp64 truth of the same bf16 inputs, element by element.
// Tolerance: each product of two bf16 is exact in fp32 (8-bit by 8-bit
// significands), so the only errors are the fp32 roundings of the sum (at
// most K - 1 additions, in any order: vdpbf16ps adds each product with its
// own rounding, sgemm with an FMA), of alpha*sum, of beta*C and of their
// sum. Each costs at most u = 2^-24 of the magnitude it adds up, so
// |C - truth| <= (K + 2) u (|alpha| sum_k |a_ik b_kj| + |beta c_ij|) to
// first order; (K + 3) u leaves room for the second-order terms. Also
// checks that C's pad columns kept their sentinel. Returns the normwise
// relative error, printed beside the case.
double check_against_truth(const char* path, const Problem& p, const std::vector<float>& C) {
    const Case& c = p.c;
    auto a = [&](int i, int k) { return (double)bf16_to_f32(p.A[c.ta ? (size_t)k * p.lda + i : (size_t)i * p.lda + k]); };
    auto b = [&](int k, int j) { return (double)bf16_to_f32(p.B[c.tb ? (size_t)j * p.ldb + k : (size_t)k * p.ldb + j]); };
    const double u = std::ldexp(1.0, -24);
    int bad = 0, pad_bad = 0;
    double worst = 0, num = 0, den = 0;
    for (int i = 0; i < c.M; i++)
        for (int j = 0; j < p.ldc; j++) {
            const size_t at = (size_t)i * p.ldc + j;
            if (j >= c.N) {
                pad_bad += C[at] != 777.f;
                continue;
            }
            double s = 0, mag = 0;
            for (int k = 0; k < c.K; k++) {
                s += a(i, k) * b(k, j);
                mag += std::fabs(a(i, k) * b(k, j));
            }
            const double c0 = c.beta == 0.f ? 0.0 : p.C0[at];
            const double truth = c.alpha * s + c.beta * c0;
            const double bound = (c.K + 3) * u * (std::fabs(c.alpha) * mag + std::fabs(c.beta * c0));
            const double err = std::fabs(C[at] - truth);
            if (!(err <= bound)) {
                if (bad++ < 3)
                    std::printf("  %s (%d, %d): %.9g, truth %.9g, error %.3g > bound %.3g\n", path, i, j, C[at], truth,
                                err, bound);
            }
            worst = std::fmax(worst, bound > 0 ? err / bound : err);
            num += err * err;
            den += truth * truth;
        }
    const double rel = std::sqrt(num / (den > 0 ? den : 1));
    CHECK(bad == 0, "%s ta=%d tb=%d %dx%dx%d: %d elements beyond (K+3)u of their magnitude", path, c.ta, c.tb, c.M,
          c.N, c.K, bad);
    CHECK(pad_bad == 0, "%s ta=%d tb=%d %dx%dx%d: %d elements of C's pad columns written", path, c.ta, c.tb, c.M, c.N,
          c.K, pad_bad);
    std::printf("%-8s ta=%d tb=%d %3dx%3dx%3d alpha=%5.2f beta=%5.2f: relative error %.2e, worst element at %.2f of "
                "its bound\n",
                path, c.ta, c.tb, c.M, c.N, c.K, c.alpha, c.beta, rel, worst);
    return rel;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

int main() {
    const bool dot = cpu_bf16_dot_supported();
    if (!dot) std::printf("skipped: the AVX-512 BF16 checks (this CPU has no AVX-512 BF16)\n");

    // ---- both paths against the fp64 truth -------------------------------------------------
    const int shapes[][3] = {{37, 53, 67}, {13, 33, 3}, {97, 129, 257}, {1, 1, 1}, {5, 7, 2}, {12, 32, 0}};
    const float ab[][2] = {{0.75f, -0.5f}, {1.f, 0.f}, {-1.25f, 1.f}};
    unsigned seed = 1;
    int n_case = 0;
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++)
        for (int t = 0; t < 4; t++) {
            const float* coef = ab[n_case++ % 3];
            const Case c{(t & 1) != 0, (t & 2) != 0, shapes[s][0], shapes[s][1], shapes[s][2], coef[0], coef[1],
                         s % 2 ? 5 : 3};
            const Problem p = make_problem(c, seed++);
            check_against_truth("widened", p, run(gemm_bf16_widened, p));
            if (dot) check_against_truth("dot", p, run(gemm_bf16_dot, p));
        }

    // ---- which path gemm_bf16 takes -------------------------------------------------------
    {
        const Problem p = make_problem({false, true, 37, 53, 67, 1.f, 0.f, 0}, 99);
        const std::vector<float> widened = run(gemm_bf16_widened, p);
        const char* saved = std::getenv("LLMC_CPU_BF16_DOT");
        const std::string keep = saved ? saved : "";
        unsetenv("LLMC_CPU_BF16_DOT");
        CHECK(cpu_bf16_dot_available() == dot, "without LLMC_CPU_BF16_DOT, the dot path is used where the CPU has it");
        CHECK(same_bits(run(gemm_bf16, p), dot ? run(gemm_bf16_dot, p) : widened),
              "gemm_bf16 gives the bits of the path cpu_bf16_dot_available() names");
        setenv("LLMC_CPU_BF16_DOT", "0", 1);
        CHECK(!cpu_bf16_dot_available(), "LLMC_CPU_BF16_DOT=0 turns the dot path off");
        CHECK(same_bits(run(gemm_bf16, p), widened), "with LLMC_CPU_BF16_DOT=0 gemm_bf16 gives the widened path's bits");
        if (saved) setenv("LLMC_CPU_BF16_DOT", keep.c_str(), 1);
        else unsetenv("LLMC_CPU_BF16_DOT");
        if (!dot) {
            bool threw = false;
            try {
                run(gemm_bf16_dot, p);
            } catch (const std::logic_error&) {
                threw = true;
            }
            CHECK(threw, "gemm_bf16_dot refuses a CPU without AVX-512 BF16");
        }
    }

    // ---- determinism: 1 and 2 threads, several tiles of C ----------------------------------
    // Our kernel's bits may not depend on the thread count. The widened path
    // is OpenBLAS's sgemm, whose bits do with some of its kernels (its
    // Haswell and generic Prescott ones, which it takes on a CPU it does not
    // recognise: measured), so it is not held to this.
    for (int t = 0; t < 4; t++) {
        const Problem p = make_problem({(t & 1) != 0, (t & 2) != 0, 200, 300, 129, 1.f, 1.f, 1}, 200 + t);
        const GemmFn fns[2] = {gemm_bf16_widened, gemm_bf16_dot};
        for (int f = 1; f < (dot ? 2 : 1); f++) {
            omp_set_num_threads(1);
            const std::vector<float> one = run(fns[f], p);
            omp_set_num_threads(2);
            const std::vector<float> two = run(fns[f], p);
            CHECK(same_bits(one, two), "%s ta=%d tb=%d: the same bits with 1 and 2 threads", f ? "dot" : "widened",
                  t & 1, (t & 2) >> 1);
        }
    }

    // ---- the dot path flushes what falls below fp32's normal range ---------------------------
    if (dot) {
        const uint16_t a = f32_to_bf16(std::ldexp(1.f, -70));  // a 1 x 1 product: 2^-70 * 2^-70 = 2^-140
        float cw = -1.f, cd = -1.f;
        gemm_bf16_widened(false, false, 1, 1, 1, 1.f, &a, 1, &a, 1, 0.f, &cw, 1);
        gemm_bf16_dot(false, false, 1, 1, 1, 1.f, &a, 1, &a, 1, 0.f, &cd, 1);
        CHECK(cw == std::ldexp(1.f, -140) && cd == 0.f,
              "a product of 2^-140: kept by the widened path (%g), zero on the dot path (%g)", cw, cd);
    }
    return check_summary();
}
