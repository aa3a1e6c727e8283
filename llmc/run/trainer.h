// llmc/run/trainer.h: a training run on one rank, everything it holds and
// the steps main() calls (train_gpt.cu). Built in dependency order by
// setup(): flags checked against the world and the model, the backend, the
// process grid, the data, the model and its parallel modes (first counted,
// then built), the weights (a checkpoint, a model file, a Hugging Face
// directory or the seeded initialisation). Then per optimizer step:
// train_step() (the pipeline schedule over the step's micro-batches, then
// the optimizer step), and when due validate(), sample() and checkpoint();
// at the end finish().
//
//   trainer_setup.cpp  setup, the memory check, the settings table
//   trainer_step.cpp   a training step, validation, samples
//   trainer_end.cpp    checkpoints, exports, resume reports, the end of a run
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/base/args.h"
#include "llmc/base/rng.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/checkpoint_async.h"
#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "llmc/model/config.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/model_stack.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/run/metrics.h"
#include "llmc/run/train_config.h"

// Everything a run holds, built in dependency order by setup(). Members are
// destroyed in reverse order, parallel modes before the model before the
// backend.
struct Trainer {
    TrainConfig cfg;
    int rank = 0;
    bool main_rank = true;
    std::unique_ptr<Backend> be;
    ProcessGrid grid;
    GPTConfig mc;
    int resume_step = -1;
    int T_local = 0, accum = 1;
    long long rows_per_step = 0;
    DataLoader train, val;
    bool use_val = false;
    long long val_rows = 0;     // rows of T per validation (-m or --val-tokens)
    bool t_from_model = false;  // no -t: T is the model's context
    Tokenizer tok;
    Layout lay;     // how the run splits over the ranks
    ModelStack s;   // this rank's model and parallel modes
    TrainState st;
    std::string threads;  // CPU threads per rank, for the settings
    Rng rng{1};
    MetricsLog metrics;
    OptimConfig oc;
    std::vector<int> full_in, full_tg, inputs, targets;  // host rows of one micro-batch
    std::vector<int> full_docs, docs;  // their document starts (--document-mask), full rows and this rank's
    const int* docs_or_null() const { return docs.empty() ? nullptr : docs.data(); }
    std::string err;

    void setup(const ArgParser& parser);
    void build(Backend& b, ModelStack* stack);
    void check_memory();
    void print_settings(const ArgParser& parser);
    RunInfo run_info() const;
    void report_resume(const RunInfo& saved);
    Ownership owner() const;
    void export_weights();
    void read_micro_batch(DataLoader& dl, uint64_t first_row, int rows);
    void poison_gradients_for_test(int step);
    StepMetrics train_step(int step);
    std::string progress(int step, unsigned long long tokens, double step_ms);
    double progress_start = -1;  // wall time of this launch's first step
    int progress_first_step = 0;
    double validate();
    void sample();
    void checkpoint();
    // --async-checkpoint: the writer (null without it), and the collective
    // check after each step that completes a checkpoint whose shards are all
    // on disk (wait: until they are; at a signal stop and the end of a run).
    std::unique_ptr<AsyncCheckpointer> async_ckpt;
    void complete_checkpoint(bool wait);
    // The largest stop signal any rank received (0: none; a collective,
    // llmc/run/signals.h), and the clean stop it leads to: a checkpoint of
    // this step (with -o, unless one was just written), one line, and the
    // exit status 128 + the signal.
    int agreed_stop_signal();
    int stop_on_signal(int sig);
    int checkpointed_step = -1;
    std::string data_fingerprint;  // of the training data (checkpoints keep it)
    // The end-of-run summary: what the steps of this launch did (note_step
    // after each), printed by finish() with where the weights went.
    struct RunTotals {
        int steps = 0, best_val_step = -1;
        unsigned long long first_tokens = 0, last_tokens = 0;
        double ms = 0, mfu_ms = 0, best_val = 0, wall_start = 0;
    } totals;
    std::vector<std::string> weights_written;
    void note_step(const StepMetrics& m);
    void print_summary() const;
    void finish();
    bool due(int every, int step) const { return every > 0 && ((step + 1) % every == 0 || step + 1 == cfg.max_steps); }
};
