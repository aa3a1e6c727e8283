// llmc/data_parallel.h: data parallelism and ZeRO stages 0-3 over the
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
// flight) into the rank's shard. Stage 3 gathers a unit's parameters just
// before its forward and again before its backward, prefetching the next
// unit while the current one computes, and frees them after use.
#pragma once
#include <vector>

#include "comm.h"
#include "gpt.h"
#include "optimizer.h"

class PipelineParallel;

class DataParallel : public UnitProvider {
  public:
    // The model must have been built with Sharding::for_zero(stage, comm.size(), comm.rank()).
    // tp: the tensor-parallel group, for the global gradient norm (null: none).
    // pp: the pipeline, whose stages tie the embedding gradients and sum
    // the gradient norm (null: none).
    DataParallel(GPT& model, Comm& comm, int zero_stage, Comm* tp = nullptr, PipelineParallel* pp = nullptr);
    ~DataParallel() override;

    int stage() const { return stage_; }
    // Says whether the coming backward is the last micro-step of the step
    // (stages 0 and 1 communicate only then).
    void set_last_micro_step(bool last) { last_micro_ = last; }
    // Finishes the step: waits for the reductions in flight, sums the tied
    // embedding gradients of the first and last pipeline stage, measures the
    // global gradient norm from the shards (over all stages), clips, runs
    // AdamW on this rank's part and (stages 1, 2) all-gathers the updated
    // parameters. Returns the norm before clipping.
    double step(const OptimConfig& o, int step);
    // Bytes of the communication buffers (units in flight), for the report.
    size_t comm_buffer_bytes() const { return comm_bytes_; }

    // UnitProvider
    void prefetch(int unit) override;
    const void* acquire(int unit) override;
    void release(int unit) override;
    void* grads(int unit) override;
    void grads_done(int unit) override;

  private:
    // A buffer holding one whole unit (parameters gathered for stage 3, or
    // gradients in flight for stages 2 and 3).
    enum State { Free, Gathering, InUse, Reducing };
    struct UnitBuffer {
        void* data = nullptr;
        int unit = -1;              // unit held, -1 when free
        State state = Free;
        CommHandle pending = 0;     // the gather or reduce-scatter in flight
        void* shard_tmp = nullptr;  // reduce-scatter output (gradients)
    };
    UnitBuffer* find(std::vector<UnitBuffer>& pool, int unit);
    UnitBuffer* take_free(std::vector<UnitBuffer>& pool, int unit);
    void start_gather(UnitBuffer& b, int unit);
    void finish_grad_reduce(UnitBuffer& b);
    void flush();
    void* shard_ptr(void* buf, DType t, int unit) const;
    void* alloc(size_t bytes);
    double grad_sum_squares();
    void owned_range(int unit, size_t* lo, size_t* hi, size_t* at) const;

    GPT& model_;
    Comm& comm_;
    Comm* tp_;
    PipelineParallel* pp_;
    Backend& be_;
    const TensorTable& table_;
    Precision prec_;
    int stage_;
    int rank_, size_;
    bool last_micro_ = true;
    // Stage 3: parameters of the embedding unit (used at both ends of the
    // model) and two rotating buffers for the others (current + prefetch).
    std::vector<UnitBuffer> param_bufs_;
    // Stages 2 and 3: gradients of the embedding unit (complete only at the
    // end of backward) and two rotating buffers for the others.
    std::vector<UnitBuffer> grad_bufs_;
    std::vector<CommHandle> pending_;  // stages 0 and 1: gradient reductions in flight
    std::vector<void*> owned_;
    size_t comm_bytes_ = 0;
};
