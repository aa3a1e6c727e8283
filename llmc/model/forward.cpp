// llmc/model/forward.cpp: the forward of a model chunk, and the pieces
// that differ between GPT-2 and Llama (the LM head and its cross-entropy
// are in head.cpp).
//
// Forward of block l (N = B·T tokens, residual stream x):
//   ln1 = LN(x); qkv = ln1·qkvw^T + qkvb; atty = attention(qkv)
//   x2 = x + atty·attprojw^T + attprojb;  ln2 = LN(x2)
//   fch = ln2·fcw^T + fcb; h = gelu(fch); x3 = x2 + h·fcprojw^T + fcprojb
// then lnf = LN(x_L); logits = lnf·wte^T; loss = cross-entropy on columns < V.
// Llama (docs/design.md section 9) is the same code with RMSNorm for LN,
// no biases and no position embeddings, RoPE on Q and K after the QKV
// product (and its inverse on their gradients), grouped-query attention,
// fch = [gate | up] and h = silu(gate)·up, and lm_head for wte when untied.
// Mixtral is Llama with the MoE block of moe.cpp for the MLP. Qwen2 is Llama
// with qkvb: the table holds it, so Pb/Gb hand it to the QKV product (and
// its gradient) here, in the recompute, the context-parallel attention's
// input and decode.cpp alike, before RoPE rotates Q and K.
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
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

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
    // With --fp8 the norms measure QKV's and fc's inputs as they write them
    // (ln1 by the previous block's residual + norm, or here at a chunk's start).
    // Under delayed scaling they also cast them (norm_cast): ln1 and ln2
    // are then read as FP8 copies, plain by the products, kept transposed
    // by their weight gradients.
    void* qkv_in_amax = norm_amax_at(la, Param::qkvw, 0);
    Fp8Cast cast;
    if (norm_input)
        norm(la.ln1, la.ln1_mean, la.ln1_rstd, la.x, Param::ln1w, l, Ns, qkv_in_amax,
             norm_cast(&cast, la, Param::qkvw, l));
    // attention: QKV column-parallel by heads, attproj row-parallel
    linear_forward(la.qkv, f_fwd(la.ln1), Param::qkvw, Pb(Param::qkvb, l), l, N, C, (int)qkv_width(), false,
                   amax_of(la, Param::qkvw), qkv_in_amax != nullptr);
    rotate(la.qkv, B, T, false);
    attention_core(la, B, T);
    linear_forward(a.proj, la.atty, Param::attprojw, bias_in_matmul ? Pb(Param::attprojb, l) : nullptr, l, N, Cl, C,
                   true, amax_of(la, Param::attprojw));
    void* attn_out = g_fwd(Pb(Param::attprojb, l));
    void* fc_in_amax = cfg_.moe() ? nullptr : norm_amax_at(la, Param::fcw, 0);  // (the experts measure their blocks)
    residual_norm(la.x2, la.ln2, la.ln2_mean, la.ln2_rstd, la.x, attn_out, Param::ln2w, l, Ns, fc_in_amax,
                  fc_in_amax ? norm_cast(&cast, la, Param::fcw, l) : nullptr);
    // Mixtral: the MoE block (moe.cpp), its experts split like the MLP.
    if (cfg_.moe()) {
        moe_forward(l, la, f_fwd(la.ln2), N);
        return g_fwd(nullptr);
    }
    // MLP: fc column-parallel, fcproj row-parallel. With --fp8 the
    // activation measures fcproj's input as it writes it.
    void* proj_amax = amax_of(la, Param::fcprojw);
    if (cfg_.llama() || gelu_apart()) {  // the product, then its activation
        linear_forward(la.fch, f_fwd(la.ln2), Param::fcw, Pb(Param::fcb, l), l, N, C, (int)fch_width(), false,
                       amax_of(la, Param::fcw), fc_in_amax != nullptr);
        activation(la.h, la.fch, N, proj_amax, l, la.h_t);
    } else {  // the product and its GELU (one op: a backend may fuse them)
        be_->matmul_gelu_forward(la.fch, la.h, f_fwd(la.ln2), P(Param::fcw, l), Pb(Param::fcb, l), N, C, fch_width());
    }
    linear_forward(a.proj, la.h, Param::fcprojw, bias_in_matmul ? Pb(Param::fcprojb, l) : nullptr, l, N, Hl, C, true,
                   proj_amax, proj_amax != nullptr);
    return g_fwd(Pb(Param::fcprojb, l));
}

void GPT::attention_core(const LayerActs& la, int B, int T) {
    const int HS = cfg_.head_size(), Cl = table_.heads * HS, Ckv = table_.kv_heads * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    const DType act = prec_.act;
    if (cp_) {
        cp_->attention_forward(la.atty, la.lse, la.qkv, B, scale, la.docs);  // ring over the cp group
        return;
    }
    const size_t W = qkv_width();
    AttnShape shape{B, table_.heads, HS, T, T, W, W, (size_t)Cl, true, scale};
    shape.NKV = table_.kv_heads;
    shape.doc_start = la.docs;
    be_->attention_forward(la.atty, la.lse, la.qkv, elem_ptr(la.qkv, act, Cl), elem_ptr(la.qkv, act, (size_t)Cl + Ckv),
                           shape);
}

// LayerNorm with weight w and its bias (GPT-2), or RMSNorm with weight w.
void GPT::norm(void* out, void* mean, void* rstd, const void* inp, Param w, int layer, int N, void* amax,
               const Fp8Cast* cast) {
    residual_norm(nullptr, out, mean, rstd, inp, nullptr, w, layer, N, amax, cast);
}

void GPT::residual_norm(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b, Param w,
                        int layer, int N, void* amax, const Fp8Cast* cast) {
    const bool rms = cfg_.llama();
    be_->norm(rms, residual, out, mean, rstd, a, b, P(w, layer), rms ? nullptr : P(bias_of(w), layer), N,
              cfg_.channels, cfg_.norm_eps, amax, cast);
}

void* GPT::norm_amax_at(const LayerActs& la, Param w, int which) const {
    void* am = tp_ && tp_->sp() ? nullptr : amax_of(la, w);  // (null: not an FP8 layer)
    return am ? elem_ptr(am, DType::F64, (size_t)which) : nullptr;
}

// (The kept copies exist only where the norm measures the operand: no
// sequence parallel, the block kept; buffers.cpp.)
const Fp8Cast* GPT::norm_cast(Fp8Cast* c, const LayerActs& la, Param w, int l) const {
    void* kept = w == Param::qkvw ? la.ln1_t : la.ln2_t;
    if (!kept || !norm_amax_at(la, w, 0) || !fp8_cast(c, w, l, 0, false, false)) return nullptr;
    c->kept = kept;  // (plain: the forward's product reads that copy)
    return c;
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
// The MLP's GELU or SwiGLU; with --fp8 it measures what it writes, the next
// FP8 product's operand (fcproj's input forward, fc's output gradient
// backward), in the same op (Backend::activation_amax; fp8.cpp). Casting
// with a kept transposed copy, nothing reads h in the compute type (the
// forward's product reads the plain copy, the weight gradient the kept
// one), so h is stored only while the history is empty; without one the
// backward's weight gradient quantises h.
void GPT::activation(void* h, const void* fch, int N, void* amax, int l, void* kept) {
    Fp8Cast cast;
    const bool cast_it = (amax || kept) && fp8_cast(&cast, Param::fcprojw, l, 0, false, kept == nullptr);
    if (cast_it) cast.kept = kept, cast.plain = amax != nullptr;
    if (cast_it || amax)
        be_->activation_amax(cfg_.llama(), h, fch, nullptr, N, table_.hidden, amax, cast_it ? &cast : nullptr);
    else be_->activation(cfg_.llama(), h, fch, nullptr, N, table_.hidden);
}

double GPT::forward_chunk(int c, int slot, const int* inputs, const void* x_in, const int* targets, int B, int T,
                          double dloss, const int* docs) {
    if (B > B_ || T > T_ || B <= 0 || T <= 0) throw std::invalid_argument("forward: batch larger than allocated");
    if (dloss != 0.0 && !training_) throw std::logic_error("forward: a loss gradient in a model built without gradients");
    fp8_record_ = dloss != 0.0;  // --fp8-history: the step's amaxes are the training passes' (fp8.cpp)
    if (cp_ && T != T_) throw std::invalid_argument("forward: context parallel runs whole local sequences");
    const ModelChunk& ch = chunks_.at(c);
    if (slot < 0 || slot >= ch.slots) throw std::logic_error("forward: no such activation slot");
    const bool sp = tp_ && tp_->sp();
    if (sp && T % tp_size_ != 0) throw std::invalid_argument("forward: sequence parallel needs T divisible by tp");
    Acts& a = *a_;
    const int L = cfg_.num_layers, C = cfg_.channels, N = B * T, Ns = sp ? N / tp_size_ : N;
    const int Vl = table_.vocab_rows;
    const int final_unit = L + 1, first = ch.first_layer, end = ch.first_layer + ch.layers;
    const DType act = prec_.act, st = prec_.stat;
    last_B_ = B;
    last_T_ = T;
    void* x0 = chunk_in(c, slot);
    if (ch.head) grad_ready_[slot] = 0;
    int* tok = ch.embed ? a.inputs + (size_t)slot * N : nullptr;
    int* tgt = ch.head ? a.targets + (size_t)slot * N : nullptr;
    // The micro-batch's ids into the slot: from the host, or staged on the
    // device (set_batch_on_device, around a training step's forwards).
    auto put_ids = [&](int* dst, const int* src) {
        if (batch_on_device_) be_->copy(dst, src, (size_t)N * sizeof(int));
        else be_->upload(dst, DType::I32, src, DType::I32, N);
    };
    if (ch.embed) put_ids(tok, inputs);
    else be_->copy(x0, x_in, (size_t)Ns * C * dtype_size(act));
    if (ch.head && targets) put_ids(tgt, targets);
    if (a.docs) {  // the document mask: this slot's document starts, for every block (and its backward)
        if (!docs) throw std::invalid_argument("forward: the document mask is on and no document starts were given");
        put_ids(a.docs + (slot_base_[c] + slot) * (size_t)B_ * T_, docs);
    }

    // From here to the loss, device work only: a recorded region (backend.h)
    // unless this is a sampling forward (its logits chunk is picked on the host).
    auto compute = [&] {
        // Embeddings: this rank's vocabulary rows (positions added by tp rank
        // 0 only), summed over the tp group by g. When the chunk also ends
        // the model, the embedding unit stays acquired until the LM head
        // (tied wte).
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
            if (cfg_.moe()) moe_stats(l, la, N, slot_base_[c] + slot);
            void *x2 = la.x2, *x3 = la.x3;
            // Residual add fused with the next LayerNorm (next block's ln1, or
            // lnf), whose parameters belong to the next unit; at the end of a
            // chunk that does not end the model, the residual add alone.
            if (next >= 0) acquire(next);
            if (l + 1 < end) {
                const LayerActs nx = layer_acts(l + 1, slot, N, Ns);
                Fp8Cast cast;
                residual_norm(x3, nx.ln1, nx.ln1_mean, nx.ln1_rstd, x2, mlp_out, Param::ln1w, l + 1, Ns,
                              norm_amax_at(nx, Param::qkvw, 0), norm_cast(&cast, nx, Param::qkvw, l + 1));
            } else if (ch.head) {
                residual_norm(x3, lnf, lnf_mean, lnf_rstd, x2, mlp_out, Param::lnfw, 0, Ns);
            } else {
                be_->residual_forward(x3, x2, mlp_out, (size_t)Ns * C);
            }
            release(block_unit(l));
        }
        // The load-balancing loss needs every block's routing: a whole model.
        if (cfg_.moe() && ch.embed && ch.head) moe_aux(slot_base_[c] + slot, N, dloss);
        if (!ch.head) return;
        if (ch.layers == 0) {  // a head chunk without blocks normalises its input
            acquire(final_unit);
            norm(lnf, lnf_mean, lnf_rstd, x0, Param::lnfw, 0, Ns);
        }
        head_forward(ch, slot, lnf, tgt, targets != nullptr, N, dloss);  // LM head and cross-entropy (head.cpp)
    };
    if (ch.head && !targets) compute();
    else region(Pass::forward, c, slot, B, T, dloss, compute);
    if (!ch.head || !targets) return 0.0;
    grad_ready_[slot] = dloss != 0.0;
    return head_loss(N, dloss);
}
