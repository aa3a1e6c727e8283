// llmc/run/progress.h: what a run tells as it goes and at its end, apart
// from the step line itself: metrics.jsonl, the progress on the step line
// (tokens seen, time since this launch's first step, the time left, memory
// in use), the totals of this launch, and the summary with where the
// weights went.
#pragma once
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/run/metrics.h"

struct RunProgress {
    MetricsLog metrics;
    std::vector<std::string> weights_written;  // every file or directory of final weights

    // Progress after step `step` of max_steps (`tokens` seen, the step took
    // step_ms), with the backend's memory in use.
    std::string line(int step, int max_steps, unsigned long long tokens, double step_ms, Backend& be);
    // After each step (total_batch: its tokens).
    void note_step(const StepMetrics& m, long long total_batch);
    // The end-of-run summary: steps and tokens of this launch, wall time and
    // the time in training steps, mean tokens/s (and MFU on a GPU), the best
    // validation loss, and where the weights are (rank 0 prints).
    void print_summary(bool main_rank) const;

  private:
    double progress_start_ = -1;  // wall time of this launch's first step
    int progress_first_step_ = 0;
    struct Totals {
        int steps = 0, best_val_step = -1;
        unsigned long long first_tokens = 0, last_tokens = 0;
        double ms = 0, mfu_ms = 0, best_val = 0, wall_start = 0;
    } totals_;
};
