// llmc/comm/watchdog.h: the collective watchdog's settings (the timeout of
// --collective-timeout, shared by every transport; the stall hook of the
// tests) and the decisions of the NCCL transport's watchdog, in plain
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
// (dist_abort).
//
// The MPI transport (llmc/comm/comm_mpi.cpp) has no thread: it waits for
// its requests by polling them against the same timeout, and names the
// ranks that never reached the collective.
//
// Timeout: --collective-timeout, in seconds (default 300; 0 turns the
// timeout off, errors are still polled). A collective's wait is counted
// from when it reached the front of the rank's communication stream (the
// collectives of all groups run there one after another, in issue order:
// llmc/comm/comm_nccl.h), so a long queue of slow but progressing
// collectives does not trip it, only one that makes no progress.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

constexpr double kDefaultCollectiveTimeout = 300.0;

// The process's timeout: set from --collective-timeout before the process
// grid is made (every rank the same value: flags are checked to agree),
// read by every communicator made after. 0: off.
void set_collective_timeout(double seconds);
double collective_timeout();

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
