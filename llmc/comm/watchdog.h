// llmc/comm/watchdog.h: the collective watchdog's test hook (the stall) and
// the decisions of the NCCL transport's watchdog, in plain
// C++ so they are tested without a GPU (tests/unit/test_watchdog.cpp): which
// collectives are in flight, when the oldest has waited too long or a
// communicator reports an asynchronous error, and the one line the job ends
// with. An NCCL collective whose peer died or hung never completes, and
// NCCL reports a failed peer only when asked (ncclCommGetAsyncError), so
// without a watchdog the job waits forever. The NCCL transport
// (llmc/comm/comm_nccl.cu) records each collective here as it issues it and
// runs check() from a background thread, with a CUDA event per collective
// as the completion query and ncclCommGetAsyncError as the error source;
// on a message it aborts its communicators (ncclCommAbort) and ends the job
// (dist_abort). Where MPI allows calls from that thread
// (dist_mpi_threads()), a long wait (long_wait()) has the ranks tell each
// other their counts (llmc/comm/arrivals.h) and the line names the ranks
// that did not arrive, as the MPI transport's does.
//
// The MPI transport (llmc/comm/comm_mpi.cpp) has no thread: it waits for
// its requests by polling them against the same timeout, and names the
// ranks that never reached the collective.
//
// Timeout: --collective-timeout, in seconds (default 300; 0 turns the
// timeout off, errors are still polled), kept in llmc/comm/dist.h. A collective's wait is counted
// from when it reached the front of the rank's communication stream (the
// collectives of all groups run there one after another, in issue order:
// llmc/comm/comm_nccl.h), so a long queue of slow but progressing
// collectives does not trip it, only one that makes no progress.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "llmc/comm/dist.h"  // the timeout: set_collective_timeout, collective_timeout

// Test hook (llmc/base/test_hooks.h): LLMC_TEST_STALL_RANK=R:K makes world
// rank R sleep for an hour before its K-th collective (counted from 1 over
// every group of size > 1), so the tests can watch the others' watchdog end
// the job. Called by every collective before it is issued; a malformed
// value ends the job with one line naming the variable.
void collective_test_stall();

struct PendingCollective {
    uint64_t id;        // the transport's token for its completion query
    std::string group;  // "dp", "tp", ...
    std::string kind;   // "reduce-scatter", ...
    uint64_t bytes;     // the call's buffer
    double issued;      // host clock when it was issued, in seconds
    // Who did not come, when known (the NCCL transport with MPI threads:
    // Arrivals::late, llmc/comm/arrivals.h), given since when the front
    // waited; empty: not known.
    std::function<std::string(double since)> arrivals = nullptr;
};

// Not thread-safe: the transport calls it under its own lock.
class CollectiveWatchdog {
  public:
    explicit CollectiveWatchdog(double timeout_s) : timeout_(timeout_s) {}
    double timeout() const { return timeout_; }
    void issued(const PendingCollective& c);
    // One look at time `now` (the clock of `issued`). Drops every collective
    // done(id) says has completed. Returns the line to end the job with when
    // error() returns a failure (not "": a communicator's asynchronous
    // error, named by its group) or when the oldest collective still
    // pending has waited more than the timeout at the front; else "".
    std::string check(double now, const std::function<bool(uint64_t)>& done, const std::function<std::string()>& error);
    size_t pending() const { return q_.size(); }
    // Whether the front collective has waited long (a quarter of the
    // timeout, at most 2 s) at `now`: the ranks then tell each other their
    // counts, so the timeout's line can name who did not come.
    bool long_wait(double now) const;
    // The oldest pending collective (pending() > 0) and since when it has
    // been the front.
    const PendingCollective& front() const { return q_.front(); }
    double front_since() const { return front_since_; }

  private:
    std::string describe(const PendingCollective& c) const;
    double timeout_;
    std::deque<PendingCollective> q_;
    double front_since_ = 0;
};

// "12.0 MiB", "512 B": sizes in the watchdog's messages.
std::string watchdog_bytes(uint64_t bytes);
