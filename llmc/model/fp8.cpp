// llmc/model/fp8.cpp: the four linear layers of a block (QKV, attention
// output, MLP up, MLP down) and their products, plain or, with --fp8 1, on
// operands rounded to FP8 grids at current scaling (docs/fp8.md): the input
// and the weight in e4m3, the output gradient in e5m2, each with the amax of
// its whole tensor. A tensor this rank holds a piece of takes the max over
// the ranks that hold the others first, so every layout rounds every value
// the same way: under tp the weights of all four layers, the input of the
// row-parallel ones and the output gradient of the column-parallel ones;
// under cp every activation and output gradient (split by sequence). With
// --fp8-history the scale comes from the largest amax of the operand's last
// N steps (delayed scaling), and the step's own amaxes join the history at
// its end, maxed over the dp x cp ranks (the trainer's collective), so the
// history too is the same in every layout. Each operand is measured once
// per micro-batch: the backward reads the forward's input and weight amaxes
// from the layer-slot (LayerActs::amax) and measures the output gradient.
//
// A Mixtral's experts (expert_amax): one expert's product over the rows of
// one micro-batch is one tensor, as one process with gradient accumulation
// runs it. Its rows reach the expert as a block (under expert parallelism
// one block per peer, each peer's micro-batch its own), so each block has
// its own input and output-gradient amax, and each expert's weight its own;
// a block's rows split by sequence (cp) or its columns and weight by tp
// take the max over those groups, all blocks in one all-reduce.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "llmc/base/test_hooks.h"
#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

// The history's slot of (layer, expert, product, operand), after the four layers'.
static size_t expert_slot(const GPTConfig& c, int l, int expert, int p, int which) {
    return (size_t)c.num_layers * 12 + (((size_t)l * c.experts + expert) * 2 + p) * 3 + which;
}

// The four layers' index in the history: QKV, attention output, MLP up, MLP down.
static int linear_index(Param w) {
    return w == Param::qkvw ? 0 : w == Param::attprojw ? 1 : w == Param::fcw ? 2 : 3;
}

// The history's slot of (layer, linear layer w, operand).
static size_t layer_slot(int l, Param w, int which) { return ((size_t)l * 4 + linear_index(w)) * 3 + which; }

// (Delayed scaling records the whole tensor's amax and scales by the
// history's in the product's own launch: fp8_delayed_of.)
void GPT::fp8_amax(int which, const void* x, DType t, size_t n, bool tp_split, bool cp_split, void* amax) {
    void* am = elem_ptr(amax, DType::F64, (size_t)which);
    if (x) be_->amax_to(am, x, t, n);  // (null: the op that wrote it measured it, activation_amax)
    static const bool local = test_hooks::fp8_local_amax();  // the tests' counter-example
    if (tp_split && tp_ && !local) tp_->max(am, 1, DType::F64);
    if (cp_split && cp_ && !local) cp_->max(am, 1, DType::F64);
}

// A step's micro-batches multiply the same weights (they change at the
// update, after the last backward; zero_grad starts the next step), so
// their FP8 copies and amax are made once: the forward's first call makes
// the plain copy and measures the amax (and its group max), the first
// backward the transposed one. A forward outside a training step
// (validation) quantises its own: the weights may have changed since.
bool GPT::fp8_weight(Fp8Weight* q, Param w, int l, bool backward) {
    if (!a_->fp8_wq || (!backward && !fp8_record_)) return false;
    const size_t k = (size_t)l * 4 + linear_index(w);
    if (fp8_woff_[k] == SIZE_MAX) return false;
    uint8_t& made = fp8_wmade_[k];
    if (backward && !(made & 1)) return false;  // (its forward used no copy: the slot holds the amax)
    uint8_t* bytes = static_cast<uint8_t*>(a_->fp8_wq) + fp8_woff_[k];
    *q = {bytes, bytes + fp8_wsize_[k], elem_ptr(a_->fp8_wamax, DType::F64, k), !backward && !(made & 1),
          backward && !(made & 2)};
    made |= backward ? 2 : 1;
    return true;
}

// Delayed scaling of layer l's product of w (Backend::Fp8Delayed): its
// three operands' step maxima and histories, consecutive slots; record:
// the operands this pass measured (forward the input and the weight,
// backward the output gradient; a split backward's W none), when it is a
// training pass. False without a history.
bool GPT::fp8_delayed_of(Fp8Delayed* d, Param w, int l, unsigned record) const {
    if (fp8_len_ == 0) return false;
    const size_t slot = layer_slot(l, w, 0);
    *d = {elem_ptr(a_->fp8_step, DType::F64, slot), elem_ptr(a_->fp8_hist, DType::F64, slot * fp8_len_), fp8_len_,
          fp8_record_ ? record : 0u};
    return true;
}

void* GPT::fp8_step_amax() { return a_->fp8_step; }

// Delayed scaling knows an operand's scale before the op that writes it runs
// (its history's amax, once it holds one), so that op may write the
// operand's FP8 copies too: a GPU then does not read it again to quantise it
// (docs/fp8.md). The values are the product's own either way.
bool GPT::fp8_cast(Fp8Cast* c, Param w, int l, int which, bool transposed, bool keep) const {
    if (fp8_len_ == 0) return false;
    const size_t slot = layer_slot(l, w, which);
    *c = {elem_ptr(a_->fp8_hist, DType::F64, slot * fp8_len_), fp8_len_, transposed, keep};
    return true;
}

// The forward's cast of fcproj's input may keep its transposed copy
// (LayerActs::h_t): the weight gradient then multiplies that, and quantises
// the input itself only while the history is empty (nothing was cast).
bool GPT::fp8_kept(Fp8Kept* k, Param w, int l, void* bytes) const {
    if (fp8_len_ == 0 || !bytes) return false;
    *k = {bytes, elem_ptr(a_->fp8_hist, DType::F64, layer_slot(l, w, 0) * fp8_len_), fp8_len_};
    return true;
}

void* GPT::amax_of(const LayerActs& la, Param w) const {
    return la.amax && fp8_on(w) ? elem_ptr(la.amax, DType::F64, (size_t)linear_index(w) * 3) : nullptr;
}

bool GPT::fp8_on(Param w) const { return fp8_ && linear_layer_in(fp8_layers_, linear_index(w)); }

void GPT::fp8_push(const void* figures, bool skipped) {
    if (fp8_len_ > 0) be_->fp8_history_push(a_->fp8_hist, a_->fp8_step, fp8_slots(), fp8_len_, figures, skipped);
}

std::vector<double> GPT::fp8_history() const {
    std::vector<double> h((size_t)fp8_slots() * fp8_len_);
    if (!h.empty()) be_->download(h.data(), DType::F64, a_->fp8_hist, DType::F64, h.size());
    return h;
}

void GPT::set_fp8_history(const std::vector<double>& h) {
    if (h.size() != (size_t)fp8_slots() * fp8_len_) throw std::invalid_argument("set_fp8_history: another shape");
    be_->upload(a_->fp8_hist, DType::F64, h.data(), DType::F64, h.size());
}

// The input's and the weight's amax are the forward's: the backward of a
// micro-batch multiplies the same two tensors (kept or recomputed bit for
// bit, the weight unchanged until the step's update) and finds them in the
// layer-slot, so it measures only the output gradient, and under tp and cp
// issues only that one's group max. (Delayed scaling: the backward scales
// the forward's two by the same history, and recording them again would
// add nothing to the step's max.)
void GPT::linear_forward(void* out, const void* in, Param w, const void* bias, int l, int N, int IC, int OC, bool row,
                         void* amax, bool in_measured) {
    if (!fp8_on(w)) {
        be_->matmul_forward(out, in, P(w, l), bias, N, IC, OC);
        return;
    }
    fp8_amax(0, in_measured ? nullptr : in, prec_.act, (size_t)N * IC, row, true, amax);
    Fp8Weight q;  // the weight's amax: with its copies (once per step), else into the layer-slot
    const bool copies = fp8_weight(&q, w, l, false);
    if (!copies || q.quantize)
        fp8_amax(copies ? 0 : 1, P(w, l), prec_.param, (size_t)OC * IC, true, false, copies ? (void*)q.amax : amax);
    Fp8Delayed d;
    const bool delayed = fp8_delayed_of(&d, w, l, 1u | 2u);
    be_->matmul_forward_fp8(out, in, P(w, l), bias, N, IC, OC, amax, delayed ? &d : nullptr, copies ? &q : nullptr);
}

void GPT::linear_backward(void* dinp, Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC,
                          int OC, bool row, void* amax, bool dout_measured, void* in_t) {
    if (fp8_on(w)) fp8_amax(2, dout_measured ? nullptr : dout, prec_.act, (size_t)N * OC, !row, true, amax);
    linear_backward_product(dinp, G(w, l), dbias, w, dout, in, l, N, IC, OC, amax, in_t, 4u);
}

// The output gradient's amax (its group max, delayed scaling's record) as
// the whole backward takes it, beside the forward's two: W reads all three
// from the slot and issues no collective.
void GPT::linear_backward_input(void* dinp, Param w, const void* dout, const void* in, int l, int N, int IC, int OC,
                                bool row, void* amax, bool dout_measured) {
    if (fp8_on(w)) fp8_amax(2, dout_measured ? nullptr : dout, prec_.act, (size_t)N * OC, !row, true, amax);
    linear_backward_product(dinp, nullptr, nullptr, w, dout, in, l, N, IC, OC, amax, nullptr, 4u);
}

// (B recorded the output gradient's amax, and made the weight's transposed
// copy, which W does not use.)
void GPT::linear_backward_weights(Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC, int OC,
                                  const void* amax, void* in_t) {
    linear_backward_product(nullptr, G(w, l), dbias, w, dout, in, l, N, IC, OC, amax, in_t, 0u);
}

void GPT::linear_backward_product(void* dinp, void* dw, void* dbias, Param w, const void* dout, const void* in, int l,
                                  int N, int IC, int OC, const void* amax, void* in_t, unsigned record) {
    if (!fp8_on(w)) {
        be_->matmul_backward(dinp, dw, dbias, dout, in, P(w, l), N, IC, OC);
        return;
    }
    Fp8Kept k;
    Fp8Delayed d;
    Fp8Weight q;
    const bool kept = dw && fp8_kept(&k, w, l, in_t), delayed = fp8_delayed_of(&d, w, l, record);
    const bool copies = fp8_weight(&q, w, l, true);
    be_->matmul_backward_fp8(dinp, dw, dbias, dout, in, P(w, l), N, IC, OC, amax, kept ? &k : nullptr,
                             delayed ? &d : nullptr, copies ? &q : nullptr);
}

void GPT::expert_amax(int l, int p, const std::vector<ExpertBlock>& blocks, const void* x, const void* dy, void* dst) {
    const int E = cfg_.experts, Hl = table_.hidden, El = table_.experts;
    const size_t IC = p == 0 ? cfg_.channels : Hl, OC = p == 0 ? 2 * (size_t)Hl : cfg_.channels, wn = IC * OC;
    const DType act = prec_.act, pt = prec_.param;
    const void* w = P(p == 0 ? Param::moe_fc : Param::moe_proj, l);
    if ((int)blocks.size() != E) throw std::logic_error("expert_amax: not one block per expert and peer");
    auto at = [&](size_t b, int which) { return elem_ptr(dst, DType::F64, 3 * b + which); };
    // The forward measures the blocks' inputs and the experts' weights, the
    // backward the blocks' output gradients (the rest is the forward's).
    const int which_rows = dy ? 2 : 0;
    std::vector<int> first(El, -1);  // each expert's weight once, copied to its other blocks
    for (size_t b = 0; b < blocks.size(); b++) {
        const ExpertBlock& k = blocks[b];
        if (dy) {
            be_->amax_to(at(b, 2), elem_ptr(dy, act, k.row * OC), act, k.n * OC);
            continue;
        }
        be_->amax_to(at(b, 0), elem_ptr(x, act, k.row * IC), act, k.n * IC);
        if (first[k.expert] >= 0) {
            be_->copy(at(b, 1), at(first[k.expert], 1), sizeof(double));
        } else {
            first[k.expert] = (int)b;
            be_->amax_to(at(b, 1), elem_ptr(w, pt, (size_t)k.expert * wn), pt, wn);
        }
    }
    static const bool whole = test_hooks::fp8_expert_whole();  // the tests' counter-example
    if (whole) {  // one amax per expert over all its blocks: what one process never does under ep
        std::vector<double> v(3 * (size_t)E);
        be_->download(v.data(), DType::F64, dst, DType::F64, v.size());
        for (size_t b = 0; b < blocks.size(); b++)
            for (size_t o = 0; o < blocks.size(); o++)
                if (blocks[o].expert == blocks[b].expert)
                    v[3 * b + which_rows] = std::max(v[3 * b + which_rows], v[3 * o + which_rows]);
        be_->upload(dst, DType::F64, v.data(), DType::F64, v.size());
    }
    // One all-reduce of all 3E numbers: the backward's max of the forward's
    // (already the group's, the same on every rank) changes nothing.
    static const bool local = test_hooks::fp8_local_amax();
    if (tp_ && !local) tp_->max(dst, 3 * (size_t)E, DType::F64);
    if (cp_ && !local) cp_->max(dst, 3 * (size_t)E, DType::F64);
    if (fp8_len_ == 0) return;
    const int base = ep_ ? ep_->rank() * El : 0;  // a rank's experts are consecutive
    for (size_t b = 0; b < blocks.size(); b++)
        for (int which = dy ? 2 : 0; which < (dy ? 3 : 2); which++) {
            const size_t slot = expert_slot(cfg_, l, base + blocks[b].expert, p, which);
            be_->fp8_delayed(at(b, which), elem_ptr(a_->fp8_step, DType::F64, slot),
                             elem_ptr(a_->fp8_hist, DType::F64, slot * fp8_len_), fp8_len_, fp8_record_);
        }
}

void* GPT::expert_amax_at(void* slot, int p, size_t b) const {
    const bool on = fp8_on(p == 0 ? Param::fcw : Param::fcprojw);  // (--fp8-layers: fc names gate and up, fcproj down)
    return slot && on ? elem_ptr(slot, DType::F64, 12 + ((size_t)p * cfg_.experts + b) * 3) : nullptr;
}

void GPT::expert_forward(void* out, const void* in, const void* w, int n, int IC, int OC, const void* amax) {
    if (amax) be_->matmul_forward_fp8(out, in, w, nullptr, n, IC, OC, amax);
    else be_->matmul_forward(out, in, w, nullptr, n, IC, OC);
}

void GPT::expert_backward(void* dinp, void* dw, const void* dout, const void* in, const void* w, int n, int IC,
                          int OC, const void* amax) {
    if (amax) be_->matmul_backward_fp8(dinp, dw, nullptr, dout, in, w, n, IC, OC, amax);
    else be_->matmul_backward(dinp, dw, nullptr, dout, in, w, n, IC, OC);
}
