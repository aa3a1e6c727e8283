// llmc/model/tensor_parallel.h: tensor parallelism (Megatron-LM) and sequence
// parallelism over the tp group. Which slices of which tensors a rank holds
// is in the tensor table (tensors.h); this file holds every collective the
// tp group issues.
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

class TensorParallel {
  public:
    TensorParallel(Comm& group, bool sequence_parallel) : comm_(group), sp_(sequence_parallel) {}
    int size() const { return comm_.size(); }
    int rank() const { return comm_.rank(); }
    bool sp() const { return sp_; }
    Comm& comm() { return comm_; }
    // Tokens (rows) of the residual stream held here, of N.
    int local_tokens(int N) const { return sp_ ? N / size() : N; }

    // f before a column-parallel layer. Forward: returns the layer's input,
    // all N rows (SP: gathered from each rank's `local` rows into `full`).
    const void* f_forward(const void* local, void* full, size_t row_elems, int N, DType t);
    // Backward: `dfull` holds this rank's partial gradient for all N rows.
    // Returns the gradient of f's input (TP: all-reduced in place; SP: the
    // rank's rows, reduce-scattered into `dlocal`).
    void* f_backward(void* dfull, void* dlocal, size_t row_elems, int N, DType t);
    // g after a row-parallel layer. Forward: `partial` holds this rank's
    // partial output for all N rows; returns the reduced output (TP: all
    // rows, in place; SP: the rank's rows, in `local`).
    void* g_forward(void* partial, void* local, size_t row_elems, int N, DType t);
    // Backward: returns the gradient for all N rows (SP: gathered into `dfull`).
    const void* g_backward(const void* dlocal, void* dfull, size_t row_elems, int N, DType t);

    // Sums a partial gradient of a replicated parameter over the group (SP).
    void sum(void* x, size_t n, DType t) { comm_.all_reduce(x, n, t, ReduceOp::Sum); }
    // The three reductions of the vocab-parallel cross-entropy.
    void max(void* x, size_t n, DType t) { comm_.all_reduce(x, n, t, ReduceOp::Max); }

  private:
    Comm& comm_;
    bool sp_;
};
