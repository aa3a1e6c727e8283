// llmc/run/trace_file.cpp: the --trace file of a run (llmc/run/trace_file.h).
#include "llmc/run/trace_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "llmc/base/fileio.h"
#include "llmc/base/trace.h"

namespace trace {

static std::string g_path;  // the file of the trace being recorded ("" when none)

void start(const std::string& path, Comm& world, const std::string& label, Backend* be) {
    g_path = path;
    world.host_all_reduce(0.0, ReduceOp::Sum);  // a barrier: every rank reads the clock after it
    std::function<void()> sync;
    if (be) sync = [be]() { be->synchronize(); };
    begin(world.rank(), label, sync);
}

bool finish(Comm& world, std::string* err) {
    if (g_path.empty()) return true;
    const std::string path = g_path;
    g_path.clear();
    trace::end();
    const int rank = world.rank();
    // Each rank writes its part; after a barrier rank 0 joins them.
    const std::string part = path + ".rank" + std::to_string(rank);
    bool ok = true;
    {
        std::ofstream f(part, std::ios::binary | std::ios::trunc);
        f << rank_json();
        ok = (bool)f;
    }
    ok = world.host_all_reduce(ok ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
    if (!ok) {
        if (err) *err = "--trace " + path + ": cannot write " + part;
        return false;
    }
    if (rank == 0) {
        std::string all = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
        for (int r = 0; r < world.size(); r++) {
            const std::string p = path + ".rank" + std::to_string(r);
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
        ok = w.open(path, err) && w.write(all.data(), all.size()) && w.commit(err);
        if (!ok && err && err->empty()) *err = "--trace " + path + ": write failed";
    }
    ok = world.host_all_reduce(ok ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
    if (!ok && err && err->empty()) *err = "--trace " + path + ": rank 0 could not write the trace";
    return ok;
}

}  // namespace trace
