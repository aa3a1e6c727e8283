// llmc/gpt.cpp: buffers, initialisation, forward and backward of GPT-2.
//
// Forward of block l (N = B·T tokens, residual stream x):
//   ln1 = LN(x); qkv = ln1·qkvw^T + qkvb; atty = attention(qkv)
//   x2 = x + atty·attprojw^T + attprojb;  ln2 = LN(x2)
//   fch = ln2·fcw^T + fcb; h = gelu(fch); x3 = x2 + h·fcprojw^T + fcprojb
// then lnf = LN(x_L); logits = lnf·wte^T; loss = cross-entropy on columns < V.
// Backward runs the same steps in reverse with one residual-gradient buffer
// that LayerNorm backward accumulates into.
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

struct GPT::Acts {
    int* inputs = nullptr;  // [B,T]
    int* targets = nullptr;
    int* pos = nullptr;  // [T] positions 0..T-1
    void* encoded = nullptr;  // [N,C]
    // per layer, [L, ...]
    void *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu,
        *residual3;
    void *lnf, *lnf_mean, *lnf_rstd;  // [N,C], [N], [N]
    void* logits;                     // [N,Vp]
    void* losses;                     // [N]
    // scratch, reused by every layer
    void* proj;       // [N,C] attention/MLP projection output
    void* gelu_tmp;   // [N,4C] recomputed GELU output (recompute mode)
    void* dresidual;  // [N,C]
    void* dC;         // [N,C]
    void* d4C;        // [N,4C]
    void* dqkv;       // [N,3C]
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

void* GPT::alloc_buffer(const char* group, const char* name, size_t count, DType t) {
    size_t bytes = count * dtype_size(t);
    void* p = be_->alloc(bytes);
    owned_.push_back(p);
    buffers_.push_back({group, name, bytes});
    return p;
}

void* GPT::act_layer(void* base, int l, size_t per_layer_count, DType t) {
    return elem_ptr(base, t, (size_t)l * per_layer_count);
}

GPT::GPT(Backend* be, const GPTConfig& cfg, int B, int T, bool recompute_gelu, const Sharding& sharding)
    : be_(be), cfg_(cfg), table_(cfg, sharding.shards), prec_(be->precision()), B_(B), T_(T),
      recompute_gelu_(recompute_gelu), sharding_(sharding) {
    if (T > cfg.max_seq_len) throw std::invalid_argument("sequence length T exceeds the model's maxT");
    const size_t L = cfg.num_layers, C = cfg.channels, N = (size_t)B * T;
    const size_t NH = cfg.num_heads, Vp = cfg.padded_vocab_size;
    const size_t full = table_.total, shard = table_.shard_total;
    const DType act = prec_.act, st = prec_.stat;
    params_ = alloc_buffer("params", "params", sharding.params ? shard : full, prec_.param);
    grads_ = alloc_buffer("grads", "grads", sharding.grads ? shard : full, prec_.grad);
    if (prec_.has_master) master_ = alloc_buffer("master", "master", sharding.optimizer ? shard : full, prec_.master);
    m_ = alloc_buffer("optimizer", "adam_m", sharding.optimizer ? shard : full, prec_.opt);
    v_ = alloc_buffer("optimizer", "adam_v", sharding.optimizer ? shard : full, prec_.opt);

    a_ = new Acts();
    Acts& a = *a_;
    a.inputs = (int*)alloc_buffer("activations", "inputs", N, DType::I32);
    a.targets = (int*)alloc_buffer("activations", "targets", N, DType::I32);
    a.pos = (int*)alloc_buffer("activations", "positions", T, DType::I32);
    a.encoded = alloc_buffer("activations", "encoded", N * C, act);
    a.ln1 = alloc_buffer("activations", "ln1", L * N * C, act);
    a.ln1_mean = alloc_buffer("activations", "ln1_mean", L * N, st);
    a.ln1_rstd = alloc_buffer("activations", "ln1_rstd", L * N, st);
    a.qkv = alloc_buffer("activations", "qkv", L * N * 3 * C, act);
    a.atty = alloc_buffer("activations", "atty", L * N * C, act);
    a.lse = alloc_buffer("activations", "attn_lse", L * N * NH, st);
    a.residual2 = alloc_buffer("activations", "residual2", L * N * C, act);
    a.ln2 = alloc_buffer("activations", "ln2", L * N * C, act);
    a.ln2_mean = alloc_buffer("activations", "ln2_mean", L * N, st);
    a.ln2_rstd = alloc_buffer("activations", "ln2_rstd", L * N, st);
    a.fch = alloc_buffer("activations", "fch", L * N * 4 * C, act);
    a.fch_gelu = recompute_gelu ? nullptr : alloc_buffer("activations", "fch_gelu", L * N * 4 * C, act);
    a.residual3 = alloc_buffer("activations", "residual3", L * N * C, act);
    a.lnf = alloc_buffer("activations", "lnf", N * C, act);
    a.lnf_mean = alloc_buffer("activations", "lnf_mean", N, st);
    a.lnf_rstd = alloc_buffer("activations", "lnf_rstd", N, st);
    a.logits = alloc_buffer("activations", "logits", N * Vp, act);
    a.losses = alloc_buffer("activations", "losses", N, st);
    a.proj = alloc_buffer("scratch", "proj", N * C, act);
    a.gelu_tmp = recompute_gelu ? alloc_buffer("scratch", "gelu_recompute", N * 4 * C, act) : nullptr;
    a.dresidual = alloc_buffer("scratch", "dresidual", N * C, act);
    a.dC = alloc_buffer("scratch", "d_channels", N * C, act);
    a.d4C = alloc_buffer("scratch", "d_hidden", N * 4 * C, act);
    a.dqkv = alloc_buffer("scratch", "d_qkv", N * 3 * C, act);

    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = t;
    be_->upload(a.pos, DType::I32, pos.data(), DType::I32, T);

    local_ = new LocalUnits(*this);
    provider_ = local_;
    unit_params_.assign(table_.num_units(), nullptr);
    unit_grads_.assign(table_.num_units(), nullptr);
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
void GPT::for_each_piece(bool sharded, Fn fn) const {
    for (const TensorEntry& e : table_.entries) {
        if (!sharded) {
            fn(e.file_offset, e.offset, e.numel);
            continue;
        }
        // The part of the entry inside this rank's slice of its unit.
        size_t lo = table_.slice_begin(e.unit, sharding_.rank), hi = lo + table_.shard_size(e.unit);
        size_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
        if (b < en) fn(e.file_offset + (b - e.offset), table_.shard_begin[e.unit] + (b - lo), en - b);
    }
}

void GPT::set_file_range(void* buf, bool sharded, DType buf_t, const void* host, DType src_t, size_t file_begin,
                         size_t file_end) {
    for_each_piece(sharded, [&](size_t f, size_t o, size_t n) {
        size_t b = std::max(f, file_begin), e = std::min(f + n, file_end);
        if (b < e)
            be_->upload(elem_ptr(buf, buf_t, o + (b - f)), buf_t, elem_ptr(host, src_t, b - file_begin), src_t, e - b);
    });
}

void GPT::set_file_order(void* buf, bool sharded, DType buf_t, const void* host, DType src_t) {
    set_file_range(buf, sharded, buf_t, host, src_t, 0, table_.params);
}

void GPT::get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t) {
    for_each_piece(sharded, [&](size_t f, size_t o, size_t n) {
        be_->download(elem_ptr(host, dst_t, f), dst_t, elem_ptr(buf, src_t, o), src_t, n);
    });
}

void GPT::set_weights_file_order(const void* host, DType t) {
    set_file_order(params_, sharding_.params, prec_.param, host, t);
    if (master_) set_file_order(master_, sharding_.optimizer, prec_.master, host, t);
}

void GPT::init_random(uint64_t seed) {
    // Drawn on the host in file order for the whole model, so the values do
    // not depend on the memory layout or on which rank holds what.
    Rng rng(seed);
    const double std_base = 0.02, std_resid = 0.02 / std::sqrt(2.0 * cfg_.num_layers);
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : table_.entries) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](const TensorEntry* x, const TensorEntry* y) { return x->file_offset < y->file_offset; });
    std::vector<double> host;
    for (const TensorEntry* e : order) {
        host.assign(e->numel, 0.0);
        double* x = host.data();
        switch (e->kind) {
            case Param::ln1w: case Param::ln2w: case Param::lnfw:
                for (size_t i = 0; i < e->numel; i++) x[i] = 1.0;
                break;
            case Param::wte:  // padded rows V..Vp-1 stay zero: they never see a gradient
                for (size_t i = 0; i < (size_t)cfg_.vocab_size * e->cols; i++) x[i] = std_base * rng.normal();
                break;
            case Param::attprojw: case Param::fcprojw:
                for (size_t i = 0; i < e->numel; i++) x[i] = std_resid * rng.normal();
                break;
            default:
                if (e->decay)
                    for (size_t i = 0; i < e->numel; i++) x[i] = std_base * rng.normal();
                break;  // biases stay zero
        }
        size_t fb = e->file_offset, fe = fb + e->numel;
        set_file_range(params_, sharding_.params, prec_.param, x, DType::F64, fb, fe);
        if (master_) set_file_range(master_, sharding_.optimizer, prec_.master, x, DType::F64, fb, fe);
    }
}

void GPT::zero_grad() {
    size_t n = sharding_.grads ? table_.shard_total : table_.total;
    be_->zero(grads_, n * dtype_size(prec_.grad));
}

// ---- forward ----------------------------------------------------------------------

// Unit numbers (tensors.h): 0 embeddings, 1 + l block l, L + 1 final LayerNorm.
static int block_unit(int l) { return l + 1; }

double GPT::forward(const int* inputs, const int* targets, int B, int T, double dloss) {
    if (B > B_ || T > T_ || B <= 0 || T <= 0) throw std::invalid_argument("forward: batch larger than allocated");
    Acts& a = *a_;
    const int L = cfg_.num_layers, C = cfg_.channels, NH = cfg_.num_heads, V = cfg_.vocab_size;
    const int Vp = cfg_.padded_vocab_size, N = B * T;
    const int final_unit = L + 1;
    const DType act = prec_.act, st = prec_.stat;
    last_B_ = B;
    last_T_ = T;
    grad_ready_ = false;
    be_->upload(a.inputs, DType::I32, inputs, DType::I32, N);
    if (targets) be_->upload(a.targets, DType::I32, targets, DType::I32, N);

    // The embedding unit stays acquired until the LM head (tied wte) is done.
    acquire(0);
    provider_->prefetch(block_unit(0));
    be_->encoder_forward(a.encoded, a.inputs, a.pos, P(Param::wte), P(Param::wpe), B, T, C, 0, Vp);
    const AttnShape shape{B, NH, C / NH, T, T, (size_t)3 * C, (size_t)3 * C, (size_t)C, true,
                          1.0 / std::sqrt((double)(C / NH))};
    acquire(block_unit(0));
    for (int l = 0; l < L; l++) {
        const int next = l + 1 < L ? block_unit(l + 1) : final_unit;
        provider_->prefetch(next);
        void* x = l == 0 ? a.encoded : act_layer(a.residual3, l - 1, (size_t)N * C, act);
        void* ln1 = act_layer(a.ln1, l, (size_t)N * C, act);
        void* qkv = act_layer(a.qkv, l, (size_t)N * 3 * C, act);
        void* atty = act_layer(a.atty, l, (size_t)N * C, act);
        void* lse = act_layer(a.lse, l, (size_t)N * NH, st);
        void* x2 = act_layer(a.residual2, l, (size_t)N * C, act);
        void* ln2 = act_layer(a.ln2, l, (size_t)N * C, act);
        void* fch = act_layer(a.fch, l, (size_t)N * 4 * C, act);
        void* h = recompute_gelu_ ? a.gelu_tmp : act_layer(a.fch_gelu, l, (size_t)N * 4 * C, act);
        void* x3 = act_layer(a.residual3, l, (size_t)N * C, act);

        // For l > 0, ln1 was produced by the previous block's fused residual + LayerNorm.
        if (l == 0)
            be_->layernorm_forward(ln1, act_layer(a.ln1_mean, l, N, st), act_layer(a.ln1_rstd, l, N, st), x,
                                   P(Param::ln1w, l), P(Param::ln1b, l), N, C);
        be_->matmul_forward(qkv, ln1, P(Param::qkvw, l), P(Param::qkvb, l), N, C, 3 * C);
        be_->attention_forward(atty, lse, qkv, elem_ptr(qkv, act, C), elem_ptr(qkv, act, 2 * (size_t)C), shape);
        be_->matmul_forward(a.proj, atty, P(Param::attprojw, l), P(Param::attprojb, l), N, C, C);
        be_->residual_layernorm_forward(x2, ln2, act_layer(a.ln2_mean, l, N, st), act_layer(a.ln2_rstd, l, N, st), x,
                                        a.proj, P(Param::ln2w, l), P(Param::ln2b, l), N, C);
        be_->matmul_forward(fch, ln2, P(Param::fcw, l), P(Param::fcb, l), N, C, 4 * C);
        be_->gelu_forward(h, fch, (size_t)N * 4 * C);
        be_->matmul_forward(a.proj, h, P(Param::fcprojw, l), P(Param::fcprojb, l), N, 4 * C, C);
        // Residual add fused with the next LayerNorm (next block's ln1, or
        // lnf), whose parameters belong to the next unit.
        acquire(next);
        if (l + 1 < L) {
            be_->residual_layernorm_forward(x3, act_layer(a.ln1, l + 1, (size_t)N * C, act),
                                            act_layer(a.ln1_mean, l + 1, N, st), act_layer(a.ln1_rstd, l + 1, N, st),
                                            x2, a.proj, P(Param::ln1w, l + 1), P(Param::ln1b, l + 1), N, C);
        } else {
            be_->residual_layernorm_forward(x3, a.lnf, a.lnf_mean, a.lnf_rstd, x2, a.proj, P(Param::lnfw),
                                            P(Param::lnfb), N, C);
        }
        release(block_unit(l));
    }
    release(final_unit);
    be_->matmul_forward(a.logits, a.lnf, P(Param::wte), nullptr, N, C, Vp);
    release(0);
    if (!targets) return 0.0;
    be_->softmax_crossentropy(a.logits, a.losses, a.targets, dloss, N, V, Vp, dloss != 0.0);
    grad_ready_ = dloss != 0.0;
    std::vector<double> losses(N);
    be_->download(losses.data(), DType::F64, a.losses, st, N);
    double sum = 0;
    for (double x : losses) sum += x;
    return sum / N;
}

void GPT::logits_row(int b, int t, void* out, DType dt) {
    size_t row = (size_t)b * last_T_ + t;
    be_->download(out, dt, elem_ptr(a_->logits, prec_.act, row * cfg_.padded_vocab_size), prec_.act,
                  cfg_.vocab_size);
}

// ---- backward ----------------------------------------------------------------------

void GPT::backward() {
    if (!grad_ready_) throw std::logic_error("backward: the last forward computed no loss gradient");
    Acts& a = *a_;
    const int L = cfg_.num_layers, C = cfg_.channels, NH = cfg_.num_heads, Vp = cfg_.padded_vocab_size;
    const int B = last_B_, T = last_T_, N = B * T;
    const int final_unit = L + 1;
    const DType act = prec_.act, st = prec_.stat;
    const AttnShape shape{B, NH, C / NH, T, T, (size_t)3 * C, (size_t)3 * C, (size_t)C, true,
                          1.0 / std::sqrt((double)(C / NH))};
    std::fill(unit_grads_.begin(), unit_grads_.end(), nullptr);

    // LM head (tied to wte) and final LayerNorm: logits now hold dlogits. The
    // embedding unit stays acquired until the encoder's backward at the end.
    acquire(0);
    acquire(final_unit);
    provider_->prefetch(block_unit(L - 1));
    be_->matmul_backward(a.dC, G(Param::wte), nullptr, a.logits, a.lnf, P(Param::wte), N, C, Vp);
    be_->zero(a.dresidual, (size_t)N * C * dtype_size(act));
    be_->layernorm_backward(a.dresidual, G(Param::lnfw), G(Param::lnfb), a.dC,
                            act_layer(a.residual3, L - 1, (size_t)N * C, act), P(Param::lnfw), a.lnf_mean, a.lnf_rstd,
                            N, C);
    provider_->grads_done(final_unit);
    release(final_unit);

    for (int l = L - 1; l >= 0; l--) {
        const int u = block_unit(l);
        acquire(u);
        if (l > 0) provider_->prefetch(block_unit(l - 1));
        void* x = l == 0 ? a.encoded : act_layer(a.residual3, l - 1, (size_t)N * C, act);
        void* ln1 = act_layer(a.ln1, l, (size_t)N * C, act);
        void* qkv = act_layer(a.qkv, l, (size_t)N * 3 * C, act);
        void* atty = act_layer(a.atty, l, (size_t)N * C, act);
        void* lse = act_layer(a.lse, l, (size_t)N * NH, st);
        void* x2 = act_layer(a.residual2, l, (size_t)N * C, act);
        void* ln2 = act_layer(a.ln2, l, (size_t)N * C, act);
        void* fch = act_layer(a.fch, l, (size_t)N * 4 * C, act);
        void* h = act_layer(a.fch_gelu, l, (size_t)N * 4 * C, act);
        if (recompute_gelu_) {
            h = a.gelu_tmp;
            be_->gelu_forward(h, fch, (size_t)N * 4 * C);
        }
        // dresidual holds d(x3); it flows unchanged into d(x2) plus the MLP path.
        be_->matmul_backward(a.d4C, G(Param::fcprojw, l), G(Param::fcprojb, l), a.dresidual, h, P(Param::fcprojw, l),
                             N, 4 * C, C);
        be_->gelu_backward(a.d4C, fch, a.d4C, (size_t)N * 4 * C);
        be_->matmul_backward(a.dC, G(Param::fcw, l), G(Param::fcb, l), a.d4C, ln2, P(Param::fcw, l), N, C, 4 * C);
        be_->layernorm_backward(a.dresidual, G(Param::ln2w, l), G(Param::ln2b, l), a.dC, x2, P(Param::ln2w, l),
                                act_layer(a.ln2_mean, l, N, st), act_layer(a.ln2_rstd, l, N, st), N, C);
        // dresidual holds d(x2); attention path.
        be_->matmul_backward(a.dC, G(Param::attprojw, l), G(Param::attprojb, l), a.dresidual, atty,
                             P(Param::attprojw, l), N, C, C);
        be_->attention_backward(a.dqkv, elem_ptr(a.dqkv, act, C), elem_ptr(a.dqkv, act, 2 * (size_t)C), a.dC, qkv,
                                elem_ptr(qkv, act, C), elem_ptr(qkv, act, 2 * (size_t)C), atty, lse, shape);
        // reuse d4C's first N·C elements for d(ln1)
        be_->matmul_backward(a.d4C, G(Param::qkvw, l), G(Param::qkvb, l), a.dqkv, ln1, P(Param::qkvw, l), N, C,
                             3 * C);
        be_->layernorm_backward(a.dresidual, G(Param::ln1w, l), G(Param::ln1b, l), a.d4C, x, P(Param::ln1w, l),
                                act_layer(a.ln1_mean, l, N, st), act_layer(a.ln1_rstd, l, N, st), N, C);
        provider_->grads_done(u);
        release(u);
    }
    be_->encoder_backward(G(Param::wte), G(Param::wpe), a.dresidual, a.inputs, a.pos, B, T, C, 0, Vp);
    provider_->grads_done(0);
    release(0);
    grad_ready_ = false;
}
