// llmc/run/run_checkpoints.h: a run's checkpoints: written in the step
// (every rank its shard; rank 0 the index, then DONE), or with
// --async-checkpoint snapshotted to host memory and written by a
// background thread, DONE once every rank's shard is on disk; the newest K
// kept (--keep-checkpoints). Each writes a line with the time the main
// thread spent (the checkpoint's cost to the step).
#pragma once
#include <memory>
#include <string>

#include "llmc/io/checkpoint.h"
#include "llmc/io/checkpoint_async.h"
#include "llmc/model/gpt.h"

struct RunCheckpoints {
    std::unique_ptr<AsyncCheckpointer> async;  // --async-checkpoint's writer (null without it)
    int last_step = -1;                        // the step of the last checkpoint written or started
    // A checkpoint of st's step into dir (keep: the newest K kept, 0: all).
    void write(const std::string& dir, GPT& model, const Ownership& own, const TrainState& st, const RunInfo& info,
               int keep, bool main_rank);
    // With --async-checkpoint, after every step: DONE for the checkpoint in
    // flight once every rank's shard is on disk (wait: until it is; a
    // collective, on the main thread, like every MPI call of the run); step:
    // the run's step, for the line.
    void complete(bool wait, const std::string& dir, int keep, int step, bool main_rank);
    // The snapshot buffer's bytes (the memory line).
    size_t host_bytes() const { return async ? async->host_bytes() : 0; }
};
