// llmc/comm/watchdog.cpp: the collective watchdog's settings and decisions
// (llmc/comm/watchdog.h).
#include "llmc/comm/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "llmc/base/test_hooks.h"
#include "llmc/comm/dist.h"


void collective_test_stall() {
    // Parsed once; rank -1 when unset, so a normal run pays one comparison.
    static int rank = -2;
    static long at = 0, calls = 0;
    if (rank == -2) {
        std::string err;
        if (!test_hooks::stall_rank(&rank, &at, &err)) dist_abort(err);
    }
    if (rank < 0 || rank != dist_world_rank() || ++calls != at) return;
    std::fprintf(stderr, "train_gpt: test: rank %d stalls before its collective %ld (LLMC_TEST_STALL_RANK)\n", rank,
                 at);
    std::fflush(stderr);
    // Long enough that only the others' watchdog ends the job; mpirun ends
    // this process with them.
    for (int i = 0; i < 3600; i++) ::sleep(1);
}

std::string watchdog_bytes(uint64_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    char buf[32];
    if (u == 0) std::snprintf(buf, sizeof(buf), "%llu B", (unsigned long long)bytes);
    else std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
    return buf;
}

void CollectiveWatchdog::issued(const PendingCollective& c) {
    if (q_.empty()) front_since_ = c.issued;
    q_.push_back(c);
}

std::string CollectiveWatchdog::describe(const PendingCollective& c) const {
    return "group " + c.group + " " + c.kind + " of " + watchdog_bytes(c.bytes);
}

std::string CollectiveWatchdog::check(double now, const std::function<bool(uint64_t)>& done,
                                      const std::function<std::string()>& error) {
    // Completed collectives leave, wherever they are (on one stream they end
    // in order; a front that leaves hands its clock to the next).
    bool front_left = false;
    for (size_t i = 0; i < q_.size();) {
        if (done(q_[i].id)) {
            front_left = front_left || i == 0;
            q_.erase(q_.begin() + (long)i);
        } else {
            i++;
        }
    }
    if (front_left && !q_.empty()) front_since_ = now > q_.front().issued ? now : q_.front().issued;
    char buf[160];
    const std::string err = error();
    if (!err.empty()) {
        std::string m = "NCCL asynchronous error (" + err + ")";
        if (!q_.empty()) {
            std::snprintf(buf, sizeof(buf), " while %s was in flight for %.1f s", describe(q_.front()).c_str(),
                          now - q_.front().issued);
            m += buf;
        }
        return m + "; ending every rank";
    }
    if (timeout_ <= 0 || q_.empty()) return "";
    const double waited = now - front_since_;
    if (waited <= timeout_) return "";
    const PendingCollective& c = q_.front();
    std::snprintf(buf, sizeof(buf), " has not completed after %.1f s (issued %.1f s ago, %zu more queued behind it; ",
                  waited, now - c.issued, q_.size() - 1);
    std::string m = "collective timed out: " + describe(c) + buf;
    std::snprintf(buf, sizeof(buf), "--collective-timeout %g", timeout_);
    m += buf;
    if (c.arrivals) return m + "): " + c.arrivals(front_since_) + "; ending every rank";
    return m + "): a peer rank died, hung or never issued it; ending every rank";
}

bool CollectiveWatchdog::long_wait(double now) const {
    if (timeout_ <= 0 || q_.empty()) return false;
    return now - front_since_ >= std::min(2.0, timeout_ / 4);
}
