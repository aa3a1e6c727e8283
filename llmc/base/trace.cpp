// llmc/base/trace.cpp: the run's timeline as Chrome trace events (llmc/base/trace.h).
#include "llmc/base/trace.h"

#include <chrono>
#include <cstdio>
#include <sstream>
#include <utility>

namespace trace {
namespace {

struct State {
    bool on = false;
    std::string label;
    int rank = 0;
    std::function<void()> sync;
    std::chrono::steady_clock::time_point origin;
    int step = -1;
    std::vector<Event> events;
};
State& st() {
    static State s;
    return s;
}

std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o;
}

const char* track_name(Track t) {
    switch (t) {
        case Track::compute: return "compute";
        case Track::p2p: return "p2p";
        case Track::collective: return "collectives";
    }
    return "?";
}

}  // namespace

std::string rank_json() {
    State& s = st();
    std::ostringstream o;
    o.precision(3);
    o << std::fixed;
    o << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << s.rank << ", \"args\": {\"name\": \""
      << escape(s.label) << "\"}},\n";
    o << "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " << s.rank << ", \"args\": {\"sort_index\": "
      << s.rank << "}},\n";
    for (Track t : {Track::compute, Track::p2p, Track::collective})
        o << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << s.rank << ", \"tid\": " << (int)t
          << ", \"args\": {\"name\": \"" << track_name(t) << "\"}},\n";
    for (const Event& e : s.events) {
        o << "{\"name\": \"" << escape(e.name) << "\", \"cat\": \"" << escape(e.cat) << "\", \"ph\": \"X\", \"pid\": "
          << s.rank << ", \"tid\": " << (int)e.track << ", \"ts\": " << e.t0 << ", \"dur\": " << (e.t1 - e.t0)
          << ", \"args\": {\"step\": " << e.step << (e.args.empty() ? "" : ", ") << e.args << "}},\n";
    }
    return o.str();
}

void begin(int rank, const std::string& label, std::function<void()> sync) {
    State& s = st();
    s.label = label;
    s.rank = rank;
    s.sync = std::move(sync);
    s.events.clear();
    s.origin = std::chrono::steady_clock::now();
    s.on = true;
}

void end() { st().on = false; }

bool on() { return st().on; }

double now() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - st().origin).count();
}

void set_step(int step) { st().step = step; }

void add(Track track, const std::string& name, const std::string& cat, double t0, double t1, const std::string& args) {
    State& s = st();
    if (!s.on) return;
    s.events.push_back({track, name, cat, t0, t1, s.step, args});
}

const std::vector<Event>& events() { return st().events; }

Scope::Scope(const std::string& name, const char* cat) : on_(st().on), cat_(cat) {
    if (!on_) return;
    name_ = name;
    if (st().sync) st().sync();
    t0_ = now();
}

Scope::~Scope() {
    if (!on_) return;
    if (st().sync) st().sync();
    add(Track::compute, name_, cat_, t0_, now());
}

}  // namespace trace
