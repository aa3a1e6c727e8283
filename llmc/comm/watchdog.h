// llmc/comm/watchdog.h: the decisions of the collective watchdog, in plain
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
// Timeout: LLMC_COLLECTIVE_TIMEOUT, in seconds (default 300; 0 turns the
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

// The timeout from the variable's value (null when unset: the default).
// false with *err naming the variable for anything but a number >= 0.
bool parse_collective_timeout(const char* value, double* seconds, std::string* err);

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
