// dev/cuda/previous.h: the production kernels as they were before the
// 16-byte / deterministic rewrite (commit 9afbfae), kept verbatim in
// namespace llmc_prev so every kernel-lab program can run the old version
// next to the new one on the same inputs and print both bandwidths. Not
// used by the trainer. Only the namespace and the include paths differ from
// the old headers; the helpers they used (to_float, warp_sum, grid_for, ...)
// come from llmc/backend/cuda/common.cuh. One file per op family
// (previous_*.h); the programs include them all through this one.
#pragma once
#include "previous_classifier.h"
#include "previous_elementwise.h"
#include "previous_encoder.h"
#include "previous_layernorm.h"
