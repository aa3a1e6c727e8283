// llmc/model/decode.cpp: generation's forward (GPT::decode) over a KV cache
// (llmc/model/kv_cache.h), and the cache's buffers.
//
// The same block as forward.cpp's, on n new rows of one sequence instead of
// a micro-batch: the new tokens' Q, K and V come from their QKV product
// (Llama: RoPE at their own positions), K and V are appended to the layer's
// cache, and attention runs the new queries against every cached key. Two
// shapes of it occur: the prompt's prefill (n rows into an empty cache:
// causal, Tq = Tk = n) and one generated token (Tq = 1 against Tk = len + 1
// keys, all visible: a non-causal block, which every backend's attention
// takes with separate strides for Q and for the cache). Only the last new
// row goes through the LM head. Weights come from the tensor table through
// the model's units (acquire, P), as in the training forward, and the
// GPT-2/Llama differences through the same helpers (norm, residual_norm,
// activation), so every architecture and every backend run this code;
// Mixtral's MoE block is the training forward's (moe_rows_forward) on the
// cache's buffers.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "llmc/model/kv_cache.h"

KVCache::KVCache(GPT& model, int cap, int max_rows) : capacity(cap), rows(max_rows), be_(&model.backend()) {
    const GPTConfig& c = model.config();
    const TensorTable& tb = model.table();
    if (cap <= 0 || max_rows <= 0 || max_rows > cap || cap > c.max_seq_len)
        throw std::invalid_argument("KVCache: capacity must be 1..maxT and rows 1..capacity");
    const size_t HS = c.head_size(), Ckv = (size_t)tb.kv_heads * HS, Cl = (size_t)tb.heads * HS, C = c.channels;
    const size_t R = max_rows, F = tb.hidden, W = Cl + 2 * Ckv;
    const DType act = model.precision().act, st = model.precision().stat;
    kv = take((size_t)c.num_layers * cap * 2 * Ckv, act);
    tokens = static_cast<int*>(take(R, DType::I32));
    pos = static_cast<int*>(take(R, DType::I32));
    x = take(R * C, act);
    x2 = take(R * C, act);
    ln = take(R * C, act);
    mean = take(R, st);
    rstd = take(R, st);
    qkv = take(R * W, act);
    atty = take(R * Cl, act);
    lse = take(R * tb.heads, st);
    proj = take(R * C, act);
    const size_t RK = c.moe() ? R * c.top_k : R;  // Mixtral: the hidden rows are the rows' assignments
    fch = take(RK * F * (c.llama() ? 2 : 1), act);
    h = take(RK * F, act);
    logits = take((size_t)tb.vocab_rows, act);
    if (c.moe()) {
        const size_t E = c.experts, K = c.top_k;
        moe_logits = take(R * E, act);
        moe_probs = take(R * E, st);
        moe_topw = take(R * K, act);
        moe_topi = static_cast<int*>(take(R * K, DType::I32));
        moe_offsets = static_cast<int*>(take(E + 1, DType::I32));
        moe_perm = static_cast<int*>(take(RK, DType::I32));
        moe_inv = static_cast<int*>(take(RK, DType::I32));
        moe_xg = take(RK * C, act);
        moe_yg = take(RK * C, act);
    }
}

KVCache::~KVCache() {
    for (int i = 0; i < n_owned_; i++) be_->release(owned_[i]);
}

void* KVCache::take(size_t count, DType t) {
    if (n_owned_ == (int)(sizeof(owned_) / sizeof(owned_[0]))) throw std::logic_error("KVCache: too many buffers");
    const size_t b = count * dtype_size(t);
    void* p = be_->alloc(b);
    owned_[n_owned_++] = p;
    bytes += b;
    return p;
}

void GPT::decode(KVCache& kv, const int* tokens, int n, void* logits, DType dt) {
    if (chunks_.size() != 1 || !chunks_[0].embed || !chunks_[0].head || tp_ || cp_ || ep_)
        throw std::logic_error("GPT::decode: a whole model in one process only");
    if (n <= 0 || n > kv.rows) throw std::invalid_argument("GPT::decode: more new tokens than the cache's rows");
    if (n > 1 && kv.len != 0) throw std::invalid_argument("GPT::decode: several new tokens only into an empty cache");
    if (kv.len + n > kv.capacity) throw std::invalid_argument("GPT::decode: the cache is full");
    const int L = cfg_.num_layers, C = cfg_.channels, HS = cfg_.head_size(), final_unit = L + 1;
    const int NH = table_.heads, NKV = table_.kv_heads, Vl = table_.vocab_rows;
    const size_t Cl = (size_t)NH * HS, Ckv = (size_t)NKV * HS, W = qkv_width(), KW = 2 * Ckv;
    const DType act = prec_.act;
    std::vector<int> pos(n);
    for (int i = 0; i < n; i++) pos[i] = kv.len + i;
    be_->upload(kv.tokens, DType::I32, tokens, DType::I32, n);
    be_->upload(kv.pos, DType::I32, pos.data(), DType::I32, n);

    // Embeddings (positions: the new tokens' own); a tied head keeps unit 0.
    acquire(0);
    be_->encoder_forward(kv.x, kv.tokens, kv.pos, P(Param::wte), Pb(Param::wpe), 1, n, C, table_.vocab_begin,
                         table_.vocab_begin + Vl);
    if (!cfg_.tied) release(0);
    acquire(block_unit(0));
    norm(kv.ln, kv.mean, kv.rstd, kv.x, Param::ln1w, 0, n);
    for (int l = 0; l < L; l++) {
        be_->matmul_forward(kv.qkv, kv.ln, P(Param::qkvw, l), Pb(Param::qkvb, l), n, C, (int)W);
        if (cfg_.llama()) {  // RoPE on the Q and K heads at the new positions
            be_->rope(kv.qkv, W, NH, HS, kv.pos, 1, n, cfg_.rope_theta, false);
            be_->rope(elem_ptr(kv.qkv, act, Cl), W, NKV, HS, kv.pos, 1, n, cfg_.rope_theta, false);
        }
        // The new rows' K | V into the layer's cache, then attention over it.
        void* cache = elem_ptr(kv.kv, act, (size_t)l * kv.capacity * KW);
        be_->copy2d(elem_ptr(cache, act, (size_t)kv.len * KW), KW, elem_ptr(kv.qkv, act, Cl), W, n, KW, act);
        const int Tk = kv.len + n;
        AttnShape s{1, NH, HS, n, Tk, W, KW, Cl, n > 1, 1.0 / std::sqrt((double)HS)};
        s.NKV = NKV;
        be_->attention_forward(kv.atty, kv.lse, kv.qkv, cache, elem_ptr(cache, act, Ckv), s);
        be_->matmul_forward(kv.proj, kv.atty, P(Param::attprojw, l), Pb(Param::attprojb, l), n, (int)Cl, C);
        residual_norm(kv.x2, kv.ln, kv.mean, kv.rstd, kv.x, kv.proj, Param::ln2w, l, n);
        if (cfg_.moe()) {  // Mixtral: the MoE block on the new rows (moe.cpp), into proj
            const MoeRows r{kv.moe_logits, kv.moe_probs, kv.moe_topw, kv.moe_topi, kv.moe_offsets, kv.moe_perm,
                            kv.moe_inv,    kv.moe_xg,    kv.fch,      kv.h,        kv.moe_yg,   &kv.moe_offsets_host, 0,
                            nullptr};
            moe_rows_forward(l, r, kv.ln, kv.proj, n);
        } else if (cfg_.llama()) {
            be_->matmul_forward(kv.fch, kv.ln, P(Param::fcw, l), Pb(Param::fcb, l), n, C, (int)fch_width());
            activation(kv.h, kv.fch, n);
        } else {
            be_->matmul_gelu_forward(kv.fch, kv.h, kv.ln, P(Param::fcw, l), Pb(Param::fcb, l), n, C,
                                     (int)fch_width());
        }
        if (!cfg_.moe())
            be_->matmul_forward(kv.proj, kv.h, P(Param::fcprojw, l), Pb(Param::fcprojb, l), n, table_.hidden, C);
        // The residual add fused with the next norm: the next block's ln1, or lnf.
        const bool last = l + 1 == L;
        acquire(last ? final_unit : block_unit(l + 1));
        residual_norm(kv.x, kv.ln, kv.mean, kv.rstd, kv.x2, kv.proj, last ? Param::lnfw : Param::ln1w,
                      last ? 0 : l + 1, n);
        release(block_unit(l));
    }
    // The LM head on the last new row only: the one whose next token is drawn.
    const void* head = P(cfg_.tied ? Param::wte : Param::lm_head);
    be_->matmul_forward(kv.logits, elem_ptr(kv.ln, act, (size_t)(n - 1) * C), head, nullptr, 1, C, Vl);
    release(final_unit);
    if (cfg_.tied) release(0);
    be_->download(logits, dt, kv.logits, act, (size_t)cfg_.vocab_size);
    kv.len += n;
}
