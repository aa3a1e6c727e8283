// llmc/run/stragglers.h: the straggler check (--straggler-every N,
// --straggler-factor F). In a synchronous job every rank's step takes as
// long as the slowest rank's, so the step time cannot say who is slow. What
// differs is how long each rank waited for the others: the slow rank
// arrives last and waits least. So each rank counts its own work, the wall
// time of a window of N steps (from the end of the step before it to the
// end of its last: everything the rank did, whatever it was) less the time
// its groups held it up (Comm::blocked_seconds: host waits on MPI, the
// compute stream's stalls on NCCL); every N steps the ranks share their figures (one host all-reduce
// over the world) and a rank whose work per step exceeds F times the median
// of the other ranks' is named, in one line on the console and in that
// step's metrics.jsonl line ("work_ms": every rank's, "stragglers": the
// ranks named). The first step (start-up, allocation, tuning) is left out.
//
// Under pipeline parallelism the stages' work differs by design (the last
// holds the LM head): F must be above that imbalance.
#pragma once
#include <string>
#include <vector>

class Comm;

// The ranks whose work exceeds factor x the median of the other ranks'
// (each rank against the rest, so that with two ranks the fast one is the
// measure) by at least kStragglerMinExcessMs: below a millisecond a step
// is small enough for the scheduler's and the clock's noise, and for rank
// 0's own logging, to reach any factor. Pure, for the tests.
constexpr double kStragglerMinExcessMs = 1.0;
std::vector<int> straggling_ranks(const std::vector<double>& work_ms, double factor);
// The median of every value but v[skip] (skip < 0: of all).
double median_without(const std::vector<double>& v, int skip);

struct StragglerCheck {
    int first_step = 0, last_step = 0;  // the window, steps counted from 1
    std::vector<double> work_ms;        // every world rank's work per step
    std::vector<int> slow;              // the ranks named
    double factor = 1.5;                // --straggler-factor
    std::string line() const;           // "stragglers: ..." (empty when none)
    std::string json() const;           // "\"work_ms\": [...], \"stragglers\": [...]"
};

class StragglerWatch {
  public:
    // every: the window in steps (0: off); off too in a world of one.
    void configure(int every, double factor, int world_size) {
        every_ = world_size > 1 ? every : 0, factor_ = factor;
    }
    bool on() const { return every_ > 0; }
    // After step `step` (from 0) on this rank: the time now (seconds, any
    // steady clock) and the blocked seconds of all its groups so far. True when this step closes a window
    // (the same steps on every rank): then the ranks have shared their
    // figures over `world` (a collective every rank makes) and *out holds
    // the check.
    bool after_step(int step, double now_s, double blocked_s, Comm& world, StragglerCheck* out);

  private:
    int every_ = 0;
    double factor_ = 1.5;
    int from_ = -1;            // the window's first step (from 0); -1 before step 0 has passed
    double opened_ = 0;        // when the window opened (now_s)
    double blocked_from_ = 0;  // blocked seconds when the window opened
};
