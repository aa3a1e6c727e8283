// tests/unit/test_fp8_passes.cpp: with --fp8 1 each FP8 operand of a
// micro-batch is measured once (llmc/model/fp8.cpp): the forward takes the
// amax of each linear layer's input and weight (a Mixtral's: each expert
// block's input and each expert's weight), the backward only the output
// gradients', and reads the other two from the layer-slot where its forward
// left them; and the ops that write an operand measure it as they write
// it, in their own op (one pass on a GPU): the MLP's activation (GELU,
// SwiGLU; Backend::activation_amax) fcproj's input forward and fc's output
// gradient backward, the norms (Backend::norm_amax, norm_backward_amax)
// QKV's and fc's inputs forward and, backward, the residual gradient they
// leave, the output gradient of attention's projection (ln2) and of
// fcproj (the next block's ln1, or lnf). A backend in front of the CPU's
// counts the amax passes and the elements they read, and the ops that
// measure, in one micro-batch's forward, backward (whole, or B then W: W
// measures nothing) and, under full recompute, the recomputed forward,
// against the count written out from the layers' shapes. Measuring the
// input and the weight again in the backward, or an operand a measuring op
// wrote in a pass of its own, fails it; that the amaxes read are the right
// ones is the reference tests' part; --fp8-layers: a layer left out has no
// FP8 product, and its operands are measured and cast by nothing (test_gpt --fp8 1 against
// reference_gpt.py and transformers, and every layout against one process
// in tests/distributed/test_fp8.py).
// Last line: "N passed, N failed".
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend_wrapper.h"
#include "llmc/backend/backends.h"
#include "llmc/base/rng.h"
#include "llmc/model/gpt.h"
#include "tests/lib/check.h"

namespace {

constexpr int B = 2, T = 16, V = 97;

class CountingBackend : public BackendWrapper {
  public:
    explicit CountingBackend(Backend* inner) : BackendWrapper(inner) {}
    void amax_to(void* dst, const void* x, DType t, size_t n) override {
        calls++, elems += n;
        BackendWrapper::amax_to(dst, x, t, n);
    }
    void activation_amax(bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                         const Fp8Cast* cast) override {
        if (amax) fused++, fused_elems += (size_t)N * H * (swiglu && dout ? 2 : 1);  // (null: a recompute's cast)
        if (cast) casts.push_back(record(*cast, dout != nullptr, amax != nullptr));
        BackendWrapper::activation_amax(swiglu, out, a, dout, N, H, amax, cast);
    }
    void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC,
                            const void* amax, const Fp8Delayed* d, const Fp8Weight* q) override {
        products.push_back({0, d ? slot(d->history) : -2, d ? d->record : 0u, d ? d->len : 0});
        weights.push_back({0, IC, OC, q ? q->bytes : nullptr, q ? q->amax : nullptr, q && q->quantize});
        BackendWrapper::matmul_forward_fp8(out, inp, weight, bias, N, IC, OC, amax, d, q);
    }
    void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                             const void* weight, int N, int IC, int OC, const void* amax, const Fp8Kept* kept,
                             const Fp8Delayed* d, const Fp8Weight* q) override {
        if (dweight) grads.push_back({IC, OC, kept ? kept->bytes : nullptr, kept ? slot(kept->history) : -2});
        products.push_back({dinp ? 1 : 2, d ? slot(d->history) : -2, d ? d->record : 0u, d ? d->len : 0});
        weights.push_back({dinp ? 1 : 2, IC, OC, q ? q->bytes : nullptr, q ? q->amax : nullptr, q && q->quantize_t});
        BackendWrapper::matmul_backward_fp8(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, amax, kept, d, q);
    }
    void norm_amax(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                   const void* w, const void* bias, int N, int C, double eps, void* amax, const Fp8Cast* cast) override {
        fused++, fused_elems += (size_t)N * C;
        if (cast) norm_casts.push_back(record(*cast, false, amax != nullptr));
        BackendWrapper::norm_amax(rms, residual, out, mean, rstd, a, b, w, bias, N, C, eps, amax, cast);
    }
    void norm_backward_amax(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C, void* amax) override {
        fused++, fused_elems += (size_t)N * C;
        BackendWrapper::norm_backward_amax(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C, amax);
    }
    void reset() {
        calls = elems = fused = fused_elems = 0;
        casts.clear(), norm_casts.clear(), grads.clear(), products.clear(), weights.clear();
    }
    // The slot a history names: each holds its slot's number + 1 (passes),
    // read when it is named (the model is gone when the runs are checked).
    static int slot(const void* history) { return (int)*static_cast<const double*>(history) - 1; }
    size_t calls = 0, elems = 0, fused = 0, fused_elems = 0;
    struct Cast {
        bool backward, transposed, keep;
        int history;  // its slot
        int len;
        void* kept;
        bool plain, measured;
    };
    static Cast record(const Fp8Cast& c, bool backward, bool measured) {
        return {backward, c.transposed, c.keep, slot(c.history), c.len, c.kept, c.plain, measured};
    }
    std::vector<Cast> casts;       // the activation's casts asked for (delayed scaling)
    std::vector<Cast> norm_casts;  // the norms' (QKV's and fc's inputs)
    struct Grad {  // a weight gradient's product
        int IC, OC;
        const void* kept;
        int history;  // the kept copy's slot (-2: none)
    };
    std::vector<Grad> grads;
    struct Product {  // a product's delayed scaling (Fp8Delayed)
        int kind;     // 0 forward, 1 backward with the input gradient (whole or B), 2 W alone
        int history;  // the slot of its operand 0 (-2: none)
        unsigned record;
        int len;
    };
    std::vector<Product> products;
    struct Weight {  // a product's weight copies (Fp8Weight)
        int kind, IC, OC;
        const void *bytes, *amax;  // (null: none)
        bool makes;                // this call makes its copy (plain forward, transposed backward)
    };
    std::vector<Weight> weights;
};

struct Count {
    size_t calls = 0, elems = 0, fused = 0, fused_elems = 0;
    Count& add(size_t n, size_t times = 1) { return calls += times, elems += n * times, *this; }
    Count& measured_by_op(size_t n) { return fused++, fused_elems += n, *this; }
};

// The passes of one layer: forward (the inputs and weights) and backward
// (the output gradients) from the shapes. N rows; a Mixtral's experts get
// N·K rows in E blocks (one per expert: one process, no ep).
// wts: the dense layers' weights' passes among the forward's (a step's
// first forward measures them, a recomputed one does not: GPT::fp8_weight).
// on: the layers on FP8 operands (--fp8-layers; bit i layer i): the others'
// operands are measured by nothing.
void layer_passes(const GPTConfig& c, Count* fwd, Count* bwd, Count* wts, unsigned on = kLinearLayersAll) {
    const size_t N = (size_t)B * T, C = c.channels, HS = c.head_size();
    const size_t qkv = C + 2 * (size_t)c.kv_heads() * HS;
    // QKV: its input measured by ln1 as it writes it, its output gradient a pass.
    if (on & 1u) fwd->measured_by_op(N * C).add(qkv * C), bwd->add(N * qkv), wts->add(qkv * C);
    // Attention's projection: its input a pass, its output gradient by ln2's backward.
    if (on & 2u) fwd->add(N * C).add(C * C), bwd->measured_by_op(N * C), wts->add(C * C);
    if (c.moe()) {
        const size_t E = c.experts, R = N * c.top_k, F = c.hidden();
        for (size_t IC : {C, F}) {
            const size_t OC = IC == C ? 2 * F : C;
            if (!(on & (IC == C ? 4u : 8u))) continue;  // (fc names the experts' gate and up, fcproj their down)
            fwd->add(0, E).elems += R * IC;  // the blocks' inputs, E passes over R rows in all
            fwd->add(OC * IC, E);            // each expert's weight
            bwd->add(0, E).elems += R * OC;  // the blocks' output gradients
        }
        return;
    }
    // fc: its input by ln2, its output gradient by the activation's backward;
    // fcproj: its input by the activation, its output gradient by the next
    // block's ln1 backward (the last block's by lnf's).
    const size_t H = c.hidden(), F = c.llama() ? 2 * H : H;
    if (on & 4u) fwd->measured_by_op(N * C).add(F * C), bwd->measured_by_op(N * F), wts->add(F * C);  // fc
    if (on & 8u) fwd->add(H * C).measured_by_op(N * H), bwd->measured_by_op(N * C), wts->add(H * C);  // fcproj
}

struct Run {
    Count fwd, bwd;
    size_t w_calls;
    std::vector<CountingBackend::Cast> fwd_casts, bwd_casts, fwd_norm_casts, bwd_norm_casts;
    std::vector<CountingBackend::Grad> grads;  // the weight gradients' products, B's or W's
    std::vector<CountingBackend::Product> products;  // every product, in order
    std::vector<std::pair<int, int>> fwd_shapes;     // the forward's FP8 products' (IC, OC)
};
Count taken(CountingBackend* be) {
    Count c;
    c.calls = be->calls, c.elems = be->elems, c.fused = be->fused, c.fused_elems = be->fused_elems;
    be->reset();
    return c;
}

constexpr int kHist = 2;  // --fp8-history's length in the runs with one

// One process's model of c on the counting backend (fp64 CPU), FP8 on, the
// whole model one chunk of one slot, with o's other options.
struct Counted {
    CountingBackend* be;
    std::unique_ptr<Backend> own;
    std::unique_ptr<GPT> model;  // (destroyed before its backend)
};
Counted counted_model(const GPTConfig& c, ModelOptions o) {
    std::string err;
    Counted m;
    m.be = new CountingBackend(make_backend("cpu", "fp64", 0, &err));
    m.own.reset(m.be);
    o.fp8 = true;
    ModelChunk ch;
    ch.layers = c.num_layers, ch.embed = ch.head = true, ch.slots = 1;
    o.chunks = {ch};
    m.model = std::make_unique<GPT>(m.be, c, o);
    m.model->init_random(5);
    m.model->zero_grad();
    return m;
}

Run passes(const GPTConfig& c, Recompute rc, bool split, int history = 0, unsigned layers = kLinearLayersAll) {
    ModelOptions o(B, T);
    o.fp8_layers = layers;
    o.recompute = rc;
    o.fp8_history = history;
    o.split_backward = split;
    Counted m = counted_model(c, o);
    CountingBackend* be = m.be;
    GPT& model = *m.model;
    // Each history holds its slot's number: a cast names its operand by it.
    std::vector<double> h((size_t)model.fp8_slots() * history);
    for (size_t i = 0; i < h.size(); i++) h[i] = (double)(i / history + 1);
    if (history) model.set_fp8_history(h);
    std::vector<int> in(B * T), tg(B * T);
    Rng r(11);
    for (int i = 0; i < B * T; i++) in[i] = (int)(r.next_u64() % V), tg[i] = (int)(r.next_u64() % V);
    Run run{};
    be->reset();
    model.forward_chunk(0, 0, in.data(), nullptr, tg.data(), B, T, 1.0 / (B * T));
    run.fwd_casts = be->casts;
    run.fwd_norm_casts = be->norm_casts;
    run.products = be->products;
    for (const auto& w : be->weights)
        if (w.kind == 0) run.fwd_shapes.push_back({w.IC, w.OC});
    run.fwd = taken(be);
    if (split) {
        model.backward_chunk(0, 0, nullptr, true, GPT::BackwardPart::input);
        run.bwd_casts = be->casts;
        run.bwd_norm_casts = be->norm_casts;
        run.grads = be->grads;
        run.products.insert(run.products.end(), be->products.begin(), be->products.end());
        run.bwd = taken(be);
        model.backward_chunk(0, 0, nullptr, true, GPT::BackwardPart::weights);
        run.grads.insert(run.grads.end(), be->grads.begin(), be->grads.end());
        run.products.insert(run.products.end(), be->products.begin(), be->products.end());
        run.w_calls = taken(be).calls;
    } else {
        model.backward_chunk(0, 0, nullptr, true);
        run.bwd_casts = be->casts;
        run.bwd_norm_casts = be->norm_casts;
        run.grads = be->grads;
        run.products.insert(run.products.end(), be->products.begin(), be->products.end());
        run.bwd = taken(be);
    }
    return run;
}

// Delayed scaling: the MLP's activation casts the operand it writes for the
// next product (Backend::Fp8Cast): forward fcproj's input (slot 3, operand
// 0), backward fc's output gradient (slot 2, operand 2) both ways when the
// whole backward runs, as it is for B (W quantises its own); a full
// recompute's forward again. The output is kept in the compute type
// (keep) but for fc's output gradient in a whole backward without fc's
// bias (Llama's), and for fcproj's input where the forward's cast also
// keeps its transposed copy for fcproj's weight gradient (Fp8Cast::kept:
// wherever h is, per layer-slot or the recompute's scratch, but not when a
// split backward recomputes h): that weight gradient multiplies the same
// copy (Fp8Kept), and a GELU recompute before a whole backward writes it
// again, alone and unmeasured. A Mixtral's experts and current scaling cast
// nothing. The history named must be the operand's own (its slot number).
void check_casts(const GPTConfig& c, const char* spec) {
    const int L = c.num_layers, dense = c.moe() ? 0 : 1;
    const size_t H = c.hidden(), C = c.channels;
    for (Recompute rc : {Recompute::none, Recompute::gelu, Recompute::selective, Recompute::full})
        for (bool split : {false, true}) {
            const Run cur = passes(c, rc, split);
            CHECK(cur.fwd_casts.empty() && cur.bwd_casts.empty(), "%s: current scaling asks for casts", spec);
            bool none_kept = true;
            for (const auto& g : cur.grads) none_kept &= g.kept == nullptr;
            CHECK(none_kept, "%s: current scaling keeps an FP8 copy", spec);
            const Run r = passes(c, rc, split, kHist);
            const bool full = rc == Recompute::full, again = rc == Recompute::gelu || rc == Recompute::selective;
            const bool kept = dense && (rc == Recompute::none || !split);
            auto slot_of = [&](int h) { return h; };
            const char* how = split ? "B then W" : "whole";
            // the forward's: fcproj's input, and its transposed copy where kept
            bool ok = r.fwd_casts.size() == (size_t)(dense * L);
            for (size_t i = 0; ok && i < r.fwd_casts.size(); i++) {
                const auto& k = r.fwd_casts[i];
                ok = !k.backward && !k.transposed && k.plain && k.measured && k.len == kHist &&
                     slot_of(k.history) == ((int)i * 4 + 3) * 3 + 0 && (k.kept != nullptr) == kept && k.keep == !kept &&
                     (!kept || i == 0 || (k.kept == r.fwd_casts[0].kept) == (rc != Recompute::none));
            }
            CHECK(ok, "%s -r %s %s: the forward's casts (%zu) are not fcproj's input of each block, its transposed "
                  "copy %s", spec, recompute_name(rc), how, r.fwd_casts.size(),
                  kept ? "kept where h is (per layer-slot, or the one scratch)" : "not kept");
            // the backward's: fc's output gradient; before it a full
            // recompute's forward cast, or a GELU recompute's kept copy
            int bwd = 0, again_casts = 0;
            ok = true;
            for (size_t i = 0; ok && i < r.bwd_casts.size(); i++) {
                const auto& k = r.bwd_casts[i];
                const int l = L - 1 - bwd;  // the block whose backward is next
                if (!k.backward) {
                    if (full)  // the recomputed forward's, as the forward's
                        ok = k.plain && k.measured && (k.kept != nullptr) == kept && k.keep == !kept &&
                             slot_of(k.history) == (l * 4 + 3) * 3;
                    else  // the recomputed activation's: the kept copy alone
                        ok = again && kept && !k.plain && !k.measured && !k.keep && k.kept == r.fwd_casts[0].kept &&
                             slot_of(k.history) == (l * 4 + 3) * 3;
                    again_casts++;
                    continue;
                }
                bwd++;
                ok = k.transposed == !split && k.keep == (split || !c.llama()) && k.len == kHist &&
                     slot_of(k.history) == (l * 4 + 2) * 3 + 2;
            }
            const int want_again = dense * L * (full || (again && kept) ? 1 : 0);
            CHECK(ok && bwd == dense * L && again_casts == want_again,
                  "%s -r %s %s: the backward's casts (%d of fc's output gradient, %d recomputed) are not fc's output "
                  "gradient of each block, %s, after %d recomputed", spec, recompute_name(rc), how, bwd, again_casts,
                  split ? "B's as they are" : "both ways", want_again);
            // fcproj's weight gradient multiplies the kept copy of its block
            int fcproj = 0;
            ok = true;
            for (const auto& g : r.grads) {
                if (!dense || !((size_t)g.IC == H && (size_t)g.OC == C)) continue;  // (the others: check_norm_casts)
                const int l = L - 1 - fcproj++;
                ok &= kept ? g.kept == r.fwd_casts[l].kept && slot_of(g.history) == (l * 4 + 3) * 3 : !g.kept;
            }
            CHECK(ok && fcproj == dense * L, "%s -r %s %s: fcproj's weight gradients (%d) %s", spec,
                  recompute_name(rc), how, fcproj,
                  kept ? "do not multiply their block's kept copy" : "name a kept copy where none is kept");
            // Delayed scaling inside each dense product (Fp8Delayed): its
            // layer's slots, recording the forward's input and weight, the
            // backward's output gradient (whole or B), nothing in W; the
            // experts' own blocks and current scaling none.
            int counts[3] = {0, 0, 0};
            ok = true;
            for (const auto& p : cur.products) ok &= p.history == -2;
            for (const auto& p : r.products) {
                if (p.history == -2) continue;
                counts[p.kind]++;
                const unsigned want = p.kind == 0 ? 3u : p.kind == 1 ? 4u : 0u;
                ok &= p.record == want && p.len == kHist && slot_of(p.history) % 3 == 0;
            }
            const int per = L * (dense ? 4 : 2);  // (a Mixtral's attention products)
            ok &= counts[0] == per * (full ? 2 : 1) && counts[1] == per && counts[2] == (split ? per : 0);
            CHECK(ok, "%s -r %s %s: the products' delayed scaling (%d forward, %d backward, %d W; want %d, %d, %d) "
                  "records the wrong operands or none", spec, recompute_name(rc), how, counts[0], counts[1],
                  counts[2], per * (full ? 2 : 1), per, split ? per : 0);
        }
}

// Delayed scaling: the norms cast QKV's input (ln1) and fc's (ln2) for the
// forward's product and keep its transposed copy for the weight gradient
// (GPT::norm_cast; Fp8Cast::kept, LayerActs::ln1_t, ln2_t), wherever the
// block keeps ln1 and ln2 (not under full recompute; whole or split), and
// store neither (keep false): block by block, ln1 (at the chunk's start
// its own norm, then the previous block's residual + norm) and ln2 (not a
// Mixtral's, whose router reads it). QKV's and fc's weight gradients
// multiply those copies (Fp8Kept: the same bytes, the input's slot);
// attention's projection's and a Mixtral's experts' none. The backward
// casts nothing through a norm; current scaling nothing at all.
void check_norm_casts(const GPTConfig& c, const char* spec) {
    const int L = c.num_layers, dense = c.moe() ? 0 : 1;
    const size_t C = c.channels, H = c.hidden(), F = c.llama() ? 2 * H : H;
    const size_t Wqkv = C + 2 * (size_t)c.kv_heads() * c.head_size();
    for (Recompute rc : {Recompute::none, Recompute::gelu, Recompute::selective, Recompute::full})
        for (bool split : {false, true}) {
            const char* how = split ? "B then W" : "whole";
            const Run cur = passes(c, rc, split);
            CHECK(cur.fwd_norm_casts.empty() && cur.bwd_norm_casts.empty(), "%s: current scaling asks the norms "
                  "for casts", spec);
            const Run r = passes(c, rc, split, kHist);
            const bool kept = rc != Recompute::full;
            const size_t per = kept ? (size_t)(1 + dense) : 0;
            bool ok = r.fwd_norm_casts.size() == per * L && r.bwd_norm_casts.empty();
            for (size_t i = 0; ok && i < r.fwd_norm_casts.size(); i++) {
                const auto& k = r.fwd_norm_casts[i];
                const int l = (int)(i / per), lin = i % per == 0 ? 0 : 2;  // QKV, then fc
                ok = !k.transposed && !k.keep && k.plain && k.measured && k.len == kHist && k.kept &&
                     k.history == (l * 4 + lin) * 3;
                for (size_t j = 0; ok && j < i; j++) ok = r.fwd_norm_casts[j].kept != k.kept;
            }
            CHECK(ok, "%s -r %s %s: the norms' casts (%zu forward, %zu backward; want %zu, 0) are not QKV's%s input "
                  "of each block, kept transposed in a copy of its own and not stored", spec, recompute_name(rc), how,
                  r.fwd_norm_casts.size(), r.bwd_norm_casts.size(), per * L, dense ? " and fc's" : "");
            // The weight gradients, last block first: which multiply a kept copy of a norm's.
            int qkv = 0, fc = 0;
            ok = true;
            for (const auto& g : r.grads) {
                const bool is_qkv = (size_t)g.IC == C && (size_t)g.OC == Wqkv;
                const bool is_fc = dense && (size_t)g.IC == C && (size_t)g.OC == F;
                if (!is_qkv && !is_fc) {  // attention's projection, a Mixtral's experts: none; fcproj: check_casts
                    ok &= g.kept == nullptr || (dense && (size_t)g.IC == H && (size_t)g.OC == C);
                    continue;
                }
                const int l = L - 1 - (is_qkv ? qkv++ : fc++);
                const size_t i = (size_t)l * per + (is_qkv ? 0 : 1);
                ok &= kept ? i < r.fwd_norm_casts.size() && g.kept == r.fwd_norm_casts[i].kept &&
                                 g.history == (l * 4 + (is_qkv ? 0 : 2)) * 3
                           : g.kept == nullptr;
            }
            CHECK(ok && qkv == L && fc == dense * L, "%s -r %s %s: QKV's (%d) and fc's (%d) weight gradients %s",
                  spec, recompute_name(rc), how, qkv, fc,
                  kept ? "do not multiply their norm's kept copy" : "name a kept copy where none is kept");
        }
}

// The weights' FP8 copies, made once per step (GPT::fp8_weight): a
// training step's first forward makes each dense layer's plain copy and
// measures its weight, its first backward the transposed copy; the next
// micro-batch makes and measures neither, on the same copies; zero_grad
// starts a step that makes them again; a forward outside training
// (validation) uses none and measures its weights itself. A Mixtral's
// experts keep their own blocks.
void check_weight_copies(const GPTConfig& c, const char* spec, size_t fwd_calls, size_t wt_calls) {
    Counted m = counted_model(c, ModelOptions(B, T));
    CountingBackend* be = m.be;
    GPT& model = *m.model;
    std::vector<int> in(B * T), tg(B * T);
    Rng r(13);
    for (int i = 0; i < B * T; i++) in[i] = (int)(r.next_u64() % V), tg[i] = (int)(r.next_u64() % V);
    const size_t dense = (size_t)c.num_layers * (c.moe() ? 2 : 4);
    // pass: 0 forward, 1 backward; want: the dense products use copies, and make them
    auto run = [&](int pass, double dloss, bool copies, bool makes, size_t want_calls, const char* what,
                   std::vector<const void*>* bytes) {
        be->reset();
        if (pass == 0) model.forward_chunk(0, 0, in.data(), nullptr, tg.data(), B, T, dloss);
        else model.backward_chunk(0, 0, nullptr, true);
        size_t n = 0, ok = 0;
        std::vector<const void*> seen;
        for (const auto& w : be->weights) {
            if (w.kind != pass || !w.bytes) continue;
            n++, seen.push_back(w.bytes);
            ok += w.makes == makes;
        }
        const bool same = !bytes || bytes->empty() || *bytes == seen;
        if (bytes && bytes->empty()) *bytes = seen;
        CHECK(n == (copies ? dense : 0) && ok == n && same && (pass == 1 || be->calls == want_calls),
              "%s, %s: %zu products on the weights' copies (want %zu), %zu %s them (the same copies: %d), %zu amax "
              "passes (want %zu)", spec, what, n, copies ? dense : 0, ok, makes ? "making" : "reusing", same, be->calls,
              want_calls);
    };
    std::vector<const void*> fwd_bytes, bwd_bytes;
    const double dl = 1.0 / (B * T);
    run(0, dl, true, true, fwd_calls, "a step's first forward", &fwd_bytes);
    run(1, dl, true, true, 0, "its first backward", &bwd_bytes);
    run(0, dl, true, false, fwd_calls - wt_calls, "the next micro-batch's forward", &fwd_bytes);
    run(1, dl, true, false, 0, "its backward", &bwd_bytes);
    model.zero_grad();
    run(0, dl, true, true, fwd_calls, "the next step's first forward (after zero_grad)", &fwd_bytes);
    run(0, 0.0, false, false, fwd_calls, "a forward outside training (validation)", nullptr);
}

// --fp8-weight-copies 0 (ModelOptions::fp8_weight_copies false): no copies,
// and every training forward measures its weights again.
void check_no_weight_copies(const GPTConfig& c, const char* spec, size_t fwd_calls) {
    ModelOptions o(B, T);
    o.fp8_weight_copies = false;
    Counted m = counted_model(c, o);
    CountingBackend* be = m.be;
    GPT& model = *m.model;
    std::vector<int> in(B * T, 1), tg(B * T, 2);
    for (int micro = 0; micro < 2; micro++) {
        be->reset();
        model.forward_chunk(0, 0, in.data(), nullptr, tg.data(), B, T, 1.0 / (B * T));
        const size_t calls = be->calls;
        model.backward_chunk(0, 0, nullptr, true);
        size_t copies = 0;
        for (const auto& w : be->weights) copies += w.bytes != nullptr;
        CHECK(copies == 0 && calls == fwd_calls, "%s, --fp8-weight-copies 0, micro-batch %d: %zu products on weight "
              "copies (want 0), %zu amax passes forward (want %zu)", spec, micro, copies, calls, fwd_calls);
    }
}

// --fp8-layers (ModelOptions::fp8_layers): a layer left out multiplies in
// the compute type: no FP8 product has its shape, and none of its operands
// is measured (by a pass or by the op that writes it) or cast; the others'
// are as with all four (layer_passes). Each layer alone and two pairs,
// under delayed scaling, whole and split.
void check_layers(const GPTConfig& c, const char* spec) {
    const int C = c.channels, H = c.hidden(), F = c.llama() ? 2 * H : H, L = c.num_layers, dense = c.moe() ? 0 : 1;
    const int Wqkv = C + 2 * c.kv_heads() * c.head_size();
    const std::pair<int, int> shape[4] = {{C, Wqkv}, {C, C}, {C, F}, {H, C}};
    for (unsigned m : {1u, 2u, 4u, 8u, 5u, 10u})
        for (bool split : {false, true}) {
            Count f, b, wt;
            for (int l = 0; l < L; l++) layer_passes(c, &f, &b, &wt, m);
            const Run r = passes(c, Recompute::none, split, kHist, m);
            const std::string set = linear_layers_names(m);
            const char* how = split ? "B then W" : "whole";
            CHECK(r.fwd.calls == f.calls && r.fwd.elems == f.elems && r.fwd.fused == f.fused &&
                      r.fwd.fused_elems == f.fused_elems && r.bwd.calls == b.calls && r.bwd.elems == b.elems &&
                      r.bwd.fused == b.fused && r.bwd.fused_elems == b.fused_elems,
                  "%s --fp8-layers %s %s: amax passes %zu/%zu forward, %zu/%zu backward, in ops %zu/%zu and "
                  "%zu/%zu (run/want)", spec, set.c_str(), how, r.fwd.calls, f.calls, r.bwd.calls, b.calls,
                  r.fwd.fused, f.fused, r.bwd.fused, b.fused);
            int n[4] = {0, 0, 0, 0}, other = 0;
            for (const auto& s : r.fwd_shapes) {
                int i = 0;
                while (i < 4 && s != shape[i]) i++;
                if (i < 4 && (m >> i & 1u)) n[i]++;
                else other++;
            }
            bool ok = other == 0;
            for (int i = 0; i < 4; i++) {
                const bool expert = !dense && i >= 2, on = (m >> i & 1u) != 0;
                ok &= expert ? (n[i] > 0) == on : n[i] == (on ? L : 0);
            }
            const size_t casts_f = (size_t)(dense * L * (m >> 3 & 1u)), casts_b = (size_t)(dense * L * (m >> 2 & 1u));
            const size_t norm_casts = (size_t)(L * (m & 1u) + dense * L * (m >> 2 & 1u));
            CHECK(ok && r.fwd_casts.size() == casts_f && r.bwd_casts.size() == casts_b &&
                      r.fwd_norm_casts.size() == norm_casts,
                  "%s --fp8-layers %s %s: FP8 products of the layers %d %d %d %d (%d of no layer of the set), the "
                  "activation's casts %zu forward and %zu backward (want %zu, %zu), the norms' %zu (want %zu)", spec,
                  set.c_str(), how, n[0], n[1], n[2], n[3], other, r.fwd_casts.size(), r.bwd_casts.size(), casts_f,
                  casts_b, r.fwd_norm_casts.size(), norm_casts);
        }
}

}  // namespace

int main() {
    const char* models[] = {"L=2,C=32,NH=4,V=97,T=16", "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=16",
                            "arch=mixtral,L=2,C=32,NH=4,NKV=2,F=48,E=4,K=2,V=97,T=16"};
    for (const char* spec : models) {
        GPTConfig c;
        std::string err;
        CHECK(parse_model_spec(spec, &c, &err), "%s: %s", spec, err.c_str());
        Count f, b, wt;
        for (int l = 0; l < c.num_layers; l++) layer_passes(c, &f, &b, &wt);
        for (Recompute rc : {Recompute::none, Recompute::gelu, Recompute::selective, Recompute::full})
            for (bool split : {false, true}) {
                const Run r = passes(c, rc, split);
                // Full recompute runs each block's forward again before its backward.
                const size_t rf = rc == Recompute::full ? 1 : 0;
                const char* how = split ? "B then W" : "whole";
                CHECK(r.fwd.calls == f.calls && r.fwd.elems == f.elems,
                      "%s -r %s: forward %zu amax passes over %zu elements, want %zu over %zu", spec,
                      recompute_name(rc), r.fwd.calls, r.fwd.elems, f.calls, f.elems);
                CHECK(r.fwd.fused == f.fused && r.fwd.fused_elems == f.fused_elems,
                      "%s -r %s: forward %zu ops measured %zu elements, want %zu over %zu", spec,
                      recompute_name(rc), r.fwd.fused, r.fwd.fused_elems, f.fused, f.fused_elems);
                const Count want{b.calls + rf * (f.calls - wt.calls), b.elems + rf * (f.elems - wt.elems),
                                 b.fused + rf * f.fused, b.fused_elems + rf * f.fused_elems};
                CHECK(r.bwd.calls == want.calls && r.bwd.elems == want.elems,
                      "%s -r %s %s: backward %zu amax passes over %zu elements, want %zu over %zu (only the output "
                      "gradients'%s)",
                      spec, recompute_name(rc), how, r.bwd.calls, r.bwd.elems, want.calls, want.elems,
                      rf ? ", after the recomputed forward's less its weights'" : "");
                CHECK(r.bwd.fused == want.fused && r.bwd.fused_elems == want.fused_elems,
                      "%s -r %s %s: backward %zu ops measured %zu elements, want %zu over %zu", spec,
                      recompute_name(rc), how, r.bwd.fused, r.bwd.fused_elems, want.fused, want.fused_elems);
                if (split) CHECK(r.w_calls == 0, "%s -r %s: W measured %zu amaxes (B's are in the slot)", spec,
                                 recompute_name(rc), r.w_calls);
            }
        check_casts(c, spec);
        check_norm_casts(c, spec);
        check_weight_copies(c, spec, f.calls, wt.calls);
        check_no_weight_copies(c, spec, f.calls);
        check_layers(c, spec);
        std::printf("%-52s forward %zu amax passes (%zu elements) + %zu in ops (%zu), backward %zu (%zu) + %zu "
                    "(%zu)\n",
                    spec, f.calls, f.elems, f.fused, f.fused_elems, b.calls, b.elems, b.fused, b.fused_elems);
    }
    return check_summary();
}
