// llmc/io/checkpoint_legacy.h: checkpoints of the earlier one-file format,
// still read (never written): DIR/state_SSSSSSSS.bin beside DONE_SSSSSSSS,
// a 256-int32 header ([0] 20241122 magic, [1] 1 version, [2] step,
// [3] weights dtype, [4] Adam dtype, [5..10] maxT, V, L, NH, C, Vp,
// [11,12] sampling RNG, [13,14] rows consumed) then the whole model's
// weights, Adam m and Adam v in model-file order.
#pragma once
#include <string>

#include "llmc/io/train_state.h"
#include "llmc/model/config.h"
#include "llmc/model/gpt.h"

// DIR/state_SSSSSSSS.bin.
std::string legacy_state_path(const std::string& dir, int step);
// The model shape of a state file (checked), for building the model first.
bool read_legacy_config(const std::string& path, GPTConfig* cfg, std::string* err);
// Loads weights, Adam state and the TrainState of a state file into a model
// of its shape (any layout: each rank keeps its part).
bool load_legacy_state(const std::string& path, GPT& model, TrainState* st, std::string* err);
