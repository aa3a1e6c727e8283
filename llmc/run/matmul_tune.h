// llmc/run/matmul_tune.h: --matmul-tune 1 in a run (docs/design.md section
// 2.11). The fastest algorithm on one GPU is not always the fastest on
// another, and two ranks that chose differently would compute the same
// product with different rounding; so after the run's first step every
// rank times the product shapes not yet chosen (its backend's trials,
// llmc/backend/matmul_tuning.h) and sends them to rank 0, which picks for
// each shape the candidate with the least time summed over the ranks that
// ran it (agree_matmul_choices); every rank takes rank 0's choices, the log
// lists them and -o's matmul_tuning.txt keeps them. A later run in the same
// -o takes the file's choices at its start (when they were timed on the
// same device and library), so a resumed run computes with the same
// algorithms, and the same numbers, as the run it continues.
#pragma once
#include <string>
#include <vector>

#include "llmc/backend/backend.h"

// What rank 0 decided for one shape: the algorithm, its time, the untuned
// algorithm and its time (each time the mean over the ranks that ran the
// shape), out of how many candidates, and how many ranks timed it.
struct MatmulDecision {
    std::string shape, id, first_id;
    double ms = 0, first_ms = 0;
    int candidates = 0, ranks = 0;
};

// The trials as text (one line per shape: the shape, then id and time
// pairs, tab-separated) and back; parse fails on a malformed line.
std::string format_matmul_trials(const std::vector<MatmulTrial>& trials);
bool parse_matmul_trials(const std::string& text, std::vector<MatmulTrial>* trials, std::string* err);

// The choice for each shape any rank timed, in the order of the shapes'
// first appearance (rank 0's first, then each next rank's new ones): among
// the ids every rank that timed the shape offered, with a finite time on
// each, the least sum of times; a tie goes to the id ranked first by the
// lowest rank. A shape with no such id gets no decision (it keeps the
// untuned algorithm).
std::vector<MatmulDecision> agree_matmul_choices(const std::vector<std::vector<MatmulTrial>>& per_rank);

// The choices file (and the text rank 0 sends): a first line naming the
// scope the timings hold for (the backend's device and library,
// Backend::matmul_scope), then one line per decision: shape, id, ms,
// first_ms, candidates, ranks, tab-separated. parse_matmul_choices
// accepts what format_matmul_choices writes, and returns the scope and the
// decisions; it fails naming the line of anything else.
std::string format_matmul_choices(const std::string& scope, const std::vector<MatmulDecision>& decisions);
bool parse_matmul_choices(const std::string& text, std::string* scope, std::vector<MatmulDecision>* decisions,
                          std::string* err);
MatmulChoices choices_of(const std::vector<MatmulDecision>& decisions);

// The run's log line for one decision: the shape, the candidate picked of
// how many, its time against the untuned algorithm's.
std::string describe_matmul_decision(const MatmulDecision& d);

struct MatmulTuning {
    bool pending = false;  // the timing is still to come (after the first step)
    std::string scope;     // the backend's device and library (Backend::matmul_scope)
    std::string file;      // OUT/matmul_tuning.txt, or "" without -o
    std::vector<MatmulDecision> decisions;  // taken so far: from the file, then timed

    // Called on every rank at setup: whether tuning applies (the flag, and a
    // backend with algorithms to choose), and the file's choices.
    void start(Backend& be, bool flag, const std::string& output_dir, bool main_rank);
    // Called on every rank before each step: the timing runs before the
    // run's second step (a collective, the same step on every rank), where
    // the products' outputs it overwrites are all recomputed or zeroed
    // before they are read again (the gradients by the step's zero_grad).
    void before_step(Backend& be, bool main_rank) {
        if (pending && steps_++ > 0) tune(be, main_rank);
    }
    void tune(Backend& be, bool main_rank);

  private:
    int steps_ = 0;
};

// The name of the choices file in an output directory.
std::string matmul_tuning_file(const std::string& output_dir);
