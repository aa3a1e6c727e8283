// llmc/model/backward.cpp: the backward of a model chunk: the forward's
// steps in reverse (llmc/model/forward.cpp), with one residual-gradient
// buffer that each norm's backward accumulates into, recomputing first what
// the recompute mode did not keep; split for zero-bubble pipelines into B
// (the input gradient) and W (the linear layers' weight gradients); and the
// sum of sequence-parallel partial gradients.
#include <array>
#include <cmath>
#include <stdexcept>

#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

void GPT::norm_backward(void* dinp, const void* dout, const void* inp, const void* mean, const void* rstd, Param w,
                        int layer, int N, void* discard, void* amax) {
    const int C = cfg_.channels;
    const bool rms = cfg_.llama();
    if (discard) be_->zero(discard, 2 * (size_t)C * dtype_size(prec_.grad));
    void* dw = discard ? discard : G(w, layer);
    void* db = rms ? nullptr : discard ? elem_ptr(discard, prec_.grad, C) : G(bias_of(w), layer);
    be_->norm_backward(rms, dinp, dw, db, dout, inp, P(w, layer), mean, rstd, N, C, amax);
}

void GPT::backward_chunk(int c, int slot, const void* dy, bool last_micro_step, BackwardPart part) {
    const ModelChunk& ch = chunks_.at(c);
    if (!training_) throw std::logic_error("backward: the model was built without gradients (training = false)");
    if (slot < 0 || slot >= ch.slots) throw std::logic_error("backward: no such activation slot");
    if (part != BackwardPart::all && !a_->g_qkv)
        throw std::logic_error("backward: a split backward needs a model built with split_backward");
    if (part == BackwardPart::weights) {  // from what B kept: nothing to check or copy
        region(last_micro_step ? Pass::weights_last : Pass::weights, c, slot, last_B_, last_T_, 0.0,
               [&] { weights_ops(c, slot, last_micro_step); });
        return;
    }
    if (ch.head && !grad_ready_[slot]) throw std::logic_error("backward: the last forward computed no loss gradient");
    // Gradient buffers are handed out afresh for each backward (ZeRO-2/3).
    const int final_unit = cfg_.num_layers + 1;
    if (ch.embed || (ch.head && cfg_.tied)) unit_grads_[0] = nullptr;
    if (ch.head) unit_grads_[final_unit] = nullptr;
    for (int l = ch.first_layer; l < ch.first_layer + ch.layers; l++) unit_grads_[block_unit(l)] = nullptr;
    // The next chunk's gradient of our output is the residual gradient (a
    // pipeline receive buffer: copied before the region, which replays with
    // fixed pointers).
    const size_t Ns = (size_t)last_B_ * last_T_ / (tp_ && tp_->sp() ? tp_size_ : 1);
    if (!ch.head) be_->copy(a_->dresidual, dy, Ns * cfg_.channels * dtype_size(prec_.act));
    if (ch.head) grad_ready_[slot] = 0;
    // The rest is device work only: a recorded region (backend.h).
    const bool b = part == BackwardPart::input;
    region(last_micro_step ? (b ? Pass::input_last : Pass::backward_last) : (b ? Pass::input : Pass::backward), c,
           slot, last_B_, last_T_, 0.0, [&] { backward_ops(c, slot, last_micro_step, part); });
}

// activation's backward (forward.cpp), the same way.
void GPT::activation_backward(void* dfch, const void* fch, const void* dh, int N, void* amax, int l, bool whole) {
    // fc's output gradient, cast both ways for the whole backward, is read by
    // nothing else there unless fc has a bias (GPT-2's) to take its gradient
    // from it; a split backward keeps it for W.
    Fp8Cast cast;
    const bool cast_it = amax && fp8_cast(&cast, Param::fcw, l, 2, whole, !whole || !cfg_.llama());
    if (amax) be_->activation_amax(cfg_.llama(), dfch, fch, dh, N, table_.hidden, amax, cast_it ? &cast : nullptr);
    else be_->activation(cfg_.llama(), dfch, fch, dh, N, table_.hidden);
}

// W of a split backward: each block's linear weight and bias gradients, in
// the order the whole backward computes them, from the output gradients B
// kept and the inputs the forward kept; then the block's unit is done.
void GPT::weights_ops(int c, int slot, bool last_micro_step) {
    const ModelChunk& ch = chunks_.at(c);
    const int C = cfg_.channels, N = last_B_ * last_T_, Cl = table_.heads * cfg_.head_size(), Hl = table_.hidden;
    const int Ns = tp_ && tp_->sp() ? N / tp_size_ : N;
    for (int l = ch.first_layer + ch.layers - 1; l >= ch.first_layer; l--) {
        const int u = block_unit(l);
        acquire(u);
        unit_grads_[u] = nullptr;  // handed out afresh for each W (ZeRO 2 and 3)
        const LayerActs la = layer_acts(l, slot, N, Ns);
        auto dw = [&](Param w, Param b, const void* dout, const void* in, int IC, int OC, void* in_t = nullptr) {
            linear_backward_weights(w, Gb(b, l), dout, in, l, N, IC, OC, amax_of(la, w), in_t);
        };
        if (cfg_.moe()) {
            moe_backward(l, la, nullptr, nullptr, N, nullptr, BackwardPart::weights);
        } else {
            dw(Param::fcprojw, Param::fcprojb, la.g_fcproj, la.g_h, Hl, C, la.h_t);
            dw(Param::fcw, Param::fcb, la.g_fc, la.g_ln2, C, (int)fch_width(), la.ln2_t);
        }
        dw(Param::attprojw, Param::attprojb, la.g_attproj, la.g_atty, Cl, C);
        dw(Param::qkvw, Param::qkvb, la.g_qkv, la.g_ln1, C, (int)qkv_width(), la.ln1_t);
        if (la.g_dln1) {  // ZeRO 2 and 3: the norms' weight gradients from B's output gradients (dx unused)
            // The norms' inputs: where the forward left them, or (full
            // recompute) where B kept them; la.x, the block's input, is kept.
            std::array<const void*, 4> stats = la.norm_stats();
            if (la.g_stats)
                for (int k = 0; k < 4; k++)
                    if (stats[k]) stats[k] = elem_ptr(la.g_stats, prec_.stat, (size_t)k * Ns);
            for (int k : {1, 0}) {  // ln2, then ln1, as the whole backward
                be_->zero(a_->dln, (size_t)Ns * C * dtype_size(prec_.act));
                norm_backward(a_->dln, k ? la.g_dln2 : la.g_dln1, k ? (la.g_x2 ? la.g_x2 : la.x2) : la.x,
                              stats[2 * k], stats[2 * k + 1], k ? Param::ln2w : Param::ln1w, l, Ns);
            }
        }
        provider_->grads_done(u, last_micro_step);
        release(u);
    }
}

void GPT::backward_ops(int c, int slot, bool last_micro_step, BackwardPart part) {
    fp8_record_ = true;
    const ModelChunk& ch = chunks_.at(c);
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
    // The conjugates' backward (identities without tp). Under SP a LayerNorm
    // output is gathered again rather than kept whole (activation memory).
    auto f_input = [&](void* local) -> const void* { return tp_ ? tp_->f_forward(local, a.ln_full, C, N, act) : local; };
    auto f_bwd = [&]() -> void* { return tp_ ? tp_->f_backward(a.dln, a.dln_s, C, N, act) : a.dln; };
    auto g_bwd = [&]() -> const void* { return tp_ ? tp_->g_backward(a.dresidual, a.dfull, C, N, act) : a.dresidual; };

    if (ch.head) {
        // LM head and final norm (head.cpp: from the logits, which now hold
        // dlogits, or with --head-chunk from what the forward's chunks left).
        // Tied, the head is wte of the embedding unit, which stays acquired
        // until the encoder's backward when the chunk also starts the model;
        // untied, it is lm_head of the final unit.
        void* lnf = elem_ptr(a.lnf, act, (size_t)slot * Ns * C);
        if (cfg_.tied) acquire(0);
        acquire(final_unit);
        if (ch.layers > 0) provider_->prefetch(block_unit(end - 1));
        void* dlnf = head_backward(slot, lnf, N);
        if (cfg_.tied && !ch.embed) {  // the last stage's copy of the embedding unit is done
            // (unless this rank's embeddings are still to come, ZBV's stage 0:
            // their backward ends the unit's accumulation)
            provider_->grads_done(0, last_micro_step && !holds_embeddings());
            release(0);
        }
        be_->zero(a.dresidual, (size_t)Ns * C * dtype_size(act));
        const void* lnf_in = ch.layers > 0 ? layer_acts(end - 1, slot, N, Ns).x3 : chunk_in(c, slot);
        void* dln = tp_ ? tp_->f_backward(dlnf, a.dln_s, C, N, act) : dlnf;
        // (With --fp8 it measures the last block's fcproj output gradient, the residual gradient it leaves.)
        void* proj_dy = ch.layers > 0 && !cfg_.moe()
                            ? norm_amax_at(layer_acts(end - 1, slot, N, Ns), Param::fcprojw, 2) : nullptr;
        norm_backward(a.dresidual, dln, lnf_in, a.lnf_mean ? elem_ptr(a.lnf_mean, prec_.stat, (size_t)slot * Ns) : nullptr,
                      elem_ptr(a.lnf_rstd, prec_.stat, (size_t)slot * Ns), Param::lnfw, 0, Ns, nullptr, proj_dy);
        provider_->grads_done(final_unit, last_micro_step);
        release(final_unit);
    }

    // B of a split backward: each linear layer's input gradient alone, its
    // output gradient kept for W (la.g_*); the norms' gradients here.
    const bool input_only = part == BackwardPart::input;
    auto keep = [&](void* to, const void* dout, size_t n) {
        be_->copy(to, dout, n * dtype_size(act));
        return to;
    };
    for (int l = end - 1; l >= first; l--) {
        const int u = block_unit(l);
        acquire(u);
        if (l > first) provider_->prefetch(block_unit(l - 1));
        const LayerActs la = layer_acts(l, slot, N, Ns);
        // What the recompute mode did not keep, from what it kept.
        if (!a.keep_block) {
            block_forward(l, la, B, T, true);
            if (input_only && la.g_xg) {  // Mixtral: W's expert input rows and row groups, recomputed here
                be_->copy(la.g_xg, la.xg, (size_t)moe_expert_rows(la, N) * C * dtype_size(act));
                moe_keep_routing(la);
            }
            if (input_only && la.g_x2) {  // ZeRO 2 and 3: W's norm inputs, recomputed here
                be_->copy(la.g_x2, la.x2, (size_t)Ns * C * dtype_size(act));
                const std::array<const void*, 4> stats = la.norm_stats();
                for (int k = 0; k < 4; k++)
                    if (stats[k])
                        be_->copy(elem_ptr(la.g_stats, prec_.stat, (size_t)k * Ns), stats[k],
                                  (size_t)Ns * dtype_size(prec_.stat));
            }
        } else {
            if (!a.keep_attn) attention_core(la, B, T);
            // (with a kept copy of fcproj's input, the recompute writes that
            // copy for the whole backward's weight gradient: activation)
            if (!a.keep_gelu)
                activation(la.h, la.fch, cfg_.moe() ? moe_expert_rows(la, N) : N, nullptr, l,
                           input_only ? nullptr : la.h_t);
        }
        // dresidual holds d(x3); it flows unchanged into d(x2) plus the MLP path.
        // With --fp8 the activation's backward measures fc's output gradient,
        // and the norms' backward the residual gradient they leave, the
        // row-parallel products' output gradient: fcproj's by the next
        // block's ln1 (or lnf) in this chunk (a chunk's last block receives
        // it), attproj's by this block's ln2.
        void* fc_amax = cfg_.moe() ? nullptr : amax_of(la, Param::fcw);
        void* fc_dy_amax = fc_amax ? elem_ptr(fc_amax, DType::F64, 2) : nullptr;
        const bool proj_dy_measured = !cfg_.moe() && (l + 1 < end || ch.head) && norm_amax_at(la, Param::fcprojw, 2);
        void* att_dy_amax = norm_amax_at(la, Param::attprojw, 2);
        // The row-parallel bias gradient sums the whole (gathered) output gradient.
        if (cfg_.moe()) {  // the MoE block (moe.cpp): dln = its input's gradient
            const void* aux = elem_ptr(a.moe_aux_grad, prec_.stat, (slot_base_[c] + slot) * (size_t)cfg_.experts);
            const void* dout = g_bwd();  // the tp collectives in a fixed order
            const void* xin = f_input(la.ln2);
            moe_backward(l, la, dout, xin, N, aux, part);
        } else if (input_only) {
            if (la.g_h != la.h) keep(la.g_h, la.h, (size_t)N * Hl);  // recomputed: kept for W
            const void* dout = keep(la.g_fcproj, g_bwd(), (size_t)N * C);
            if (cfg_.llama() || gelu_apart()) {  // fcproj's input gradient, then the activation's (measuring fc's dy)
                void* dh = cfg_.llama() ? a.dh : a.dfch;  // (GELU's backward in place)
                linear_backward_input(dh, Param::fcprojw, dout, la.h, l, N, Hl, C, true, amax_of(la, Param::fcprojw),
                                      proj_dy_measured);
                activation_backward(a.dfch, la.fch, dh, N, fc_dy_amax, l, false);
            } else {
                be_->matmul_backward_gelu(a.dfch, nullptr, nullptr, dout, la.h, P(Param::fcprojw, l), la.fch, N, Hl, C);
            }
            keep(la.g_fc, a.dfch, (size_t)N * fch_width());
            const void* xin = f_input(la.ln2);  // (gathered under sp: kept for W, which issues no collective)
            if (xin != la.g_ln2) keep(la.g_ln2, xin, (size_t)N * C);
            linear_backward_input(a.dln, Param::fcw, a.dfch, xin, l, N, C, (int)fch_width(), false,
                                  amax_of(la, Param::fcw), fc_dy_amax != nullptr);
        } else if (cfg_.llama() || gelu_apart()) {  // the product, then the activation's backward (GELU's in place)
            void* dh = cfg_.llama() ? a.dh : a.dfch;
            linear_backward(dh, Param::fcprojw, Gb(Param::fcprojb, l), g_bwd(), la.h, l, N, Hl, C, true,
                            amax_of(la, Param::fcprojw), proj_dy_measured, la.h_t);
            activation_backward(a.dfch, la.fch, dh, N, fc_dy_amax, l, true);
        } else {  // fcproj's input gradient through the GELU (one op: a backend may fuse them)
            be_->matmul_backward_gelu(a.dfch, G(Param::fcprojw, l), Gb(Param::fcprojb, l), g_bwd(), la.h,
                                      P(Param::fcprojw, l), la.fch, N, Hl, C);
        }
        if (!cfg_.moe() && !input_only)
            linear_backward(a.dln, Param::fcw, Gb(Param::fcb, l), a.dfch, f_input(la.ln2), l, N, C, (int)fch_width(),
                            false, amax_of(la, Param::fcw), fc_dy_amax != nullptr, la.ln2_t);
        // (ZeRO 2 and 3 under a split backward: B keeps the norm's output
        // gradient and its W computes the norm's weight gradients, so a block's
        // gradient buffer is handed out once per micro-batch, in W.)
        auto block_norm_backward = [&](void* kept, const void* inp, const void* mean, const void* rstd, Param w,
                                       void* amax) {
            void* dout = f_bwd();
            if (input_only && kept) keep(kept, dout, (size_t)Ns * C);
            norm_backward(a.dresidual, dout, inp, mean, rstd, w, l, Ns, input_only && kept ? a.norm_discard : nullptr,
                          amax);
        };
        block_norm_backward(la.g_dln2, la.x2, la.ln2_mean, la.ln2_rstd, Param::ln2w, att_dy_amax);
        // dresidual holds d(x2); attention path.
        if (input_only) {
            if (la.g_atty != la.atty) keep(la.g_atty, la.atty, (size_t)N * Cl);  // recomputed: kept for W
            linear_backward_input(a.datt, Param::attprojw, keep(la.g_attproj, g_bwd(), (size_t)N * C), la.atty, l, N,
                                  Cl, C, true, amax_of(la, Param::attprojw), att_dy_amax != nullptr);
        } else
            linear_backward(a.datt, Param::attprojw, Gb(Param::attprojb, l), g_bwd(), la.atty, l, N, Cl, C, true,
                            amax_of(la, Param::attprojw), att_dy_amax != nullptr);
        if (cp_)
            cp_->attention_backward(a.dqkv, a.datt, la.qkv, la.atty, la.lse, B, shape.scale, la.docs);
        else {
            shape.doc_start = la.docs;
            be_->attention_backward(a.dqkv, elem_ptr(a.dqkv, act, Cl), elem_ptr(a.dqkv, act, (size_t)Cl + Ckv), a.datt,
                                    la.qkv, elem_ptr(la.qkv, act, Cl), elem_ptr(la.qkv, act, (size_t)Cl + Ckv), la.atty,
                                    la.lse, shape);
        }
        rotate(a.dqkv, B, T, true);  // back through the rotary embeddings (Llama)
        if (input_only) {
            const void* xin = f_input(la.ln1);
            if (xin != la.g_ln1) keep(la.g_ln1, xin, (size_t)N * C);
            linear_backward_input(a.dln, Param::qkvw, keep(la.g_qkv, a.dqkv, (size_t)N * W), xin, l, N, C, (int)W,
                                  false, amax_of(la, Param::qkvw));
        }
        else
            linear_backward(a.dln, Param::qkvw, Gb(Param::qkvb, l), a.dqkv, f_input(la.ln1), l, N, C, (int)W, false,
                            amax_of(la, Param::qkvw), false, la.ln1_t);
        block_norm_backward(la.g_dln1, la.x, la.ln1_mean, la.ln1_rstd, Param::ln1w,
                            l > first && !cfg_.moe() ? norm_amax_at(layer_acts(l - 1, slot, N, Ns), Param::fcprojw, 2)
                                                     : nullptr);
        if (!input_only) provider_->grads_done(u, last_micro_step);  // (split: after its W)
        release(u);
    }
    if (!ch.embed) return;  // dresidual holds the gradient of the chunk's input
    // Embeddings: every tp rank computes wpe's gradient from the whole
    // output gradient (so the replicas agree) and its vocabulary rows' of wte.
    be_->encoder_backward(G(Param::wte), Gb(Param::wpe), g_bwd(), a.inputs + (size_t)slot * N, a.pos, B, T, C,
                          table_.vocab_begin, table_.vocab_begin + Vl);
    provider_->grads_done(0, last_micro_step);
    if (ch.head && cfg_.tied) release(0);
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
