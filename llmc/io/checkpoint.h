// llmc/io/checkpoint.h: training checkpoints that scale.
//
// A checkpoint after S completed steps, in the output directory:
//   ckpt_SSSSSSSS/index.json        what the checkpoint is: the model shape,
//                                   the dtypes, the step, the data position
//                                   and sampling RNG, the run's flags and
//                                   layout, and the list of shard files;
//   ckpt_SSSSSSSS/shard_RRRRR.bin   what rank R owns of the weights (full
//                                   precision: the master copy when there is
//                                   one) and of Adam m and v;
//   DONE_SSSSSSSS                   written last: a checkpoint without it is
//                                   torn and never resumed from.
// Every rank writes its own shard, in parallel, holding nothing but its own
// part; every element of the model is in exactly one shard (shards of ZeRO
// buffers belong to their rank, whole buffers to dp x cp rank 0, tensors
// replicated over tp to tp rank 0, the last pipeline stage's copy of the
// embeddings to nobody). Shards name their elements by their place in the
// model file, so any layout loads any other: each rank reads, one tensor at a
// time, the pieces of the tensors it holds, whatever layout wrote them.
//
// Shard file: 256 int32 header
//   [0] 20241124 magic  [1] 1 version  [2] rank  [3] world
//   [4] weights dtype  [5] Adam dtype  [6,7] weight pieces (lo, hi)
//   [8,9] Adam pieces (lo, hi)
// then the weight pieces and the Adam pieces, 4 uint64 each (file offset of
// the first element, length, stride, count: `count` runs of `length`
// elements, `stride` apart in the model file), then the weights of the
// weight pieces in order, then m and then v of the Adam pieces.
//
// Files are written under temporary names and renamed; a killed run leaves
// only temporaries and torn checkpoints, which clean_checkpoints() removes.
// With --async-checkpoint the same files are written by a background thread
// from a host snapshot (llmc/io/checkpoint_async.h), through the pieces
// below: the shard's image, its payload, the index, DONE.
// Checkpoints of the earlier format (state_SSSSSSSS.bin, one file with the
// whole model and no checksums) are refused by name. The llm.c model file
// export is llmc/io/model_io.h.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/io/train_state.h"
#include "llmc/io/weight_gather.h"
#include "llmc/model/gpt.h"

std::string checkpoint_dir(const std::string& dir, int step);
std::string done_path(const std::string& dir, int step);

// Writes the checkpoint of st.step into dir. Collective over own.world;
// every rank returns the same verdict (false with *err naming the file).
bool save_checkpoint(const std::string& dir, GPT& model, const Ownership& own, const TrainState& st,
                     const RunInfo& run, std::string* err);

// A rank's shard laid out for writing: everything but the payload. The
// synchronous writer streams the payload from the device run by run; the
// asynchronous one copies it whole into host memory first.
struct ShardImage {
    std::string path;                // the shard file
    std::vector<char> head;          // the header and the piece tables
    std::vector<uint64_t> sections;  // byte length of each (section, piece) of the payload: its checksums
    size_t payload_bytes = 0;        // weights, then Adam m, then Adam v
};
ShardImage shard_image(const std::string& dir, int step, GPT& model, const Ownership& own);
// Copies this rank's payload (im.payload_bytes) from the device into host.
void copy_shard_payload(GPT& model, const Ownership& own, char* host);
// Writes the shard file from its image and a host payload; touches neither
// the backend nor MPI, so any thread may call it. before_commit (may be
// empty) runs with the temporary file written but not yet renamed.
bool write_shard_image(const ShardImage& im, const char* payload, std::string* err,
                       const std::function<void()>& before_commit);
// The text of ckpt_S/index.json for st.step (rank 0 writes it).
std::string checkpoint_index_text(GPT& model, int world, const TrainState& st, const RunInfo& run);
// Writes a small file atomically (the index, DONE).
bool write_file_atomic(const std::string& path, const std::string& text, std::string* err);

// Largest S with a complete checkpoint in dir (DONE_S written), or -1.
int latest_checkpoint(const std::string& dir);
// Every S with a complete checkpoint in dir, newest first.
std::vector<int> complete_checkpoints(const std::string& dir);
// What is wrong with complete checkpoint S, without reading its payload:
// its index, and each shard's header, piece tables and size against what
// they promise (a truncated or overwritten shard); "" when nothing is. The
// checksums are checked when it is loaded.
std::string checkpoint_problem(const std::string& dir, int step);

// The model shape of checkpoint S, for building the model before loading.
bool read_checkpoint_config(const std::string& dir, int step, GPTConfig* cfg, std::string* err);

// Loads weights, Adam state, TrainState and the writer's RunInfo (zeros for
// the earlier format) into a model of the checkpoint's shape, whatever the
// layout of either. Each rank holds at most one tensor beside its buffers.
bool load_checkpoint(const std::string& dir, int step, GPT& model, TrainState* st, RunInfo* run, std::string* err);

// Removes what a killed run left in dir (temporary files, checkpoints without
// DONE) and, with keep > 0, all complete checkpoints but the newest keep.
// One rank (rank 0) calls it. Returns the number of entries removed.
int clean_checkpoints(const std::string& dir, int keep);

