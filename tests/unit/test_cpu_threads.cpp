// tests/unit/test_cpu_threads.cpp: the CPU threads that follow other
// processes' load (llmc/run/cpu_threads.h) and what makes that safe, the
// CPU matrix product giving the same bits at every thread count
// (llmc/backend/cpu_gemm.h). Checks:
//   - threads_for_load against the rule worked out by hand: the CPUs left
//     after other processes (beyond the job's own ranks' shares), rounded,
//     between one and the most;
//   - CpuThreads: off under OMP_NUM_THREADS or with one thread; with the
//     load given by LLMC_TEST_CPU_OTHERS, down to one thread after two busy
//     windows and back up after two quiet ones, OpenMP's count following;
//   - cpu::gemm in fp32 and fp64, every transpose, shapes cut by rows, by
//     columns and not at all (odd widths among them; a Mixtral expert's
//     small products): 1, 2 and 3 threads
//     bit for bit the same, and the product within rounding of an fp64
//     sum of its own (the truth).
// Last line: "N passed, N failed".
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/backend/cpu_gemm.h"
#include "llmc/base/rng.h"
#include "llmc/run/cpu_threads.h"

static int g_pass = 0, g_fail = 0;
static void check(bool ok, const std::string& what) {
    (ok ? g_pass : g_fail)++;
    if (!ok) std::printf("FAIL %s\n", what.c_str());
}

static void rule() {
    struct Case { int max, cpus; double others; int ranks, want; } cases[] = {
        {2, 2, 0.0, 1, 2},   // quiet
        {2, 2, 0.4, 1, 2},   // 1.6 left: two
        {2, 2, 0.6, 1, 1},   // 1.4 left: one
        {2, 2, 1.0, 1, 1},   // one busy loop
        {2, 2, 2.0, 1, 1},   // two: still one, never zero
        {8, 8, 3.0, 1, 5},   // 5 left
        {4, 8, 0.0, 1, 4},   // never above the most
        {4, 8, 4.0, 2, 4},   // the other rank's share (4) is not outside load
        {4, 8, 6.0, 2, 3},   // 2 outside, shared by 2 ranks: 4 - 1
        {2, 4, 4.0, 2, 1},   // 2 outside over 2 ranks: 2 - 1
        {1, 2, 0.0, 1, 1},
    };
    for (const Case& c : cases) {
        const int got = threads_for_load(c.max, c.cpus, c.others, c.ranks);
        char what[160];
        std::snprintf(what, sizeof what, "threads_for_load(max %d, cpus %d, others %.1f, ranks %d) = %d, want %d",
                      c.max, c.cpus, c.others, c.ranks, got, c.want);
        check(got == c.want, what);
    }
}

static void governor() {
    setenv("OMP_NUM_THREADS", "2", 1);
    CpuThreads fixed;
    fixed.start(2, 1);
    check(!fixed.active() && fixed.text().find("OMP_NUM_THREADS") != std::string::npos,
          "OMP_NUM_THREADS set: off, and the settings say why (" + fixed.text() + ")");
    unsetenv("OMP_NUM_THREADS");
    CpuThreads one;
    one.start(1, 1);
    check(!one.active(), "one thread: off");

    // Two windows of 1.5 CPUs taken, then two quiet ones. The rank's CPUs
    // are its affinity's; with one CPU the rule keeps one thread anyway.
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    setenv("LLMC_TEST_CPU_OTHERS", "1.5,1.5,0,0", 1);
    omp_set_num_threads(2);
    CpuThreads t;
    t.start(2, 1);
    check(t.active(), "two threads, OMP_NUM_THREADS unset: on");
    std::vector<std::string> lines;
    for (int w = 0; w < 4 && t.active(); w++) {
        usleep((useconds_t)(CpuThreads::kWindowSeconds * 1.1e6));
        lines.push_back(t.after_step());
        std::printf("  window %d: threads %d, OpenMP %d%s%s\n", w, t.threads(), omp_get_max_threads(),
                    lines.back().empty() ? "" : ": ", lines.back().c_str());
        if (w == 1 && cpus >= 2) check(t.threads() == 1 && omp_get_max_threads() == 1, "two busy windows: one thread");
    }
    if (cpus >= 2) {
        check(lines.size() == 4 && lines[0].empty() && !lines[1].empty() && lines[2].empty() && !lines[3].empty(),
              "a line when the count changes, none when one window asks");
        check(t.threads() == 2 && omp_get_max_threads() == 2 && t.changes() == 2, "two quiet windows: back to two");
    }
    unsetenv("LLMC_TEST_CPU_OTHERS");
}

template <typename F>
static void gemm_bits(const char* type, double tol) {
    struct Shape { int M, N, K; } shapes[] = {{1024, 257, 128}, {1024, 384, 128}, {300, 129, 64},
                                              {64, 1000, 96},   {100, 257, 512},  {31, 17, 9},
                                              {32, 192, 64},    {17, 64, 96}};  // (one block, above OpenBLAS's own threading size)
    Rng rng(7);
    for (const Shape& s : shapes)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                std::vector<F> A((size_t)s.M * s.K), B((size_t)s.K * s.N);
                for (F& x : A) x = (F)(rng.uniform() - 0.5);
                for (F& x : B) x = (F)(rng.uniform() - 0.5);
                const int lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
                std::vector<F> C[3];
                for (int t = 0; t < 3; t++) {
                    C[t].assign((size_t)s.M * s.N, F(0));
                    omp_set_num_threads(t + 1);
                    cpu::gemm(ta, tb, s.M, s.N, s.K, F(1), A.data(), lda, B.data(), ldb, F(0), C[t].data(), s.N);
                }
                double err = 0;
                for (int i = 0; i < s.M; i++)
                    for (int j = 0; j < s.N; j++) {
                        double sum = 0;
                        for (int k = 0; k < s.K; k++)
                            sum += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                   (double)(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                        err = std::max(err, std::fabs(sum - (double)C[0][(size_t)i * s.N + j]));
                    }
                char what[160];
                std::snprintf(what, sizeof what, "%s gemm %s%s M=%d N=%d K=%d", type, ta ? "T" : "N", tb ? "T" : "N",
                              s.M, s.N, s.K);
                const size_t bytes = C[0].size() * sizeof(F);
                check(std::memcmp(C[0].data(), C[1].data(), bytes) == 0 &&
                          std::memcmp(C[0].data(), C[2].data(), bytes) == 0,
                      std::string(what) + ": 1, 2 and 3 threads bit for bit");
                check(err <= tol * s.K, std::string(what) + ": against an fp64 sum, err " + std::to_string(err));
            }
    omp_set_num_threads(2);
}

int main() {
    cpu::blas_one_thread();
    rule();
    governor();
    gemm_bits<float>("fp32", 1e-6);
    gemm_bits<double>("fp64", 1e-15);
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
