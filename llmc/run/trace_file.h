// llmc/run/trace_file.h: the --trace file of a run: starts the recorder
// (llmc/base/trace.h) on every rank from a common origin, and at the end
// writes every rank's events into one Chrome trace-event JSON file.
#pragma once
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"

namespace trace {

// Starts recording on every rank of `world` (collective: a barrier, so the
// ranks share an origin). label names this rank's track group; be is
// synchronised around compute spans (null: never).
void start(const std::string& path, Comm& world, const std::string& label, Backend* be);

// Writes the trace (collective over the same world as start): each rank
// writes PATH.rankN, then rank 0 joins them into PATH (written to a
// temporary name and renamed). Returns false with *err naming the file when
// it cannot be written; true at once when no trace was started.
bool finish(Comm& world, std::string* err);

}  // namespace trace
