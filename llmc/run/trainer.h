// llmc/run/trainer.h: a training run on one rank: what it holds, by
// responsibility, and the steps main() calls (train_gpt.cu). Built in
// dependency order by setup(): the layout from the flags (checked against
// the world, then the model), the backend, the process grid, the data, the
// model and its parallel modes (first counted, then built), the weights (a
// checkpoint, a model file, a Hugging Face directory or the seeded
// initialisation). Then per optimizer step: train_step() (the pipeline
// schedule over the step's micro-batches, then the optimizer step), and
// when due validate(), sample() and checkpoint(); at the end finish().
//
// What it holds beside the run's core (flags, layout, grid, model stack,
// training state): its data (llmc/run/train_data.h), its checkpoints
// (llmc/run/run_checkpoints.h) and its reports (llmc/run/progress.h).
//
//   trainer_setup.cpp  setup, the memory check, the settings table
//   trainer_step.cpp   a training step, validation, samples
//   trainer_end.cpp    checkpoints, exports, resume reports, the end of a run
#pragma once
#include <memory>
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/base/args.h"
#include "llmc/base/rng.h"
#include "llmc/io/checkpoint.h"
#include "llmc/model/config.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/model_stack.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/run/run_checkpoints.h"
#include "llmc/run/progress.h"
#include "llmc/run/train_config.h"
#include "llmc/run/train_data.h"

// Members are destroyed in reverse order: parallel modes before the model
// before the backend.
struct Trainer {
    // ---- the run's core ----
    TrainConfig cfg;
    int rank = 0;
    bool main_rank = true;
    std::unique_ptr<Backend> be;
    Layout lay;  // how the run splits over the ranks (made once from the flags)
    ProcessGrid grid;
    GPTConfig mc;
    int resume_step = -1;
    int T_local = 0, accum = 1;
    long long rows_per_step = 0;
    bool t_from_model = false;  // no -t: T is the model's context
    ModelStack s;               // this rank's model and parallel modes
    void* figures = nullptr;    // --sync-free: the step's figures in backend memory (step_figure)
    TrainState st;
    OptimConfig oc;
    Rng rng{1};
    std::string threads;  // CPU threads per rank, for the settings
    std::string err;
    // ---- by responsibility ----
    TrainData data;
    RunCheckpoints ckpt;
    RunProgress progress;

    // Setting up (trainer_setup.cpp).
    void setup(const ArgParser& parser);
    void build(Backend& b, ModelStack* stack);
    void check_memory();
    void print_settings(const ArgParser& parser);
    // The steps (trainer_step.cpp).
    StepMetrics train_step(int step);
    // The step's loss, verdict and gradient norm, read on the host as they
    // come, or (--sync-free) kept on the device and read once at the end.
    double step_loss(int step, bool* bad, double loss_sum);
    double sync_free_figures(int step, bool* bad);
    double validate();
    void sample();
    bool due(int every, int step) const { return every > 0 && ((step + 1) % every == 0 || step + 1 == cfg.max_steps); }
    // Checkpoints, signals and the end (trainer_end.cpp).
    void checkpoint();
    void complete_checkpoint(bool wait);
    // The largest stop signal any rank received (0: none; a collective,
    // llmc/run/signals.h), and the clean stop it leads to: a checkpoint of
    // this step (with -o, unless one was just written), one line, and the
    // exit status 128 + the signal.
    int agreed_stop_signal();
    int stop_on_signal(int sig);
    RunInfo run_info() const;
    void report_resume(const RunInfo& saved);
    Ownership owner() const;
    void export_weights();
    void finish();
};
