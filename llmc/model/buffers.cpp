// llmc/model/buffers.cpp: the model's buffers (parameters, gradients, master
// weights, Adam state and activations, llmc/model/activations.h), the
// micro-batch slots of its chunks, and access to the units' parameters and
// gradients through a UnitProvider. Weights in file order and the
// initialisation are in weights.cpp, the forward in forward.cpp, the
// backward in backward.cpp.
//
// Parameters and gradients are reached through a UnitProvider: the model
// acquires each unit (embeddings, a block, the final LayerNorm) before it
// computes with it and releases it after, and reports each unit's gradients
// as complete as soon as its backward is done. Single-process runs use
// LocalUnits (whole buffers); parallel modes install their own provider.
#include "llmc/model/gpt.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>

#include "llmc/base/fnv.h"
#include "llmc/model/activations.h"

// The provider for whole buffers: nothing to gather, nothing to reduce.
class GPT::LocalUnits : public UnitProvider {
  public:
    explicit LocalUnits(GPT& m) : m_(m) {}
    const void* acquire(int u) override {
        return elem_ptr(m_.params_, m_.prec_.param, m_.table_.unit_begin[u]);
    }
    void release(int) override {}
    void* grads(int u) override { return elem_ptr(m_.grads_, m_.prec_.grad, m_.table_.unit_begin[u]); }
    void grads_done(int, bool) override {}
    bool quiet(bool, bool) const override { return true; }

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

// A number per model built in this process, for its regions' keys.
static uint64_t next_region_model() {
    static std::atomic<uint64_t> n{0};
    return ++n;
}

// The tensor table's cut of the model for this rank: its degrees from the
// parallel modes' hooks and the sharding, its units from the chunks.
static TableSplit table_split(const GPTConfig& cfg, const ModelOptions& o) {
    TableSplit t;
    t.shards = o.sharding.shards;
    t.expert_shards = o.sharding.expert_shards;
    if (o.tp) t.tp = o.tp->size(), t.tp_rank = o.tp->rank();
    if (o.ep) t.ep = o.ep->size(), t.ep_rank = o.ep->rank();
    t.stage = stage_units(cfg, o.chunks.empty() ? whole_model(cfg) : o.chunks);
    return t;
}

GPT::GPT(Backend* be, const GPTConfig& cfg, const ModelOptions& o)
    : region_model_(next_region_model()), be_(be), cfg_(cfg), table_(cfg, table_split(cfg, o)),
      prec_(be->precision()), B_(o.B), T_(o.T), recompute_(o.recompute),
      chunks_(o.chunks.empty() ? whole_model(cfg) : o.chunks), tp_(o.tp && o.tp->size() > 1 ? o.tp : nullptr),
      tp_size_(o.tp ? o.tp->size() : 1), cp_(o.cp && o.cp->size() > 1 ? o.cp : nullptr), head_chunk_(o.head_chunk),
      ep_(o.ep && o.ep->size() > 1 ? o.ep : nullptr), sharding_(o.sharding), training_(o.training), fp8_(o.fp8),
      fp8_len_(o.fp8 ? o.fp8_history : 0), fp8_layers_(o.fp8_layers) {
    const int B = o.B, T = o.T, head_chunk = o.head_chunk;
    const Recompute recompute = o.recompute;
    const Sharding& sharding = o.sharding;
    const bool training = o.training;
    if (o.bf16_optimizer_state) prec_.opt = DType::BF16;
    if (T > cfg.max_seq_len) throw std::invalid_argument("sequence length T exceeds the model's maxT");
    if (head_chunk < 0) throw std::invalid_argument("GPT: negative LM-head chunk");
    const bool sp = tp_ && tp_->sp();
    if (sp && T % tp_size_ != 0) throw std::invalid_argument("sequence parallel needs T divisible by tp");
    // Where each chunk's slots live in the per-layer and per-chunk buffers.
    int embed_slots = 0, head_slots = 0, head_bufs = 0;
    size_t chunk_slots = 0, fb_slots = 0, bw_slots = 0;
    auto count = [](const std::vector<int>& bufs, int slots) {  // buffers of an fb_bufs or bw_bufs
        if (bufs.empty()) return slots;
        if ((int)bufs.size() != slots) throw std::invalid_argument("GPT: a chunk's buffers not one per slot");
        return 1 + *std::max_element(bufs.begin(), bufs.end());
    };
    for (const ModelChunk& c : chunks_) {
        if (c.slots < 1 || c.layers < 0 || c.first_layer < 0 || c.first_layer + c.layers > cfg.num_layers)
            throw std::invalid_argument("GPT: bad model chunk");
        layer_base_.push_back(layer_slots_);
        fb_base_.push_back(fb_slots);
        bw_base_.push_back(bw_slots);
        slot_base_.push_back(chunk_slots);
        layer_slots_ += (size_t)c.layers * c.slots;
        fb_slots += (size_t)c.layers * count(c.fb_bufs, c.slots);
        bw_slots += (size_t)c.layers * count(c.bw_bufs, c.slots);
        chunk_slots += c.slots;
        if (c.embed) embed_slots = c.slots;
        if (c.head) head_slots = c.slots, head_bufs = count(c.fb_bufs, c.slots);
    }
    const size_t LS = layer_slots_, C = cfg.channels, N = (size_t)B * T, Ns = sp ? N / tp_size_ : N;
    const size_t NHl = table_.heads, Cl = NHl * cfg.head_size(), Wqkv = qkv_width(), Hl = table_.hidden;
    const size_t Fl = fch_width(), Vl = table_.vocab_rows;
    const bool ln = !cfg.llama();  // LayerNorm keeps a mean; RMSNorm does not
    const size_t full = table_.total, shard = table_.shard_total;
    const size_t ES = embed_slots, HSl = head_slots, HB = head_bufs;
    const DType act = prec_.act, st = prec_.stat;
    params_ = alloc_buffer("params", "params", sharding.params ? shard : full, prec_.param);
    // The master copy stays without training: the loaders write the weights through it.
    if (training) grads_ = alloc_buffer("grads", "grads", sharding.grads ? shard : full, prec_.grad);
    if (prec_.has_master) master_ = alloc_buffer("master", "master", sharding.optimizer ? shard : full, prec_.master);
    if (training) m_ = alloc_buffer("optimizer", "adam_m", sharding.optimizer ? shard : full, prec_.opt);
    if (training) v_ = alloc_buffer("optimizer", "adam_v", sharding.optimizer ? shard : full, prec_.opt);

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
    // fb: held from the forward to B only (ModelChunk::fb_bufs), where W
    // reads none of it: the norms' statistics and second residual only
    // when W leaves the norms alone (not ZeRO 2 and 3), a Mixtral's MLP's
    // pre-activation never.
    a.fb_norms = !sharding.grads;
    a.fb_fch = !cfg.moe();
    auto block_buf = [&](const char* name, size_t per_block, DType t, bool keep, bool fb = false) {
        return keep ? alloc_buffer(A, name, (fb ? fb_slots : LS) * per_block, t, true)
                    : alloc_buffer(S, (std::string(name) + "_recomputed").c_str(), per_block, t);
    };
    a.ln1 = block_buf("ln1", Ns * C, act, a.keep_block);
    a.ln1_mean = ln ? block_buf("ln1_mean", Ns, st, a.keep_block, a.fb_norms) : nullptr;
    a.ln1_rstd = block_buf("ln1_rstd", Ns, st, a.keep_block, a.fb_norms);
    a.qkv = block_buf("qkv", N * Wqkv, act, a.keep_block, true);
    a.atty = block_buf("atty", N * Cl, act, a.keep_attn);
    a.lse = block_buf("attn_lse", N * NHl, st, a.keep_attn, true);
    a.residual2 = block_buf("residual2", Ns * C, act, a.keep_block, a.fb_norms);
    a.ln2 = block_buf("ln2", Ns * C, act, a.keep_block);
    a.ln2_mean = ln ? block_buf("ln2_mean", Ns, st, a.keep_block, a.fb_norms) : nullptr;
    a.ln2_rstd = block_buf("ln2_rstd", Ns, st, a.keep_block, a.fb_norms);
    const size_t R = mlp_rows((int)N);  // rows of the MLP's hidden layer (Mixtral: N·K grouped rows)
    a.fch = block_buf("fch", R * Fl, act, a.keep_block, a.fb_fch);
    a.fch_gelu = block_buf("fch_gelu", R * Hl, act, a.keep_gelu);
    a.residual3 = block_buf("residual3", Ns * C, act, true);  // the next block's input: always kept
    if (o.split_backward) {
        // W reads the linear layers' inputs where the forward left them, or
        // copies B keeps here: under sequence parallelism the column-parallel
        // ones' gathered inputs (so W issues no collective), under recompute
        // what B recomputed into the block's scratch; and their output
        // gradients, kept here. What the split does not keep yet is refused.
        // (A Mixtral's fully recomputed routing lives in the block's scratch:
        // B keeps the experts' input rows, and the row groups on the host.)
        if (cfg.moe() && !a.keep_block) a.g_xg = alloc_buffer(A, "w_input_experts", bw_slots * R * C, act, true);
        a.g_qkv = alloc_buffer(A, "w_grad_qkv", bw_slots * N * Wqkv, act, true);
        a.g_attproj = alloc_buffer(A, "w_grad_attproj", bw_slots * N * C, act, true);
        a.g_fc = alloc_buffer(A, "w_grad_fc", bw_slots * R * Fl, act, true);
        a.g_fcproj = alloc_buffer(A, "w_grad_fcproj", bw_slots * (cfg.moe() ? R : N) * C, act, true);
        if (cfg.moe()) a.g_router = alloc_buffer(A, "w_grad_router", bw_slots * N * cfg.experts, act, true);
        if (sp || !a.keep_block) a.g_ln1 = alloc_buffer(A, "w_input_ln1", bw_slots * N * C, act, true);
        if (sp || !a.keep_block) a.g_ln2 = alloc_buffer(A, "w_input_ln2", bw_slots * N * C, act, true);
        if (!a.keep_attn) a.g_atty = alloc_buffer(A, "w_input_atty", bw_slots * N * Cl, act, true);
        if (!a.keep_gelu) a.g_h = alloc_buffer(A, "w_input_h", bw_slots * R * Hl, act, true);
        // ZeRO 2 and 3 hand a block's gradient buffer out per backward: W
        // takes the norms' weight gradients too (from their inputs, which the
        // forward keeps, and the output gradients B keeps here), so B leaves
        // the block's gradients alone.
        if (sharding.grads) {
            a.g_dln1 = alloc_buffer(A, "w_grad_ln1", bw_slots * Ns * C, act, true);
            a.g_dln2 = alloc_buffer(A, "w_grad_ln2", bw_slots * Ns * C, act, true);
            a.norm_discard = alloc_buffer(S, "norm_grads_discarded", 2 * (size_t)C, prec_.grad);
            if (!a.keep_block) a.g_x2 = alloc_buffer(A, "w_input_x2", bw_slots * Ns * C, act, true);
            if (!a.keep_block) a.g_stats = alloc_buffer(A, "w_norm_stats", bw_slots * 4 * Ns, st, true);
        }
    }
    if (cfg.moe()) {
        const size_t E = cfg.experts, K = cfg.top_k;
        a.moe_probs = block_buf("moe_probs", N * E, st, a.keep_block);
        a.moe_topw = block_buf("moe_topw", N * K, act, a.keep_block);
        a.moe_topi = (int*)block_buf("moe_topi", N * K, DType::I32, a.keep_block);
        a.moe_offsets = (int*)block_buf("moe_offsets", E + 1, DType::I32, a.keep_block);
        a.moe_perm = (int*)block_buf("moe_perm", N * K, DType::I32, a.keep_block);
        a.moe_inv = (int*)block_buf("moe_inv", N * K, DType::I32, a.keep_block);
        // R rows on the experts' side (under expert parallelism the rows
        // this rank's experts receive, at most ep·N·min(K, E/ep)), N·K on
        // the tokens' side.
        a.moe_xg = block_buf("moe_xg", R * C, act, a.keep_block);
        a.moe_yg = block_buf("moe_yg", N * K * C, act, a.keep_block);
        if (ep_) {
            a.moe_send = alloc_buffer(S, "moe_grouped_local", N * K * C, act);
            a.moe_ye = alloc_buffer(S, "moe_expert_rows", R * C, act);
        }
        a.moe_logits = alloc_buffer(S, "moe_logits", N * E, act);
        a.moe_dlogits = alloc_buffer(S, "moe_dlogits", N * E, act);
        a.moe_dg = alloc_buffer(S, "moe_dgrouped", N * K * C, act);
        a.moe_dtopw = alloc_buffer(S, "moe_dtopw", N * K, st);
        a.moe_dx = alloc_buffer(S, "moe_drouter", N * C, act);
        a.moe_aux_grad = alloc_buffer(S, "moe_aux_grad", chunk_slots * E, st);
        // --moe-balance bias's [L, E] (zero, and unused, until set_moe_bias).
        a.moe_bias = alloc_buffer(S, "moe_bias", (size_t)cfg.num_layers * E, st);
        be_->zero(a.moe_bias, (size_t)cfg.num_layers * E * dtype_size(st));
        moe_.init(cfg.num_layers, (int)E, LS, chunk_slots, ep_ != nullptr);
    }
    if (fp8_) {  // the four layers' FP8 operands' amax (fp8.cpp): input, weight, output gradient
        if (!be_->fp8()) throw std::invalid_argument("GPT: the " + std::string(be_->name()) + " backend has no FP8 products");
        a.fp8_amax = alloc_buffer(A, "fp8_amax", LS * amax_per_slot(), DType::F64, true);
        // The weights' FP8 copies once per step: not under ZeRO-3, whose
        // ranks hold a weight whole only while they use it.
        if (!sharding.params && o.fp8_weight_copies) {
            const size_t L = cfg.num_layers, IC[4] = {C, Cl, C, Hl}, OC[4] = {Wqkv, C, Fl, C};
            fp8_woff_.assign(L * 4, SIZE_MAX), fp8_wsize_.assign(L * 4, 0), fp8_wmade_.assign(L * 4, 0);
            size_t off = 0;
            for (const ModelChunk& c : chunks_)
                for (int l = c.first_layer; l < c.first_layer + c.layers; l++)
                    for (int k = 0; k < (cfg.moe() ? 2 : 4); k++) {  // (a Mixtral's experts: their own blocks)
                        if (!linear_layer_in(o.fp8_layers, k)) continue;  // (--fp8-layers: in the compute type)
                        const size_t i = (size_t)l * 4 + k, bytes = (IC[k] * OC[k] + 255) / 256 * 256;
                        fp8_woff_[i] = off, fp8_wsize_[i] = bytes, off += 2 * bytes;
                    }
            if (off > 0) a.fp8_wq = alloc_buffer(S, "fp8_weights", off / 4, DType::I32);  // (none: no FP8 layer here)
            if (off > 0) a.fp8_wamax = alloc_buffer(S, "fp8_weight_amax", L * 4, DType::F64);
        }
        if (fp8_len_ > 0) {
            const size_t slots = (size_t)fp8_slots();
            a.fp8_hist = alloc_buffer(S, "fp8_amax_history", slots * fp8_len_, DType::F64);
            a.fp8_step = alloc_buffer(S, "fp8_amax_step", slots, DType::F64);
            // fcproj's input kept transposed in FP8 for its weight gradient (the activation's cast) where h is,
            // not when a split backward recomputes h (B keeps h for W); QKV's and fc's (the norms' casts) where
            // ln1 and ln2 are, not under sp (a norm writes a shard); fc's not a Mixtral's (its router reads ln2).
            // Each in the buffer of the input it replaces: [C, N padded to 16] bytes in 2·N·C, each layer-slot's
            // 256-byte aligned as cuBLASLt assumes (a GPU's FP8 takes N and C in multiples of 16).
            // Each only for a layer on FP8 operands (--fp8-layers).
            auto on = [&](int k) { return linear_layer_in(o.fp8_layers, k); };
            a.fp8_kept_h = on(3) && !cfg.moe() && (a.keep_gelu || !o.split_backward);
            a.fp8_kept_ln1 = on(0) && a.keep_block && !sp, a.fp8_kept_ln2 = on(2) && a.keep_block && !sp && !cfg.moe();
        }
    }
    if (HSl) {
        a.lnf = alloc_buffer(A, "lnf", HSl * Ns * C, act);
        a.lnf_mean = ln ? alloc_buffer(A, "lnf_mean", HSl * Ns, st) : nullptr;
        a.lnf_rstd = alloc_buffer(A, "lnf_rstd", HSl * Ns, st);
        if (!head_chunk) {
            a.logits = alloc_buffer(A, "logits", HB * N * Vl, act);  // (head_buf: F to B)
        } else {
            // Chunked head (head.cpp): one chunk of logits for every slot,
            // each slot's gradient of the head input (the backward's), and
            // the head weight's gradient, kept apart from the gradient
            // buffers because those are handed out only in the backward
            // (ZeRO-2/3, pipeline schedules). Gradient type (the matrix
            // product accumulates into it; the activations' type on every
            // backend).
            a.logits = alloc_buffer(S, "logits_chunk", std::min((size_t)head_chunk, N) * Vl, act);
            a.dlnf = alloc_buffer(A, "dlnf", HB * N * C, act);
            a.head_dw = alloc_buffer(S, "head_dweight", Vl * C, prec_.grad);
            be_->zero(a.head_dw, Vl * C * dtype_size(prec_.grad));
        }
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
    a.dh = alloc_buffer(S, "d_hidden", R * Hl, act);
    a.dfch = Fl == Hl ? a.dh : alloc_buffer(S, "d_gate_up", R * Fl, act);
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

void GPT::region(Pass pass, int c, int slot, int B, int T, double dloss, const std::function<void()>& ops) {
    const bool backward = pass != Pass::forward;
    // Mixtral's expert products need the routing's row counts on the host,
    // unless they stay on the device (keep_moe_on_device).
    if (tp_ || cp_ || (cfg_.moe() && !moe_.on_device()) || !provider_->quiet(backward, pass == Pass::backward_last)) {
        ops();
        return;
    }
    // The key: a 64-bit FNV-1a hash of the fields (a model has a handful of
    // keys: a chance of two colliding below 1e-17).
    uint64_t bits = 0;
    std::memcpy(&bits, &dloss, sizeof bits);
    const uint64_t fields[] = {region_model_, (uint64_t)pass, (uint64_t)c, (uint64_t)slot, (uint64_t)B, (uint64_t)T, bits};
    const uint64_t key = fnv1a64(kFnvStart, fields, sizeof fields);
    if (be_->region_replay(key)) return;
    const bool recording = be_->region_begin(key);
    ops();
    if (recording) be_->region_end();
}

void GPT::zero_grad() {
    if (!training_) throw std::logic_error("GPT: built without gradients (training = false)");
    size_t n = sharding_.grads ? table_.shard_total : table_.total;
    be_->zero(grads_, n * dtype_size(prec_.grad));
    std::fill(fp8_wmade_.begin(), fp8_wmade_.end(), 0);  // a step: the weights' FP8 copies are made again
    // --head-chunk's accumulator of the head weight's gradient, cleared after
    // each use and again here: nothing a step reads is then a matrix
    // product's output from before it (--matmul-tune times the products
    // between steps on their last operands, writing their outputs).
    if (a_ && a_->head_dw)
        be_->zero(a_->head_dw, (size_t)table_.vocab_rows * cfg_.channels * dtype_size(prec_.grad));
}

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
    // The same layer's slice in the buffers held from F to B, and from B to W.
    const int ifb = (int)(fb_base_[c] + (size_t)ch.fb(slot) * ch.layers + (l - ch.first_layer));
    const int ibw = (int)(bw_base_[c] + (size_t)ch.bw(slot) * ch.layers + (l - ch.first_layer));
    // A kept buffer's slice for this layer-slot (in_fb: ifb's), or the scratch.
    auto at = [&](void* base, bool keep, size_t per, DType t, bool in_fb = false) {
        return keep && base ? act_layer(base, in_fb ? ifb : i, per, t) : base;
    };
    const bool kb = a.keep_block, ka = a.keep_attn;
    LayerActs r;
    r.x = l == ch.first_layer ? chunk_in(c, slot) : act_layer(a.residual3, i - 1, Ns * C, act);
    r.ln1 = at(a.ln1, kb, Ns * C, act);
    r.ln1_mean = at(a.ln1_mean, kb, Ns, st, a.fb_norms);
    r.ln1_rstd = at(a.ln1_rstd, kb, Ns, st, a.fb_norms);
    r.qkv = at(a.qkv, kb, N * qkv_width(), act, true);
    r.atty = at(a.atty, ka, N * Cl, act);
    r.lse = at(a.lse, ka, (size_t)N * table_.heads, st, true);
    r.x2 = at(a.residual2, kb, Ns * C, act, a.fb_norms);
    r.ln2 = at(a.ln2, kb, Ns * C, act);
    r.ln2_mean = at(a.ln2_mean, kb, Ns, st, a.fb_norms);
    r.ln2_rstd = at(a.ln2_rstd, kb, Ns, st, a.fb_norms);
    const size_t R = mlp_rows(N);
    r.fch = at(a.fch, kb, R * fch_width(), act, a.fb_fch);
    r.h = at(a.fch_gelu, a.keep_gelu, R * Hl, act);
    r.x3 = act_layer(a.residual3, i, Ns * C, act);
    r.docs = a.docs ? a.docs + (slot_base_[c] + slot) * (size_t)B_ * T_ : nullptr;
    const size_t E = cfg_.experts, K = cfg_.top_k;
    auto ati = [&](int* base, size_t per) { return (int*)at(base, kb, per, DType::I32); };
    r.probs = at(a.moe_probs, kb, (size_t)N * E, st);
    r.topw = at(a.moe_topw, kb, (size_t)N * K, act);
    r.topi = ati(a.moe_topi, (size_t)N * K);
    r.offsets = ati(a.moe_offsets, E + 1);
    r.perm = ati(a.moe_perm, (size_t)N * K);
    r.inv = ati(a.moe_inv, (size_t)N * K);
    r.xg = at(a.moe_xg, kb, R * C, act);
    r.yg = at(a.moe_yg, kb, (size_t)N * K * C, act);
    r.g_qkv = a.g_qkv ? act_layer(a.g_qkv, ibw, N * qkv_width(), act) : nullptr;
    r.g_attproj = a.g_attproj ? act_layer(a.g_attproj, ibw, N * C, act) : nullptr;
    r.g_fc = a.g_fc ? act_layer(a.g_fc, ibw, R * fch_width(), act) : nullptr;
    r.g_fcproj = a.g_fcproj ? act_layer(a.g_fcproj, ibw, (cfg_.moe() ? R : (size_t)N) * C, act) : nullptr;
    r.g_router = a.g_router ? act_layer(a.g_router, ibw, (size_t)N * cfg_.experts, act) : nullptr;
    r.amax = a.fp8_amax ? elem_ptr(a.fp8_amax, DType::F64, (size_t)i * amax_per_slot()) : nullptr;
    r.h_t = a.fp8_kept_h ? r.h : nullptr;
    r.ln1_t = a.fp8_kept_ln1 ? r.ln1 : nullptr;
    r.ln2_t = a.fp8_kept_ln2 ? r.ln2 : nullptr;
    r.g_dln1 = a.g_dln1 ? act_layer(a.g_dln1, ibw, Ns * C, act) : nullptr;
    r.g_dln2 = a.g_dln2 ? act_layer(a.g_dln2, ibw, Ns * C, act) : nullptr;
    r.g_x2 = a.g_x2 ? act_layer(a.g_x2, ibw, Ns * C, act) : nullptr;
    r.g_stats = a.g_stats ? act_layer(a.g_stats, ibw, 4 * (size_t)Ns, st) : nullptr;
    r.g_ln1 = a.g_ln1 ? act_layer(a.g_ln1, ibw, N * C, act) : r.ln1;  // W's inputs of QKV and fc
    r.g_ln2 = a.g_ln2 ? act_layer(a.g_ln2, ibw, N * C, act) : r.ln2;
    r.g_atty = a.g_atty ? act_layer(a.g_atty, ibw, N * Cl, act) : r.atty;  // W's inputs of the projections
    r.g_h = a.g_h ? act_layer(a.g_h, ibw, R * Hl, act) : r.h;
    r.index = kb ? (size_t)i : layer_slots_;
    r.slot_index = (size_t)i;
    r.g_xg = a.g_xg ? act_layer(a.g_xg, ibw, R * C, act) : nullptr;
    return r;
}

void GPT::set_document_mask() {
    size_t chunk_slots = 0;
    for (const ModelChunk& c : chunks_) chunk_slots += c.slots;
    if (!a_->docs) a_->docs = (int*)alloc_buffer("activations", "document_starts", chunk_slots * B_ * T_, DType::I32);
}

bool GPT::document_mask() const { return a_->docs != nullptr; }

void GPT::document_starts(const int* tokens, int nrows, int T, int eot, int* out, int bos) {
    for (int r = 0; r < nrows; r++) {
        int start = 0;
        for (int t = 0; t < T; t++) {
            const int id = tokens[(size_t)r * T + t];
            if (bos >= 0 && id == bos) start = t;  // a start token opens its document
            out[(size_t)r * T + t] = start;
            if (eot >= 0 && id == eot) start = t + 1;  // an end token closes it
        }
    }
}

double GPT::forward(const int* inputs, const int* targets, int B, int T, double dloss, const int* docs) {
    if (chunks_.size() != 1 || !chunks_[0].embed || !chunks_[0].head)
        throw std::logic_error("GPT::forward: the model is split into pipeline chunks");
    return forward_chunk(0, 0, inputs, nullptr, targets, B, T, dloss, docs);
}

void GPT::backward(bool last_micro_step) {
    if (chunks_.size() != 1) throw std::logic_error("GPT::backward: the model is split into pipeline chunks");
    backward_chunk(0, 0, nullptr, last_micro_step);
}

const void* GPT::chunk_output(int c, int slot) {
    const ModelChunk& ch = chunks_.at(c);
    if (ch.head || ch.layers == 0) throw std::logic_error("GPT::chunk_output: the head chunk has no output");
    const int N = last_B_ * last_T_, Ns = tp_ && tp_->sp() ? N / tp_size_ : N;
    return layer_acts(ch.first_layer + ch.layers - 1, slot, N, Ns).x3;
}

const void* GPT::input_grad() const { return a_->dresidual; }

// ---- the pieces that differ between GPT-2 and Llama -----------------------------------

size_t GPT::qkv_width() const { return (size_t)(table_.heads + 2 * table_.kv_heads) * cfg_.head_size(); }
size_t GPT::fch_width() const { return (size_t)table_.hidden * (cfg_.llama() ? 2 : 1); }

const void* GPT::Pb(Param p, int layer) const { return table_.has(p, layer) ? P(p, layer) : nullptr; }
void* GPT::Gb(Param p, int layer) { return table_.has(p, layer) ? G(p, layer) : nullptr; }

// Rows: a norm, matmul or encoder backward sees at most the B·T rows of a
// micro-batch (fewer under sequence parallelism); attention at most all of
// this rank's heads over T queries. Biases: the widest output of a layer.
// The optimizer's runs: each tensor meets each span of adamw_spans or of
// the norm at most once, over at most the whole flat buffer.
Workspace GPT::workspace() const {
    Workspace w;
    w.rows = mlp_rows(B_ * T_);  // Mixtral's expert products: up to N·K rows
    w.seq = T_;
    w.channels = cfg_.channels;
    w.bias_width = (int)std::max({(size_t)cfg_.channels, qkv_width(), fch_width()});
    w.vocab_rows = table_.vocab_rows;
    w.attn_rows = (size_t)B_ * table_.heads * T_;
    w.head_size = cfg_.head_size();
    w.runs = (int)table_.entries.size();
    w.run_elems = table_.total;
    if (fp8_) {  // the FP8 layers' inputs, output gradients and weights (fp8.cpp; --fp8-layers' alone)
        const size_t N = (size_t)B_ * T_, C = cfg_.channels, Cl = table_.heads * cfg_.head_size(), Hl = table_.hidden;
        const size_t in[4] = {C, Cl, C, Hl}, out[4] = {qkv_width(), C, fch_width(), C};
        // x, W, dy, then x^T, W^T, dy^T, their K padded to a multiple of 16 (cuda/fp8_kernels.h);
        // a Mixtral's expert blocks: up to all its N·K rows in one.
        for (int k = 0; k < 4; k++) {
            const size_t r = cfg_.moe() && k >= 2 ? mlp_rows((int)N) : N, rp = (r + 15) / 16 * 16;
            const size_t op = (out[k] + 15) / 16 * 16;
            const size_t z[6] = {r * in[k], in[k] * out[k], r * out[k], rp * in[k], in[k] * op, rp * out[k]};
            for (int i = 0; i < 6 && linear_layer_in(fp8_layers_, k); i++) w.fp8_elems[i] = std::max(w.fp8_elems[i], z[i]);
        }
    }
    return w;
}
