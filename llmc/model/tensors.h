// llmc/model/tensors.h: the one table that describes every parameter tensor.
//
// Parameters, gradients, master weights and Adam m/v each live in one flat
// buffer with the same layout; this table says where each tensor lives in
// it (offset, shape, weight decay or not) and where it lives in an llm.c
// model file. Everything that walks the parameters (I/O, init, optimizer,
// and later the partitioning of ZeRO and tensor parallelism) iterates this
// table; no code finds a tensor by a literal index.
//
// Memory order is unit-major: unit 0 holds the embeddings (wte, wpe), units
// 1..L hold one transformer block each, unit L+1 the final LayerNorm. A unit
// is one contiguous range, so a layer's parameters or gradients can move in
// one collective. The model file keeps llm.c's tensor-major order
// (wte, wpe, ln1w for all layers, ln1b for all layers, ...).
//
// Tensor parallel (degree tp, docs/design.md section 3): each rank's table holds
// its local slice of every tensor. QKV is split by whole heads (the rank's
// rows of Q, of K and of V), attproj and fcproj by input columns (row-
// parallel), fc by output rows (column-parallel), wte by vocabulary rows
// (Vp rounded up to a multiple of tp; rows past Vp are zero padding that the
// model file does not hold). LayerNorms, wpe and the row-parallel biases are
// replicated. An entry maps its local rows and columns to the file's.
//
// Sharding (ZeRO over `shards` data-parallel ranks): every unit is padded
// with zeros to a multiple of `shards` elements and split into equal
// contiguous slices, rank r owning slice r of every unit. A rank's shard
// buffer is its slices of all units, one after another. Padding elements
// exist in every flat buffer, are zero, and are never read by the model.
//
// Expert parallel (Mixtral, degree ep, docs/moe.md): the expert kinds hold
// only this ep rank's experts, which the other ep ranks of the dp group do
// not share. A block unit then has two segments: its dense tensors (padded
// and sliced over the `shards` dp ranks as above) and, last, its expert
// tensors (padded and sliced over the `expert_shards` ranks of the
// expert-data group, which hold the same experts). Every other unit, and
// every unit when ep = 1, is one segment. A rank's shard of a unit is its
// slice of each segment, one after the other.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "llmc/model/config.h"

// The kinds of parameter tensor, in the file's order. GPT-2 has all but
// lm_head; Llama has wte, ln1w (RMSNorm), qkvw, attprojw (o_proj), ln2w,
// fcw (gate and up, stacked), fcprojw (down), lnfw and, when untied,
// lm_head; Qwen2 has Llama's and qkvb. The canonical file order of a
// model (llm.c's for GPT-2; the same rule for Llama) is its kinds in this
// order, each per-layer kind stacked over the layers. Fused kinds stack
// their parts by rows:
//   qkvw  [Q heads (NH·HS); K heads (NKV·HS); V heads (NKV·HS)] x C
//   qkvb  the same rows, one column (GPT-2 and Qwen2's Q, K, V biases;
//         split by whole heads under tp as qkvw's rows are)
//   fcw   GPT-2 [4C] x C; Llama [gate (F); up (F)] x C
// Mixtral (docs/moe.md) has Llama's kinds with the MoE block's three for
// fcw and fcprojw; its expert kinds stack the E experts by rows, expert
// e's rows contiguous (an expert dimension first):
//   moe_gate  the router, E x C
//   moe_fc    [expert 0: w1 (F); w3 (F); expert 1: ...] x C  (E·2F rows)
//   moe_proj  [expert 0: w2 (C rows); expert 1: ...] x F     (E·C rows)
enum class Param : int {
    wte, wpe,
    ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
    ln2w, ln2b, fcw, fcb, fcprojw, fcprojb,
    moe_gate, moe_fc, moe_proj,
    lnfw, lnfb,
    lm_head,
    count
};

// Static facts of a kind of tensor.
struct ParamKind {
    Param id;
    const char* name;
    bool per_layer;  // one tensor per block (file stores them stacked as (L, ...))
    bool experts;    // rows are E experts' blocks of rows, one after another (Mixtral)
    bool decay;      // weight decay applies (2-D tensors only)
    Param bias;      // the bias that goes with this weight (a norm's shift, a linear's bias); Param::count: none
};
const ParamKind& param_kind(Param p);
// The bias of a weight kind (ln1w -> ln1b, qkvw -> qkvb, ...), or
// Param::count when the kind has none.
inline Param bias_of(Param weight) { return param_kind(weight).bias; }

// The unit of block l (units: 0 the embeddings, 1 + l block l, L + 1 the
// final norm).
inline int block_unit(int layer) { return layer + 1; }

// Local rows [local, local + count) are the file tensor's rows
// [global, global + count).
struct RowRun {
    size_t local, global, count;
};

// One tensor instance: a kind at a layer (layer 0 for non-layer kinds).
struct TensorEntry {
    Param kind;
    int layer;
    int unit;            // 0 embeddings, 1..L blocks, L+1 final LayerNorm
    size_t rows, cols;   // local shape (out, in) for matrices; (n, 1) for vectors
    size_t numel;        // rows * cols
    size_t offset;       // element offset in the flat buffers
    size_t file_offset;  // where the whole (global) tensor starts in the model file's payload
    size_t file_rows, file_cols;  // shape of the global tensor
    size_t col_begin;    // global column of local column 0
    std::vector<RowRun> runs;  // local rows held in the file (vocabulary padding rows are not)
    bool split;          // differs across tensor-parallel ranks (else replicated)
    bool tied_copy;      // the last pipeline stage's copy of the embedding unit (owned by the first stage)
    bool decay;
    std::string name() const;  // e.g. "h3.qkvw" or "wte"
};

// Which units a pipeline stage holds (docs/design.md section 7): its
// blocks, the embedding unit when it runs the embeddings (first stage) or
// the tied LM head (last stage: a copy, so both ends shard it alike and
// their gradients can be summed slice by slice), and the final LayerNorm on
// the last stage. Units not held take no room in the flat buffers (size 0);
// the numbering of units stays the whole model's.
struct StageUnits {
    std::vector<bool> held;       // one per unit (L + 2); empty: every unit
    bool embedding_copy = false;  // unit 0 here is a copy of the first stage's
};

// How one rank's table is cut from the whole model's: the parallel degrees
// and this rank's place along each (llmc/parallel/model_stack.h derives it
// from the run's layout). The default is the whole model in one process.
struct TableSplit {
    int shards = 1;          // units padded to a multiple of this (ZeRO's data-parallel ranks)
    int tp = 1, tp_rank = 0;  // tensor parallel
    StageUnits stage;        // the units this pipeline stage holds
    int ep = 1, ep_rank = 0;  // expert parallel
    int expert_shards = 1;   // expert segments padded to a multiple of this (ep > 1)
};

// Which flat buffers a rank holds only its shard of (ZeRO stage 1: the
// optimizer state; 2: and gradients; 3: and parameters). Sharded buffers hold
// TensorTable::shard_total elements, the others TensorTable::total.
struct Sharding {
    int shards = 1;  // data-parallel ranks the units are split over
    int rank = 0;    // this rank's slice
    bool params = false, grads = false, optimizer = false;
    // Expert parallel: the ranks the expert segments are split over (the
    // expert-data group) and this rank's slice of them.
    int expert_shards = 1, expert_rank = 0;
    static Sharding for_zero(int stage, int shards, int rank, int expert_shards = 1, int expert_rank = 0) {
        Sharding s{shards, rank, stage >= 3, stage >= 2, stage >= 1};
        s.expert_shards = expert_shards;
        s.expert_rank = expert_rank;
        return s;
    }
};

// A contiguous range of a unit whose slices belong to the ranks of one
// group: the data-parallel group (dense) or the expert-data group (experts).
struct UnitSegment {
    size_t begin = 0;        // first flat-buffer element
    size_t size = 0;         // elements, padded to a multiple of shards
    size_t shard_begin = 0;  // this segment's slice in a shard buffer
    int shards = 1;
    bool experts = false;
    size_t slice_size() const { return size / shards; }
    size_t slice_begin(int r) const { return begin + (size_t)r * slice_size(); }  // rank r's slice
};

struct TensorTable {
    GPTConfig cfg;
    int tp = 1, tp_rank = 0;            // tensor-parallel degree and this rank's index
    int heads = 0;                      // attention heads on this rank (NH / tp)
    int kv_heads = 0;                   // key/value heads on this rank (NKV / tp)
    int hidden = 0;                     // MLP hidden width on this rank (4C or F, / tp; an expert's for Mixtral)
    int vocab_rows = 0;                 // wte rows on this rank: ceil(Vp / tp)
    int vocab_begin = 0;                // global id of this rank's first wte row
    // Expert parallel (Mixtral, docs/moe.md): the expert kinds (ParamKind::
    // experts) hold experts [expert_begin, expert_begin + experts) only, cut
    // before tp's split of each expert; the router stays whole.
    int ep = 1, ep_rank = 0;
    int experts = 0;                    // experts on this rank (E / ep)
    int expert_begin = 0;               // global index of this rank's first expert
    int expert_shards = 1;              // expert segments padded to a multiple of this (ep > 1)
    size_t file_params = 0;             // parameters in a model file (the whole model)
    int shards = 1;                     // units padded to a multiple of this
    StageUnits stage;                   // units held by this pipeline stage
    std::vector<TensorEntry> entries;   // in memory order
    std::vector<size_t> unit_begin;     // unit u occupies [unit_begin[u], unit_begin[u+1]) (padded)
    std::vector<size_t> unit_used;      // elements of unit u before its padding
    std::vector<size_t> shard_begin;    // unit u's slices start here in a shard buffer
    std::vector<std::vector<UnitSegment>> segments;  // unit u's segments (one; two for ep's blocks)
    size_t total = 0;                   // elements in a flat buffer (padding included)
    size_t params = 0;                  // elements of this rank's tensors (no unit padding)
    size_t shard_total = 0;             // elements in one rank's shard buffer

    explicit TensorTable(const GPTConfig& c, const TableSplit& split = TableSplit());
    const TensorEntry& get(Param p, int layer = 0) const;
    // Whether the entry holds only this ep rank's experts (ep > 1).
    bool ep_split(const TensorEntry& e) const { return ep > 1 && param_kind(e.kind).experts; }
    bool has(Param p, int layer = 0) const;  // whether this stage holds the tensor
    bool held(int u) const { return stage.held.empty() || stage.held[u]; }
    int num_units() const { return (int)unit_begin.size() - 1; }
    size_t unit_size(int u) const { return unit_begin[u + 1] - unit_begin[u]; }
    // Elements of a rank's shard of unit u (its slice of each segment).
    size_t shard_size(int u) const;
    // The segment holding flat element i of unit u.
    const UnitSegment& segment_of(int u, size_t i) const;

  private:
    std::vector<int> index_;  // (kind, layer) -> entry
};

// 12·L·C² + 13·L·C + (Vp + maxT)·C + 2C, docs/design.md section 1.
size_t gpt2_param_count(const GPTConfig& c);
// The parameters of any model (the sum of its kinds' shapes): a model file's
// or a checkpoint's element count.
size_t model_param_count(const GPTConfig& c);
// The parameters one token goes through: model_param_count less the experts
// a token is not routed to (of Mixtral's E experts' tensors only K/E count;
// the router counts whole). Equal to model_param_count without experts.
double active_param_count(const GPTConfig& c);
// The active parameters less an untied model's token embedding: its lookup
// reads V·C weights' rows and multiplies none (a tied wte is also the LM
// head's matrix, and counts). GPT-2's positions count, as llm.c counts them.
double matmul_param_count(const GPTConfig& c);
// Training FLOPs per token as llm.c counts them (docs/design.md section 10):
// 6 per weight of matmul_param_count plus 6·L·C·T for attention, so MFU
// figures compare; the trainer's MFU and the planner's both use it.
double train_flops_per_token(const GPTConfig& c, int T);
// Whether a kind belongs to the model's architecture.
bool kind_in_model(const GPTConfig& c, Param p);
