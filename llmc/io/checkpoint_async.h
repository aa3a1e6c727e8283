// llmc/io/checkpoint_async.h: checkpoints written while training goes on
// (--async-checkpoint). The files are the synchronous writer's, byte for
// byte (llmc/io/checkpoint.h); only when and by which thread they are
// written differs:
//   start()     at a checkpoint step, on the main thread: waits for the
//               checkpoint in flight (at most one), rank 0 makes ckpt_S/,
//               each rank copies its shard's payload into a host buffer
//               (allocated once, sized from the shard) and rank 0 renders
//               the index; then a background thread writes the shard (and
//               on rank 0 the index) from that snapshot;
//   complete()  after each later step, on the main thread, a collective:
//               once every rank's writer has finished, rank 0 writes DONE.
//               A writer's error ends the run on every rank with its line.
// The background thread calls neither MPI nor the backend (both stay with
// the main thread).
//
// Test hook (llmc/base/test_hooks.h): LLMC_TEST_CHECKPOINT_DELAY_MS=N makes
// each writer wait N ms with its shard written under the temporary name,
// before the rename, so the tests can watch training go on, and kill a
// run, mid-write.
#pragma once
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "llmc/io/checkpoint.h"

class AsyncCheckpointer {
  public:
    // Allocates the snapshot buffer for this rank's shard of model.
    AsyncCheckpointer(const std::string& dir, GPT& model, const Ownership& own);
    ~AsyncCheckpointer();  // waits for the writer (no MPI: a run ending on an error)
    AsyncCheckpointer(const AsyncCheckpointer&) = delete;
    AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

    // The host memory the snapshot holds on this rank.
    size_t host_bytes() const { return buf_bytes_; }
    // The same, before the model is allocated (the memory check).
    static size_t host_bytes_for(GPT& model, const Ownership& own);

    // Collective: completes the checkpoint in flight, if any (waiting for
    // it), then snapshots st.step's and starts writing it. False (every
    // rank, *err naming the file) on an error.
    bool start(GPT& model, const TrainState& st, const RunInfo& run, std::string* err);
    // Collective: when every rank's writer has finished (wait: after waiting
    // for this rank's), marks the checkpoint complete (DONE) and sets *done
    // to its step; otherwise *done = -1. False (every rank) on an error.
    bool complete(bool wait, int* done, std::string* err);
    bool in_flight() const { return step_ >= 0; }
    int step_in_flight() const { return step_; }

  private:
    void write();  // the background thread
    void join();

    std::string dir_;
    Ownership own_;
    int rank_ = 0;
    Backend* be_ = nullptr;  // whose host memory holds the snapshot
    char* buf_ = nullptr;    // the payload snapshot (Backend::alloc_host)
    size_t buf_bytes_ = 0;
    ShardImage image_;
    std::string index_;      // rank 0: index.json's text
    int step_ = -1;          // the checkpoint in flight
    std::thread thread_;
    // 0 writing, 1 written, 2 failed (error_ then holds the line); release
    // on store, acquire on load, so error_ is visible once 2 is.
    std::atomic<int> state_{1};
    std::string error_;
    int delay_ms_ = 0;
};
