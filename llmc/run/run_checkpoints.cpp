// llmc/run/run_checkpoints.cpp: a run's checkpoints, written in the step or
// in the background (llmc/run/run_checkpoints.h).
#include "llmc/run/run_checkpoints.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "llmc/comm/dist.h"
#include "llmc/run/startup.h"

// An error of the asynchronous writer, which every rank already agrees on
// (all_ranks_ok): each rank prints the one line and leaves cleanly, rather
// than an abort that could kill a rank before it prints.
[[noreturn]] static void agreed_error(const std::string& msg) {
    if (dist_world_size() > 1)
        std::fprintf(stderr, "train_gpt: error (rank %d): %s\n", dist_world_rank(), msg.c_str());
    else
        std::fprintf(stderr, "train_gpt: error: %s\n", msg.c_str());
    std::fflush(stderr);
    dist_finalize();
    std::exit(1);
}

void RunCheckpoints::write(const std::string& dir, GPT& model, const Ownership& own, const TrainState& st,
                           const RunInfo& info, int keep, bool main_rank) {
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    if (async) {
        complete(true, dir, keep, st.step, main_rank);  // at most one in flight
        if (!async->start(model, st, info, &err)) agreed_error(err);
    } else if (!save_checkpoint(dir, model, own, st, info, &err)) {
        end_job(err);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    last_step = st.step;
    if (!main_rank) return;
    const std::string d = checkpoint_dir(dir, st.step);
    if (async) {
        std::printf("checkpoint: %s snapshot in %.1f ms, writing in the background\n", d.c_str(), ms);
    } else {
        std::printf("checkpoint: %s in %.1f ms\n", d.c_str(), ms);
        if (keep > 0) clean_checkpoints(dir, keep);
    }
}

void RunCheckpoints::complete(bool wait, const std::string& dir, int keep, int step, bool main_rank) {
    if (!async || !async->in_flight()) return;
    std::string err;
    int done = -1;
    if (!async->complete(wait, &done, &err)) agreed_error(err);
    if (done < 0 || !main_rank) return;
    std::printf("checkpoint: %s complete after step %d\n", checkpoint_dir(dir, done).c_str(), step);
    if (keep > 0) clean_checkpoints(dir, keep);
}
