// llmc/parallel/context_parallel.h: context parallelism, ring attention with
// load-balanced (zigzag) causal chunks over the cp group (docs/design.md
// section 5), the model's ContextParallelOps (llmc/model/parallel_hooks.h).
// This file holds every collective the cp group issues and the
// rule that splits a sequence over its ranks.
//
// Sharding: each sequence of T tokens is cut into 2c chunks of T/(2c); rank
// i holds chunks i and 2c-1-i, in that order, as its local sequence of
// T/c tokens. Inputs and targets (already shifted on the full sequence) are
// sharded with the same permutation; position embeddings use the global
// positions. Everything but attention runs on the local tokens with no
// communication; gradients are reduced over dp × cp by the data-parallel
// mode (wpe's are partial per rank until then).
//
// Ring attention, forward: c steps; at step s the rank holds the K,V block
// of rank j = i - s (mod c), sends it on to i+1 and receives the next from
// i-1 while it computes. Zigzag makes every step half a block of work:
//   s = 0        local causal attention (local order is global order);
//   j < i        all local queries against the first half of the block;
//   j > i        the second half of the local queries against the whole block.
// Partial results merge by log-sum-exp into fp32 accumulators.
// Backward: the ring again with the final output and global lse; dQ
// accumulates locally, dK/dV accumulators (fp32) travel with their block and
// reach their owner after c hops.
//
// --cp-impl a2a (DeepSpeed-Ulysses) keeps the same sharding and instead
// trades sequence shards for head shards around attention with two
// all-to-alls (llmc/parallel/context_parallel_a2a.cpp has its picture).
// --cp-impl hybrid (all-to-all inside groups of N consecutive cp ranks, the
// ring across the c/N groups) runs the all-to-all over its group and, in
// the head layout, this same ring over the ranks that hold the same heads
// in every group: the group's zigzag chunks, placed in global order, are
// chunks g and 2c/N-1-g of a sequence cut into 2c/N, a ring rank's shard.
// Document mask: each step's block gets the queries' document starts (global
// positions) and the global positions of the block's keys (those of rank j,
// held here for every j), so a query sees a key of another rank only when it
// is in the query's document; the attention op skips the tiles, and so a
// whole block, whose keys are all before the documents of their queries. The
// ring's transfers are the same with or without the mask (every step still
// passes its block on).
#pragma once
#include <memory>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/model/parallel_hooks.h"

class ContextParallel final : public ContextParallelOps {
  public:
    // B rows of T_local = T/c tokens; Cl attention channels (NHl heads of HS)
    // held by this rank (after tensor parallelism), and NKVl key/value heads
    // (grouped-query attention; 0: NHl). The model's QKV rows are [Q (NHl
    // heads) | K (NKVl) | V (NKVl)]; the travelling blocks carry K and V.
    // a2a_group: the all-to-all's ranks, null for the ring alone; the cp
    // group itself for --cp-impl a2a (Ulysses); N < c consecutive cp ranks
    // for --cp-impl hybrid, with ring_group the c/N ranks of the same place
    // in every group. N must divide NHl and NKVl (std::invalid_argument
    // naming the flag otherwise).
    ContextParallel(Comm& group, Backend& be, int B, int T_local, int NHl, int HS, int NKVl = 0,
                    Comm* a2a_group = nullptr, Comm* ring_group = nullptr);
    ~ContextParallel();
    int size() const override { return comm_.size(); }
    int rank() const override { return comm_.rank(); }
    Comm& comm() { return comm_; }
    size_t buffer_bytes() const { return bytes_ + (ring_ ? ring_->buffer_bytes() : 0); }

    // The global positions of this rank's T/c tokens, for a sequence of T.
    static std::vector<int> positions(int T, int c, int rank);
    // This rank's tokens of nrows full rows of T (host int32, [nrows, T] ->
    // [nrows, T/c]).
    void shard_rows(const int* full, int nrows, int T, int* local) const;

    // Ring attention on the local tokens of B rows: qkv [B·Tl, Cl + 2·Ckv] (Q,
    // K, V heads as the model lays them out), out [B·Tl, Cl], lse [B, NHl, Tl].
    // docs: the local tokens' document starts ([B, Tl], backend memory;
    // null: no document mask; set_document_mask() first).
    void attention_forward(void* out, void* lse, const void* qkv, int B, double scale,
                           const int* docs = nullptr) override;
    // dqkv (overwritten) from dout, with qkv, out and lse of the forward.
    void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse, int B,
                            double scale, const int* docs = nullptr) override;
    // Sums over the cp group (a logits row, the MoE routing statistics).
    void sum(void* x, size_t n, DType t) override { comm_.all_reduce(x, n, t, ReduceOp::Sum); }
    double host_sum(double x) override { return comm_.host_all_reduce(x, ReduceOp::Sum); }
    void max(void* x, size_t n, DType t) override { comm_.all_reduce(x, n, t, ReduceOp::Max); }
    // Holds the global positions of every rank's tokens (the key positions
    // of the document mask) for sequences of T = c·T_local.
    void set_document_mask();

  private:
    // The shape of step s's block (see the header comment), with pointers
    // advanced to the rows it covers.
    struct Block {
        AttnShape shape;
        size_t q_off, kv_off, o_off, lse_off;  // element offsets of the first row
    };
    Block block(int s, int B, double scale, const int* docs) const;
    void* alloc(size_t bytes);

    // All-to-all (context_parallel_a2a.cpp).
    struct Seg;
    void a2a_alloc();
    void all_to_all(size_t block_elems);
    void to_heads(const void* src, size_t ld, const std::vector<Seg>& segs, void* full, int B);
    void to_tokens(const void* full, const std::vector<Seg>& segs, void* dst, size_t ld, int B);
    AttnShape a2a_shape(int B, double scale) const;
    std::vector<Seg> qkv_segs() const;
    const int* whole_docs(const int* docs, int B);
    void a2a_forward(void* out, void* lse, const void* qkv, int B, double scale, const int* docs);
    void a2a_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse, int B,
                      double scale, const int* docs);

    Comm& comm_;
    Comm* xc_ = nullptr;  // the all-to-all's group (a2a and hybrid)
    // hybrid: the ring over the groups, on the head layout (B rows of N·T_local
    // tokens, NHl/N heads)
    std::unique_ptr<ContextParallel> ring_;
    Backend& be_;
    Precision prec_;
    int B_, Tl_, NHl_, HS_, Cl_;
    int NKVl_, Ckv_, W_;  // key/value heads, their channels, a QKV row's width
    void* kv_[2];        // K,V blocks [B·Tl, 2·Ckv] (act): held and arriving
    void* dkv_[2];       // their dK,dV accumulators (stat)
    void* out_acc_;      // [B·Tl, Cl] (stat)
    void* dqkv_acc_;     // [B·Tl, W] (stat)
    bool a2a_ = false;
    // a2a: the exchange's send and receive blocks ([B·Tl, W] each), and the
    // head layout's Q,K,V, output, their gradients ([B, N·Tl, W/N], [B, N·Tl,
    // Cl/N] for a group of N).
    void *send_ = nullptr, *recv_ = nullptr, *fqkv_ = nullptr, *fdqkv_ = nullptr, *fo_ = nullptr, *fdo_ = nullptr;
    int *docs_gather_ = nullptr, *docs_full_ = nullptr;  // a2a with the document mask: [N·B·Tl], [B, N·Tl]
    std::vector<int*> key_pos_;  // per rank j: the global positions of its T_local tokens (document mask)
    std::vector<void*> owned_;
    size_t bytes_ = 0;
};
