// tests/unit/test_watchdog.cpp: the collective watchdog's decisions
// (llmc/comm/watchdog.h) with a fake clock, fake completion queries and a
// fake asynchronous-error source, as the NCCL transport drives it from its
// background thread: completed collectives are dropped, the oldest one
// still pending times out after --collective-timeout seconds at the
// front of the stream (not counting the time it queued behind others), an
// asynchronous error ends the job at once, and the line names the group,
// the collective and how long it waited. Last line: "N passed, N failed".
#include <cstdio>
#include <set>
#include <string>

#include "llmc/comm/watchdog.h"
#include "tests/lib/check.h"

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The fake transport: which ids have completed, and the error to report.
struct Fake {
    std::set<uint64_t> completed;
    std::string error;
    std::string check(CollectiveWatchdog& w, double now) {
        return w.check(
            now, [&](uint64_t id) { return completed.count(id) > 0; }, [&] { return error; });
    }
};

void test_setting() {
    CHECK(collective_timeout() == 300.0, "the default of 300 s (got %g)", collective_timeout());
    set_collective_timeout(0.5);
    CHECK(collective_timeout() == 0.5, "fractions of a second");
    set_collective_timeout(0);
    CHECK(collective_timeout() == 0.0, "0 turns the timeout off");
    set_collective_timeout(-1);
    CHECK(collective_timeout() == 0.0, "below 0 is off too");
    set_collective_timeout(kDefaultCollectiveTimeout);
}

void test_timeout() {
    CollectiveWatchdog w(300);
    Fake f;
    w.issued({1, "dp", "reduce-scatter", 12u << 20, 0.0});
    w.issued({2, "tp", "all-reduce", 4096, 1.0});
    w.issued({3, "dp", "all-gather", 1u << 20, 2.0});
    CHECK(f.check(w, 10).empty() && w.pending() == 3, "nothing done, nothing late: quiet, 3 pending");
    CHECK(f.check(w, 299.5).empty(), "the front has waited 299.5 s of 300: quiet");
    f.completed.insert(1);
    CHECK(f.check(w, 300.5).empty() && w.pending() == 2, "the front completed: dropped, 2 pending");
    CHECK(w.front().id == 2 && w.front_since() == 300.5, "the next one is the front from when the last left");
    // tp all-reduce queued 299.5 s behind the reduce-scatter: its own wait starts now.
    CHECK(f.check(w, 600.0).empty(), "299.5 s at the front: quiet, though issued 599 s ago");
    const std::string m = f.check(w, 601.0);
    CHECK(!m.empty(), "300.5 s at the front: timed out");
    CHECK(has(m, "group tp") && has(m, "all-reduce") && has(m, "4.0 KiB"), "the line names the group, the collective and its size: %s",
          m.c_str());
    CHECK(has(m, "300.5 s") && has(m, "issued 600.0 s ago") && has(m, "1 more queued") &&
              has(m, "--collective-timeout 300"),
          "the line says how long it waited, since when, what queues behind it and the limit: %s", m.c_str());
    CHECK(m.find('\n') == std::string::npos, "one line");
    f.completed.insert(2);
    f.completed.insert(3);
    CHECK(f.check(w, 601.5).empty() && w.pending() == 0, "completed ones dropped: quiet, nothing pending");
    CHECK(f.check(w, 1e6).empty(), "nothing pending never times out");
}

void test_out_of_order_and_empty() {
    CollectiveWatchdog w(10);
    Fake f;
    w.issued({7, "pp", "send-recv", 100, 5.0});
    CHECK(w.front_since() == 5.0, "a collective issued into an empty queue is the front from its issue");
    w.issued({8, "cp", "send-recv", 100, 6.0});
    f.completed.insert(8);  // a later one done first (not on one stream, but must not confuse it)
    CHECK(f.check(w, 14.0).empty() && w.pending() == 1 && w.front().id == 7 && w.front_since() == 5.0,
          "a later completion leaves the front and its clock alone");
    const std::string m = f.check(w, 15.5);
    CHECK(has(m, "group pp") && has(m, "send-recv") && has(m, "10.5 s"), "the front times out on its own clock: %s",
          m.c_str());
    f.completed.insert(7);
    CHECK(f.check(w, 16).empty() && w.pending() == 0, "then it completes: empty");
    w.issued({9, "dp", "all-reduce", 8, 100.0});
    CHECK(w.front_since() == 100.0, "after the queue emptied, the next is the front from its issue");
}

void test_errors_and_off() {
    CollectiveWatchdog w(300);
    Fake f;
    w.issued({1, "dp", "reduce-scatter", 2048, 10.0});
    f.error = "group tp: remote process exited or there was a network error";
    const std::string m = f.check(w, 12.5);
    CHECK(has(m, "NCCL asynchronous error") && has(m, "group tp: remote process exited") &&
              has(m, "group dp reduce-scatter of 2.0 KiB") && has(m, "2.5 s"),
          "an asynchronous error ends at once, naming its group and what was in flight: %s", m.c_str());
    CHECK(m.find('\n') == std::string::npos, "one line");
    CollectiveWatchdog idle(300);
    const std::string e = f.check(idle, 1.0);
    CHECK(has(e, "group tp") && !has(e, "in flight"), "an error with nothing in flight: %s", e.c_str());

    CollectiveWatchdog off(0);
    Fake g;
    off.issued({1, "dp", "all-gather", 1, 0.0});
    CHECK(g.check(off, 1e9).empty(), "timeout 0: never times out");
    g.error = "group dp: internal error";
    CHECK(has(g.check(off, 1e9 + 1), "internal error"), "timeout 0: errors are still reported");
}

// Where the transport knows who came (PendingCollective::arrivals), the
// line names them instead of guessing, asked with the front's start; the
// long wait that makes the ranks tell each other comes at a quarter of the
// timeout, at most 2 s, of the front's own wait.
void test_arrivals() {
    CollectiveWatchdog w(8);
    Fake f;
    double asked = -1;
    PendingCollective a{1, "dp", "all-reduce", 64, 0.0};
    a.arrivals = [&](double since) {
        asked = since;
        return std::string("ranks that did not arrive: 3 (dp rank 1)");
    };
    CHECK(!w.long_wait(0.0), "nothing pending: no long wait");
    w.issued(a);
    CHECK(!w.long_wait(1.9) && w.long_wait(2.0), "8 s timeout: a long wait from 2 s (a quarter)");
    const std::string m = f.check(w, 8.5);
    CHECK(has(m, "ranks that did not arrive: 3 (dp rank 1)") && !has(m, "a peer rank died") && asked == 0.0,
          "the line names who did not come, asked with the front's start: %s (since %g)", m.c_str(), asked);
    CollectiveWatchdog big(300);
    big.issued({2, "tp", "all-gather", 8, 5.0});
    CHECK(!big.long_wait(6.9) && big.long_wait(7.0), "300 s timeout: a long wait from 2 s");
    const std::string n = f.check(big, 400);
    CHECK(has(n, "a peer rank died, hung or never issued it"), "unknown arrivals: the general words: %s", n.c_str());
    CollectiveWatchdog off(0);
    off.issued({3, "dp", "all-gather", 8, 0.0});
    CHECK(!off.long_wait(1e9), "timeout 0: never a long wait");
}

}  // namespace

int main() {
    test_setting();
    test_timeout();
    test_out_of_order_and_empty();
    test_errors_and_off();
    test_arrivals();
    CHECK(watchdog_bytes(512) == "512 B" && watchdog_bytes(1536) == "1.5 KiB" && watchdog_bytes(12u << 20) == "12.0 MiB",
          "sizes: %s %s %s", watchdog_bytes(512).c_str(), watchdog_bytes(1536).c_str(), watchdog_bytes(12u << 20).c_str());
    return check_summary();
}
