// llmc/parallel/data_parallel.h: data parallelism and ZeRO stages 0-3 over the
// data-parallel group (dp × cp ranks when context parallel is on).
//
// This is the one place where gradients, optimizer state and (stage 3)
// parameters are split over ranks and where their collectives are issued.
// Every unit (embeddings, each block, final LayerNorm; tensors.h) is padded
// to a multiple of N ranks and rank r owns slice r of it.
//
//   stage  held in full       held as a shard      per step, per rank (ring)
//   0      params, grads,     -                    all-reduce grads: 2P
//          master, Adam
//   1      params, grads      master, Adam         reduce-scatter grads +
//                                                  all-gather params: 2P
//   2      params             grads, master, Adam  same: 2P
//   3      -                  everything           all-gather params in
//                                                  forward and in backward +
//                                                  reduce-scatter grads: 3P
//
// When: stages 0 and 1 reduce only on the last micro-step of a step, unit by
// unit as soon as the unit's backward is done, overlapped with the backward
// of the units below; earlier micro-steps accumulate locally. Stages 2 and 3
// have no full gradient buffer, so every micro-step reduce-scatters each
// unit's gradients (from a buffer that exists only while the unit is in
// flight, at most one per unit) into the rank's shard. Stage 3 gathers a
// unit's parameters just before its forward and again before its backward,
// prefetching the next unit while the current one computes, and frees them
// after use.
//
// Expert parallel (docs/moe.md): a block's expert tensors are the unit's
// second segment (tensors.h), held alike only by the ranks of the
// expert-data group; every collective above is issued once per segment,
// the expert segment's over that group, so its gradients are summed (and
// its ZeRO slices owned) there and not across ranks holding other experts.
//
// The optimizer step that follows (the norm over the shards, AdamW on this
// rank's part, and the all-gather of updated parameters at stages 1 and 2)
// is llmc/parallel/optimizer_step.h, over the same groups.
#pragma once
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/model/gpt.h"

class DataParallel : public UnitProvider {
  public:
    // The model must have been built with Sharding::for_zero(stage,
    // comm.size(), comm.rank(), expert_comm's size and rank). expert_comm:
    // the expert-data group (ep > 1 only).
    DataParallel(GPT& model, Comm& comm, int zero_stage, Comm* expert_comm = nullptr);
    ~DataParallel() override;

    int stage() const { return stage_; }
    // Waits for every gradient reduction of the step still in flight: after
    // it, the gradients this rank owns are complete (before the optimizer).
    void finish_reductions();
    // Bytes of the communication buffers (units in flight), for the report.
    size_t comm_buffer_bytes() const { return comm_bytes_; }

    // UnitProvider. Stages 0 and 1 reduce a unit's gradients only when its
    // backward is the last micro-step of the optimizer step.
    void prefetch(int unit) override;
    const void* acquire(int unit) override;
    void release(int unit) override;
    void* grads(int unit) override;
    void grads_done(int unit, bool last_micro_step) override;
    // Stages 0-1 hand out the whole buffers' pointers; their only
    // communication is the reduction the last micro-step's backward starts
    // (none in a world of one).
    bool quiet(bool backward, bool last_micro_step) const override {
        return stage_ < 2 && (comm_.size() == 1 || !backward || !last_micro_step);
    }

  private:
    // A buffer holding one whole unit (parameters gathered for stage 3, or
    // gradients in flight for stages 2 and 3).
    enum State { Free, Gathering, InUse, Reducing };
    struct Pending {  // a collective in flight and the group that issued it
        Comm* comm;
        CommHandle handle;
    };
    struct UnitBuffer {
        void* data = nullptr;
        int unit = -1;              // unit held, -1 when free
        State state = Free;
        std::vector<Pending> pending;  // the gathers or reduce-scatters in flight (one per segment)
        void* shard_tmp = nullptr;  // reduce-scatter output (gradients)
    };
    UnitBuffer* find(std::vector<UnitBuffer>& pool, int unit);
    UnitBuffer* take_free(std::vector<UnitBuffer>& pool, int unit);
    void start_gather(UnitBuffer& b, int unit);
    void finish_grad_reduce(UnitBuffer& b);
    void* shard_ptr(void* buf, DType t, int unit) const;
    Comm& comm_of(const UnitSegment& s) const { return s.experts ? *ecomm_ : comm_; }
    static void wait_all(std::vector<Pending>& hs);
    void* alloc(size_t bytes);

    GPT& model_;
    Comm& comm_;
    Comm* ecomm_;  // the expert segments' group (comm_ when ep = 1)
    Backend& be_;
    const TensorTable& table_;
    Precision prec_;
    int stage_;
    int rank_, size_;
    // Stage 3: parameters of the embedding unit (used at both ends of the
    // model) and two rotating buffers for the others (current + prefetch).
    std::vector<UnitBuffer> param_bufs_;
    // Stages 2 and 3: gradients of the embedding unit (complete only at the
    // end of backward) and two rotating buffers for the others.
    std::vector<UnitBuffer> grad_bufs_;
    std::vector<Pending> pending_;  // stages 0 and 1: gradient reductions in flight
    std::vector<void*> owned_;
    size_t comm_bytes_ = 0;
};
