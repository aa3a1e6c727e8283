// llmc/model/expert_parallel.h: expert parallelism (Mixtral, docs/moe.md)
// over the ep group: the ep ranks of one group each hold E/ep of a block's
// experts (the tensor table's expert split) and route their own tokens. This
// file holds every collective the ep group issues, all inside the MoE block
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

class ExpertParallel {
  public:
    // group: the ep group; experts: E of the model (ep must divide it).
    ExpertParallel(Comm& group, Backend& be, int experts);
    ~ExpertParallel();
    ExpertParallel(const ExpertParallel&) = delete;
    ExpertParallel& operator=(const ExpertParallel&) = delete;
    int size() const { return comm_.size(); }
    int rank() const { return comm_.rank(); }
    int local_experts() const { return experts_ / comm_.size(); }
    Comm& comm() { return comm_; }
    size_t buffer_bytes() const { return (size_t)comm_.size() * experts_ * sizeof(int); }  // the counts'

    // One block's exchange for one micro-batch.
    struct Route {
        std::vector<size_t> send_rows, recv_rows;  // per peer
        std::vector<int> block_rows;               // [peer][local expert]: the expert side's blocks, in order
        size_t expert_rows = 0;                    // rows on the expert side (the sum of recv_rows)
    };
    // offsets: this rank's grouped rows per expert (E + 1 prefix sums, host).
    void plan(const std::vector<int>& offsets, Route* r);
    // rows of `width` elements of type t: token side -> expert side.
    void dispatch(const void* grouped, void* expert_side, const Route& r, size_t width, DType t);
    // expert side -> token side (the inverse of dispatch).
    void combine(const void* expert_side, void* grouped, const Route& r, size_t width, DType t);

  private:
    void exchange(const void* send, const std::vector<size_t>& send_rows, void* recv,
                  const std::vector<size_t>& recv_rows, size_t width, DType t);
    Comm& comm_;
    Backend& be_;
    int experts_;
    int* counts_ = nullptr;  // backend memory: ep x E ints (the all-gathered counts)
};
