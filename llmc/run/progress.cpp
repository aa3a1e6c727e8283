// llmc/run/progress.cpp: progress, totals and the summary of a run
// (llmc/run/progress.h).
#include "llmc/run/progress.h"

#include <chrono>
#include <cstdio>

#include "llmc/run/report.h"

static double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Progress after step `step`: tokens seen, wall time since this launch's
// first step, the time left at the launch's pace so far (validation and
// samples included), and this rank's device memory in use.
std::string RunProgress::line(int step, int max_steps, unsigned long long tokens, double step_ms, Backend& be) {
    const double now = now_seconds();
    if (progress_start_ < 0) {
        progress_start_ = now - step_ms / 1e3;
        progress_first_step_ = step;
    }
    const double elapsed = now - progress_start_;
    const int done = step + 1 - progress_first_step_, left = max_steps - step - 1;
    char tk[32], b[160];
    const double x = (double)tokens;
    if (x < 1e3) std::snprintf(tk, sizeof tk, "%.0f", x);
    else if (x < 1e6) std::snprintf(tk, sizeof tk, "%.1fk", x / 1e3);
    else if (x < 1e9) std::snprintf(tk, sizeof tk, "%.2fM", x / 1e6);
    else std::snprintf(tk, sizeof tk, "%.2fG", x / 1e9);
    std::snprintf(b, sizeof b, "%s tok | %s, ETA %s | mem %.1f MiB", tk, hms(elapsed).c_str(),
                  hms(done > 0 ? elapsed / done * left : 0).c_str(), be.bytes_in_use() / 1048576.0);
    return b;
}

void RunProgress::note_step(const StepMetrics& m, long long total_batch) {
    if (totals_.steps == 0) {
        totals_.first_tokens = m.tokens - (unsigned long long)total_batch;
        totals_.wall_start = now_seconds() - m.ms / 1e3;
    }
    totals_.steps++;
    totals_.last_tokens = m.tokens;
    totals_.ms += m.ms;
    totals_.mfu_ms += m.mfu * m.ms;
    if (m.val_loss >= 0 && (totals_.best_val_step < 0 || m.val_loss < totals_.best_val)) {
        totals_.best_val = m.val_loss;
        totals_.best_val_step = m.step + 1;  // the console's numbering
    }
}

// One paragraph at the end: steps and tokens of this launch, wall time and
// the time in training steps, mean tokens/s (and MFU on a GPU), the best
// validation loss, and where the weights are.
void RunProgress::print_summary(bool main_rank) const {
    if (!main_rank || totals_.steps == 0) return;
    const unsigned long long tokens = totals_.last_tokens - totals_.first_tokens;
    const double train_s = totals_.ms / 1e3;
    std::printf("run summary: %d steps, %llu tokens in %s (%s in training steps: %.0f tokens/s", totals_.steps, tokens,
                hms(now_seconds() - totals_.wall_start).c_str(), hms(train_s).c_str(),
                train_s > 0 ? tokens / train_s : 0.0);
    if (totals_.mfu_ms > 0) std::printf(", MFU %.1f%%", 100 * totals_.mfu_ms / totals_.ms);
    std::printf(")");
    if (totals_.best_val_step >= 0) std::printf("; best val loss %.4f at step %d", totals_.best_val, totals_.best_val_step);
    std::printf("\n");
    if (weights_written.empty())
        std::printf("weights: not written (no -o, --export-model or --export-hf)\n");
    for (const std::string& p : weights_written) std::printf("weights: %s\n", p.c_str());
}
