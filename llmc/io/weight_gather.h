// llmc/io/weight_gather.h: which elements of the model each rank writes to
// checkpoints and exports (every element has exactly one owner), and the
// gathering of whole tensors from their owners for the exports.
#pragma once
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/model/gpt.h"

// Which elements this rank writes: shards of ZeRO buffers belong to their
// rank, whole buffers to dp x cp rank 0 (whole_owner) but for the experts
// of expert parallelism, which belong to the first rank of their
// expert-data group (expert_owner), tensors replicated over tp to tp rank 0
// (replicated_owner), the last pipeline stage's copy of the embeddings to
// nobody (GPT::for_each_owned). world: the group of all ranks (null for one
// process).
struct Ownership {
    Comm* world = nullptr;
    bool whole_owner = true;
    bool replicated_owner = true;
    bool expert_owner = true;
};

// Every rank's verdict, the same on all: false everywhere, with the lowest
// failing rank's message in *err, when any rank failed.
bool all_ranks_ok(bool ok, std::string* err);

// Assembles ranges of the whole model's weights, in model-file order, on
// rank 0 for the exports: every rank downloads what it owns of the range
// into a zeroed buffer and a sum over own.world completes it (each element
// has one owner; the sum's bytes are not counted as step traffic). One
// range's buffer at a time, so no rank holds more than one tensor beside
// its buffers. Collective: every rank calls gather() for the same ranges.
class WeightGather {
  public:
    WeightGather(GPT& model, const Ownership& own) : model_(model), own_(own) {}
    ~WeightGather();
    WeightGather(const WeightGather&) = delete;
    WeightGather& operator=(const WeightGather&) = delete;
    // n elements from file offset fo, in the weights' dtype; whole on rank 0.
    const std::vector<char>& gather(size_t fo, size_t n);

  private:
    GPT& model_;
    Ownership own_;
    std::vector<char> host_;
    void* tmp_ = nullptr;  // the device buffer of the sum
    size_t tmp_elems_ = 0;
};
