// llmc/model/moe.cpp: Mixtral's sparse mixture-of-experts block, which takes
// the MLP's place in every block (docs/moe.md), and its load-balancing loss.
//
// Forward of N tokens x (the block's second norm output, gathered whole
// under sequence parallelism):
//   logits = x·gate^T [N,E]; p = softmax(logits); the K most probable
//   experts of each token, weights w = their p renormalised to sum 1;
//   the token rows copied to the grouped order (by expert), each expert's
//   contiguous group through its SwiGLU (w1 gate, w3 up, w2 down), and
//   out[n] = sum_j w[n,j] · expert_j(x[n]).
// Under tensor parallelism every rank routes all N tokens alike (the router
// is replicated) and holds its slice of every expert (w1 and w3 by output
// rows, w2 by input columns, as the MLP): its out is a partial sum that the
// block's g operator reduces, the combine being linear. The gradient of
// the weights w needs the whole expert outputs: a sum over the tp group.
//
// Under expert parallelism (llmc/parallel/expert_parallel.h) this rank holds
// E/ep of the experts: the grouped rows leave for their experts' ranks
// after the dispatch, the experts run over the rows they receive, block by
// (peer, local expert), and the outputs come back before the combine; the
// backward sends the combine's row gradients out and takes the input rows'
// gradients back the same way. Routing, combine and router stay local.
//
// --moe-balance bias (DeepSeek-V3's balancing without a loss): the routing
// adds a per-layer, per-expert bias to the probabilities for its choice of
// the K only; the weights stay the chosen probabilities renormalised, so
// the bias has no gradient. The trainer moves it after each step from the
// step's loads (moe_bias_update).
//
// The load-balancing loss (transformers' load_balancing_loss_func, which
// concatenates the router logits of all layers): over the L·N routings of
// a micro-batch (a forward call; under context parallelism its tokens on
// every rank of the cp group), f_e = (assignments to e) / (L·N), P_e = (sum
// of p_e) / (L·N), aux = E · sum_e f_e·P_e. The objective adds
// aux_coef · aux averaged over the step's micro-batches, so its gradient
// with respect to each probability p_e is aux_coef · (N / global tokens) ·
// E · f_e / (L·N): moe_aux computes it once the micro-batch's blocks have
// all run, and each block's backward adds it to the router's gradient.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

// The experts' side of a block: blocks of rows, each for one of this
// rank's experts, in row order.
std::vector<GPT::ExpertBlock> GPT::expert_blocks(const std::vector<int>& off, const ExpertParallelOps::Route* r,
                                                 int El) {
    std::vector<ExpertBlock> out;
    size_t row = 0;
    if (!r) {  // every expert here, its rows as grouped
        for (int e = 0; e + 1 < (int)off.size(); e++) out.push_back({(size_t)off[e], (size_t)(off[e + 1] - off[e]), e});
        return out;
    }
    for (size_t i = 0; i < r->block_rows.size(); i++) {
        out.push_back({row, (size_t)r->block_rows[i], (int)(i % El)});
        row += r->block_rows[i];
    }
    return out;
}

int GPT::moe_expert_rows(const LayerActs& la, int N) const {
    return ep_ ? (int)moe_.routes_[la.index].expert_rows : N * cfg_.top_k;
}

void GPT::moe_keep_routing(const LayerActs& la) {
    moe_.offsets_[la.slot_index] = moe_.offsets_[la.index];
    if (ep_) moe_.routes_[la.slot_index] = moe_.routes_[la.index];
}

void GPT::moe_forward(int l, const LayerActs& la, const void* xin, int N) {
    const MoeRows r{a_->moe_logits, la.probs, la.topw, la.topi, la.offsets, la.perm, la.inv,
                    la.xg,          la.fch,   la.h,    la.yg,   &moe_.offsets_[la.index], la.index, la.amax};
    moe_rows_forward(l, r, xin, a_->proj, N);
}

void GPT::moe_rows_forward(int l, const MoeRows& r, const void* xin, void* out, int N) {
    Acts& a = *a_;
    const int C = cfg_.channels, E = cfg_.experts, K = cfg_.top_k, Hl = table_.hidden;
    const DType act = prec_.act, pt = prec_.param;
    be_->matmul_forward(r.logits, xin, P(Param::moe_gate, l), nullptr, N, C, E);
    const void* bias = moe_.bias_on_ ? elem_ptr(a.moe_bias, prec_.stat, (size_t)l * E) : nullptr;
    be_->moe_route(r.probs, r.topw, r.topi, r.offsets, r.perm, r.inv, r.logits, N, E, K, bias);
    // The grouped rows are the experts' input here; under ep they leave first.
    be_->moe_dispatch(ep_ ? a.moe_send : r.xg, nullptr, xin, nullptr, nullptr, r.inv, N, K, C);
    const void *w13 = P(Param::moe_fc, l), *w2 = P(Param::moe_proj, l);
    if (moe_.on_device_) {  // the groups' sizes stay on the device (keep_moe_on_device; not with FP8 experts)
        be_->moe_expert_matmul_forward(r.fch, r.xg, w13, r.offsets, N * K, E, C, 2 * Hl);
        activation(r.h, r.fch, N * K);
        be_->moe_expert_matmul_forward(r.yg, r.h, w2, r.offsets, N * K, E, Hl, C);
        be_->moe_combine(out, r.yg, r.topw, r.inv, N, K, C);
        return;
    }
    std::vector<int>& off = *r.offsets_host;
    off.resize((size_t)E + 1);
    be_->download(off.data(), DType::I32, r.offsets, DType::I32, (size_t)E + 1);
    ExpertParallelOps::Route* route = ep_ ? &moe_.routes_[r.route] : nullptr;
    if (ep_) {
        ep_->plan(off, route);
        ep_->dispatch(a.moe_send, r.xg, *route, C, act);
    }
    const std::vector<ExpertBlock> blocks = expert_blocks(off, route, table_.experts);
    void* y = ep_ ? a.moe_ye : r.yg;  // the experts' outputs, in the experts' row order
    auto am = [&](int p, size_t b) { return expert_amax_at(r.amax, p, b); };  // --fp8 1 (null without, and decoding)
    if (am(0, 0)) expert_amax(l, 0, blocks, r.xg, nullptr, am(0, 0));
    for (size_t i = 0; i < blocks.size(); i++) {  // expert rows: [gate | up] of its hidden layer
        const ExpertBlock& b = blocks[i];
        if (b.n > 0)
            expert_forward(elem_ptr(r.fch, act, b.row * 2 * Hl), elem_ptr(r.xg, act, b.row * C),
                           elem_ptr(w13, pt, (size_t)b.expert * 2 * Hl * C), (int)b.n, C, 2 * Hl, am(0, i));
    }
    activation(r.h, r.fch, ep_ ? (int)moe_.routes_[r.route].expert_rows : N * K);
    if (am(1, 0)) expert_amax(l, 1, blocks, r.h, nullptr, am(1, 0));
    for (size_t i = 0; i < blocks.size(); i++) {
        const ExpertBlock& b = blocks[i];
        if (b.n > 0)
            expert_forward(elem_ptr(y, act, b.row * C), elem_ptr(r.h, act, b.row * Hl),
                           elem_ptr(w2, pt, (size_t)b.expert * C * Hl), (int)b.n, Hl, C, am(1, i));
    }
    if (ep_) ep_->combine(a.moe_ye, r.yg, *route, C, act);
    be_->moe_combine(out, r.yg, r.topw, r.inv, N, K, C);
}

void GPT::moe_backward(int l, const LayerActs& la, const void* dout, const void* xin, int N, const void* aux_grad,
                       BackwardPart part) {
    Acts& a = *a_;
    const int C = cfg_.channels, E = cfg_.experts, K = cfg_.top_k, Hl = table_.hidden;
    const DType act = prec_.act, pt = prec_.param, gt = prec_.grad;
    // W under full recompute reads the routing B kept for its layer-slot
    // (moe_keep_routing) and the experts' input rows B copied.
    const bool kept = part == BackwardPart::weights && la.g_xg;
    const size_t index = kept ? la.slot_index : la.index;
    const void* xg = kept ? la.g_xg : la.xg;
    const ExpertParallelOps::Route* route = ep_ ? &moe_.routes_[index] : nullptr;
    // The groups from the host's copy of the offsets, or none (on the device).
    const std::vector<ExpertBlock> blocks =
        moe_.on_device_ ? std::vector<ExpertBlock>() : expert_blocks(moe_.offsets_[index], route, table_.experts);
    if (part != BackwardPart::all && moe_.on_device_)
        throw std::logic_error("moe_backward: a split backward reads the experts' row counts on the host");
    const void *w13 = P(Param::moe_fc, l), *w2 = P(Param::moe_proj, l);
    const size_t rows = (size_t)moe_expert_rows(la, N);
    // --fp8 1: each block's amaxes in the layer-slot (null without): the
    // forward's, and B's output gradients' for W.
    auto am = [&](int p, size_t b) { return expert_amax_at(la.amax, p, b); };
    if (part == BackwardPart::weights) {  // W: the experts' and the router's weight gradients, as below
        void *dw13 = G(Param::moe_fc, l), *dw2 = G(Param::moe_proj, l);
        for (size_t i = 0; i < blocks.size(); i++) {
            const ExpertBlock& b = blocks[i];
            if (b.n > 0)
                expert_backward(nullptr, elem_ptr(dw2, gt, (size_t)b.expert * C * Hl),
                                elem_ptr(la.g_fcproj, act, b.row * C), elem_ptr(la.g_h, act, b.row * Hl),
                                elem_ptr(w2, pt, (size_t)b.expert * C * Hl), (int)b.n, Hl, C, am(1, i));
        }
        for (size_t i = 0; i < blocks.size(); i++) {
            const ExpertBlock& b = blocks[i];
            if (b.n > 0)
                expert_backward(nullptr, elem_ptr(dw13, gt, (size_t)b.expert * 2 * Hl * C),
                                elem_ptr(la.g_fc, act, b.row * 2 * Hl), elem_ptr(xg, act, b.row * C),
                                elem_ptr(w13, pt, (size_t)b.expert * 2 * Hl * C), (int)b.n, C, 2 * Hl, am(0, i));
        }
        be_->matmul_backward(nullptr, G(Param::moe_gate, l), nullptr, la.g_router, la.g_ln2, P(Param::moe_gate, l), N,
                             C, E);
        return;
    }
    const bool input_only = part == BackwardPart::input;
    auto keep = [&](void* to, const void* from, size_t n) { be_->copy(to, from, n * dtype_size(act)); };
    if (input_only && la.g_h != la.h) keep(la.g_h, la.h, rows * Hl);  // recomputed: kept for W
    // The combine's backward: each grouped row's gradient, and the weights'.
    be_->moe_dispatch(a.moe_dg, a.moe_dtopw, dout, la.yg, la.topw, la.inv, N, K, C);
    if (tp_) tp_->sum(a.moe_dtopw, (size_t)N * K, prec_.stat);  // the whole expert outputs' dot products
    // The experts' side: the rows' gradients (sent to the experts' ranks under ep).
    void* dg = ep_ ? a.moe_ye : a.moe_dg;
    if (ep_) ep_->dispatch(a.moe_dg, dg, *route, C, act);
    if (input_only) keep(la.g_fcproj, dg, rows * C);  // the experts' output gradients, for W
    void *dw13 = input_only ? nullptr : G(Param::moe_fc, l), *dw2 = input_only ? nullptr : G(Param::moe_proj, l);
    auto at = [&](void* base, size_t off) { return base ? elem_ptr(base, gt, off) : nullptr; };
    if (moe_.on_device_) be_->moe_expert_matmul_backward(a.dh, dw2, dg, la.h, w2, la.offsets, N * K, E, Hl, C);
    if (am(1, 0)) expert_amax(l, 1, blocks, la.h, dg, am(1, 0));
    for (size_t i = 0; i < blocks.size(); i++) {
        const ExpertBlock& b = blocks[i];
        if (b.n > 0)
            expert_backward(elem_ptr(a.dh, act, b.row * Hl), at(dw2, (size_t)b.expert * C * Hl),
                            elem_ptr(dg, act, b.row * C), elem_ptr(la.h, act, b.row * Hl),
                            elem_ptr(w2, pt, (size_t)b.expert * C * Hl), (int)b.n, Hl, C, am(1, i));
    }
    be_->swiglu_backward(a.dfch, la.fch, a.dh, moe_expert_rows(la, N), Hl);
    if (input_only) keep(la.g_fc, a.dfch, rows * 2 * Hl);
    if (moe_.on_device_) be_->moe_expert_matmul_backward(dg, dw13, a.dfch, la.xg, w13, la.offsets, N * K, E, C, 2 * Hl);
    if (am(0, 0)) expert_amax(l, 0, blocks, la.xg, a.dfch, am(0, 0));
    for (size_t i = 0; i < blocks.size(); i++) {  // the experts' input rows' gradients (dg again: its rows are done)
        const ExpertBlock& b = blocks[i];
        if (b.n > 0)
            expert_backward(elem_ptr(dg, act, b.row * C), at(dw13, (size_t)b.expert * 2 * Hl * C),
                            elem_ptr(a.dfch, act, b.row * 2 * Hl), elem_ptr(la.xg, act, b.row * C),
                            elem_ptr(w13, pt, (size_t)b.expert * 2 * Hl * C), (int)b.n, C, 2 * Hl, am(0, i));
    }
    if (ep_) ep_->combine(dg, a.moe_dg, *route, C, act);  // back to the tokens' rank, in the grouped order
    be_->moe_combine(a.dln, a.moe_dg, nullptr, la.inv, N, K, C);  // back to the tokens, summed over their experts
    // The router: through the weights' renormalisation and the softmax, with
    // the load-balancing loss's gradient. Its input gradient is whole on
    // every tp rank: added on one, as the f operator's backward sums dln.
    be_->moe_route_backward(a.moe_dlogits, la.probs, la.topi, a.moe_dtopw, aux_grad, N, E, K);
    if (input_only) keep(la.g_router, a.moe_dlogits, (size_t)N * E);
    if (input_only && xin != la.g_ln2) keep(la.g_ln2, xin, (size_t)N * C);
    be_->matmul_backward(a.moe_dx, input_only ? nullptr : G(Param::moe_gate, l), nullptr, a.moe_dlogits, xin,
                         P(Param::moe_gate, l), N, C, E);
    if (!tp_ || tp_->rank() == 0) be_->residual_forward(a.dln, a.dln, a.moe_dx, (size_t)N * C);
}

// After block l's forward (activations la): its assignments per expert and
// the sums of its routing probabilities, added to the micro-batch's (slot
// s); and, counting, to the layer's loads.
void GPT::moe_stats(int l, const LayerActs& la, int N, size_t s) {
    const int E = cfg_.experts;
    if (moe_.on_device_) {
        be_->moe_route_stats(elem_ptr(moe_.stats_dev_, DType::F64, s * 2 * E),
                             moe_.count_loads_ ? elem_ptr(moe_.loads_dev_, DType::F64, (size_t)l * E) : nullptr,
                             la.probs, la.offsets, N, E);
        return;
    }
    const std::vector<int>& off = moe_.offsets_[la.index];
    if (moe_.count_loads_)
        for (int e = 0; e < E; e++) moe_.load_[(size_t)l * E + e] += off[e + 1] - off[e];
    std::vector<double> p((size_t)N * E);
    be_->download(p.data(), DType::F64, la.probs, prec_.stat, p.size());
    for (int e = 0; e < E; e++) {
        moe_.count_[s][e] += off[e + 1] - off[e];
        double sum = 0;
        for (int n = 0; n < N; n++) sum += p[(size_t)n * E + e];
        moe_.psum_[s][e] += sum;
    }
}

void GPT::set_moe_aux(int c, int slot, const std::vector<double>& stats, int N, double dloss) {
    const size_t s = slot_base_.at(c) + slot, E = cfg_.experts;
    if (stats.size() != 2 * E) throw std::invalid_argument("set_moe_aux: statistics of another expert count");
    for (size_t e = 0; e < E; e++) moe_.count_[s][e] = stats[e], moe_.psum_[s][e] = stats[E + e];
    moe_aux(s, N, dloss, chunks_.at(c).head);
}

// After the micro-batch's last block: the loss (docs/moe.md) and, when the
// forward computes a loss gradient (dloss = 1 / tokens of the global
// batch), the gradient of aux_coef times this micro-batch's share of the
// step's mean with respect to every routing probability.
void GPT::moe_aux(size_t s, int N, double dloss, bool count) {
    const int E = cfg_.experts;
    std::vector<double>& cnt = moe_.count_[s];
    std::vector<double>& psum = moe_.psum_[s];
    const double tokens = (double)N * (cp_ ? cp_->size() : 1);  // the micro-batch's, over the cp group
    if (moe_.on_device_) {  // the same arithmetic on the device (moe_figures.h)
        void* st = elem_ptr(moe_.stats_dev_, DType::F64, s * 2 * E);
        if (cp_) cp_->sum(st, 2 * (size_t)E, DType::F64);
        be_->moe_aux_loss(elem_ptr(a_->moe_aux_grad, prec_.stat, s * E), count ? aux_figure_ : nullptr, st, E,
                          (double)cfg_.num_layers * tokens, cfg_.aux_coef * dloss * tokens * E);
        return;
    }
    if (cp_)
        for (int e = 0; e < E; e++) {
            cnt[e] = cp_->host_sum(cnt[e]);
            psum[e] = cp_->host_sum(psum[e]);
        }
    const double LN = (double)cfg_.num_layers * tokens;
    std::vector<double> grad(E);
    double aux = 0;
    for (int e = 0; e < E; e++) {
        aux += (cnt[e] / LN) * (psum[e] / LN);
        grad[e] = cfg_.aux_coef * dloss * tokens * E * (cnt[e] / LN) / LN;
        cnt[e] = psum[e] = 0;
    }
    aux *= E;
    be_->upload(elem_ptr(a_->moe_aux_grad, prec_.stat, s * E), prec_.stat, grad.data(), DType::F64, E);
    moe_.aux_last_ = aux;
    if (count) moe_.aux_sum_ += aux;
}

void GPT::set_moe_bias(const std::vector<double>& bias) {
    const size_t n = (size_t)cfg_.num_layers * cfg_.experts;
    if (!cfg_.moe() || bias.size() != n) throw std::invalid_argument("set_moe_bias: not [L, E] of a Mixtral model");
    be_->upload(a_->moe_bias, prec_.stat, bias.data(), DType::F64, n);
    if (moe_.on_device_) be_->upload(moe_.bias_dev_, DType::F64, bias.data(), DType::F64, n);
    moe_.bias_on_ = true;
}

std::vector<double> GPT::moe_bias() const {
    const size_t n = (size_t)cfg_.num_layers * cfg_.experts;
    std::vector<double> b(cfg_.moe() ? n : 0);
    if (!b.empty()) {
        if (moe_.on_device_) be_->download(b.data(), DType::F64, moe_.bias_dev_, DType::F64, n);
        else be_->download(b.data(), DType::F64, a_->moe_bias, prec_.stat, n);
    }
    return b;
}

void GPT::keep_moe_on_device() {
    if (!cfg_.moe() || moe_.on_device_) return;
    if (ep_ || chunks_.size() != 1 || !chunks_[0].embed || !chunks_[0].head)
        throw std::logic_error("keep_moe_on_device: not with expert parallelism or pipeline chunks");
    if (moe_.bias_on_) throw std::logic_error("keep_moe_on_device: before set_moe_bias");
    if (fp8_on(Param::fcw) || fp8_on(Param::fcprojw))
        throw std::logic_error("keep_moe_on_device: not with the experts on FP8 operands (their blocks are sized on "
                               "the host)");
    const size_t E = cfg_.experts, L = cfg_.num_layers;
    moe_.stats_dev_ = alloc_buffer("scratch", "moe_stats", moe_.count_.size() * 2 * E, DType::F64);
    moe_.loads_dev_ = alloc_buffer("scratch", "moe_loads", L * E, DType::F64);
    moe_.bias_dev_ = alloc_buffer("scratch", "moe_bias_f64", L * E, DType::F64);
    moe_.on_device_ = true;
}

void GPT::moe_balance(void* figures, double divisor, double rate) {
    if (!moe_.on_device_) throw std::logic_error("moe_balance: the MoE state is on the host");
    be_->moe_balance(figures, moe_.bias_on_ ? a_->moe_bias : nullptr, moe_.bias_on_ ? moe_.bias_dev_ : nullptr,
                     moe_.loads_dev_, cfg_.num_layers, cfg_.experts, divisor, rate);
}
