// llmc/model/gpt.h: the model, GPT-2, Llama or Mixtral (one code for all;
// the tensor table says which tensors an architecture has): its flat
// buffers (parameters, gradients, master weights, Adam m and v, all laid
// out by the tensor table), its activations, and a forward and backward
// pass written once against the Backend interface, so the same code runs on
// the CPU and on CUDA. The model holds no parallel code: where a parallel
// mode must act it calls the hooks of llmc/model/parallel_hooks.h, which
// llmc/parallel/ implements. The class is implemented in files by job:
// buffers.cpp (the buffers and the units' parameters), weights.cpp (weights
// in file order, initialisation; the walks themselves are weight_walk.h),
// forward.cpp, backward.cpp, moe.cpp (Mixtral's block; its state between
// calls is moe_state.h), head.cpp (the LM head and its cross-entropy, whole
// or in row chunks) and decode.cpp (generation's forward of new tokens
// against a KV cache, llmc/model/kv_cache.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/model/config.h"
#include "llmc/model/moe_state.h"
#include "llmc/model/parallel_hooks.h"
#include "llmc/model/tensors.h"
#include "llmc/model/weight_walk.h"

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
    // Under a split backward (zero-bubble schedules) a micro-batch keeps its
    // slot from its forward to its W, but some of what it holds lives less:
    // fb_bufs, the buffer each slot uses for what only the forward and B
    // read (the blocks' QKV, attention statistics, MLP pre-activation, norm
    // statistics and second residual; the head's logits, or with
    // --head-chunk its input's gradient); bw_bufs, for what B keeps for W
    // (the linear layers' output gradients, inputs it recomputed or
    // gathered). Slots never in the same span at once share a buffer
    // (PipelineParallel::colour_slots). Empty: each slot its own.
    std::vector<int> fb_bufs, bw_bufs;
    int fb(int slot) const { return fb_bufs.empty() ? slot : fb_bufs.at(slot); }
    int bw(int slot) const { return bw_bufs.empty() ? slot : bw_bufs.at(slot); }
};

// A named backend allocation, for the memory report.
struct BufferInfo {
    std::string group;  // "params", "grads", "master", "optimizer", "activations", "scratch"
    std::string name;
    size_t bytes;
    bool per_layer;     // one slice per transformer block (kept from forward to backward)
};

struct KVCache;  // llmc/model/kv_cache.h

// How a model is built: the micro-batch it holds, what it keeps for its
// backward, which buffers are sharded, the pipeline chunks it runs, and the
// parallel modes' hooks it calls (llmc/parallel/model_stack.h derives them
// from the run's layout; a model of one process needs only B and T).
struct ModelOptions {
    ModelOptions() {}
    ModelOptions(int B_, int T_) : B(B_), T(T_) {}
    // Micro-batches of up to B rows of T tokens (under context parallelism
    // T is the local sequence length T/c and set_positions() gives the
    // global positions).
    int B = 1, T = 1;
    Recompute recompute = Recompute::none;  // what each block keeps for its backward
    Sharding sharding;                      // which flat buffers hold only this rank's shard
    // What this pipeline stage runs (empty: the whole model).
    std::vector<ModelChunk> chunks;
    // 0 computes the LM head's logits for every row of every micro-batch in
    // flight at once; ROWS > 0 runs the head and its cross-entropy in chunks
    // of at most ROWS rows, the backward's head products fused into the
    // forward (head.cpp), so that only ROWS rows of logits are ever held.
    int head_chunk = 0;
    // Adam's m and v in bf16 (--optimizer-dtype bf16) instead of the
    // backend's precision().opt; the update still runs in the compute type.
    bool bf16_optimizer_state = false;
    // false: no gradients and no Adam state (generation: the weights and the
    // forward only); backward and a forward with a loss gradient then refuse.
    bool training = true;
    // --fp8 1 (docs/fp8.md): the four linear layers of every block multiply
    // operands rounded to FP8 grids at current scaling (fp8.cpp).
    bool fp8 = false;
    // With fp8: delayed scaling, each operand scaled by the largest amax of
    // its last fp8_history steps (0: current scaling, its own amax).
    int fp8_history = 0;
    // With fp8: the four layers' weights as FP8 copies a step's first
    // micro-batch makes for the others (fp8.cpp's fp8_weight; not under
    // ZeRO-3); false: each product quantises its weight.
    bool fp8_weight_copies = true;
    // With fp8: the linear layers on FP8 operands (config.h's mask, bit i
    // layer i: QKV, attention output, MLP up, MLP down); the others multiply
    // in the compute type and are neither measured nor cast.
    unsigned fp8_layers = kLinearLayersAll;
    // Zero-bubble pipelines: each block's backward may run as an input part
    // and, later, a weights part (backward_chunk's part), the linear layers'
    // output gradients kept per layer-slot in between.
    bool split_backward = false;
    // The parallel modes (null: off). Under sequence parallelism B·T must
    // divide by the tp degree.
    TensorParallelOps* tp = nullptr;
    ContextParallelOps* cp = nullptr;
    ExpertParallelOps* ep = nullptr;
};

class GPT {
  public:
    // Allocates every buffer the options ask for (see ModelOptions).
    GPT(Backend* be, const GPTConfig& cfg, const ModelOptions& opt);
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
    // Host arrays in model-file order <-> this rank's part of a flat buffer
    // (the walks over the tensor table are llmc/model/weight_walk.h; these
    // apply them to this model's buffers). get_file_order writes only the
    // elements this rank holds of buf (a shard buffer when sharded) and
    // leaves the rest of host untouched.
    void get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t,
                        Tensors which = Tensors::all);
    // Sets every weight this rank holds (params, and master when present)
    // from host values of type t in model-file order; the _range form only
    // the file elements [file_begin, file_end) (one tensor, say), host
    // pointing at element file_begin.
    void set_weights_file_order(const void* host, DType t);
    void set_weights_file_range(const void* host, DType t, size_t file_begin, size_t file_end);
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
    // Mixtral (docs/moe.md): the MoE blocks' state between calls (the
    // load-balancing loss, routing statistics, the experts' loads).
    MoeState& moe() { return moe_; }
    // Over pipeline stages: the load-balancing gradient of the micro-batch
    // in chunk c's slot from its whole statistics (every stage's
    // MoeState::take_stats, summed), for the chunk's next backward (the head
    // chunk also adds the micro-batch's loss to MoeState's sum).
    void set_moe_aux(int c, int slot, const std::vector<double>& stats, int N, double dloss);
    // --moe-balance bias (DeepSeek-V3): the per-layer, per-expert bias [L, E]
    // the routing adds to the probabilities for its choice of the K (not to
    // their weights); setting it turns it on.
    void set_moe_bias(const std::vector<double>& bias);
    // The routing bias as it is now ([L, E]; a sync-free step moves it on
    // the device).
    std::vector<double> moe_bias() const;
    // The sync-free step (--sync-free): the routing statistics, the
    // load-balancing loss and its gradient, the experts' loads and the bias
    // stay in backend memory, and the experts' products take their row
    // counts there (Backend::moe_expert_matmul_*), so a Mixtral step reads
    // nothing on the host. Not with expert parallelism (its exchange sizes
    // go to the host) or a model split into pipeline chunks (its statistics
    // cross stages on the host).
    void keep_moe_on_device();
    // Its step's end: the loads [L, E] (doubles in backend memory, to be
    // summed over the world first), then moe_balance (backend.h) with the
    // figures, the loads' divisor and the bias's rate (0: no bias).
    void* moe_loads_device() { return moe_.loads_dev_; }
    void moe_balance(void* figures, double divisor, double rate);
    // --fp8-history (docs/fp8.md): the step's end (its amaxes, maxed over
    // the dp x cp ranks first by the caller: fp8_step_amax's fp8_slots()
    // doubles, then pushed into the histories unless the step was skipped,
    // by the host's word or the figures'), and the histories [L, 4 layers,
    // 3 operands, N], then a Mixtral's [L, E experts, 2 products, 3, N], for
    // checkpoints (this rank's layers; zero elsewhere).
    int fp8_slots() const { return fp8_len_ ? cfg_.num_layers * cfg_.fp8_slots_per_layer() : 0; }
    void* fp8_step_amax();
    void fp8_push(const void* figures, bool skipped);
    std::vector<double> fp8_history() const;
    void set_fp8_history(const std::vector<double>& h);
    // The load-balancing loss's coefficient for the rest of the run (0 under
    // --moe-balance bias).
    void set_aux_coef(double c) { cfg_.aux_coef = c; }

    // ---- model chunks (pipeline parallel) ----
    const std::vector<ModelChunk>& chunks() const { return chunks_; }
    bool holds_embeddings() const {  // whether one of this rank's chunks starts the model
        for (const ModelChunk& c : chunks_)
            if (c.embed) return true;
        return false;
    }
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
    // Training forwards with a loss gradient (dloss != 0) add their mean loss
    // to this double in backend memory instead of reading it (null: read it,
    // the default; forward_chunk then returns 0): a step whose figures stay
    // on the device (step_figure::loss, backend.h); aux (null: none), with
    // the MoE state on the device, the load-balancing loss's (step_figure::aux).
    void set_loss_figure(void* acc, void* aux = nullptr) { loss_figure_ = acc, aux_figure_ = aux; }
    // Training forwards' inputs, targets and docs in backend memory instead
    // of the host's (copied on the device: a step staged before it runs as
    // one recorded region, llmc/run/step_graph.h): set around that step's
    // forwards alone. Off by default.
    void set_batch_on_device(bool on) { batch_on_device_ = on; }
    // Document masking (docs/attention.md): each token attends only to the
    // earlier tokens of its own document. Allocates the per-slot document
    // starts; from then on every forward needs its docs.
    void set_document_mask();
    bool document_mask() const;
    // The document start of each token of nrows rows of T tokens (host
    // int32): the position after the last end token eot before it (a
    // document ends with its EOT), or of the last start token bos at or
    // before it (a document opens with it: Llama's <s>), whichever is later;
    // 0 if none. eot or bos -1: none.
    static void document_starts(const int* tokens, int nrows, int T, int eot, int* out, int bos = -1);
    // The residual stream leaving chunk c for the micro-batch in `slot`
    // (valid until that slot's next forward). Not for the head chunk.
    const void* chunk_output(int c, int slot);
    // Backward of chunk c for the micro-batch in `slot`: dy is the gradient
    // of its output (null for the head chunk, which starts from its loss);
    // last_micro_step as for backward(). With split_backward the part may be
    // `input` (B: every gradient but the blocks' linear weights and biases,
    // the chunk's input gradient among them) and then `weights` (W: those,
    // from the output gradients B kept; dy unused); B then W give the same
    // gradients as `all`, bit for bit on the CPU. A block's unit is done
    // (told to the unit provider) after its W.
    enum class BackwardPart { all, input, weights };
    void backward_chunk(int c, int slot, const void* dy, bool last_micro_step = true,
                        BackwardPart part = BackwardPart::all);
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
    // fc outputs on this rank, optional tensors (biases: null where the
    // table has none, Llama's and all but Qwen2's qkvb),
    // the norm, the rotary embeddings, the MLP's activation.
    size_t qkv_width() const;
    size_t fch_width() const;
    const void* Pb(Param p, int layer = 0) const;
    void* Gb(Param p, int layer = 0);
    // amax (one double, or null): with --fp8 the amax of what the norm
    // writes (out forward; dinp, the residual gradient, backward), the next
    // FP8 product's operand, measured in the same pass (norm_amax_at).
    // cast (or null): that operand cast as well (Backend::norm's; norm_cast).
    void norm(void* out, void* mean, void* rstd, const void* inp, Param w, int layer, int N, void* amax = nullptr,
              const Fp8Cast* cast = nullptr);
    void residual_norm(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b, Param w,
                       int layer, int N, void* amax = nullptr, const Fp8Cast* cast = nullptr);
    // discard: where the weights' (and bias') gradients go instead of the
    // unit's (a split backward's B under ZeRO 2 and 3, whose W computes them).
    void norm_backward(void* dinp, const void* dout, const void* inp, const void* mean, const void* rstd, Param w,
                       int layer, int N, void* discard = nullptr, void* amax = nullptr);
    // Where a norm measures linear layer w's operand `which` (0 its input,
    // 2 its output gradient) in la's slot: with --fp8 and without sequence
    // parallel (whose norms see a shard of the rows the product gathers); else null.
    void* norm_amax_at(const LayerActs& la, Param w, int which) const;
    // Delayed scaling's cast of the input of la's block's QKV (w = qkvw) or
    // fc (fcw) by the norm that writes it, plain for the product and
    // transposed into the kept copy its weight gradient multiplies
    // (LayerActs::ln1_t, ln2_t); ln1 and ln2 are then stored only while the
    // history is empty. Null (nothing in c) where no copy is kept.
    const Fp8Cast* norm_cast(Fp8Cast* c, const LayerActs& la, Param w, int l) const;
    void rotate(void* qkv, int B, int T, bool inverse);
    // The MLP's GELU or SwiGLU, forward (h from fch) and backward (dfch from
    // dh); amax (one double, or null): with --fp8 the amax of what it writes,
    // the next FP8 product's operand, measured in the same pass, and with
    // --fp8-history that operand cast for layer l's product too (fp8_cast;
    // both ways when the whole backward runs) (fp8.cpp). kept (or null):
    // fcproj's input also as the transposed FP8 copy its weight gradient
    // multiplies (LayerActs::h_t): with amax the forward's, beside the plain
    // copy; without, a recompute's before the backward, that copy alone.
    void activation(void* h, const void* fch, int N, void* amax = nullptr, int l = 0, void* kept = nullptr);
    void activation_backward(void* dfch, const void* fch, const void* dh, int N, void* amax, int l, bool whole);
    // Delayed scaling's cast of operand `which` of layer l's linear layer w by
    // the op that writes it (Backend::Fp8Cast; keep: another op reads the
    // operand in the compute type); false without a history.
    bool fp8_cast(Fp8Cast* c, Param w, int l, int which, bool transposed, bool keep) const;
    // The backward's view of that kept copy of layer l's input of w (bytes;
    // Backend::Fp8Kept); false without one.
    bool fp8_kept(Fp8Kept* k, Param w, int l, void* bytes) const;
    // The four linear layers' products (fp8.cpp): the backend's matmul, or
    // with --fp8 1 the same on operands rounded to FP8 grids, each amax a
    // max over the ranks that hold pieces of its tensor. Row-parallel
    // layers (attention output, MLP down) split their input and weight
    // over tp, column-parallel ones (QKV, MLP up) their weight and output
    // gradient; cp splits every activation and output gradient. amax: the
    // layer's three amaxes in its layer-slot (amax_of; null without --fp8):
    // the forward takes the input's and the weight's, the backward the
    // output gradient's and reads the other two where its forward left them
    // (the same tensors), so each operand is measured once per micro-batch.
    // in_measured / dout_measured: the op that wrote that operand measured
    // its amax into the slot (activation's), so it is not read again here.
    void linear_forward(void* out, const void* in, Param w, const void* bias, int l, int N, int IC, int OC, bool row,
                        void* amax, bool in_measured = false);
    // in_t (or null): the input's transposed FP8 copy kept from the forward (fp8_kept).
    void linear_backward(void* dinp, Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC,
                         int OC, bool row, void* amax, bool dout_measured = false, void* in_t = nullptr);
    // A split backward's halves of linear_backward: B, the input's gradient
    // alone (with --fp8 the output gradient's amax joins the forward's in
    // the layer-slot), and W, the weight's and bias's gradients (with --fp8
    // at the three, as B left them).
    void linear_backward_input(void* dinp, Param w, const void* dout, const void* in, int l, int N, int IC, int OC,
                               bool row, void* amax, bool dout_measured = false);
    void linear_backward_weights(Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC, int OC,
                                 const void* amax, void* in_t = nullptr);
    // The three's product, once their amaxes are in the slot: dinp and dw
    // (either null), plain or on FP8 operands with layer l's delayed scaling
    // (recording `record`), the kept input copy (in_t, for dw) and the
    // weight's copies.
    void linear_backward_product(void* dinp, void* dw, void* dbias, Param w, const void* dout, const void* in, int l,
                                 int N, int IC, int OC, const void* amax, void* in_t, unsigned record);
    // amax[which] (0 input, 1 weight, 2 output gradient) of x (null: already
    // there, measured by the op that wrote it), with the group max.
    void fp8_amax(int which, const void* x, DType t, size_t n, bool tp_split, bool cp_split, void* amax);
    // Layer l's weight of w as the FP8 copies a training step makes once
    // (Backend::Fp8Weight; false: none, the product quantises its own):
    // the forward's call makes the plain copy and measures the amax, the
    // backward's the transposed copy, each the step's first.
    bool fp8_weight(Fp8Weight* q, Param w, int l, bool backward);
    // Delayed scaling of layer l's product of w, recording the operands in
    // `record` (bits: 1 input, 2 weight, 4 output gradient) on a training
    // pass (Backend::Fp8Delayed); false without a history.
    bool fp8_delayed_of(Fp8Delayed* d, Param w, int l, unsigned record) const;
    // A Mixtral's experts take their rows in blocks, each one micro-batch's
    // rows for one of this rank's experts (first row, rows, local expert):
    // E blocks, one per expert, or under ep one per (peer, local expert).
    struct ExpertBlock {
        size_t row, n;
        int expert;
    };
    // From the row groups by expert (offsets) or an ep route; El: local experts.
    static std::vector<ExpertBlock> expert_blocks(const std::vector<int>& off, const ExpertParallelOps::Route* r,
                                                  int El);
    // --fp8 1 (fp8.cpp): product p of layer l's experts (0: w1|w3, input
    // [rows, C]; 1: w2, input [rows, Hl]) on FP8 operands, each block one
    // tensor. Forward (dy null): its input's and its expert's weight's amax;
    // backward: its output gradient's, beside the forward's (the same
    // blocks); at dst + 3·b for block b, maxed over the tp and cp groups,
    // delayed scaling's bookkeeping done.
    void expert_amax(int l, int p, const std::vector<ExpertBlock>& blocks, const void* x, const void* dy, void* dst);
    // Where block b's three amaxes of product p go among a layer-slot's
    // (slot: LayerActs::amax; null without --fp8).
    void* expert_amax_at(void* slot, int p, size_t b) const;
    // One block's product of expert weight w: plain (amax null) or on FP8
    // operands at the block's three amaxes; the weight gradient accumulated.
    void expert_forward(void* out, const void* in, const void* w, int n, int IC, int OC, const void* amax);
    void expert_backward(void* dinp, void* dw, const void* dout, const void* in, const void* w, int n, int IC, int OC,
                         const void* amax);
    // Rows of fch and h: N; Mixtral's N·K grouped rows, under expert
    // parallelism the most this rank's experts can receive.
    int mlp_rows(int N) const {
        if (!cfg_.moe()) return N;
        return ep_ ? ep_->size() * N * std::min(cfg_.top_k, ep_->local_experts()) : N * cfg_.top_k;
    }
    // --fp8: the amaxes a layer-slot keeps from its forward for its
    // backward, as many as a layer's in the history (the four layers'
    // [4][3], a Mixtral's experts' [2 products][E blocks][3] after them).
    size_t amax_per_slot() const { return (size_t)cfg_.fp8_slots_per_layer(); }
    // The rows the MoE block of layer-slot la's last forward gave its experts.
    int moe_expert_rows(const LayerActs& la, int N) const;
    // A split backward under full recompute: the recomputed routing's host
    // state (row groups, expert-parallel sizes) copied to the layer-slot's own for W.
    void moe_keep_routing(const LayerActs& la);
    // Mixtral's MoE block (moe.cpp) in place of the MLP: its forward from
    // the (gathered) norm output xin into the row-parallel output buffer,
    // its backward into the column-parallel input gradient, and the
    // load-balancing loss: statistics of each block's routing for the
    // micro-batch in chunk-slot s, then the loss and its gradient.
    void moe_forward(int l, const LayerActs& la, const void* xin, int N);
    // The MoE block's forward on N rows with its buffers named (the training
    // forward's, or generation's KV cache's): router, routing, the experts'
    // products, the combine into out [N, C]. route: the layer-slot's
    // expert-parallel route (with ep).
    struct MoeRows {
        void *logits, *probs, *topw;
        int *topi, *offsets, *perm, *inv;
        void *xg, *fch, *h, *yg;
        std::vector<int>* offsets_host;  // the expert offsets read back
        size_t route;                    // moe_.routes_'s index (expert parallel)
        void* amax;                      // --fp8: the layer-slot's amaxes (null: plain products, as decoding)
    };
    void moe_rows_forward(int l, const MoeRows& r, const void* xin, void* out, int N);
    // part: all, or B (the weights' products left out, their output
    // gradients kept in la.g_*) or W (those products alone, from what B kept).
    void moe_backward(int l, const LayerActs& la, const void* dout, const void* xin, int N, const void* aux_grad,
                      BackwardPart part = BackwardPart::all);
    void moe_stats(int l, const LayerActs& la, int N, size_t s);
    void moe_aux(size_t s, int N, double dloss, bool count = true);
    MoeState moe_;
    // The LM head of the head chunk's micro-batch in `slot` from its final
    // norm's output lnf (head.cpp): logits, and with targets the losses
    // (head_loss reads their mean); with dloss != 0 also the head's gradients, for the
    // backward (head_backward). Acquires and releases the head's units.
    void head_forward(const ModelChunk& ch, int slot, void* lnf, const int* tgt, bool has_targets, int N,
                      double dloss);
    // backward_chunk's device work (the recorded region), after its bookkeeping.
    void backward_ops(int c, int slot, bool last_micro_step, BackwardPart part);
    void weights_ops(int c, int slot, bool last_micro_step);  // the W part (backward.cpp)
    // Linear layer w's three amaxes in la's slot; null without --fp8 and for
    // a layer --fp8-layers leaves in the compute type (fp8_on).
    void* amax_of(const LayerActs& la, Param w) const;
    bool fp8_on(Param w) const;  // --fp8 1 and w (qkvw, attprojw, fcw, fcprojw) among --fp8-layers
    // GPT-2's fc and its GELU as two ops (the activation measuring or
    // casting fcproj's input, or fc's output gradient) where either product is FP8.
    bool gelu_apart() const { return fp8_on(Param::fcw) || fp8_on(Param::fcprojw); }
    // The mean of the losses the last head forward left (a download), or
    // (set_loss_figure, dloss != 0) 0 with the mean added on the device.
    double head_loss(int N, double dloss);
    void head_forward_chunked(int slot, const void* in, const void* W, const int* tgt, bool has_targets, int N,
                              double dloss);
    // Losses of rows r0..r0+n-1 from their logits (and their gradient in
    // place when dloss != 0).
    void cross_entropy(void* logits, int r0, int n, const int* tgt, double dloss);
    // The head's backward: G(head) += its weight gradient; returns the
    // gradient of lnf's input rows to the head (all N rows, partial under tp).
    void* head_backward(int slot, const void* lnf, int N);
    // The head buffer (logits, or dlnf) of the micro-batch in `slot`
    // (the head chunk's ModelChunk::fb_bufs).
    int head_buf(int slot) const;
    // Runs ops, a forward or backward pass, as a recorded region (backend.h,
    // docs/design.md section 2.9) when the pass holds device work only: a
    // quiet unit provider (UnitProvider::quiet) and no tensor or context
    // parallelism (their collectives run between ops); otherwise runs them
    // as they come. The region's key is what makes two runs of it differ:
    // the model (region_model_, never reused: two models of one shape on one
    // backend hold different buffers), the pass, the chunk, the slot, the
    // shape and the loss scale (a kernel argument).
    enum class Pass { forward, backward_last, backward, input_last, input, weights_last, weights };
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

    Backend* be_;
    GPTConfig cfg_;
    TensorTable table_;
    Precision prec_;
    int B_, T_;
    Recompute recompute_;
    std::vector<ModelChunk> chunks_;
    std::vector<size_t> layer_base_;  // per chunk: its first layer-slot (per-layer activations)
    std::vector<size_t> fb_base_, bw_base_;  // the same for the buffers of ModelChunk::fb_bufs and bw_bufs
    std::vector<size_t> slot_base_;   // per chunk: its first chunk-slot (chunk inputs)
    size_t layer_slots_ = 0;          // layer-slots of per-layer activations held
    int last_B_ = 0, last_T_ = 0;
    TensorParallelOps* tp_ = nullptr;  // null when tp = 1
    int tp_size_ = 1;
    ContextParallelOps* cp_ = nullptr;  // null when cp = 1
    std::vector<int> pos_host_;  // global position of each local token
    std::vector<char> grad_ready_;  // per slot of the head chunk
    int head_chunk_ = 0;            // rows per LM-head chunk, 0: unchunked
    void* loss_figure_ = nullptr;   // set_loss_figure
    void* aux_figure_ = nullptr;    // set_loss_figure: Mixtral's load-balancing loss, kept on the device
    bool batch_on_device_ = false;  // set_batch_on_device
    int want_b_ = 0, want_pos_ = -1;   // the row a chunked forward without targets computes
    int logits_first_ = 0, logits_rows_ = 0;  // rows of the micro-batch the logits buffer holds
    ExpertParallelOps* ep_ = nullptr;  // null when ep = 1
    Sharding sharding_;
    bool training_ = true;  // gradients and Adam state allocated
    bool fp8_ = false;      // ModelOptions::fp8: the four layers' products on FP8 operands
    int fp8_len_ = 0;       // ModelOptions::fp8_history
    unsigned fp8_layers_ = kLinearLayersAll;  // ModelOptions::fp8_layers
    bool fp8_record_ = false;  // the pass records its amaxes for the history (a training pass)
    // --fp8: the linear layers' weights as FP8 copies made once per step
    // (fp8_weight): per (layer, linear) their offset in Acts::fp8_wq and the
    // plain copy's bytes (SIZE_MAX: not on this rank), and what this step
    // made (1: the forward's copy and the weight's amax, 2: the transposed
    // copy); zero_grad starts a step.
    std::vector<size_t> fp8_woff_, fp8_wsize_;
    std::vector<uint8_t> fp8_wmade_;
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
