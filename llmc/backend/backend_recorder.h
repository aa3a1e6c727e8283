// llmc/backend/backend_recorder.h: recorded regions (backend.h, docs/design.md
// section 2.9) on a backend that has none, by recording its calls: the CPU
// backend under LLMC_CPU_GRAPH=1. A region's ops are kept as calls and run
// again at each replay, and any op a CUDA graph could not hold (a transfer,
// an allocation, a synchronisation, a host-side result) inside a region
// stops the run naming it. So the rules the CUDA graphs of the step rely on,
// and the replays' results (bit for bit those of running the ops), are
// checked on a machine without a GPU.
//
// The same file holds a second watcher: a backend that counts the calls
// bringing a value to the host (a test hook, LLMC_TEST_HOST_READS=1), and a
// backend with stand-in matmul algorithms to choose from (a test hook,
// LLMC_TEST_MATMUL_TUNE=1).
#pragma once
#include <string>

#include "llmc/backend/backend.h"

// Takes ownership of inner.
Backend* make_recording_backend(Backend* inner);

// Counts inner's downloads, synchronisations and host-returned sums of
// squares (takes ownership of inner).
Backend* make_read_counting_backend(Backend* inner);
// The reads counted since the last call, by name in first-seen order
// ("download 1, sum_squares_multi 2"; "none" when there were none), and
// resets the count; "" when be does not count.
std::string take_host_reads(Backend& be);

// Offers three stand-in algorithms for every product shape inner runs, with
// times from a formula of the shape, the algorithm and `rank`, printing what
// it times and what it is told to take; the products stay inner's (takes
// ownership of inner).
Backend* make_standin_tuning_backend(Backend* inner, int rank);
