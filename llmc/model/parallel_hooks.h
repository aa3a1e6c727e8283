// llmc/model/parallel_hooks.h: every call the model makes to a parallel
// mode, declared here by the model and implemented in llmc/parallel/ (one
// file per mode), so that the model holds no parallel code and names no
// collective: it calls these hooks at the points of its forward and
// backward where a mode must act, and a null hook (or one over a single
// rank) means the mode is off.
//
//   TensorParallelOps   Megatron's conjugate f and g operators around each
//                       column-/row-parallel pair, and the sums of the
//                       vocabulary-parallel head and of sequence-parallel
//                       partial gradients (llmc/parallel/tensor_parallel.h)
//   ContextParallelOps  the attention core over a sequence shard: ring,
//                       all-to-all or both (llmc/parallel/context_parallel.h)
//   ExpertParallelOps   the MoE block's exchange of grouped rows with the
//                       ranks holding their experts (llmc/parallel/expert_parallel.h)
//   UnitProvider        where a unit's parameters and gradients live, and
//                       when: ZeRO's gathers and the gradient reductions
//                       overlapped with the backward (llmc/parallel/data_parallel.h)
#pragma once
#include <cstddef>
#include <vector>

#include "llmc/base/dtype.h"

// Tensor (and sequence) parallelism: the model's only contact with its tp
// group. Rows are the N = B·T tokens of a micro-batch; with sequence
// parallelism the residual stream holds N/t of them on each rank.
class TensorParallelOps {
  public:
    virtual ~TensorParallelOps() {}
    virtual int size() const = 0;
    virtual int rank() const = 0;
    virtual bool sp() const = 0;
    // Tokens (rows) of the residual stream held here, of N.
    int local_tokens(int N) const { return sp() ? N / size() : N; }
    // f before a column-parallel layer. Forward: returns the layer's input,
    // all N rows (SP: gathered from each rank's `local` rows into `full`).
    virtual const void* f_forward(const void* local, void* full, size_t row_elems, int N, DType t) = 0;
    // Backward: `dfull` holds this rank's partial gradient for all N rows.
    // Returns the gradient of f's input (TP: summed in place; SP: the rank's
    // rows, into `dlocal`).
    virtual void* f_backward(void* dfull, void* dlocal, size_t row_elems, int N, DType t) = 0;
    // g after a row-parallel layer. Forward: `partial` holds this rank's
    // partial output for all N rows; returns the summed output (TP: all rows,
    // in place; SP: the rank's rows, in `local`).
    virtual void* g_forward(void* partial, void* local, size_t row_elems, int N, DType t) = 0;
    // Backward: returns the gradient for all N rows (SP: gathered into `dfull`).
    virtual const void* g_backward(const void* dlocal, void* dfull, size_t row_elems, int N, DType t) = 0;
    // Element-wise sum / max of x over the group, in place: partial
    // gradients of replicated parameters (SP), the vocabulary-parallel
    // cross-entropy's reductions, a logits row assembled from its slices.
    virtual void sum(void* x, size_t n, DType t) = 0;
    virtual void max(void* x, size_t n, DType t) = 0;
};

// Context parallelism: the attention core of B rows of this rank's T/c
// tokens (a shard of each sequence; the rest of the block runs on the local
// tokens alone). qkv [B·Tl, Cl + 2·Ckv] as the model lays it out, out
// [B·Tl, Cl], lse [B, NHl, Tl]; docs: the local tokens' document starts
// ([B, Tl], backend memory; null: no document mask).
class ContextParallelOps {
  public:
    virtual ~ContextParallelOps() {}
    virtual int size() const = 0;
    virtual int rank() const = 0;
    virtual void attention_forward(void* out, void* lse, const void* qkv, int B, double scale,
                                   const int* docs = nullptr) = 0;
    // dqkv (overwritten) from dout, with qkv, out and lse of the forward.
    virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                                    int B, double scale, const int* docs = nullptr) = 0;
    // Element-wise sum of x over the group, in place (a logits row assembled
    // from the rank that holds it), and of a host value (the MoE block's
    // routing statistics of a whole micro-batch); and the element-wise max
    // (an FP8 operand's amax over the sequence's pieces, docs/fp8.md).
    virtual void sum(void* x, size_t n, DType t) = 0;
    virtual double host_sum(double x) = 0;
    virtual void max(void* x, size_t n, DType t) = 0;
};

// Expert parallelism (Mixtral): each rank of the ep group holds E/ep of a
// block's experts and routes its own tokens; the MoE block sends its
// grouped rows to their experts' ranks and takes the outputs back.
class ExpertParallelOps {
  public:
    virtual ~ExpertParallelOps() {}
    virtual int size() const = 0;
    virtual int rank() const = 0;
    virtual int local_experts() const = 0;
    // One block's exchange for one micro-batch.
    struct Route {
        std::vector<size_t> send_rows, recv_rows;  // per peer
        std::vector<int> block_rows;               // [peer][local expert]: the expert side's blocks, in order
        size_t expert_rows = 0;                    // rows on the expert side (the sum of recv_rows)
    };
    // offsets: this rank's grouped rows per expert (E + 1 prefix sums, host).
    virtual void plan(const std::vector<int>& offsets, Route* r) = 0;
    // rows of `width` elements of type t: token side -> expert side.
    virtual void dispatch(const void* grouped, void* expert_side, const Route& r, size_t width, DType t) = 0;
    // expert side -> token side (the inverse of dispatch).
    virtual void combine(const void* expert_side, void* grouped, const Route& r, size_t width, DType t) = 0;
};

// Where the model finds a unit's parameters and puts its gradients, and
// when. The model calls these around every unit it computes (units: 0
// embeddings, 1..L blocks, L+1 final LayerNorm; see tensors.h), so a
// parallel mode can gather parameters just in time (ZeRO-3) and reduce each
// unit's gradients as soon as its backward is done, overlapped with the
// backward of the units below. Pointers are to the unit's first element,
// laid out as in the table (element i of the unit at unit_begin[u] + i).
class UnitProvider {
  public:
    virtual ~UnitProvider() {}
    virtual void prefetch(int unit) { (void)unit; }  // a hint: acquire(unit) comes soon
    virtual const void* acquire(int unit) = 0;       // parameters, ready for compute
    virtual void release(int unit) = 0;
    virtual void* grads(int unit) = 0;  // gradients of this micro-step accumulate here
    // The unit's gradients of this micro-step are complete; last_micro_step:
    // this was the last micro-step of the optimizer step (the unit's
    // gradients of the whole step are complete too).
    virtual void grads_done(int unit, bool last_micro_step) = 0;
    // Whether, during a forward (backward = false) or a backward of a
    // micro-step, the calls above only hand out fixed pointers: no
    // communication, no waiting, no buffer taken from a pool. Then the pass
    // holds device work only and may be a recorded region (backend.h).
    virtual bool quiet(bool backward, bool last_micro_step) const {
        (void)backward, (void)last_micro_step;
        return false;
    }
};
