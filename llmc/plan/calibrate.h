// llmc/plan/calibrate.h: --calibrate FILE: measures the machine at hand and
// writes a hardware profile (llmc/plan/hardware.h) for the planner. On the local
// device it times the operations the planner's cost model counts, at the
// shapes of the model given with -e, -b and -t: the block's four matrix
// products forward and backward (and one large square product, to say how
// far below its rate the model's shapes run), causal attention forward and backward, the
// block's memory-bound kernels (LayerNorms, residual adds, GELU) forward and
// backward, and an empty launch. Over the ranks of the launch it times
// all-reduces and point-to-point transfers of several sizes and fits the
// latency and bandwidth of docs/design.md section 10 to them.
#pragma once
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/model/config.h"
#include "llmc/plan/hardware.h"
#include "llmc/parallel/process_grid.h"

// Collective over grid.world; rank 0's *hw is the profile (its name: name).
bool calibrate(Backend& be, ProcessGrid& grid, const GPTConfig& mc, int B, int T, const std::string& name, Hardware* hw,
               std::string* err);
