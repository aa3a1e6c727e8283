// tests/unit/test_matmul_tuning.cpp: the host side of --matmul-tune
// (llmc/run/matmul_tune.h): how the ranks' timings become one choice per
// product shape, and the text the timings and choices travel in.
//
//   1. Hand-made cases: the least summed time wins; a tie goes to the
//      heuristic's earlier candidate; a candidate one rank lacks or could
//      not run (+inf) is out; a shape no candidate survives gets no decision;
//      shapes only some ranks ran are decided over those ranks; the order of
//      the decisions is the shapes' first appearance.
//   2. Random cases against a brute force written apart: every shape's
//      choice is a candidate every rank offered, with no other candidate of
//      a smaller sum, and earlier-ranked among equal sums.
//   3. The texts: trials and choices survive format and parse exactly
//      (times to 9 digits, +inf); malformed text is refused with its line.
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "llmc/run/matmul_tune.h"
#include "tests/lib/check.h"

namespace {

MatmulTrial trial(const std::string& shape, std::vector<std::string> ids, std::vector<double> ms) {
    return MatmulTrial{shape, std::move(ids), std::move(ms)};
}

const MatmulDecision* find(const std::vector<MatmulDecision>& ds, const std::string& shape) {
    for (const MatmulDecision& d : ds)
        if (d.shape == shape) return &d;
    return nullptr;
}

// ---- 1. hand-made cases ------------------------------------------------------------------
void test_cases() {
    // Rank 0 prefers b, rank 1 prefers c; the sums are a 5, b 4.5, c 4.
    std::vector<std::vector<MatmulTrial>> r = {
        {trial("x", {"a", "b", "c"}, {2.0, 1.0, 3.0})},
        {trial("x", {"a", "b", "c"}, {3.0, 3.5, 1.0})},
    };
    std::vector<MatmulDecision> d = agree_matmul_choices(r);
    CHECK(d.size() == 1 && d[0].id == "c", "the least sum over the ranks wins (got %s)", d.empty() ? "-" : d[0].id.c_str());
    CHECK(d.size() == 1 && d[0].ms == 2.0 && d[0].first_ms == 2.5 && d[0].first_id == "a" && d[0].ranks == 2 &&
              d[0].candidates == 3,
          "the mean times, the untuned id, the counts");
    // A tie: the earlier candidate of the lowest rank.
    r = {{trial("x", {"a", "b", "c"}, {2.0, 1.0, 1.0})}, {trial("x", {"c", "b", "a"}, {1.0, 1.0, 2.0})}};
    d = agree_matmul_choices(r);
    CHECK(d.size() == 1 && d[0].id == "b", "a tie goes to rank 0's earlier candidate (got %s)", d.empty() ? "-" : d[0].id.c_str());
    // A candidate missing on one rank, one that failed (+inf) on one rank.
    r = {{trial("x", {"a", "b", "c"}, {5.0, 1.0, 0.5})}, {trial("x", {"a", "c"}, {5.0, INFINITY})}};
    d = agree_matmul_choices(r);
    CHECK(d.size() == 1 && d[0].id == "a", "b (missing on rank 1) and c (failed there) are out (got %s)", d.empty() ? "-" : d[0].id.c_str());
    // No candidate survives: no decision.
    r = {{trial("x", {"a"}, {INFINITY}), trial("y", {"a", "b"}, {1.0, 2.0})}};
    d = agree_matmul_choices(r);
    CHECK(d.size() == 1 && d[0].shape == "y" && d[0].id == "a", "a shape nothing can run gets no decision");
    // Shapes on some ranks only (pipeline stages), in first-appearance order.
    r = {{trial("s0", {"a", "b"}, {2.0, 1.0})},
         {trial("s1", {"a", "b"}, {1.0, 2.0}), trial("s0", {"a", "b"}, {1.0, 1.5})},
         {trial("s1", {"a", "b"}, {1.0, 0.1})}};
    d = agree_matmul_choices(r);
    CHECK(d.size() == 2 && d[0].shape == "s0" && d[1].shape == "s1", "order of first appearance");
    const MatmulDecision* s0 = find(d, "s0");
    const MatmulDecision* s1 = find(d, "s1");
    CHECK(s0 && s0->id == "b" && s0->ranks == 2 && s0->ms == 1.25, "s0 over ranks 0 and 1");
    CHECK(s1 && s1->id == "a" && s1->ranks == 2 && s1->ms == 1.0, "s1 over ranks 1 and 2 (a: 2.0 against b: 2.1)");
    CHECK(agree_matmul_choices({}).empty() && agree_matmul_choices({{}, {}}).empty(), "nothing timed, nothing decided");
}

// ---- 2. random cases against a brute force ------------------------------------------------
void test_random() {
    std::mt19937 rng(11);
    int bad = 0, cases = 0;
    for (int it = 0; it < 400; it++) {
        const int ranks = 1 + (int)(rng() % 4), shapes = 1 + (int)(rng() % 5);
        std::vector<std::vector<MatmulTrial>> per(ranks);
        for (int s = 0; s < shapes; s++)
            for (int r = 0; r < ranks; r++) {
                if (rng() % 3 == 0) continue;  // not every rank runs every shape
                MatmulTrial t;
                t.shape = "shape" + std::to_string(s);
                for (int c = 0; c < 6; c++) {
                    if (rng() % 5 == 0) continue;  // not every candidate everywhere
                    t.ids.push_back("alg" + std::to_string(c));
                    // Few distinct values, so ties happen; now and then a failure.
                    t.ms.push_back(rng() % 11 == 0 ? INFINITY : 0.25 * (double)(1 + rng() % 4));
                }
                per[r].push_back(t);
            }
        const std::vector<MatmulDecision> got = agree_matmul_choices(per);
        // The brute force: per shape, the ranks that ran it, in rank order.
        std::set<std::string> decided;
        for (int s = 0; s < shapes; s++) {
            const std::string shape = "shape" + std::to_string(s);
            std::vector<const MatmulTrial*> ts;
            for (int r = 0; r < ranks; r++)
                for (const MatmulTrial& t : per[r])
                    if (t.shape == shape) ts.push_back(&t);
            if (ts.empty()) continue;
            std::string best;
            double best_sum = INFINITY;
            for (const std::string& id : ts[0]->ids) {  // rank order of the first
                double sum = 0;
                for (const MatmulTrial* t : ts) {
                    bool has = false;
                    for (size_t j = 0; j < t->ids.size(); j++)
                        if (t->ids[j] == id) has = true, sum += t->ms[j];
                    if (!has) sum = INFINITY;
                }
                if (sum < best_sum) best_sum = sum, best = id;
            }
            const MatmulDecision* d = find(got, shape);
            cases++;
            if (best.empty() ? d != nullptr : !(d && d->id == best && d->ranks == (int)ts.size() &&
                                                  std::fabs(d->ms * d->ranks - best_sum) < 1e-12))
                bad++;
            if (d) decided.insert(shape);
        }
        if (decided.size() != got.size()) bad++;
    }
    CHECK(bad == 0, "%d of %d random shapes decided unlike the brute force", bad, cases);
}

// ---- 3. the texts -------------------------------------------------------------------------
void test_texts() {
    const std::vector<MatmulTrial> ts = {trial("bf16 m=768 n=32768 k=3072 op=TN", {"21-00ff", "6-1234"}, {0.123456789, INFINITY}),
                                         trial("fp32 m=1 n=1 k=1 op=NN", {"x"}, {1e-7})};
    std::vector<MatmulTrial> back;
    std::string err;
    CHECK(parse_matmul_trials(format_matmul_trials(ts), &back, &err), "trials parse: %s", err.c_str());
    bool same = back.size() == ts.size();
    for (size_t i = 0; same && i < ts.size(); i++)
        same = back[i].shape == ts[i].shape && back[i].ids == ts[i].ids && back[i].ms == ts[i].ms;
    CHECK(same, "trials survive format and parse");
    CHECK(parse_matmul_trials("", &back, &err) && back.empty(), "no trials: empty text");
    CHECK(!parse_matmul_trials("shape\ta\n", &back, &err) && err.find("line 1") == 0, "an id without a time: %s", err.c_str());
    CHECK(!parse_matmul_trials("s\ta\t1\nt\tb\tx\n", &back, &err) && err.find("line 2") == 0, "a bad time: %s", err.c_str());
    CHECK(!parse_matmul_trials("s\ta\t-1\n", &back, &err), "a negative time");

    std::vector<MatmulDecision> ds = agree_matmul_choices({ts});
    std::string scope, s2;
    std::vector<MatmulDecision> back_d;
    const std::string text = format_matmul_choices("NVIDIA H100 (sm_90), cuBLASLt 130000", ds);
    CHECK(parse_matmul_choices(text, &scope, &back_d, &err), "choices parse: %s", err.c_str());
    same = scope == "NVIDIA H100 (sm_90), cuBLASLt 130000" && back_d.size() == ds.size();
    for (size_t i = 0; same && i < ds.size(); i++)
        same = back_d[i].shape == ds[i].shape && back_d[i].id == ds[i].id && back_d[i].ms == ds[i].ms &&
               back_d[i].first_id == ds[i].first_id && back_d[i].first_ms == ds[i].first_ms &&
               back_d[i].candidates == ds[i].candidates && back_d[i].ranks == ds[i].ranks;
    CHECK(same, "choices survive format and parse");
    MatmulChoices c = choices_of(back_d);
    CHECK(c.size() == 2 && c["bf16 m=768 n=32768 k=3072 op=TN"] == "21-00ff" && c["fp32 m=1 n=1 k=1 op=NN"] == "x",
          "choices_of: shape to id");
    CHECK(!parse_matmul_choices("shape\tid\n", &s2, &back_d, &err) && err.find("line 1") == 0, "no header: %s", err.c_str());
    CHECK(!parse_matmul_choices(text + "s\tid\t1\tid\t1\t0\t1\n", &s2, &back_d, &err) && err.find("line 4") == 0,
          "zero candidates: %s", err.c_str());
    CHECK(!parse_matmul_choices(text + "s\tid\t1\n", &s2, &back_d, &err) && err.find("line 4") == 0, "a short line: %s",
          err.c_str());
    const std::string line = describe_matmul_decision(ds[0]);
    CHECK(line.find("bf16 m=768 n=32768 k=3072 op=TN: untuned 21-00ff, 0.1235 ms") == 0 && line.find("2 candidates") != std::string::npos,
          "the log line: %s", line.c_str());
}

}  // namespace

int main() {
    std::printf("hand-made cases\n");
    test_cases();
    std::printf("random cases against a brute force\n");
    test_random();
    std::printf("the texts\n");
    test_texts();
    return check_summary();
}
