// llmc/checkpoint.h: training checkpoints in the output directory.
//
// A checkpoint after S completed steps is three files:
//   model_SSSSSSSS.bin  the weights as an llm.c model file (for users, eval,
//                       fine-tuning elsewhere);
//   state_SSSSSSSS.bin  everything needed to continue bit for bit: the
//                       full-precision weights, Adam m and v, the step, the
//                       rows of data consumed and the sampling RNG;
//   DONE_SSSSSSSS       written last: a checkpoint without it is torn and
//                       never resumed from.
// Every file is written atomically (temporary name, then rename). Tensors are
// stored in model-file order, so a checkpoint does not depend on how the
// flat buffers are laid out or partitioned.
//
// State file: 256 int32 header
//   [0] 20241122 magic  [1] 1 version  [2] steps done  [3] weights dtype
//   [4] Adam dtype  [5..10] maxT V L NH C Vp  [11,12] rng state (lo, hi)
//   [13,14] rows consumed (lo, hi)
// then weights[P], m[P], v[P] in model-file order.
#pragma once
#include <cstdint>
#include <string>

#include "comm.h"
#include "gpt.h"

constexpr int kStateMagic = 20241122;

struct TrainState {
    int step = 0;                // completed optimizer steps
    uint64_t rng_state = 0;      // sampling RNG
    uint64_t rows_consumed = 0;  // rows of the training stream used so far
};

// The contents of a checkpoint as host arrays in model-file order
// (gathered over the ranks by the caller when the buffers are sharded).
struct CheckpointData {
    GPTConfig cfg;
    const void* weights;  // full-precision weights (master when there is one)
    DType weights_dtype;
    const void* m;        // Adam state
    const void* v;
    DType opt_dtype;
    int model_version;    // 3 (fp32) or 5 (bf16) for the llm.c model file
};

// The whole of a flat buffer in model-file order (file_params elements of
// type t) on every rank of `world`, whatever the layout: every element is
// contributed by exactly one rank and the others add zeros, so a sum over
// the world gathers it exactly. This rank contributes the pieces it holds of
// a sharded buffer, or of a whole one when `whole_owner` (dp rank 0), and of
// tensors replicated across tensor-parallel ranks when `replicated_owner`
// (tp rank 0). Checkpoint traffic is not step traffic: it is not counted.
void gather_file_order(GPT& model, Comm& world, const void* buf, bool sharded, DType buf_t, void* host, DType t,
                       bool whole_owner, bool replicated_owner);

// Writes model, state and DONE files (one writer: rank 0).
bool write_checkpoint(const std::string& dir, const CheckpointData& d, const TrainState& st, std::string* err);

// Single-process convenience for a model with whole buffers.
bool save_checkpoint(const std::string& dir, GPT& model, const TrainState& st, std::string* err);

// Largest S with a complete checkpoint in dir, or -1 when there is none.
int latest_checkpoint(const std::string& dir);

// Reads state_S.bin's shape, for building the model before loading into it.
bool read_checkpoint_config(const std::string& dir, int step, GPTConfig* cfg, std::string* err);

// Loads weights, Adam state and TrainState; the model must have the
// checkpoint's shape. Any backend precision can load any checkpoint, and
// each rank loads the part of every buffer it holds, whatever the layout.
bool load_checkpoint(const std::string& dir, int step, GPT& model, TrainState* st, std::string* err);

std::string checkpoint_path(const std::string& dir, const char* kind, int step);
