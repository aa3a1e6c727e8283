// train_gpt.cu: the trainer's entry point, GPT-2, Llama and Mixtral. main() is the
// outline of a run: flags, then the run set up (llmc/run/trainer.h: the
// process grid, the data, the model and its parallel modes, the weights),
// then per optimizer step the pipeline schedule over the micro-batches and
// the optimizer step, and the step's reports (log line, validation, samples,
// checkpoints); at the end the checks, the exports and the trace.
// Built by nvcc's host compiler with the CUDA backend when nvcc is present,
// by g++ otherwise; the code is the same either way: everything
// device-specific is behind the Backend and Comm interfaces.
//
// Launch: ./train_gpt (one process) or mpirun -np N ./train_gpt (parallel
// over N ranks, laid out by --pp, --tp, --cp, --ep and what remains for data
// parallel; the global batch, and so the run, is the same).
//
// Each parallel mode has one home in llmc/parallel/, with its splits and
// every collective it issues: data_parallel.h (dp, ZeRO 1-3),
// tensor_parallel.h (tp, sp), context_parallel.h (cp: ring, all-to-all,
// hybrid), expert_parallel.h (ep), pipeline_parallel.h with
// pipeline_schedule.h (pp, vpp), and optimizer_step.h (the step after
// them); layout.h is the one value that says how a run is split, and
// model_stack.h builds a rank's model with its modes. The model
// (llmc/model/) holds no parallel code: it calls the hooks it declares in
// llmc/model/parallel_hooks.h. README.md has the map of the folders.
#include <cstdio>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "llmc/base/args.h"
#include "llmc/comm/dist.h"
#include "llmc/comm/watchdog.h"
#include "llmc/plan/modes.h"
#include "llmc/run/generate.h"
#include "llmc/run/signals.h"
#include "llmc/run/startup.h"
#include "llmc/run/train_config.h"
#include "llmc/run/trainer.h"

int main(int argc, char** argv) {
    openmp_wait_policy(argv);  // may start the process again, before anything has run
    dist_init(&argc, &argv);
    std::unique_ptr<Trainer> run(new Trainer);  // released before MPI ends
    Trainer& r = *run;
    r.rank = dist_world_rank();
    r.main_rank = r.rank == 0;
    ArgParser parser("train_gpt", "Trains GPT-2 and Llama models on llm.c token shards (CPU or CUDA backend; mpirun for the parallel modes).");
    add_train_options(parser, r.cfg);
    bool help = false;
    std::string err;
    const bool parsed = parser.parse(argc, argv, &help, &err);
    set_collective_timeout(r.cfg.collective_timeout);  // the start-up collectives are watched with it from here
    setup_check(parsed, err);
    check_same_flags(parser, help);
    if (help) {
        if (r.main_rank) std::printf("%s%s", parser.usage().c_str(), train_examples());
        dist_finalize();
        return 0;
    }
    if (!r.cfg.plan.empty()) return plan_main(parser, r.cfg);
    if (!r.cfg.calibrate.empty()) return calibrate_main(r.cfg);
    if (generate_requested(parser)) return generate_main(parser, r.cfg);
    try {
        const TrainConfig& cfg = r.cfg;
        r.setup(parser);
        install_stop_signals();
        // With --sync-free the next step is queued before this one is
        // reported (its figures read one step late), when nothing between
        // the two reads the model (Trainer::overlap_next).
        std::unique_ptr<PendingStep> next;
        int stop_after_next = 0;  // a stop signal that came while a step was queued
        for (int step = r.st.step; step < cfg.max_steps; step++) {
            PendingStep p = next ? *next : r.issue_step(step);
            next.reset();
            const bool overlap = !stop_after_next && r.overlap_next(step);
            if (overlap) next.reset(new PendingStep(r.issue_step(step + 1)));
            StepMetrics m = r.finish_step(p, overlap);
            if (r.data.use_val && r.due(cfg.val_every, step)) m.val_loss = r.validate();
            if (r.main_rank && !r.progress.metrics.write(m, &err)) end_job(err);
            r.progress.note_step(m, cfg.total_batch);
            if (r.due(cfg.sample_every, step)) r.sample();
            if (!cfg.output_dir.empty() && r.due(cfg.checkpoint_every, step)) r.checkpoint();
            else if (r.ckpt.async) r.complete_checkpoint(false);
            std::fflush(stdout);
            // SIGTERM, SIGINT or SIGUSR1 on any rank: a checkpoint, then out
            // (after the step already queued, if any: the signal stays set).
            if (step + 1 < cfg.max_steps) {
                if (const int sig = r.agreed_stop_signal(); sig && next) {
                    stop_after_next = sig;  // that step first (no further one queued)
                } else if (sig) {
                    const int status = r.stop_on_signal(sig);
                    run.reset();
                    dist_finalize();
                    return status;
                }
            }
        }
        r.finish();
        run.reset();
    } catch (const std::bad_alloc&) {
        end_job(r.cfg.memory_budget > 0
                 ? "out of memory within --memory-budget " + std::to_string((long long)r.cfg.memory_budget) + " MiB"
                 : "out of memory");
    } catch (const std::exception& e) {
        end_job(e.what());
    }
    dist_finalize();
    return 0;
}
