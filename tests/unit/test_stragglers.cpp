// tests/unit/test_stragglers.cpp: the straggler check's arithmetic
// (llmc/run/stragglers.h) against hand-worked figures: the median of the
// other ranks, which ranks it names at a factor, and the windows a run's
// steps fall into, with a stand-in world whose other ranks report fixed
// work and a clock and blocked times the test sets. Last line: "N passed,
// N failed".
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/run/stragglers.h"
#include "tests/lib/check.h"

namespace {

bool near(double a, double b) { return std::fabs(a - b) < 1e-9 * std::max(1.0, std::fabs(b)); }

// A world of others.size() + 1 ranks, this one `rank`: the host all-reduce
// adds the other ranks' figures (others[i] in slot i, skipping ours).
class FakeWorld : public Comm {
  public:
    FakeWorld(int rank, std::vector<double> others) : others_(std::move(others)) {
        name_ = "world", rank_ = rank, size_ = (int)others_.size() + 1;
    }
    int reductions = 0;
    double host_all_reduce(double x, ReduceOp) override { return x; }
    void host_all_reduce_n(double* x, size_t n, ReduceOp) override {
        reductions++;
        for (size_t i = 0, j = 0; i < n; i++)
            if ((int)i != rank_) x[i] += others_[j++];
    }

  protected:
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return 0; }
    CommHandle do_reduce_scatter(const void*, void*, size_t, DType) override { return 0; }
    CommHandle do_all_gather(const void*, void*, size_t, DType) override { return 0; }
    void do_broadcast(void*, size_t, DType, int) override {}
    CommHandle do_send_recv(const void*, int, void*, int, size_t, DType) override { return 0; }
    void do_p2p(const std::vector<P2POp>&, DType, std::vector<CommHandle>*) override {}
    void do_wait(CommHandle) override {}

  private:
    std::vector<double> others_;
};

void test_median() {
    CHECK(near(median_without({4, 1, 3}, -1), 3), "median of 3 values");
    CHECK(near(median_without({4, 1, 3, 2}, -1), 2.5), "median of 4 values: the mean of the middle two");
    CHECK(near(median_without({4, 1, 3, 2}, 0), 2), "without rank 0: median of {1, 3, 2}");
    CHECK(near(median_without({10, 40}, 1), 10), "two ranks: the other one");
    CHECK(near(median_without({7}, 0), 0), "nobody else: 0");
}

void test_naming() {
    std::vector<int> s = straggling_ranks({10, 40}, 1.5);
    CHECK(s == std::vector<int>({1}), "two ranks, 4x: the slow one alone (got %zu)", s.size());
    s = straggling_ranks({10, 14}, 1.5);
    CHECK(s.empty(), "two ranks, 1.4x < 1.5: nobody");
    s = straggling_ranks({10, 15.0001, 10, 10}, 1.5);
    CHECK(s == std::vector<int>({1}), "just over the factor is named");
    s = straggling_ranks({10, 15, 10, 10}, 1.5);
    CHECK(s.empty(), "exactly the factor is not (more than F x the median)");
    s = straggling_ranks({10, 30, 11, 9, 35, 10}, 2.0);
    CHECK(s == std::vector<int>({1, 4}), "two stragglers among six, in rank order");
    s = straggling_ranks({0, 0, 0}, 1.5);
    CHECK(s.empty(), "no work measured: nobody");
    s = straggling_ranks({5}, 1.5);
    CHECK(s.empty(), "one rank: nobody");
    s = straggling_ranks({0.6, 1.0, 0.6, 0.6}, 1.5);
    CHECK(s.empty(), "1.7x but 0.4 ms more a step: under the 1 ms floor, nobody");
    s = straggling_ranks({0.6, 1.6, 0.6, 0.6}, 1.5);
    CHECK(s == std::vector<int>({1}), "1 ms more a step: named");
}

void test_text() {
    StragglerCheck c;
    c.first_step = 2, c.last_step = 5, c.factor = 1.5;
    c.work_ms = {2.0, 8.0, 2.5};
    c.slow = {1};
    const std::string l = c.line();
    CHECK(l.find("steps 2-5") != std::string::npos && l.find("rank 1 8.0 ms") != std::string::npos &&
              l.find("3.6x") != std::string::npos && l.find("median 2.2 ms") != std::string::npos &&
              l.find("--straggler-factor 1.5") != std::string::npos,
          "the line names the window, the rank, its work, the ratio, the median and the flag: %s", l.c_str());
    CHECK(c.json() == "\"work_ms\": [2.000, 8.000, 2.500], \"stragglers\": [1]", "the metrics fields: %s",
          c.json().c_str());
    c.slow.clear();
    CHECK(c.line().empty(), "no line when nobody straggles");
}

void test_windows() {
    // This rank (1 of 3) works 30 ms a step and waits 5 of them; the others report 10 ms.
    FakeWorld w(1, {10, 10});
    StragglerWatch sw;
    sw.configure(4, 1.5, 3);
    StragglerCheck c;
    double t = 100, blocked = 7;
    bool closed = sw.after_step(0, t, blocked, w, &c);  // the first step opens the first window
    CHECK(!closed && w.reductions == 0, "step 1 is left out");
    std::vector<int> checks;
    for (int step = 1; step < 12; step++) {
        t += 0.030, blocked += 0.005;
        if (sw.after_step(step, t, blocked, w, &c)) {
            checks.push_back(step + 1);
            const int n = step + 1 == 4 ? 3 : 4;
            CHECK(c.first_step == step + 2 - n && c.last_step == step + 1, "window %d-%d", c.first_step, c.last_step);
            CHECK(near(c.work_ms[1], 25.0) && near(c.work_ms[0], 10.0), "work = wall less blocked: %g ms",
                  c.work_ms[1]);
            CHECK(c.slow == std::vector<int>({1}), "this rank named (2.5x)");
        }
    }
    CHECK(checks == std::vector<int>({4, 8, 12}), "checks at steps 4, 8 and 12 (%zu checks)", checks.size());
    CHECK(w.reductions == 3, "one host all-reduce per check (%d)", w.reductions);

    StragglerWatch off;
    off.configure(4, 1.5, 1);
    CHECK(!off.on(), "off in a world of one");
    off.configure(0, 1.5, 8);
    CHECK(!off.on(), "off with --straggler-every 0");

    // A resumed run starts its first window after its own first step.
    StragglerWatch r;
    r.configure(5, 1.5, 3);
    FakeWorld w2(0, {10, 10});
    CHECK(!r.after_step(9, 0.0, 0, w2, &c), "a resumed run's first step (10) is left out, though it closes a window");
    CHECK(r.after_step(14, 0.05, 0, w2, &c) && c.first_step == 11 && near(c.work_ms[0], 50.0 / 5),
          "then steps 11-15: %d-%d, %g ms", c.first_step, c.last_step, c.work_ms[0]);
}

}  // namespace

int main() {
    test_median();
    test_naming();
    test_text();
    test_windows();
    return check_summary();
}
