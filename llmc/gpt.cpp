// llmc/gpt.cpp: buffers, initialisation, forward and backward of GPT-2.
//
// Forward of block l (N = B·T tokens, residual stream x):
//   ln1 = LN(x); qkv = ln1·qkvw^T + qkvb; atty = attention(qkv)
//   x2 = x + atty·attprojw^T + attprojb;  ln2 = LN(x2)
//   fch = ln2·fcw^T + fcb; h = gelu(fch); x3 = x2 + h·fcprojw^T + fcprojb
// then lnf = LN(x_L); logits = lnf·wte^T; loss = cross-entropy on columns < V.
// Llama (shared/reference.md section 9) is the same code with RMSNorm for LN,
// no biases and no position embeddings, RoPE on Q and K after the QKV
// product (and its inverse on their gradients), grouped-query attention,
// fch = [gate | up] and h = silu(gate)·up, and lm_head for wte when untied.
// Backward runs the same steps in reverse with one residual-gradient buffer
// that LayerNorm backward accumulates into.
//
// The model is run in chunks of consecutive blocks (one chunk for the whole
// model unless pipeline parallel splits it, see ModelChunk): a chunk's
// forward starts from the embeddings or from the residual stream the
// previous chunk produced, and ends at the LM head or with the residual
// stream the next chunk needs; its backward runs the other way. Each chunk
// keeps the activations of up to `slots` micro-batches (those in flight in
// the pipeline schedule) side by side.
//
// Parameters and gradients are reached through a UnitProvider: the model
// acquires each unit (embeddings, a block, the final LayerNorm) before it
// computes with it and releases it after, and reports each unit's gradients
// as complete as soon as its backward is done. Single-process runs use
// LocalUnits (whole buffers); parallel modes install their own provider.
#include "gpt.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "rng.h"

// Activations. N = B·T tokens; Ns = tokens of the residual stream held here
// (N/tp under sequence parallelism, else N); Cl = C/tp attention channels,
// Hl = 4C/tp MLP channels and Vl vocabulary rows of this tensor-parallel rank.
// Kept per micro-batch slot: per-layer buffers hold one slice per
// layer-slot (a block of a chunk for one slot, layer_acts()), chunk inputs
// one per chunk-slot, the embedding and head buffers one per slot of the
// chunk that has them.
struct GPT::Acts {
    int* inputs = nullptr;  // [slots, N] token ids (embedding chunk)
    int* targets = nullptr;  // [slots, N] (head chunk)
    int* pos = nullptr;  // [T] positions 0..T-1
    void* encoded = nullptr;  // [chunk-slots, Ns,C] the residual stream entering each chunk
    void* emb = nullptr;      // [N,C] partial embeddings (SP: before the reduce-scatter)
    // per layer-slot, [L·slots, ...], or one block's scratch when the
    // recompute mode does not keep them (keep_*)
    bool keep_block = true, keep_attn = true, keep_gelu = true;
    void *ln1, *ln1_mean, *ln1_rstd;            // [Ns,C], [Ns], [Ns]
    void *qkv, *atty, *lse;                     // [N,3Cl], [N,Cl], [NHl,N]
    void *residual2, *ln2, *ln2_mean, *ln2_rstd;  // [Ns,C], ...
    void *fch, *fch_gelu;                       // [N,Hl]
    void* residual3;                            // [Ns,C]
    // per slot of the head chunk
    void *lnf, *lnf_mean, *lnf_rstd;            // [Ns,C], [Ns], [Ns]
    void* logits;                               // [N,Vl]
    void* losses;                               // [N]
    void *ce_max = nullptr, *ce_target = nullptr, *ce_sumexp = nullptr;  // [N], tp > 1
    void* logit_row = nullptr;                  // [V], tp > 1: one gathered row
    // scratch, reused by every layer
    void* ln_full = nullptr;  // [N,C] SP: a LayerNorm output gathered over the tp group
    void* proj;               // [N,C] row-parallel output (partial under tp)
    void* proj_s = nullptr;   // [Ns,C] SP: its reduce-scattered rows
    void* dresidual;          // [Ns,C]
    void* dfull = nullptr;    // [N,C] SP: residual gradient gathered
    void* dln;                // [N,C] gradient of a column-parallel layer's input
    void* dln_s = nullptr;    // [Ns,C] SP: its reduce-scattered rows
    void* datt;               // [N,Cl]
    void* dh;                 // [N,Hl] gradient of the MLP's activation output
    void* dfch;               // [N,Fl] gradient of fch (GPT-2: the same buffer as dh)
    void* dqkv;               // [N,3Cl]
};

// The provider for whole buffers: nothing to gather, nothing to reduce.
class GPT::LocalUnits : public UnitProvider {
  public:
    explicit LocalUnits(GPT& m) : m_(m) {}
    const void* acquire(int u) override {
        return elem_ptr(m_.params_, m_.prec_.param, m_.table_.unit_begin[u]);
    }
    void release(int) override {}
    void* grads(int u) override { return elem_ptr(m_.grads_, m_.prec_.grad, m_.table_.unit_begin[u]); }
    void grads_done(int) override {}

  private:
    GPT& m_;
};

void* GPT::alloc_buffer(const char* group, const char* name, size_t count, DType t, bool per_layer) {
    size_t bytes = count * dtype_size(t);
    void* p = be_->alloc(bytes);
    owned_.push_back(p);
    buffers_.push_back({group, name, bytes, per_layer});
    return p;
}

void* GPT::act_layer(void* base, int l, size_t per_layer_count, DType t) {
    return elem_ptr(base, t, (size_t)l * per_layer_count);
}

// The units a list of chunks needs (tensors.h StageUnits).
static StageUnits stage_units(const GPTConfig& cfg, const std::vector<ModelChunk>& chunks) {
    StageUnits su;
    su.held.assign(cfg.num_layers + 2, false);
    bool embed = false, head = false;
    for (const ModelChunk& c : chunks) {
        for (int l = c.first_layer; l < c.first_layer + c.layers; l++) su.held[l + 1] = true;
        embed = embed || c.embed;
        head = head || c.head;
    }
    // The head needs the embedding unit only when it is tied to wte.
    su.held[0] = embed || (head && cfg.tied);
    su.held[cfg.num_layers + 1] = head;
    su.embedding_copy = head && !embed && cfg.tied;
    return su;
}

static std::vector<ModelChunk> whole_model(const GPTConfig& cfg) {
    ModelChunk c;
    c.first_layer = 0;
    c.layers = cfg.num_layers;
    c.embed = c.head = true;
    c.slots = 1;
    return {c};
}

bool parse_recompute(const std::string& s, Recompute* r) {
    if (s == "none" || s == "0") *r = Recompute::none;
    else if (s == "gelu" || s == "1") *r = Recompute::gelu;
    else if (s == "selective") *r = Recompute::selective;
    else if (s == "full") *r = Recompute::full;
    else return false;
    return true;
}

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::none: return "none";
        case Recompute::gelu: return "gelu";
        case Recompute::selective: return "selective";
        case Recompute::full: return "full";
    }
    return "?";
}

GPT::GPT(Backend* be, const GPTConfig& cfg, int B, int T, Recompute recompute, const Sharding& sharding,
         TensorParallel* tp, ContextParallel* cp, const std::vector<ModelChunk>& chunks)
    : be_(be), cfg_(cfg),
      table_(cfg, sharding.shards, tp ? tp->size() : 1, tp ? tp->rank() : 0,
             stage_units(cfg, chunks.empty() ? whole_model(cfg) : chunks)),
      prec_(be->precision()), B_(B), T_(T), recompute_(recompute),
      chunks_(chunks.empty() ? whole_model(cfg) : chunks), tp_(tp && tp->size() > 1 ? tp : nullptr),
      tp_size_(tp ? tp->size() : 1), cp_(cp && cp->size() > 1 ? cp : nullptr), sharding_(sharding) {
    if (T > cfg.max_seq_len) throw std::invalid_argument("sequence length T exceeds the model's maxT");
    const bool sp = tp_ && tp_->sp();
    if (sp && T % tp_size_ != 0) throw std::invalid_argument("sequence parallel needs T divisible by tp");
    // Where each chunk's slots live in the per-layer and per-chunk buffers.
    int embed_slots = 0, head_slots = 0;
    size_t chunk_slots = 0;
    for (const ModelChunk& c : chunks_) {
        if (c.slots < 1 || c.layers < 0 || c.first_layer < 0 || c.first_layer + c.layers > cfg.num_layers)
            throw std::invalid_argument("GPT: bad model chunk");
        layer_base_.push_back(layer_slots_);
        slot_base_.push_back(chunk_slots);
        layer_slots_ += (size_t)c.layers * c.slots;
        chunk_slots += c.slots;
        if (c.embed) embed_slots = c.slots;
        if (c.head) head_slots = c.slots;
    }
    const size_t LS = layer_slots_, C = cfg.channels, N = (size_t)B * T, Ns = sp ? N / tp_size_ : N;
    const size_t NHl = table_.heads, Cl = NHl * cfg.head_size(), Wqkv = qkv_width(), Hl = table_.hidden;
    const size_t Fl = fch_width(), Vl = table_.vocab_rows;
    const bool ln = !cfg.llama();  // LayerNorm keeps a mean; RMSNorm does not
    const size_t full = table_.total, shard = table_.shard_total;
    const size_t ES = embed_slots, HSl = head_slots;
    const DType act = prec_.act, st = prec_.stat;
    params_ = alloc_buffer("params", "params", sharding.params ? shard : full, prec_.param);
    grads_ = alloc_buffer("grads", "grads", sharding.grads ? shard : full, prec_.grad);
    if (prec_.has_master) master_ = alloc_buffer("master", "master", sharding.optimizer ? shard : full, prec_.master);
    m_ = alloc_buffer("optimizer", "adam_m", sharding.optimizer ? shard : full, prec_.opt);
    v_ = alloc_buffer("optimizer", "adam_v", sharding.optimizer ? shard : full, prec_.opt);

    a_ = new Acts();
    Acts& a = *a_;
    const char* A = "activations";
    const char* S = "scratch";
    if (ES) a.inputs = (int*)alloc_buffer(A, "inputs", ES * N, DType::I32);
    if (HSl) a.targets = (int*)alloc_buffer(A, "targets", HSl * N, DType::I32);
    a.pos = (int*)alloc_buffer(A, "positions", T, DType::I32);
    a.encoded = alloc_buffer(A, "chunk_inputs", chunk_slots * Ns * C, act);
    if (ES) a.emb = sp ? alloc_buffer(S, "embeddings_partial", N * C, act) : nullptr;
    // Per-block activations: one slice per layer-slot when the recompute
    // mode keeps them for the backward, else one block's scratch.
    a.keep_block = recompute != Recompute::full;
    a.keep_attn = recompute == Recompute::none || recompute == Recompute::gelu;
    a.keep_gelu = recompute == Recompute::none;
    auto block_buf = [&](const char* name, size_t per_block, DType t, bool keep) {
        return keep ? alloc_buffer(A, name, LS * per_block, t, true)
                    : alloc_buffer(S, (std::string(name) + "_recomputed").c_str(), per_block, t);
    };
    a.ln1 = block_buf("ln1", Ns * C, act, a.keep_block);
    a.ln1_mean = ln ? block_buf("ln1_mean", Ns, st, a.keep_block) : nullptr;
    a.ln1_rstd = block_buf("ln1_rstd", Ns, st, a.keep_block);
    a.qkv = block_buf("qkv", N * Wqkv, act, a.keep_block);
    a.atty = block_buf("atty", N * Cl, act, a.keep_attn);
    a.lse = block_buf("attn_lse", N * NHl, st, a.keep_attn);
    a.residual2 = block_buf("residual2", Ns * C, act, a.keep_block);
    a.ln2 = block_buf("ln2", Ns * C, act, a.keep_block);
    a.ln2_mean = ln ? block_buf("ln2_mean", Ns, st, a.keep_block) : nullptr;
    a.ln2_rstd = block_buf("ln2_rstd", Ns, st, a.keep_block);
    a.fch = block_buf("fch", N * Fl, act, a.keep_block);
    a.fch_gelu = block_buf("fch_gelu", N * Hl, act, a.keep_gelu);
    a.residual3 = block_buf("residual3", Ns * C, act, true);  // the next block's input: always kept
    if (HSl) {
        a.lnf = alloc_buffer(A, "lnf", HSl * Ns * C, act);
        a.lnf_mean = ln ? alloc_buffer(A, "lnf_mean", HSl * Ns, st) : nullptr;
        a.lnf_rstd = alloc_buffer(A, "lnf_rstd", HSl * Ns, st);
        a.logits = alloc_buffer(A, "logits", HSl * N * Vl, act);
        a.losses = alloc_buffer(A, "losses", N, st);
        if (tp_) {
            a.ce_max = alloc_buffer(S, "ce_max", N, st);
            a.ce_target = alloc_buffer(S, "ce_target", N, st);
            a.ce_sumexp = alloc_buffer(S, "ce_sumexp", N, st);
        }
        if (tp_ || cp_) a.logit_row = alloc_buffer(S, "logit_row", cfg.vocab_size, act);
    }
    if (sp) {
        a.ln_full = alloc_buffer(S, "ln_gathered", N * C, act);
        a.proj_s = alloc_buffer(S, "proj_local", Ns * C, act);
        a.dfull = alloc_buffer(S, "dresidual_gathered", N * C, act);
        a.dln_s = alloc_buffer(S, "dln_local", Ns * C, act);
    }
    a.proj = alloc_buffer(S, "proj", N * C, act);
    a.dresidual = alloc_buffer(S, "dresidual", Ns * C, act);
    a.dln = alloc_buffer(S, "d_ln", N * C, act);
    a.datt = alloc_buffer(S, "d_atty", N * Cl, act);
    a.dh = alloc_buffer(S, "d_hidden", N * Hl, act);
    a.dfch = Fl == Hl ? a.dh : alloc_buffer(S, "d_gate_up", N * Fl, act);
    a.dqkv = alloc_buffer(S, "d_qkv", N * Wqkv, act);
    grad_ready_.assign(std::max(1, head_slots), 0);

    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = t;
    set_positions(pos);

    local_ = new LocalUnits(*this);
    provider_ = local_;
    unit_params_.assign(table_.num_units(), nullptr);
    unit_grads_.assign(table_.num_units(), nullptr);
}

void GPT::set_positions(const std::vector<int>& pos) {
    if ((int)pos.size() != T_) throw std::invalid_argument("set_positions: one position per local token");
    for (int p : pos)
        if (p < 0 || p >= cfg_.max_seq_len) throw std::invalid_argument("set_positions: position past maxT");
    pos_host_ = pos;
    be_->upload(a_->pos, DType::I32, pos.data(), DType::I32, T_);
}

size_t GPT::layer_activation_bytes() const {
    size_t n = 0;
    for (const BufferInfo& b : buffers_)
        if (b.per_layer) n += b.bytes;
    return layer_slots_ ? n / layer_slots_ : 0;
}

size_t GPT::boundary_elems() const {
    const size_t N = (size_t)B_ * T_;
    return (tp_ && tp_->sp() ? N / tp_size_ : N) * cfg_.channels;
}

size_t GPT::activation_bytes() const {
    size_t n = 0;
    for (const BufferInfo& b : buffers_)
        if (b.group == "activations" || b.group == "scratch") n += b.bytes;
    return n;
}

GPT::~GPT() {
    for (void* p : owned_) be_->release(p);
    delete a_;
    delete local_;
}

void GPT::set_provider(UnitProvider* p) {
    if (!p && (sharding_.params || sharding_.grads))
        throw std::logic_error("GPT: sharded buffers need a parallel unit provider");
    provider_ = p ? p : local_;
}

void* GPT::param(Param p, int layer) {
    if (sharding_.params) throw std::logic_error("GPT::param: parameters are sharded");
    return elem_ptr(params_, prec_.param, table_.get(p, layer).offset);
}

const void* GPT::P(Param p, int layer) const {
    const TensorEntry& e = table_.get(p, layer);
    const void* base = unit_params_[e.unit];
    if (!base) throw std::logic_error("GPT: unit " + std::to_string(e.unit) + " used without acquire");
    return elem_ptr(base, prec_.param, e.offset - table_.unit_begin[e.unit]);
}

void* GPT::G(Param p, int layer) {
    const TensorEntry& e = table_.get(p, layer);
    void*& base = unit_grads_[e.unit];
    if (!base) base = provider_->grads(e.unit);
    return elem_ptr(base, prec_.grad, e.offset - table_.unit_begin[e.unit]);
}

void GPT::acquire(int unit) { unit_params_[unit] = provider_->acquire(unit); }
void GPT::release(int unit) {
    provider_->release(unit);
    unit_params_[unit] = nullptr;
}

// ---- initialisation and host transfer -------------------------------------------------

template <typename Fn>
void GPT::for_each_piece(bool sharded, Fn fn, Tensors which, bool skip_copies, size_t file_begin,
                         size_t file_end) const {
    // One run of the tensor's local memory <-> the file, cut to this rank's
    // slice of the unit when the buffer is sharded.
    auto emit = [&](const TensorEntry& e, size_t local, size_t file, size_t n) {
        size_t g = e.offset + local;
        if (!sharded) return fn(file, g, n);
        size_t lo = table_.slice_begin(e.unit, sharding_.rank), hi = lo + table_.shard_size(e.unit);
        size_t b = std::max(lo, g), en = std::min(hi, g + n);
        if (b < en) fn(file + (b - g), table_.shard_begin[e.unit] + (b - lo), en - b);
    };
    for (const TensorEntry& e : table_.entries) {
        if ((which == Tensors::split && !e.split) || (which == Tensors::replicated && e.split)) continue;
        if (skip_copies && e.tied_copy) continue;
        if (e.file_offset >= file_end || e.file_offset + e.file_rows * e.file_cols <= file_begin) continue;
        for (const RowRun& r : e.runs) {
            if (e.cols == e.file_cols) {  // whole rows: one contiguous run
                emit(e, r.local * e.cols, e.file_offset + r.global * e.file_cols, r.count * e.cols);
                continue;
            }
            for (size_t i = 0; i < r.count; i++)  // a column slice: one run per row
                emit(e, (r.local + i) * e.cols, e.file_offset + (r.global + i) * e.file_cols + e.col_begin, e.cols);
        }
    }
}

void GPT::set_file_range(void* buf, bool sharded, DType buf_t, const void* host, DType src_t, size_t file_begin,
                         size_t file_end) {
    for_each_piece(
        sharded,
        [&](size_t f, size_t o, size_t n) {
            size_t b = std::max(f, file_begin), e = std::min(f + n, file_end);
            if (b < e)
                be_->upload(elem_ptr(buf, buf_t, o + (b - f)), buf_t, elem_ptr(host, src_t, b - file_begin), src_t,
                            e - b);
        },
        Tensors::all, false, file_begin, file_end);
}

void GPT::for_each_owned(bool sharded, bool whole_owner, bool replicated_owner,
                         const std::function<void(size_t, size_t, size_t)>& fn) const {
    if (!sharded && !whole_owner) return;
    for_each_piece(sharded, fn, replicated_owner ? Tensors::all : Tensors::split, true);
}

void GPT::set_weights_file_range(const void* host, DType t, size_t file_begin, size_t file_end) {
    set_file_range(params_, sharding_.params, prec_.param, host, t, file_begin, file_end);
    if (master_) set_file_range(master_, sharding_.optimizer, prec_.master, host, t, file_begin, file_end);
}

void GPT::set_file_order(void* buf, bool sharded, DType buf_t, const void* host, DType src_t) {
    set_file_range(buf, sharded, buf_t, host, src_t, 0, table_.file_params);
}

void GPT::get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t, Tensors which) {
    for_each_piece(
        sharded, [&](size_t f, size_t o, size_t n) {
            be_->download(elem_ptr(host, dst_t, f), dst_t, elem_ptr(buf, src_t, o), src_t, n);
        },
        which, true);
}

double GPT::replicated_checksum() {
    double ss = 0;
    for_each_piece(
        sharding_.params,
        [&](size_t, size_t o, size_t n) { ss += be_->sum_squares(elem_ptr(params_, prec_.param, o), prec_.param, n); },
        Tensors::replicated);
    return ss;
}

double GPT::unit_checksum(int u) {
    if (table_.unit_size(u) == 0) return 0;
    const size_t at = sharding_.params ? table_.shard_begin[u] : table_.unit_begin[u];
    const size_t n = sharding_.params ? table_.shard_size(u) : table_.unit_size(u);
    return be_->sum_squares(elem_ptr(params_, prec_.param, at), prec_.param, n);
}

void GPT::set_weights_file_order(const void* host, DType t) {
    set_file_order(params_, sharding_.params, prec_.param, host, t);
    if (master_) set_file_order(master_, sharding_.optimizer, prec_.master, host, t);
}

void GPT::init_random(uint64_t seed) {
    // Drawn on the host in file order for the whole model, tensor by tensor,
    // so the values do not depend on the memory layout or on which rank holds
    // what: every rank draws every tensor of the whole model (the table of
    // one process lists them) and keeps its own part.
    Rng rng(seed);
    // GPT-2 (llm.c): N(0, 0.02), the projections into the residual stream
    // scaled by 1/sqrt(2L). Llama (Hugging Face): N(0, 0.02) everywhere.
    const double std_base = 0.02;
    const double std_resid = cfg_.llama() ? std_base : 0.02 / std::sqrt(2.0 * cfg_.num_layers);
    const TensorTable whole(cfg_);
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : whole.entries) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](const TensorEntry* x, const TensorEntry* y) { return x->file_offset < y->file_offset; });
    std::vector<double> host;
    for (const TensorEntry* e : order) {
        const size_t n = e->file_rows * e->file_cols;
        host.assign(n, 0.0);
        double* x = host.data();
        switch (e->kind) {
            case Param::ln1w: case Param::ln2w: case Param::lnfw:
                for (size_t i = 0; i < n; i++) x[i] = 1.0;
                break;
            case Param::wte: case Param::lm_head:  // padded rows V..Vp-1 stay zero: they never see a gradient
                for (size_t i = 0; i < (size_t)cfg_.vocab_size * e->file_cols; i++) x[i] = std_base * rng.normal();
                break;
            case Param::attprojw: case Param::fcprojw:
                for (size_t i = 0; i < n; i++) x[i] = std_resid * rng.normal();
                break;
            default:
                if (e->decay)
                    for (size_t i = 0; i < n; i++) x[i] = std_base * rng.normal();
                break;  // biases stay zero
        }
        size_t fb = e->file_offset, fe = fb + n;
        set_file_range(params_, sharding_.params, prec_.param, x, DType::F64, fb, fe);
        if (master_) set_file_range(master_, sharding_.optimizer, prec_.master, x, DType::F64, fb, fe);
    }
}

void GPT::zero_grad() {
    size_t n = sharding_.grads ? table_.shard_total : table_.total;
    be_->zero(grads_, n * dtype_size(prec_.grad));
}

// Under sequence parallelism the LayerNorm parameters see only this rank's
// tokens, so their gradients are partial: sum them over the tp group. The
// parallel mode calls this just before it reduces the unit's gradients
// (once per accumulation when they accumulate in place, every micro-step
// when each micro-step has a fresh buffer), so nothing is summed twice.
void GPT::sum_partial_grads(int unit, void* unit_grads) {
    if (!tp_ || !tp_->sp()) return;
    for (const TensorEntry& e : table_.entries) {
        if (e.unit != unit) continue;
        switch (e.kind) {
            case Param::ln1w: case Param::ln1b: case Param::ln2w: case Param::ln2b: case Param::lnfw: case Param::lnfb:
                tp_->sum(elem_ptr(unit_grads, prec_.grad, e.offset - table_.unit_begin[unit]), e.numel, prec_.grad);
                break;
            default: break;
        }
    }
}

// ---- forward ----------------------------------------------------------------------

// Block l's slices of the activations, for N tokens (Ns in the residual
// stream). Buffers the recompute mode does not keep are the block scratch.
struct GPT::LayerActs {
    void *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *x2, *ln2, *ln2_mean, *ln2_rstd, *fch, *h, *x3;
};

// Layer-slot of block l for the micro-batch in `slot`: the chunk's slots
// follow one another, each holding the chunk's blocks in order.
int GPT::chunk_of_layer(int l) const {
    for (size_t c = 0; c < chunks_.size(); c++)
        if (l >= chunks_[c].first_layer && l < chunks_[c].first_layer + chunks_[c].layers) return (int)c;
    throw std::logic_error("GPT: block " + std::to_string(l) + " is not on this pipeline stage");
}

void* GPT::chunk_in(int c, int slot) {
    const size_t N = (size_t)last_B_ * last_T_, Ns = tp_ && tp_->sp() ? N / tp_size_ : N;
    return act_layer(a_->encoded, (int)(slot_base_[c] + slot), Ns * cfg_.channels, prec_.act);
}

GPT::LayerActs GPT::layer_acts(int l, int slot, int N, int Ns) {
    Acts& a = *a_;
    const size_t C = cfg_.channels, Cl = (size_t)table_.heads * cfg_.head_size(), Hl = table_.hidden;
    const DType act = prec_.act, st = prec_.stat;
    const int c = chunk_of_layer(l);
    const ModelChunk& ch = chunks_[c];
    const int i = (int)(layer_base_[c] + (size_t)slot * ch.layers + (l - ch.first_layer));
    // A kept buffer's slice for this layer-slot, or the scratch.
    auto at = [&](void* base, bool keep, size_t per, DType t) {
        return keep && base ? act_layer(base, i, per, t) : base;
    };
    const bool kb = a.keep_block, ka = a.keep_attn;
    LayerActs r;
    r.x = l == ch.first_layer ? chunk_in(c, slot) : act_layer(a.residual3, i - 1, Ns * C, act);
    r.ln1 = at(a.ln1, kb, Ns * C, act);
    r.ln1_mean = at(a.ln1_mean, kb, Ns, st);
    r.ln1_rstd = at(a.ln1_rstd, kb, Ns, st);
    r.qkv = at(a.qkv, kb, N * qkv_width(), act);
    r.atty = at(a.atty, ka, N * Cl, act);
    r.lse = at(a.lse, ka, (size_t)N * table_.heads, st);
    r.x2 = at(a.residual2, kb, Ns * C, act);
    r.ln2 = at(a.ln2, kb, Ns * C, act);
    r.ln2_mean = at(a.ln2_mean, kb, Ns, st);
    r.ln2_rstd = at(a.ln2_rstd, kb, Ns, st);
    r.fch = at(a.fch, kb, N * fch_width(), act);
    r.h = at(a.fch_gelu, a.keep_gelu, N * Hl, act);
    r.x3 = act_layer(a.residual3, i, Ns * C, act);
    return r;
}

// Unit numbers (tensors.h): 0 embeddings, 1 + l block l, L + 1 final LayerNorm.
static int block_unit(int l) { return l + 1; }

double GPT::forward(const int* inputs, const int* targets, int B, int T, double dloss) {
    if (chunks_.size() != 1 || !chunks_[0].embed || !chunks_[0].head)
        throw std::logic_error("GPT::forward: the model is split into pipeline chunks");
    return forward_chunk(0, 0, inputs, nullptr, targets, B, T, dloss);
}

void GPT::backward() {
    if (chunks_.size() != 1) throw std::logic_error("GPT::backward: the model is split into pipeline chunks");
    backward_chunk(0, 0, nullptr);
}

const void* GPT::chunk_output(int c, int slot) {
    const ModelChunk& ch = chunks_.at(c);
    if (ch.head || ch.layers == 0) throw std::logic_error("GPT::chunk_output: the head chunk has no output");
    const int N = last_B_ * last_T_, Ns = tp_ && tp_->sp() ? N / tp_size_ : N;
    return layer_acts(ch.first_layer + ch.layers - 1, slot, N, Ns).x3;
}

const void* GPT::input_grad() const { return a_->dresidual; }

// f and g around a column-parallel / row-parallel pair (identities without tp).
void* GPT::block_forward(int l, const LayerActs& la, int B, int T, bool norm_input) {
    Acts& a = *a_;
    const bool sp = tp_ && tp_->sp();
    const int C = cfg_.channels, N = B * T, Ns = sp ? N / tp_size_ : N, Cl = table_.heads * cfg_.head_size();
    const int Hl = table_.hidden;
    const bool bias_in_matmul = !tp_;  // row-parallel biases wait for the reduction
    const DType act = prec_.act;
    auto f_fwd = [&](void* local) -> const void* { return tp_ ? tp_->f_forward(local, a.ln_full, C, N, act) : local; };
    auto g_fwd = [&](const void* bias) -> void* {
        if (!tp_) return a.proj;
        void* out = tp_->g_forward(a.proj, a.proj_s, C, N, act);
        if (bias) be_->add_bias(out, bias, Ns, C);
        return out;
    };
    if (norm_input) norm(la.ln1, la.ln1_mean, la.ln1_rstd, la.x, Param::ln1w, l, Ns);
    // attention: QKV column-parallel by heads, attproj row-parallel
    be_->matmul_forward(la.qkv, f_fwd(la.ln1), P(Param::qkvw, l), Pb(Param::qkvb, l), N, C, qkv_width());
    rotate(la.qkv, B, T, false);
    attention_core(la, B, T);
    be_->matmul_forward(a.proj, la.atty, P(Param::attprojw, l), bias_in_matmul ? Pb(Param::attprojb, l) : nullptr, N,
                        Cl, C);
    void* attn_out = g_fwd(Pb(Param::attprojb, l));
    residual_norm(la.x2, la.ln2, la.ln2_mean, la.ln2_rstd, la.x, attn_out, Param::ln2w, l, Ns);
    // MLP: fc column-parallel, fcproj row-parallel
    be_->matmul_forward(la.fch, f_fwd(la.ln2), P(Param::fcw, l), Pb(Param::fcb, l), N, C, fch_width());
    activation(la.h, la.fch, N);
    be_->matmul_forward(a.proj, la.h, P(Param::fcprojw, l), bias_in_matmul ? Pb(Param::fcprojb, l) : nullptr, N, Hl,
                        C);
    return g_fwd(Pb(Param::fcprojb, l));
}

void GPT::attention_core(const LayerActs& la, int B, int T) {
    const int HS = cfg_.head_size(), Cl = table_.heads * HS, Ckv = table_.kv_heads * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    const DType act = prec_.act;
    if (cp_) {
        cp_->attention_forward(la.atty, la.lse, la.qkv, B, scale);  // ring over the cp group
        return;
    }
    const size_t W = qkv_width();
    AttnShape shape{B, table_.heads, HS, T, T, W, W, (size_t)Cl, true, scale};
    shape.NKV = table_.kv_heads;
    be_->attention_forward(la.atty, la.lse, la.qkv, elem_ptr(la.qkv, act, Cl), elem_ptr(la.qkv, act, (size_t)Cl + Ckv),
                           shape);
}

// ---- the pieces that differ between GPT-2 and Llama -----------------------------------

size_t GPT::qkv_width() const { return (size_t)(table_.heads + 2 * table_.kv_heads) * cfg_.head_size(); }
size_t GPT::fch_width() const { return (size_t)table_.hidden * (cfg_.llama() ? 2 : 1); }

const void* GPT::Pb(Param p, int layer) const { return table_.has(p, layer) ? P(p, layer) : nullptr; }
void* GPT::Gb(Param p, int layer) { return table_.has(p, layer) ? G(p, layer) : nullptr; }

// LayerNorm with weight w and bias w+1 (GPT-2), or RMSNorm with weight w.
void GPT::norm(void* out, void* mean, void* rstd, const void* inp, Param w, int layer, int N) {
    const int C = cfg_.channels;
    if (cfg_.llama()) be_->rmsnorm_forward(out, rstd, inp, P(w, layer), N, C, cfg_.norm_eps);
    else be_->layernorm_forward(out, mean, rstd, inp, P(w, layer), P((Param)((int)w + 1), layer), N, C);
}

void GPT::residual_norm(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b, Param w,
                        int layer, int N) {
    const int C = cfg_.channels;
    if (cfg_.llama()) be_->residual_rmsnorm_forward(residual, out, rstd, a, b, P(w, layer), N, C, cfg_.norm_eps);
    else
        be_->residual_layernorm_forward(residual, out, mean, rstd, a, b, P(w, layer), P((Param)((int)w + 1), layer), N,
                                        C);
}

void GPT::norm_backward(void* dinp, const void* dout, const void* inp, const void* mean, const void* rstd, Param w,
                        int layer, int N) {
    const int C = cfg_.channels;
    if (cfg_.llama()) be_->rmsnorm_backward(dinp, G(w, layer), dout, inp, P(w, layer), rstd, N, C);
    else
        be_->layernorm_backward(dinp, G(w, layer), G((Param)((int)w + 1), layer), dout, inp, P(w, layer), mean, rstd,
                                N, C);
}

// Llama: rotary embeddings on the Q and K heads of each QKV row, at the
// tokens' global positions (the inverse on their gradients).
void GPT::rotate(void* qkv, int B, int T, bool inverse) {
    if (!cfg_.llama()) return;
    const int HS = cfg_.head_size();
    const size_t W = qkv_width();
    be_->rope(qkv, W, table_.heads, HS, a_->pos, B, T, cfg_.rope_theta, inverse);
    be_->rope(elem_ptr(qkv, prec_.act, (size_t)table_.heads * HS), W, table_.kv_heads, HS, a_->pos, B, T,
              cfg_.rope_theta, inverse);
}

// The MLP's activation: GELU of fch (GPT-2), or SwiGLU of its gate and up halves.
void GPT::activation(void* h, const void* fch, int N) {
    if (cfg_.llama()) be_->swiglu_forward(h, fch, N, table_.hidden);
    else be_->gelu_forward(h, fch, (size_t)N * table_.hidden);
}

double GPT::forward_chunk(int c, int slot, const int* inputs, const void* x_in, const int* targets, int B, int T,
                          double dloss) {
    if (B > B_ || T > T_ || B <= 0 || T <= 0) throw std::invalid_argument("forward: batch larger than allocated");
    if (cp_ && T != T_) throw std::invalid_argument("forward: context parallel runs whole local sequences");
    const ModelChunk& ch = chunks_.at(c);
    if (slot < 0 || slot >= ch.slots) throw std::logic_error("forward: no such activation slot");
    const bool sp = tp_ && tp_->sp();
    if (sp && T % tp_size_ != 0) throw std::invalid_argument("forward: sequence parallel needs T divisible by tp");
    Acts& a = *a_;
    const int L = cfg_.num_layers, C = cfg_.channels, V = cfg_.vocab_size, N = B * T, Ns = sp ? N / tp_size_ : N;
    const int Vl = table_.vocab_rows;
    const int final_unit = L + 1, first = ch.first_layer, end = ch.first_layer + ch.layers;
    const DType act = prec_.act, st = prec_.stat;
    last_B_ = B;
    last_T_ = T;
    void* x0 = chunk_in(c, slot);
    if (ch.head) grad_ready_[slot] = 0;
    int* tok = ch.embed ? a.inputs + (size_t)slot * N : nullptr;
    int* tgt = ch.head ? a.targets + (size_t)slot * N : nullptr;
    if (ch.embed) be_->upload(tok, DType::I32, inputs, DType::I32, N);
    else be_->copy(x0, x_in, (size_t)Ns * C * dtype_size(act));
    if (ch.head && targets) be_->upload(tgt, DType::I32, targets, DType::I32, N);

    // Embeddings: this rank's vocabulary rows (positions added by tp rank 0
    // only), summed over the tp group by g. When the chunk also ends the
    // model, the embedding unit stays acquired until the LM head (tied wte).
    if (ch.embed) {
        acquire(0);
        if (ch.layers > 0) provider_->prefetch(block_unit(first));
        const bool add_pos = !tp_ || tp_->rank() == 0;
        void* emb = sp ? a.emb : x0;
        be_->encoder_forward(emb, tok, a.pos, P(Param::wte), add_pos ? Pb(Param::wpe) : nullptr, B, T, C,
                             table_.vocab_begin, table_.vocab_begin + Vl);
        if (tp_) tp_->g_forward(emb, x0, C, N, act);
        if (!ch.head || !cfg_.tied) release(0);
    }
    auto f_fwd = [&](void* local) -> const void* { return tp_ ? tp_->f_forward(local, a.ln_full, C, N, act) : local; };
    void* lnf = ch.head ? elem_ptr(a.lnf, act, (size_t)slot * Ns * C) : nullptr;
    void* lnf_mean = ch.head ? elem_ptr(a.lnf_mean, st, (size_t)slot * Ns) : nullptr;
    void* lnf_rstd = ch.head ? elem_ptr(a.lnf_rstd, st, (size_t)slot * Ns) : nullptr;
    if (ch.layers > 0) acquire(block_unit(first));
    for (int l = first; l < end; l++) {
        // The unit after this block: the next block of the chunk, the final
        // LayerNorm when the chunk ends the model, else none (next stage's).
        const int next = l + 1 < end ? block_unit(l + 1) : ch.head ? final_unit : -1;
        if (next >= 0) provider_->prefetch(next);
        const LayerActs la = layer_acts(l, slot, N, Ns);
        // For later blocks, ln1 was produced by the previous block's fused
        // residual + LayerNorm; the chunk's first block normalises its input.
        void* mlp_out = block_forward(l, la, B, T, l == first);
        void *x2 = la.x2, *x3 = la.x3;
        // Residual add fused with the next LayerNorm (next block's ln1, or
        // lnf), whose parameters belong to the next unit; at the end of a
        // chunk that does not end the model, the residual add alone.
        if (next >= 0) acquire(next);
        if (l + 1 < end) {
            const LayerActs nx = layer_acts(l + 1, slot, N, Ns);
            residual_norm(x3, nx.ln1, nx.ln1_mean, nx.ln1_rstd, x2, mlp_out, Param::ln1w, l + 1, Ns);
        } else if (ch.head) {
            residual_norm(x3, lnf, lnf_mean, lnf_rstd, x2, mlp_out, Param::lnfw, 0, Ns);
        } else {
            be_->residual_forward(x3, x2, mlp_out, (size_t)Ns * C);
        }
        release(block_unit(l));
    }
    if (!ch.head) return 0.0;
    if (ch.layers == 0) {  // a head chunk without blocks normalises its input
        acquire(final_unit);
        norm(lnf, lnf_mean, lnf_rstd, x0, Param::lnfw, 0, Ns);
    }
    // LM head: vocabulary-parallel, column-parallel over the rows of wte
    // (tied) or of lm_head, which lives in the final unit (untied) (f).
    void* logits = elem_ptr(a.logits, act, (size_t)slot * N * Vl);
    if (cfg_.tied) {
        release(final_unit);
        if (!ch.embed) acquire(0);
        be_->matmul_forward(logits, f_fwd(lnf), P(Param::wte), nullptr, N, C, Vl);
        release(0);
    } else {
        be_->matmul_forward(logits, f_fwd(lnf), P(Param::lm_head), nullptr, N, C, Vl);
        release(final_unit);
    }
    if (!targets) return 0.0;
    if (!tp_) {
        be_->softmax_crossentropy(logits, a.losses, tgt, dloss, N, V, Vl, dloss != 0.0);
    } else {
        // Vocab-parallel cross-entropy: the logits are never gathered.
        const int vb = table_.vocab_begin;
        be_->crossentropy_stats(logits, tgt, a.ce_max, a.ce_target, N, Vl, vb, V);
        tp_->max(a.ce_max, N, st);
        tp_->sum(a.ce_target, N, st);
        be_->crossentropy_sumexp(logits, a.ce_max, a.ce_sumexp, N, Vl, vb, V);
        tp_->sum(a.ce_sumexp, N, st);
        be_->crossentropy_finish(logits, a.losses, tgt, a.ce_max, a.ce_sumexp, a.ce_target, dloss, N, Vl, vb,
                                 V, dloss != 0.0);
    }
    grad_ready_[slot] = dloss != 0.0;
    std::vector<double> losses(N);
    be_->download(losses.data(), DType::F64, a.losses, st, N);
    double sum = 0;
    for (double v : losses) sum += v;
    return sum / N;
}

void GPT::logits_row(int b, int pos, void* out, DType dt) {
    // The local token at global position pos, if this rank holds it.
    int t = -1;
    for (int i = 0; i < last_T_; i++)
        if (pos_host_[i] == pos) t = i;
    const size_t Vl = table_.vocab_rows, V = cfg_.vocab_size;
    if (!a_->logits) throw std::logic_error("logits_row: this pipeline stage has no LM head");
    // Slot 0 of the head chunk: the forward-only passes (samples) use it.
    const void* src = t >= 0 ? elem_ptr(a_->logits, prec_.act, ((size_t)b * last_T_ + t) * Vl) : nullptr;
    if (!tp_ && !cp_) {
        if (!src) throw std::invalid_argument("logits_row: position not in the last forward");
        be_->download(out, dt, src, prec_.act, V);
        return;
    }
    // Each rank contributes the part of the row it holds (a vocabulary slice
    // under tp, nothing when cp puts the position elsewhere); sums assemble it.
    const size_t vb = table_.vocab_begin, held = vb < V ? std::min(Vl, V - vb) : 0;
    be_->zero(a_->logit_row, V * dtype_size(prec_.act));
    if (src && held) be_->copy(elem_ptr(a_->logit_row, prec_.act, vb), src, held * dtype_size(prec_.act));
    if (tp_) tp_->sum(a_->logit_row, V, prec_.act);
    if (cp_) cp_->comm().all_reduce(a_->logit_row, V, prec_.act, ReduceOp::Sum);
    be_->download(out, dt, a_->logit_row, prec_.act, V);
}

// ---- backward ----------------------------------------------------------------------

void GPT::backward_chunk(int c, int slot, const void* dy) {
    const ModelChunk& ch = chunks_.at(c);
    if (slot < 0 || slot >= ch.slots) throw std::logic_error("backward: no such activation slot");
    if (ch.head && !grad_ready_[slot]) throw std::logic_error("backward: the last forward computed no loss gradient");
    Acts& a = *a_;
    const bool sp = tp_ && tp_->sp();
    const int L = cfg_.num_layers, C = cfg_.channels, HS = cfg_.head_size();
    const int B = last_B_, T = last_T_, N = B * T, Ns = sp ? N / tp_size_ : N;
    const int NHl = table_.heads, Cl = NHl * HS, Ckv = table_.kv_heads * HS, Hl = table_.hidden;
    const int Vl = table_.vocab_rows;
    const int final_unit = L + 1, first = ch.first_layer, end = ch.first_layer + ch.layers;
    const DType act = prec_.act;
    const size_t W = qkv_width();
    AttnShape shape{B, NHl, HS, T, T, W, W, (size_t)Cl, true, 1.0 / std::sqrt((double)HS)};
    shape.NKV = table_.kv_heads;
    // Gradient buffers are handed out afresh for each backward (ZeRO-2/3).
    if (ch.embed || (ch.head && cfg_.tied)) unit_grads_[0] = nullptr;
    if (ch.head) unit_grads_[final_unit] = nullptr;
    for (int l = first; l < end; l++) unit_grads_[block_unit(l)] = nullptr;
    // The conjugates' backward (identities without tp). Under SP a LayerNorm
    // output is gathered again rather than kept whole (activation memory).
    auto f_input = [&](void* local) -> const void* { return tp_ ? tp_->f_forward(local, a.ln_full, C, N, act) : local; };
    auto f_bwd = [&]() -> void* { return tp_ ? tp_->f_backward(a.dln, a.dln_s, C, N, act) : a.dln; };
    auto g_bwd = [&]() -> const void* { return tp_ ? tp_->g_backward(a.dresidual, a.dfull, C, N, act) : a.dresidual; };

    if (ch.head) {
        // LM head and final norm: logits now hold dlogits. Tied, the head is
        // wte of the embedding unit, which stays acquired until the encoder's
        // backward when the chunk also starts the model; untied, it is
        // lm_head of the final unit.
        void* logits = elem_ptr(a.logits, act, (size_t)slot * N * Vl);
        void* lnf = elem_ptr(a.lnf, act, (size_t)slot * Ns * C);
        if (cfg_.tied) acquire(0);
        acquire(final_unit);
        if (ch.layers > 0) provider_->prefetch(block_unit(end - 1));
        const Param head = cfg_.tied ? Param::wte : Param::lm_head;
        be_->matmul_backward(a.dln, G(head), nullptr, logits, f_input(lnf), P(head), N, C, Vl);
        if (cfg_.tied && !ch.embed) {  // the last stage's copy of the embedding unit is done
            provider_->grads_done(0);
            release(0);
        }
        be_->zero(a.dresidual, (size_t)Ns * C * dtype_size(act));
        const void* lnf_in = ch.layers > 0 ? layer_acts(end - 1, slot, N, Ns).x3 : chunk_in(c, slot);
        norm_backward(a.dresidual, f_bwd(), lnf_in, a.lnf_mean ? elem_ptr(a.lnf_mean, prec_.stat, (size_t)slot * Ns) : nullptr,
                      elem_ptr(a.lnf_rstd, prec_.stat, (size_t)slot * Ns), Param::lnfw, 0, Ns);
        provider_->grads_done(final_unit);
        release(final_unit);
        grad_ready_[slot] = 0;
    } else {
        // The next chunk's gradient of our output is the residual gradient.
        be_->copy(a.dresidual, dy, (size_t)Ns * C * dtype_size(act));
    }

    for (int l = end - 1; l >= first; l--) {
        const int u = block_unit(l);
        acquire(u);
        if (l > first) provider_->prefetch(block_unit(l - 1));
        const LayerActs la = layer_acts(l, slot, N, Ns);
        // What the recompute mode did not keep, from what it kept.
        if (!a.keep_block) {
            block_forward(l, la, B, T, true);
        } else {
            if (!a.keep_attn) attention_core(la, B, T);
            if (!a.keep_gelu) activation(la.h, la.fch, N);
        }
        // dresidual holds d(x3); it flows unchanged into d(x2) plus the MLP path.
        // The row-parallel bias gradient sums the whole (gathered) output gradient.
        be_->matmul_backward(a.dh, G(Param::fcprojw, l), Gb(Param::fcprojb, l), g_bwd(), la.h, P(Param::fcprojw, l),
                             N, Hl, C);
        if (cfg_.llama()) be_->swiglu_backward(a.dfch, la.fch, a.dh, N, Hl);
        else be_->gelu_backward(a.dfch, la.fch, a.dh, (size_t)N * Hl);
        be_->matmul_backward(a.dln, G(Param::fcw, l), Gb(Param::fcb, l), a.dfch, f_input(la.ln2), P(Param::fcw, l), N,
                             C, (int)fch_width());
        norm_backward(a.dresidual, f_bwd(), la.x2, la.ln2_mean, la.ln2_rstd, Param::ln2w, l, Ns);
        // dresidual holds d(x2); attention path.
        be_->matmul_backward(a.datt, G(Param::attprojw, l), Gb(Param::attprojb, l), g_bwd(), la.atty,
                             P(Param::attprojw, l), N, Cl, C);
        if (cp_)
            cp_->attention_backward(a.dqkv, a.datt, la.qkv, la.atty, la.lse, B, shape.scale);
        else
            be_->attention_backward(a.dqkv, elem_ptr(a.dqkv, act, Cl), elem_ptr(a.dqkv, act, (size_t)Cl + Ckv), a.datt,
                                    la.qkv, elem_ptr(la.qkv, act, Cl), elem_ptr(la.qkv, act, (size_t)Cl + Ckv), la.atty,
                                    la.lse, shape);
        rotate(a.dqkv, B, T, true);  // back through the rotary embeddings (Llama)
        be_->matmul_backward(a.dln, G(Param::qkvw, l), Gb(Param::qkvb, l), a.dqkv, f_input(la.ln1), P(Param::qkvw, l),
                             N, C, (int)W);
        norm_backward(a.dresidual, f_bwd(), la.x, la.ln1_mean, la.ln1_rstd, Param::ln1w, l, Ns);
        provider_->grads_done(u);
        release(u);
    }
    if (!ch.embed) return;  // dresidual holds the gradient of the chunk's input
    // Embeddings: every tp rank computes wpe's gradient from the whole
    // output gradient (so the replicas agree) and its vocabulary rows' of wte.
    be_->encoder_backward(G(Param::wte), Gb(Param::wpe), g_bwd(), a.inputs + (size_t)slot * N, a.pos, B, T, C,
                          table_.vocab_begin, table_.vocab_begin + Vl);
    provider_->grads_done(0);
    if (ch.head && cfg_.tied) release(0);
}
