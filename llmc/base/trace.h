// llmc/base/trace.h: a timeline of the run (--trace FILE) as Chrome trace-event
// JSON, which loads in Perfetto (ui.perfetto.dev) and chrome://tracing.
//
// One process per rank (pid = world rank, named with its place in the grid),
// three tracks per rank: compute (forward and backward of each micro-batch
// and model chunk, the optimizer step), p2p (pipeline sends and receives)
// and collectives (dp, tp, cp, pp groups), each span carrying its bytes.
// Communicators record their own spans (llmc/comm/comm.cpp): from the call that
// starts a collective to the wait that ends it, so an overlapped reduction
// shows as a long span beside the compute it hides behind.
//
// Times are host times in microseconds from a common origin (the ranks pass
// a barrier in start(), then read the clock). On a GPU the compute spans
// synchronise the device at both ends while tracing, so they measure the
// kernels rather than their launch; tracing slows a GPU run for that reason.
//
// This file is the recorder, which every layer may call: recording is off
// unless begin() was called, and every entry point then costs one branch.
// Events are kept in memory; starting a run's trace over its ranks and
// writing the file (each rank writes FILE.rankN, rank 0 joins them into
// FILE) is llmc/run/trace_file.h.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace trace {

enum class Track : int { compute = 0, p2p = 1, collective = 2 };

struct Event {
    Track track;
    std::string name;   // e.g. "F mb3 c1", "dp all-reduce"
    std::string cat;    // "forward", "backward", "optimizer", "send-recv", "all-reduce", ...
    double t0, t1;      // microseconds from the origin
    int step;           // optimizer step the event belongs to (-1: outside a step)
    std::string args;   // extra JSON members, e.g. "\"bytes\": 4096" (may be empty)
};

// Starts recording for this rank from now on (the origin of its times);
// `label` names the rank's track group (e.g. "rank 3: stage 1, dp 0, cp 0,
// tp 1"). sync, when set, is called at both ends of every compute span (a
// GPU backend's synchronize, so that spans measure kernels, not launches).
void begin(int rank, const std::string& label, std::function<void()> sync);
// Stops recording; the events stay until the next begin().
void end();
bool on();
double now();                       // microseconds from the origin
void set_step(int step);            // events recorded from now on belong to `step`
void add(Track track, const std::string& name, const std::string& cat, double t0, double t1,
         const std::string& args = "");
const std::vector<Event>& events();  // this rank's events so far

// A compute span for the lifetime of the object (nothing when off).
class Scope {
  public:
    Scope(const std::string& name, const char* cat);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

  private:
    bool on_;
    std::string name_;
    const char* cat_;
    double t0_ = 0;
};

// This rank's part of the trace file: its track names and its events as
// Chrome trace-event JSON objects, one per line, each ending with ",".
std::string rank_json();

}  // namespace trace
