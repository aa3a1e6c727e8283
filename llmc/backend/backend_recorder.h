// llmc/backend/backend_recorder.h: recorded regions (backend.h, docs/design.md
// section 2.9) on a backend that has none, by recording its calls: the CPU
// backend under LLMC_CPU_GRAPH=1. A region's ops are kept as calls and run
// again at each replay, and any op a CUDA graph could not hold (a transfer,
// an allocation, a synchronisation, a host-side result) inside a region
// stops the run naming it. So the rules the CUDA graphs of the step rely on,
// and the replays' results (bit for bit those of running the ops), are
// checked on a machine without a GPU.
#pragma once
#include "llmc/backend/backend.h"

// Takes ownership of inner.
Backend* make_recording_backend(Backend* inner);
