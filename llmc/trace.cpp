// llmc/trace.cpp: the run's timeline as Chrome trace events (llmc/trace.h).
#include "trace.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend.h"
#include "comm.h"
#include "fileio.h"

namespace trace {
namespace {

struct State {
    bool on = false;
    std::string path, label;
    int rank = 0;
    Backend* be = nullptr;
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

// This rank's events as JSON objects, one per line, each ending with ",".
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

}  // namespace

void start(const std::string& path, Comm& world, const std::string& label, Backend* be) {
    State& s = st();
    s.path = path;
    s.label = label;
    s.rank = world.rank();
    s.be = be;
    s.events.clear();
    world.host_all_reduce(0.0, ReduceOp::Sum);  // a barrier: every rank reads the clock after it
    s.origin = std::chrono::steady_clock::now();
    s.on = true;
}

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
    if (st().be) st().be->synchronize();
    t0_ = now();
}

Scope::~Scope() {
    if (!on_) return;
    if (st().be) st().be->synchronize();
    add(Track::compute, name_, cat_, t0_, now());
}

bool finish(Comm& world, std::string* err) {
    State& s = st();
    if (!s.on) return true;
    s.on = false;
    // Each rank writes its part; after a barrier rank 0 joins them.
    const std::string part = s.path + ".rank" + std::to_string(s.rank);
    bool ok = true;
    {
        std::ofstream f(part, std::ios::binary | std::ios::trunc);
        f << rank_json();
        ok = (bool)f;
    }
    ok = world.host_all_reduce(ok ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
    if (!ok) {
        if (err) *err = "--trace " + s.path + ": cannot write " + part;
        return false;
    }
    if (s.rank == 0) {
        std::string all = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
        for (int r = 0; r < world.size(); r++) {
            const std::string p = s.path + ".rank" + std::to_string(r);
            std::ifstream f(p, std::ios::binary);
            std::stringstream ss;
            ss << f.rdbuf();
            all += ss.str();
            std::remove(p.c_str());
        }
        // Drop the last separator: JSON allows no trailing comma.
        if (all.size() >= 2 && all.compare(all.size() - 2, 2, ",\n") == 0) all.erase(all.size() - 2);
        all += "\n]}\n";
        AtomicWriter w;
        ok = w.open(s.path, err) && w.write(all.data(), all.size()) && w.commit(err);
        if (!ok && err && err->empty()) *err = "--trace " + s.path + ": write failed";
    }
    ok = world.host_all_reduce(ok ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
    if (!ok && err && err->empty()) *err = "--trace " + s.path + ": rank 0 could not write the trace";
    return ok;
}

}  // namespace trace
