// tests/unit/test_vocab_ce.cpp: the vocab-parallel cross-entropy (backend ops
// crossentropy_stats / _sumexp / _finish, docs/design.md section 3) against
// the full softmax of the fused classifier, on the CPU backend in fp64.
// Vocabularies are split over t = 1..4 "ranks" as the tensor table splits
// wte (Vp rounded up to a multiple of t, rows past V are padding), and the
// three all-reduces (max, target logit, sum of exponentials) are done here on
// the host. Targets include 0, V-1 and the ids on both sides of every slice
// boundary. Checks the loss and the gradient, including the zero gradient of
// padding columns. Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/base/rng.h"

static int g_pass = 0, g_fail = 0;
static void check(bool ok, const char* what, double err) {
    (ok ? g_pass : g_fail)++;
    if (!ok) std::printf("FAIL %s (err %.3e)\n", what, err);
}

int main() {
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F64));
    Rng rng(3);
    struct Case { int V, Vp; } cases[] = {{97, 97}, {97, 128}, {257, 384}, {10, 13}};
    for (const Case& c : cases) {
        for (int t = 1; t <= 4; t++) {
            const int Vl = (c.Vp + t - 1) / t, N = 0 + 4 * t + 8;
            // Targets: the vocabulary's ends and both sides of each slice boundary.
            std::vector<int> targets;
            for (int r = 0; r < t; r++)
                for (int id : {r * Vl - 1, r * Vl, r * Vl + Vl - 1, r * Vl + Vl})
                    if (id >= 0 && id < c.V) targets.push_back(id);
            targets.push_back(0);
            targets.push_back(c.V - 1);
            while ((int)targets.size() < N) targets.push_back((int)(rng.uniform() * c.V));
            targets.resize(N);
            // Full logits [N, Vp]; padding columns get large values that must not leak in.
            std::vector<double> full((size_t)N * c.Vp);
            for (int n = 0; n < N; n++)
                for (int j = 0; j < c.Vp; j++) full[(size_t)n * c.Vp + j] = j < c.V ? 3 * rng.normal() : 50.0;
            std::vector<double> ref_logits = full, ref_loss(N);
            const double dloss = 1.0 / N;
            be->softmax_crossentropy(ref_logits.data(), ref_loss.data(), targets.data(), dloss, N, c.V, c.Vp, true);

            // Slices, and the three steps with host all-reduces between them.
            std::vector<std::vector<double>> sl(t, std::vector<double>((size_t)N * Vl, 0.0));
            for (int r = 0; r < t; r++)
                for (int n = 0; n < N; n++)
                    for (int j = 0; j < Vl; j++) {
                        int g = r * Vl + j;
                        sl[r][(size_t)n * Vl + j] = g < c.Vp ? full[(size_t)n * c.Vp + g] : 77.0;  // rows past Vp: padding too
                    }
            std::vector<std::vector<double>> mx(t, std::vector<double>(N)), tg(t, std::vector<double>(N)),
                se(t, std::vector<double>(N)), loss(t, std::vector<double>(N));
            for (int r = 0; r < t; r++)
                be->crossentropy_stats(sl[r].data(), targets.data(), mx[r].data(), tg[r].data(), N, Vl, r * Vl, c.V);
            std::vector<double> gmax(N, -INFINITY), gtgt(N, 0.0), gsum(N, 0.0);
            for (int r = 0; r < t; r++)
                for (int n = 0; n < N; n++) gmax[n] = std::max(gmax[n], mx[r][n]), gtgt[n] += tg[r][n];
            for (int r = 0; r < t; r++) be->crossentropy_sumexp(sl[r].data(), gmax.data(), se[r].data(), N, Vl, r * Vl, c.V);
            for (int r = 0; r < t; r++)
                for (int n = 0; n < N; n++) gsum[n] += se[r][n];
            for (int r = 0; r < t; r++)
                be->crossentropy_finish(sl[r].data(), loss[r].data(), targets.data(), gmax.data(), gsum.data(),
                                        gtgt.data(), dloss, N, Vl, r * Vl, c.V, true);
            double lerr = 0, gerr = 0, pad = 0;
            for (int r = 0; r < t; r++)
                for (int n = 0; n < N; n++) {
                    lerr = std::max(lerr, std::fabs(loss[r][n] - ref_loss[n]) / ref_loss[n]);
                    for (int j = 0; j < Vl; j++) {
                        int g = r * Vl + j;
                        double got = sl[r][(size_t)n * Vl + j];
                        if (g < c.V) gerr = std::max(gerr, std::fabs(got - ref_logits[(size_t)n * c.Vp + g]));
                        else pad = std::max(pad, std::fabs(got));
                    }
                }
            char what[128];
            std::snprintf(what, sizeof what, "V=%d Vp=%d t=%d loss", c.V, c.Vp, t);
            check(lerr <= 1e-13, what, lerr);
            std::snprintf(what, sizeof what, "V=%d Vp=%d t=%d dlogits", c.V, c.Vp, t);
            check(gerr <= 1e-15, what, gerr);
            std::snprintf(what, sizeof what, "V=%d Vp=%d t=%d padding gradient", c.V, c.Vp, t);
            check(pad == 0.0, what, pad);
        }
    }
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
