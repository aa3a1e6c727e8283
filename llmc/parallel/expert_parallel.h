// llmc/parallel/expert_parallel.h: expert parallelism (Mixtral, docs/moe.md)
// over the ep group, the model's ExpertParallelOps (llmc/model/parallel_hooks.h):
// the ep ranks of one group each hold E/ep of a block's experts (the tensor
// table's expert split) and route their own tokens. This file holds every
// collective the ep group issues, called from the MoE block
// (llmc/model/moe.cpp):
//
//   plan      the counts first: each rank's rows per expert (E ints), all-
//             gathered over the group, so every rank knows what it sends to
//             and receives from each peer;
//   dispatch  the token side's grouped rows (by expert, hence by owner: the
//             experts of a rank are consecutive) to their experts' ranks,
//             an all-to-all with those sizes; the forward's inputs and the
//             backward's output gradients;
//   combine   the expert side's rows back to their tokens' ranks (the
//             inverse sizes); the forward's outputs and the backward's input
//             gradients.
//
// On the expert side a rank's rows come peer by peer and, within a peer's,
// expert by expert: blocks of (peer, local expert) that the experts' matrix
// products take one at a time. Dropless: every row reaches its expert, and
// the expert side's buffers are sized for the worst case, every token of
// every peer routed to this rank (ep·N·min(K, E/ep) rows).
#pragma once
#include <cstddef>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/model/parallel_hooks.h"

class ExpertParallel final : public ExpertParallelOps {
  public:
    // group: the ep group; experts: E of the model (ep must divide it).
    ExpertParallel(Comm& group, Backend& be, int experts);
    ~ExpertParallel();
    ExpertParallel(const ExpertParallel&) = delete;
    ExpertParallel& operator=(const ExpertParallel&) = delete;
    int size() const override { return comm_.size(); }
    int rank() const override { return comm_.rank(); }
    int local_experts() const override { return experts_ / comm_.size(); }
    Comm& comm() { return comm_; }
    size_t buffer_bytes() const { return (size_t)comm_.size() * experts_ * sizeof(int); }  // the counts'

    void plan(const std::vector<int>& offsets, Route* r) override;
    void dispatch(const void* grouped, void* expert_side, const Route& r, size_t width, DType t) override;
    void combine(const void* expert_side, void* grouped, const Route& r, size_t width, DType t) override;

  private:
    void exchange(const void* send, const std::vector<size_t>& send_rows, void* recv,
                  const std::vector<size_t>& recv_rows, size_t width, DType t);
    Comm& comm_;
    Backend& be_;
    int experts_;
    int* counts_ = nullptr;  // backend memory: ep x E ints (the all-gathered counts)
};
