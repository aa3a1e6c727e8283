// llmc/model/gpt.h: the model, GPT-2 or Llama (one code for both; the
// tensor table says which tensors an architecture has): its flat buffers
// (parameters, gradients, master weights, Adam m and v, all laid out by the
// tensor table), its activations, and a forward and backward pass written
// once against the Backend interface, so the same code runs on the CPU and
// on CUDA. The class is implemented in six files by job: buffers.cpp (the
// buffers and the units' parameters), weights.cpp (weights in file order,
// initialisation), forward.cpp, backward.cpp, head.cpp (the LM head and
// its cross-entropy, whole or in row chunks) and decode.cpp (generation's
// forward of new tokens against a KV cache, llmc/model/kv_cache.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/model/config.h"
#include "llmc/model/context_parallel.h"
#include "llmc/model/expert_parallel.h"
#include "llmc/model/tensor_parallel.h"
#include "llmc/model/tensors.h"

// Which flat buffers a rank holds only its shard of (ZeRO stage 1: the
// optimizer state; 2: and gradients; 3: and parameters). Sharded buffers hold
// TensorTable::shard_total elements, the others TensorTable::total.
struct Sharding {
    int shards = 1;  // data-parallel ranks the units are split over
    int rank = 0;    // this rank's slice
    bool params = false, grads = false, optimizer = false;
    // Expert parallel: the ranks the expert segments are split over (the
    // expert-data group, tensors.h) and this rank's slice of them.
    int expert_shards = 1, expert_rank = 0;
    static Sharding for_zero(int stage, int shards, int rank, int expert_shards = 1, int expert_rank = 0) {
        Sharding s{shards, rank, stage >= 3, stage >= 2, stage >= 1};
        s.expert_shards = expert_shards;
        s.expert_rank = expert_rank;
        return s;
    }
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

// What a block keeps from its forward for its backward (--recompute):
//   none       everything the backward reads;
//   gelu       all but the GELU output, recomputed from its input (llm.c -r 1);
//   selective  also not the attention core's output and log-sum-exp,
//              recomputed from Q, K, V (Megatron's selective recompute; the
//              T x T scores it drops are never stored here, so its analogue
//              is the core's output);
//   full       only the block's input; the whole block runs forward again in
//              its backward, into one block's working set.
// In elements of B·T·C per block (activations, statistics aside): 16, 12,
// 11 and 1.
enum class Recompute { none, gelu, selective, full };
// "none", "gelu", "selective", "full" (and "0" = none, "1" = gelu).
bool parse_recompute(const std::string& s, Recompute* r);
const char* recompute_name(Recompute r);

// The part of the model a pipeline stage runs (llmc/parallel/pipeline_parallel.h
// plans it): model chunks of consecutive blocks; the chunk that starts the
// model begins with the embeddings, the one that ends it finishes with the
// final LayerNorm and the LM head. Each chunk keeps the activations of up to
// `slots` micro-batches at once (those in flight in the schedule). The
// default is the whole model as one chunk of one slot.
struct ModelChunk {
    int first_layer = 0, layers = 0;
    bool embed = false, head = false;
    int slots = 1;
};

// A named backend allocation, for the memory report.
struct BufferInfo {
    std::string group;  // "params", "grads", "master", "optimizer", "activations", "scratch"
    std::string name;
    size_t bytes;
    bool per_layer;     // one slice per transformer block (kept from forward to backward)
};

struct KVCache;  // llmc/model/kv_cache.h

// --moe-balance bias's update (DeepSeek-V3) from a step's loads [L, E]
// (assignments per layer and expert, over the whole batch): every expert's
// bias moves by rate toward an even load, b_e += rate · sign(mean - load_e),
// the mean over the layer's E experts. And the loads' imbalance, the mean
// over layers of max_e load_e / mean - 1 (0: even; "MaxVio").
void moe_bias_update(std::vector<double>* bias, const std::vector<double>& loads, int E, double rate);
double moe_max_violation(const std::vector<double>& loads, int E);

class GPT {
  public:
    // Allocates every buffer for micro-batches of up to B rows of T tokens.
    // recompute: what each block keeps for its backward (see Recompute).
    // sharding: which flat buffers hold only this rank's shard (default: none).
    // tp: tensor (and sequence) parallelism; null for none. Under sequence
    // parallelism B·T must divide by the tp degree.
    // cp: context parallelism (ring attention); T is then the local sequence
    // length T/c and set_positions() gives the global positions.
    // chunks: what this pipeline stage runs (empty: the whole model).
    // head_chunk: 0 computes the LM head's logits for every row of every
    // micro-batch in flight at once; ROWS > 0 runs the head and its
    // cross-entropy in chunks of at most ROWS rows, the backward's head
    // products fused into the forward (head.cpp), so that only ROWS rows of
    // logits are ever held.
    // training false: no gradients and no Adam state (generation: the
    // weights and the forward only); backward and a forward with a loss
    // gradient then refuse.
    GPT(Backend* be, const GPTConfig& cfg, int B, int T, Recompute recompute = Recompute::none,
        const Sharding& sharding = Sharding(), TensorParallel* tp = nullptr, ContextParallel* cp = nullptr,
        const std::vector<ModelChunk>& chunks = {}, int head_chunk = 0, bool training = true,
        ExpertParallel* ep = nullptr);
    ~GPT();
    GPT(const GPT&) = delete;
    GPT& operator=(const GPT&) = delete;

    const GPTConfig& config() const { return cfg_; }
    const TensorTable& table() const { return table_; }
    Backend& backend() { return *be_; }
    const Precision& precision() const { return prec_; }
    int max_B() const { return B_; }
    int max_T() const { return T_; }
    int head_chunk() const { return head_chunk_; }  // rows per LM-head chunk (0: whole)

    const Sharding& sharding() const { return sharding_; }
    // Parallel modes install their provider; null restores the local one
    // (whole buffers, nothing to wait for; only valid without sharding).
    void set_provider(UnitProvider* p);

    // Flat buffers (backend memory); master is null without mixed precision,
    // grads, adam_m and adam_v in a model built with training = false.
    // Sharded buffers hold this rank's slices only (see Sharding).
    void* params() { return params_; }
    void* grads() { return grads_; }
    void* master() { return master_; }
    void* adam_m() { return m_; }
    void* adam_v() { return v_; }
    // The buffer that holds full-precision weights: master if any, else params.
    void* weights() { return master_ ? master_ : params_; }
    DType weights_dtype() const { return prec_.has_master ? prec_.master : prec_.param; }
    // The parameters of a tensor in a whole (unsharded) params buffer.
    void* param(Param p, int layer = 0);

    // GPT-2 initialisation, deterministic for a seed and independent of the
    // memory layout: values are drawn tensor by tensor in model-file order.
    void init_random(uint64_t seed);
    // Host arrays in model-file order <-> this rank's part of a flat buffer.
    // `sharded` says whether buf is a shard buffer. get_file_order writes only
    // the elements this rank holds and leaves the rest of host untouched.
    // Which tensors a walk over the buffers visits: all, or only those split
    // over (or only those replicated across) the tensor-parallel ranks.
    enum class Tensors { all, split, replicated };
    // `which` = split lets one rank of a tp group contribute the replicated
    // tensors when gathering.
    void get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t,
                        Tensors which = Tensors::all);
    void set_file_order(void* buf, bool sharded, DType buf_t, const void* host, DType src_t);
    // Sets every weight this rank holds (params, and master when present)
    // from host values of type t in model-file order.
    void set_weights_file_order(const void* host, DType t);
    // The same for the file elements [file_begin, file_end) only (one
    // tensor, say); host points at element file_begin.
    void set_file_range(void* buf, bool sharded, DType buf_t, const void* host, DType src_t, size_t file_begin,
                        size_t file_end);
    void set_weights_file_range(const void* host, DType t, size_t file_begin, size_t file_end);
    // Calls fn(file_offset, buffer_offset, n) for every run of elements this
    // rank owns of a flat buffer (sharded: its shard) when every element of
    // the model has exactly one owner: shards belong to their rank; a whole
    // buffer to the rank with whole_owner (dp x cp rank 0); tensors
    // replicated over tp to the rank with replicated_owner (tp rank 0); the
    // last pipeline stage's copy of the embeddings to nobody (the first
    // stage owns them). Runs come in memory order.
    // Under expert parallelism the ep ranks hold different experts: in whole
    // buffers an expert tensor belongs to expert_owner (the first rank of
    // its expert-data group), the other tensors to whole_owner.
    void for_each_owned(bool sharded, bool whole_owner, bool replicated_owner, bool expert_owner,
                        const std::function<void(size_t, size_t, size_t)>& fn) const;
    bool weights_sharded() const { return prec_.has_master ? sharding_.optimizer : sharding_.params; }

    // Forward over inputs (host int32 [B,T]); returns the mean loss over the
    // B·T targets when targets is non-null. With dloss != 0 the fused
    // classifier leaves dloss·(softmax - onehot) in the logits for backward
    // (the caller passes 1/(tokens in the global batch)). Whole models only
    // (one chunk holding the embeddings and the head).
    // docs: with the document mask on (set_document_mask), each local
    // token's document start (host int32 [B,T], document_starts()).
    double forward(const int* inputs, const int* targets, int B, int T, double dloss = 0.0,
                   const int* docs = nullptr);
    // Backward of the last forward (which must have had dloss != 0);
    // gradients accumulate (+=) into grads(). last_micro_step: whether this
    // is the optimizer step's last micro-step (told to the unit provider).
    void backward(bool last_micro_step = true);
    // Mixtral (docs/moe.md): the load-balancing loss of the last forward's
    // micro-batch (without its coefficient; 0 for other models and for a
    // model split into pipeline chunks), and the sum of it over the
    // forwards since the last call (which clears it).
    double aux_loss() const { return aux_last_; }
    double take_aux_sum() {
        const double s = aux_sum_;
        aux_sum_ = 0;
        return s;
    }
    // Mixtral over pipeline stages (docs/moe.md): the routing statistics of
    // this stage's blocks since the last call, [assignments per expert (E);
    // probability sums (E)], cleared; and the load-balancing gradient of the
    // micro-batch in chunk c's slot from its whole statistics (every
    // stage's, summed), for the chunk's next backward (the head chunk also
    // adds the micro-batch's loss to the sum above).
    std::vector<double> take_moe_stats();
    void set_moe_aux(int c, int slot, const std::vector<double>& stats, int N, double dloss);
    // Mixtral's experts' loads: with counting on, each training forward adds
    // its blocks' assignments per expert ([L, E], this stage's layers);
    // take_moe_loads returns them and clears them. Off for validation and
    // samples (and the pipeline's forward-only pass of the statistics).
    void count_moe_loads(bool on) { count_loads_ = on; }
    bool counting_moe_loads() const { return count_loads_; }
    std::vector<double> take_moe_loads();
    // --moe-balance bias (DeepSeek-V3): the per-layer, per-expert bias [L, E]
    // the routing adds to the probabilities for its choice of the K (not to
    // their weights); setting it turns it on.
    void set_moe_bias(const std::vector<double>& bias);
    // The load-balancing loss's coefficient for the rest of the run (0 under
    // --moe-balance bias).
    void set_aux_coef(double c) { cfg_.aux_coef = c; }

    // ---- model chunks (pipeline parallel) ----
    const std::vector<ModelChunk>& chunks() const { return chunks_; }
    // Elements of the activation that crosses a chunk boundary: the residual
    // stream of B·T tokens (this rank's N/tp under sequence parallelism).
    size_t boundary_elems() const;
    // Forward of chunk c on the micro-batch kept in `slot`. A chunk with the
    // embeddings reads token ids `inputs` (host); any other reads `x` (the
    // previous chunk's output, backend memory, boundary_elems() elements),
    // which is copied into the slot. The head chunk takes `targets` and
    // returns the mean loss (0 for other chunks or without targets).
    // With the document mask on, every chunk takes `docs` (as forward()) and
    // keeps them in the slot for its backward.
    double forward_chunk(int c, int slot, const int* inputs, const void* x, const int* targets, int B, int T,
                         double dloss = 0.0, const int* docs = nullptr);
    // Document masking (docs/attention.md): each token attends only to the
    // earlier tokens of its own document. Allocates the per-slot document
    // starts; from then on every forward needs its docs.
    void set_document_mask();
    bool document_mask() const;
    // The document start of each token of nrows rows of T tokens (host
    // int32): the position after the last EOT before it (a document ends with
    // its EOT), 0 if none.
    static void document_starts(const int* tokens, int nrows, int T, int eot, int* out);
    // The residual stream leaving chunk c for the micro-batch in `slot`
    // (valid until that slot's next forward). Not for the head chunk.
    const void* chunk_output(int c, int slot);
    // Backward of chunk c for the micro-batch in `slot`: dy is the gradient
    // of its output (null for the head chunk, which starts from its loss);
    // last_micro_step as for backward().
    void backward_chunk(int c, int slot, const void* dy, bool last_micro_step = true);
    // The gradient of the input of the chunk whose backward ran last (not
    // for the embedding chunk); valid until the next backward.
    const void* input_grad() const;
    void zero_grad();
    // Sequence parallel: sums unit's partial LayerNorm gradients (in the
    // unit's gradient buffer) over the tp group. Called by the parallel mode
    // right before it reduces the unit's gradients; a no-op otherwise.
    void sum_partial_grads(int unit, void* unit_grads);
    // Global position of each of the T local tokens (default 0..T-1).
    void set_positions(const std::vector<int>& pos);
    // Logits of row b at global position pos of the last forward, first V
    // columns, to host memory of type dt (before backward overwrote them
    // with gradients). Under tensor or context parallelism every rank of the
    // groups must call it (the row is assembled from the ranks that hold it).
    // With head_chunk > 0 a forward without targets computes the logits of
    // one chunk of rows only: the one holding the row named by
    // want_logits(b, pos) before it (default: the chunk of row 0).
    void logits_row(int b, int pos, void* out, DType dt);
    void want_logits(int b, int pos);
    // Generation (decode.cpp): the forward of n new tokens of one sequence
    // at positions kv.len .. kv.len+n-1, attending to the keys and values kv
    // holds for the earlier positions and to their own (causally), which it
    // then appends (kv.len += n). Writes the logits of the last new token,
    // first V columns, to host memory of type dt. n > 1 only into an empty
    // cache (the prompt's prefill). Whole models in one process only; uses
    // none of the model's activation buffers (B and T may be 1).
    void decode(KVCache& kv, const int* tokens, int n, void* logits, DType dt);
    // Activation bytes held (activations and their gradient scratch).
    size_t activation_bytes() const;
    // Bytes one transformer block keeps from its forward for its backward
    // (what docs/design.md section 4 counts per layer).
    size_t layer_activation_bytes() const;
    // Sum of squares of the tensor-parallel-replicated parameters this rank
    // holds: equal on every rank of a tp group while the replicas agree.
    double replicated_checksum();
    // Sum of squares of the parameters this rank holds of unit u (whole or
    // its shard): equal on the first and last pipeline stage while their
    // copies of the embedding unit agree.
    double unit_checksum(int u);

    const std::vector<BufferInfo>& buffers() const { return buffers_; }
    // The largest shapes this model passes to the backend's ops that need
    // temporary memory (Backend::reserve_workspace), from its B, T, tensor
    // table and slices; the optimizer's multi-run calls included.
    Workspace workspace() const;

  private:
    struct Acts;  // activation and scratch pointers, see activations.h
    struct LayerActs;  // one block's slices of them
    LayerActs layer_acts(int l, int slot, int N, int Ns);
    // Block l's forward from its input la.x up to the MLP's output (before
    // the last residual add, which the caller fuses with the next
    // LayerNorm); ln1 is computed here when norm_input, else it came fused
    // from the previous block. Also the recompute of the backward.
    void* block_forward(int l, const LayerActs& la, int B, int T, bool norm_input);
    void attention_core(const LayerActs& la, int B, int T);  // atty, lse from qkv
    // What differs between GPT-2 and Llama (forward.cpp): widths of the QKV and
    // fc outputs on this rank, optional tensors (biases: null for Llama),
    // the norm, the rotary embeddings, the MLP's activation.
    size_t qkv_width() const;
    size_t fch_width() const;
    const void* Pb(Param p, int layer = 0) const;
    void* Gb(Param p, int layer = 0);
    void norm(void* out, void* mean, void* rstd, const void* inp, Param w, int layer, int N);
    void residual_norm(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b, Param w,
                       int layer, int N);
    void norm_backward(void* dinp, const void* dout, const void* inp, const void* mean, const void* rstd, Param w,
                       int layer, int N);
    void rotate(void* qkv, int B, int T, bool inverse);
    void activation(void* h, const void* fch, int N);
    // Rows of fch and h: N; Mixtral's N·K grouped rows, under expert
    // parallelism the most this rank's experts can receive.
    int mlp_rows(int N) const {
        if (!cfg_.moe()) return N;
        return ep_ ? ep_->size() * N * std::min(cfg_.top_k, ep_->local_experts()) : N * cfg_.top_k;
    }
    // The rows the MoE block of layer-slot la's last forward gave its experts.
    int moe_expert_rows(const LayerActs& la, int N) const;
    // Mixtral's MoE block (moe.cpp) in place of the MLP: its forward from
    // the (gathered) norm output xin into the row-parallel output buffer,
    // its backward into the column-parallel input gradient, and the
    // load-balancing loss: statistics of each block's routing for the
    // micro-batch in chunk-slot s, then the loss and its gradient.
    void moe_forward(int l, const LayerActs& la, const void* xin, int N);
    void moe_backward(int l, const LayerActs& la, const void* dout, const void* xin, int N, const void* aux_grad);
    void moe_stats(int l, const LayerActs& la, int N, size_t s);
    void moe_aux(size_t s, int N, double dloss, bool count = true);
    std::vector<std::vector<int>> moe_offsets_;  // per layer-slot (and one scratch): the experts' row groups
    std::vector<ExpertParallel::Route> moe_routes_;  // expert parallel: per layer-slot, the exchange's sizes
    std::vector<std::vector<double>> moe_count_, moe_psum_;  // per chunk-slot [E]: assignments, probabilities
    double aux_last_ = 0, aux_sum_ = 0;
    std::vector<double> moe_load_;  // [L, E]: the training forwards' assignments since the last take
    bool count_loads_ = false, moe_bias_on_ = false;
    // The LM head of the head chunk's micro-batch in `slot` from its final
    // norm's output lnf (head.cpp): logits, and with targets the losses
    // (head_loss reads their mean); with dloss != 0 also the head's gradients, for the
    // backward (head_backward). Acquires and releases the head's units.
    void head_forward(const ModelChunk& ch, int slot, void* lnf, const int* tgt, bool has_targets, int N,
                      double dloss);
    // backward_chunk's device work (the recorded region), after its bookkeeping.
    void backward_ops(int c, int slot, bool last_micro_step);
    // The mean of the losses the last head forward left (a download).
    double head_loss(int N, double dloss);
    void head_forward_chunked(int slot, const void* in, const void* W, const int* tgt, bool has_targets, int N,
                              double dloss);
    // Losses of rows r0..r0+n-1 from their logits (and their gradient in
    // place when dloss != 0).
    void cross_entropy(void* logits, int r0, int n, const int* tgt, double dloss);
    // The head's backward: G(head) += its weight gradient; returns the
    // gradient of lnf's input rows to the head (all N rows, partial under tp).
    void* head_backward(int slot, const void* lnf, int N);
    // Runs ops, a forward or backward pass, as a recorded region (backend.h,
    // docs/design.md section 2.9) when the pass holds device work only: a
    // quiet unit provider (UnitProvider::quiet) and no tensor or context
    // parallelism (their collectives run between ops); otherwise runs them
    // as they come. The region's key is what makes two runs of it differ:
    // the model (region_model_, never reused: two models of one shape on one
    // backend hold different buffers), the pass, the chunk, the slot, the
    // shape and the loss scale (a kernel argument).
    enum class Pass { forward, backward_last, backward };
    void region(Pass pass, int c, int slot, int B, int T, double dloss, const std::function<void()>& ops);
    const uint64_t region_model_;
    int chunk_of_layer(int l) const;
    void* chunk_in(int c, int slot);  // the residual stream entering chunk c
    class LocalUnits;
    void* alloc_buffer(const char* group, const char* name, size_t count, DType t, bool per_layer = false);
    void* act_layer(void* base, int l, size_t per_layer_count, DType t);
    // Parameter / gradient of a tensor of an acquired unit.
    const void* P(Param p, int layer = 0) const;
    void* G(Param p, int layer = 0);
    void acquire(int unit);
    void release(int unit);
    // Calls fn(file_offset, buffer_offset, n) for every run of elements of a
    // (sharded or whole) flat buffer that holds real parameters.
    // skip_copies: leave out the last stage's copy of the embeddings (so
    // that gathering over the pipeline stages sees every tensor once).
    // Only tensors that meet the file range [file_begin, file_end) are visited.
    // dense / experts: whether the walk visits the tensors that are the
    // same on every ep rank, and those of this ep rank's experts (ep > 1).
    template <typename Fn>
    void for_each_piece(bool sharded, Fn fn, Tensors which = Tensors::all, bool skip_copies = false,
                        size_t file_begin = 0, size_t file_end = SIZE_MAX, bool dense = true,
                        bool experts = true) const;

    Backend* be_;
    GPTConfig cfg_;
    TensorTable table_;
    Precision prec_;
    int B_, T_;
    Recompute recompute_;
    std::vector<ModelChunk> chunks_;
    std::vector<size_t> layer_base_;  // per chunk: its first layer-slot (per-layer activations)
    std::vector<size_t> slot_base_;   // per chunk: its first chunk-slot (chunk inputs)
    size_t layer_slots_ = 0;          // layer-slots of per-layer activations held
    int last_B_ = 0, last_T_ = 0;
    TensorParallel* tp_ = nullptr;
    int tp_size_ = 1;
    ContextParallel* cp_ = nullptr;
    std::vector<int> pos_host_;  // global position of each local token
    std::vector<char> grad_ready_;  // per slot of the head chunk
    int head_chunk_ = 0;            // rows per LM-head chunk, 0: unchunked
    int want_b_ = 0, want_pos_ = -1;   // the row a chunked forward without targets computes
    int logits_first_ = 0, logits_rows_ = 0;  // rows of the micro-batch the logits buffer holds
    ExpertParallel* ep_ = nullptr;  // null when ep = 1
    Sharding sharding_;
    bool training_ = true;  // gradients and Adam state allocated
    UnitProvider* provider_ = nullptr;
    LocalUnits* local_ = nullptr;
    std::vector<const void*> unit_params_;  // acquired units' parameters, else null
    std::vector<void*> unit_grads_;         // units' gradient buffers this backward
    void* params_ = nullptr;
    void* grads_ = nullptr;
    void* master_ = nullptr;
    void* m_ = nullptr;
    void* v_ = nullptr;
    Acts* a_;
    std::vector<void*> owned_;
    std::vector<BufferInfo> buffers_;
};
