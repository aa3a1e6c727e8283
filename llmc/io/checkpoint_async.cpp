// llmc/io/checkpoint_async.cpp: the background checkpoint writer
// (llmc/io/checkpoint_async.h).
#include "llmc/io/checkpoint_async.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>

#include "llmc/base/fileio.h"
#include "llmc/base/test_hooks.h"

AsyncCheckpointer::AsyncCheckpointer(const std::string& dir, GPT& model, const Ownership& own)
    : dir_(dir), own_(own), rank_(own.world ? own.world->rank() : 0) {
    // Allocated (and touched) once, so a checkpoint step neither waits for
    // the allocation nor finds the memory missing half-way through the run;
    // the backend's host memory (pinned on CUDA: the snapshot's download runs
    // at the link's speed, not through the driver's staging).
    be_ = &model.backend();
    buf_bytes_ = host_bytes_for(model, own);
    buf_ = static_cast<char*>(be_->alloc_host(buf_bytes_));
    delay_ms_ = test_hooks::checkpoint_delay_ms();
}

AsyncCheckpointer::~AsyncCheckpointer() {
    join();
    be_->release_host(buf_);
}

size_t AsyncCheckpointer::host_bytes_for(GPT& model, const Ownership& own) {
    return shard_image("", 0, model, own).payload_bytes;
}

void AsyncCheckpointer::join() {
    if (thread_.joinable()) thread_.join();
}

void AsyncCheckpointer::write() {
    std::string err;
    bool ok = false;
    try {
        const int delay = delay_ms_;
        ok = write_shard_image(image_, buf_, &err, [delay] {
            if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        });
        // The index beside the shards; the checkpoint counts only once DONE
        // follows, after every rank's shard is on disk.
        if (ok && rank_ == 0) ok = write_file_atomic(checkpoint_dir(dir_, step_) + "/index.json", index_, &err);
    } catch (const std::exception& e) {  // a thread must not let one escape (std::terminate)
        err = "checkpoint " + image_.path + ": " + e.what();
        ok = false;
    }
    if (!ok) error_ = err;
    state_.store(ok ? 1 : 2, std::memory_order_release);
}

bool AsyncCheckpointer::start(GPT& model, const TrainState& st, const RunInfo& run, std::string* err) {
    int done = -1;
    if (in_flight() && !complete(true, &done, err)) return false;
    const int world = own_.world ? own_.world->size() : 1;
    bool ok = rank_ != 0 || make_dirs(checkpoint_dir(dir_, st.step), err);
    if (!all_ranks_ok(ok, err)) return false;
    image_ = shard_image(dir_, st.step, model, own_);
    if (image_.payload_bytes != buf_bytes_) {  // the shard's shape is fixed for the run
        *err = "checkpoint " + image_.path + ": the shard holds " + std::to_string(image_.payload_bytes) +
               " bytes, the snapshot buffer " + std::to_string(buf_bytes_);
        ok = false;
    } else {
        copy_shard_payload(model, own_, buf_);
        if (rank_ == 0) index_ = checkpoint_index_text(model, world, st, run);
    }
    if (!all_ranks_ok(ok, err)) return false;
    step_ = st.step;
    error_.clear();
    state_.store(0, std::memory_order_release);
    thread_ = std::thread(&AsyncCheckpointer::write, this);
    return true;
}

bool AsyncCheckpointer::complete(bool wait, int* done, std::string* err) {
    *done = -1;
    if (!in_flight()) return true;
    if (wait) join();
    // Every rank's state in one reduction: 2 when any writer failed, 1 when
    // any still writes, 0 when all have written.
    const int mine = state_.load(std::memory_order_acquire);
    const double code = mine == 2 ? 2 : mine == 0 ? 1 : 0;
    const double all = own_.world ? own_.world->host_all_reduce(code, ReduceOp::Max) : code;
    if (all == 1) return true;  // still writing somewhere; asked again after the next step
    join();                     // finished (or failed) here: the thread ends at once
    bool ok = state_.load(std::memory_order_acquire) == 1;
    if (!ok) *err = error_;
    if (!all_ranks_ok(ok, err)) {
        step_ = -1;
        return false;
    }
    if (rank_ == 0) ok = write_file_atomic(done_path(dir_, step_), "", err);
    if (!all_ranks_ok(ok, err)) {
        step_ = -1;
        return false;
    }
    *done = step_;
    step_ = -1;
    return true;
}
