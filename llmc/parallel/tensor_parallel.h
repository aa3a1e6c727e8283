// llmc/parallel/tensor_parallel.h: tensor parallelism (Megatron-LM) and sequence
// parallelism over the tp group: the model's TensorParallelOps
// (llmc/model/parallel_hooks.h). Which slices of which tensors a rank holds
// is in the tensor table (llmc/model/tensors.h); this file holds every
// collective the tp group issues.
//
// Inside a block the tp group communicates only through Megatron's
// conjugate operators, around each column-parallel (QKV, fc) and
// row-parallel (attproj, fcproj) pair:
//
//   operator  plain TP (--tp)              TP + SP (--tp --sp)
//   f fwd     identity                     all-gather tokens  (N/t -> N rows)
//   f bwd     all-reduce d(input)          reduce-scatter     (N -> N/t rows)
//   g fwd     all-reduce partial output    reduce-scatter     (N -> N/t rows)
//   g bwd     identity                     all-gather tokens  (N/t -> N rows)
//
// With SP the residual stream, LayerNorms and residual adds hold only this
// rank's N/t tokens (rows r·N/t .. (r+1)·N/t of the flattened B·T), and the
// LayerNorm parameters' gradients, being sums over those tokens, are partial
// and summed over the group. The embedding and the LM head are vocabulary-
// parallel: partial embeddings are reduced (g), logits are never gathered,
// and the cross-entropy needs three small all-reduces (max, target logit,
// sum of exponentials).
#pragma once
#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/model/parallel_hooks.h"

class TensorParallel final : public TensorParallelOps {
  public:
    TensorParallel(Comm& group, bool sequence_parallel) : comm_(group), sp_(sequence_parallel) {}
    int size() const override { return comm_.size(); }
    int rank() const override { return comm_.rank(); }
    bool sp() const override { return sp_; }
    Comm& comm() { return comm_; }

    // Megatron's conjugate operators (parallel_hooks.h says what each returns).
    const void* f_forward(const void* local, void* full, size_t row_elems, int N, DType t) override;
    void* f_backward(void* dfull, void* dlocal, size_t row_elems, int N, DType t) override;
    void* g_forward(void* partial, void* local, size_t row_elems, int N, DType t) override;
    const void* g_backward(const void* dlocal, void* dfull, size_t row_elems, int N, DType t) override;

    void sum(void* x, size_t n, DType t) override { comm_.all_reduce(x, n, t, ReduceOp::Sum); }
    void max(void* x, size_t n, DType t) override { comm_.all_reduce(x, n, t, ReduceOp::Max); }

  private:
    Comm& comm_;
    bool sp_;
};
