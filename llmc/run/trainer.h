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
#include <chrono>
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
#include "llmc/run/cpu_threads.h"
#include "llmc/run/matmul_tune.h"
#include "llmc/run/progress.h"
#include "llmc/run/stragglers.h"
#include "llmc/run/run_checkpoints.h"
#include "llmc/run/step_graph.h"
#include "llmc/run/train_config.h"
#include "llmc/run/train_data.h"

// A step issued and not yet reported (Trainer::issue_step, finish_step):
// what its report needs. Under --sync-free its figures arrive late (the
// backend's download_late) while the next step is issued.
struct PendingStep {
    int step = -1;
    std::chrono::steady_clock::time_point t0;
    double loss = 0, norm = 0, aux = -1, maxvio = -1;
    bool skipped = false;
    bool late = false;  // figures[] arrive by the backend's wait_late()
    double figures[step_figure::count] = {};
    std::string comm_text, comm_json;
};

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
    bool figures_fresh = true;  // the running mean's state goes to the device at the next step
    StepGraph step_graph;       // the whole step as one recorded region (step_graph.h)
    std::string step_graph_off; // why not ("" when on)
    std::chrono::steady_clock::time_point last_report{};  // when the previous step was reported
    TrainState st;
    OptimConfig oc;
    Rng rng{1};
    std::string threads;  // CPU threads per rank, for the settings
    std::string err;
    // ---- by responsibility ----
    TrainData data;
    RunCheckpoints ckpt;
    RunProgress progress;
    MatmulTuning tuning;  // --matmul-tune
    StragglerWatch stragglers;  // --straggler-every
    CpuThreads cpu_threads;     // the CPU backend's threads, following other processes' load

    // Setting up (trainer_setup.cpp).
    void setup(const ArgParser& parser);
    void build(Backend& b, ModelStack* stack);
    void check_memory();
    void warn_document_tokens(const std::string& source);
    void print_settings(const ArgParser& parser);
    // The steps (trainer_step.cpp).
    // One step: issue_step() queues its work (and, --sync-free, its figures'
    // late download); finish_step() waits for its figures and reports it.
    // train_step() is the two at once; main() issues the next step before
    // finishing this one when overlap_next(step) says so.
    StepMetrics train_step(int step) {
        PendingStep p = issue_step(step);
        return finish_step(p, false);
    }
    PendingStep issue_step(int step);
    StepMetrics finish_step(PendingStep& p, bool overlapped);
    bool overlap_next(int step) const;
    // The step's global loss and the loss's verdict: read on the host
    // (step_loss), or kept on the device (reduce_loss_figure, --sync-free).
    double step_loss(double loss_sum, bool* bad);
    void reduce_loss_figure();
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
