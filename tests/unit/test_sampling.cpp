// tests/unit/test_sampling.cpp: --generate's sampler (pick_token,
// llmc/run/generate.h) against its definition: greedy takes the first
// largest logit and draws nothing; top-k keeps the k largest (ties at the
// threshold too, as transformers does); top-p keeps the fewest most likely
// ids whose probability reaches p (transformers' rule, checked on both sides
// of a boundary); the frequencies of many draws follow the softmax of the
// kept ids; a temperature divides the logits; the same seed draws the same.
// Last line: "N passed, N failed".
#include <cmath>
#include <vector>

#include "llmc/run/generate.h"
#include "tests/lib/check.h"

// Counts of each id over n draws.
static std::vector<int> counts(const std::vector<double>& logits, const SamplingParams& sp, int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> c(logits.size(), 0);
    for (int i = 0; i < n; i++) c[pick_token(logits, sp, rng)]++;
    return c;
}

int main() {
    {  // greedy: the first of equal maxima, and no random number used
        Rng rng(5);
        const uint64_t before = rng.state;
        SamplingParams g;
        g.temperature = 0;
        CHECK(pick_token({1, 3, 3, 2}, g, rng) == 1, "greedy picks the first largest logit");
        CHECK(pick_token({-5, -7, -1e9}, g, rng) == 0, "greedy with negative logits");
        CHECK(rng.state == before, "greedy draws no random number");
    }
    const int n = 20000;
    {  // plain sampling follows the softmax
        const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
        std::vector<double> logits;
        for (double x : p) logits.push_back(std::log(x) + 3.0);  // a shift changes nothing
        const std::vector<int> c = counts(logits, SamplingParams(), n, 1);
        for (size_t i = 0; i < p.size(); i++)
            CHECK(std::fabs(c[i] / (double)n - p[i]) < 0.02, "id %zu drawn %.3f of the time, softmax %.2f", i,
                  c[i] / (double)n, p[i]);
    }
    {  // temperature: logits / T; T = 0.5 is the logits doubled at T = 1
        SamplingParams half;
        half.temperature = 0.5;
        const std::vector<double> logits = {0.3, -1.2, 2.0, 0.7, 0.0};
        std::vector<double> doubled;
        for (double x : logits) doubled.push_back(2 * x);
        CHECK(counts(logits, half, 500, 9) == counts(doubled, SamplingParams(), 500, 9),
              "temperature 0.5 draws as the doubled logits at 1");
        CHECK(counts(logits, SamplingParams(), 500, 9) == counts(logits, SamplingParams(), 500, 9),
              "the same seed draws the same ids");
    }
    {  // top-k
        SamplingParams k1;
        k1.top_k = 1;
        const std::vector<int> c1 = counts({0.5, 2.0, 1.9, -1.0}, k1, 500, 2);
        CHECK(c1[1] == 500, "top-k 1 is greedy (%d of 500)", c1[1]);
        SamplingParams k2;
        k2.top_k = 2;
        const std::vector<int> c2 = counts({5, 4, 4, 1, 4.5}, k2, n, 3);
        CHECK(c2[3] == 0 && c2[1] == 0 && c2[2] == 0 && c2[0] > 0 && c2[4] > 0, "top-k 2 keeps the two largest");
        const std::vector<int> c3 = counts({5, 4, 4, 1}, k2, n, 3);
        CHECK(c3[0] > 0 && c3[1] > 0 && c3[2] > 0 && c3[3] == 0, "top-k keeps every id tied at its threshold");
        SamplingParams kbig;
        kbig.top_k = 100;
        CHECK(counts({0, 0, 0}, kbig, n, 4)[2] > 0, "top-k above the vocabulary keeps all");
    }
    {  // top-p on probabilities 0.5, 0.3, 0.15, 0.05 (in a shuffled order)
        const std::vector<double> p = {0.15, 0.5, 0.05, 0.3};
        std::vector<double> logits;
        for (double x : p) logits.push_back(std::log(x));
        auto kept = [&](double top_p) {
            SamplingParams s;
            s.top_p = top_p;
            const std::vector<int> c = counts(logits, s, n, 6);
            std::vector<int> k;
            for (size_t i = 0; i < c.size(); i++)
                if (c[i] > 0) k.push_back((int)i);
            return k;
        };
        CHECK(kept(0.3) == std::vector<int>({1}), "top-p 0.3: the most likely id alone");
        CHECK(kept(0.49) == std::vector<int>({1}), "top-p 0.49: still one id (0.5 reaches it)");
        CHECK(kept(0.51) == std::vector<int>({1, 3}), "top-p 0.51: two ids");
        CHECK(kept(0.79) == std::vector<int>({1, 3}), "top-p 0.79: two ids (0.8 reaches it)");
        CHECK(kept(0.81) == std::vector<int>({0, 1, 3}), "top-p 0.81: three ids");
        CHECK(kept(1.0) == std::vector<int>({0, 1, 2, 3}), "top-p 1: every id");
        SamplingParams s;
        s.top_p = 0.81;
        const std::vector<int> c = counts(logits, s, n, 7);
        CHECK(std::fabs(c[1] / (double)n - 0.5 / 0.95) < 0.02, "top-p renormalises over the kept ids (%.3f)",
              c[1] / (double)n);
        SamplingParams both;  // top-k first, then top-p over what is left
        both.top_k = 2;
        both.top_p = 0.6;  // alone it keeps 0.5 and 0.3; after top-k 2, 0.5/0.8 reaches it alone
        const std::vector<int> cb = counts(logits, both, n, 8);
        CHECK(cb[1] == n, "top-k 2 then top-p 0.6 over the renormalised two: one id (%d of %d)", cb[1], n);
    }
    return check_summary();
}
