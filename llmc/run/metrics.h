// llmc/run/metrics.h: metrics.jsonl, one JSON object per optimizer step.
// On resume the file is rewritten keeping only the steps before the resume
// point, so a resumed run's file reads like an uninterrupted one.
#pragma once
#include <cstdio>
#include <string>

struct StepMetrics {
    int step;                   // 0-based here; metrics.jsonl and the console count from 1
    double loss, lr, grad_norm, ms, tokens_per_s, mfu;
    unsigned long long tokens;  // tokens trained on so far
    double val_loss;            // < 0 when not measured this step
    double aux_loss = -1;       // Mixtral: the load-balancing loss (docs/moe.md); < 0 for other models
    double moe_maxvio = -1;     // Mixtral: the step's expert loads' imbalance (max / mean - 1, mean over layers)
    std::string comm_json;      // {"dp_all_reduce": {"calls": N, "bytes": N}, ...} or empty
    std::string breakdown_json; // LLMC_BREAKDOWN=1: {"qkv": ms, ...} (llmc/backend/backend_profile.h), or empty
    std::string stragglers_json; // a straggler check's step: "work_ms": [...], "stragglers": [...] (stragglers.h)
    bool skipped = false;       // this step's update was skipped (a bad step)
    int skips = 0;              // updates skipped so far
};

class MetricsLog {
  public:
    // keep_before_step < 0: start a new file; else keep existing lines of
    // the steps before it: "step" <= keep_before_step (the file counts
    // steps from 1, as the console does).
    bool open(const std::string& path, int keep_before_step, std::string* err);
    // False (with *err naming the file and the reason) when the line could
    // not be written, a full disk say.
    bool write(const StepMetrics& m, std::string* err);
    ~MetricsLog();

  private:
    FILE* f_ = nullptr;
    std::string path_;
};
