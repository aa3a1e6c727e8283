// llmc/io/checkpoint.h: training checkpoints that scale, and the llm.c model
// file as an export.
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
// Checkpoints of the earlier format (state_SSSSSSSS.bin, one file with the
// whole model) still load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/model/gpt.h"

constexpr int kStateMagic = 20241122;  // the earlier, one-file format
constexpr int kShardMagic = 20241124;

struct TrainState {
    int step = 0;                // completed optimizer steps
    uint64_t rng_state = 0;      // sampling RNG
    uint64_t rows_consumed = 0;  // rows of the training stream used so far
};

// The flags and layout of the run that wrote a checkpoint (a resume compares
// them with its own and says what changed).
struct RunInfo {
    int max_steps = 0;
    long long total_batch = 0;
    int B = 0, T = 0;
    int world = 1, pp = 1, vpp = 1, dp = 1, cp = 1, tp = 1, sp = 0, zero = 0;
    std::string recompute = "none";
    std::string layout() const;  // "world 8 = pp 2 x dp 2 x cp 1 x tp 2, ZeRO 1, B=4"
};

// Which elements this rank writes (see above). world: the group of all ranks
// (null for one process).
struct CheckpointOwner {
    Comm* world = nullptr;
    bool whole_owner = true;
    bool replicated_owner = true;
};

std::string checkpoint_dir(const std::string& dir, int step);
std::string done_path(const std::string& dir, int step);

// Writes the checkpoint of st.step into dir. Collective over own.world;
// every rank returns the same verdict (false with *err naming the file).
bool save_checkpoint(const std::string& dir, GPT& model, const CheckpointOwner& own, const TrainState& st,
                     const RunInfo& run, std::string* err);

// Largest S with a complete checkpoint in dir (DONE_S written), or -1.
int latest_checkpoint(const std::string& dir);

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

// Assembles ranges of the whole model's weights, in model-file order, on
// rank 0 for the exports: every rank downloads what it owns of the range
// into a zeroed buffer and a sum over own.world completes it (each element
// has one owner; the sum's bytes are not counted as step traffic). One
// range's buffer at a time, so no rank holds more than one tensor beside
// its buffers. Collective: every rank calls gather() for the same ranges.
class WeightGather {
  public:
    WeightGather(GPT& model, const CheckpointOwner& own) : model_(model), own_(own) {}
    ~WeightGather();
    WeightGather(const WeightGather&) = delete;
    WeightGather& operator=(const WeightGather&) = delete;
    // n elements from file offset fo, in the weights' dtype; whole on rank 0.
    const std::vector<char>& gather(size_t fo, size_t n);

  private:
    GPT& model_;
    CheckpointOwner own_;
    std::vector<char> host_;
    void* tmp_ = nullptr;  // the device buffer of the sum
    size_t tmp_elems_ = 0;
};

// Writes the weights as an llm.c model file (version 3 fp32, 5 bf16),
// tensor by tensor: each tensor is gathered over own.world from its owners
// and rank 0 appends it, so no rank holds more than one tensor beside its
// buffers. Collective; every rank returns the same verdict.
bool export_model(const std::string& path, GPT& model, const CheckpointOwner& own, int version, std::string* err);
