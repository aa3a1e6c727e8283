// llmc/plan/cost_model.cpp: the planner's time model (llmc/plan/cost_model.h).
#include "llmc/plan/cost_model.h"

#include <algorithm>
#include <cmath>

CostModel::CostModel(const GPTConfig& c, const Layout& l, const Hardware& hw, const Precision& prec, int gpus_per_node,
                     bool standard_attention)
    : c_(c), l_(l), hw_(hw), G_(std::max(1, gpus_per_node)), standard_(standard_attention) {
    a_ = (double)dtype_size(prec.act);
    st_ = (double)dtype_size(prec.stat);
    pb_ = (double)dtype_size(prec.param);
    gb_ = (double)dtype_size(prec.grad);
    master_ = prec.has_master;
    ov_ = std::min(1.0, std::max(0.0, hw.comm_overlap));
    rate8_ = !l.fp8 ? 0 : hw.fp8_matmul_flops > 0 ? hw.fp8_matmul_flops : hw.matmul_flops;
}

CostModel::Fp8Passes CostModel::fp8_passes(bool cpu, double a, double pb, double N, double IC, double OC,
                                           bool backward, bool fused, int part, bool cast, bool kept, double wshare) {
    Fp8Passes p;
    const double x = N * IC, dy = N * OC, w = OC * IC * wshare;  // (w: the weight's bytes this micro-batch)
    // The forward measures the input and the weight, the backward only the
    // output gradient (the other two are the forward's, llmc/model/fp8.cpp).
    p.amax_bytes = backward ? a * dy : a * x + pb * w;
    // The GPU's amax is two kernels (the max as float bits, then stored as
    // a double); the scales one more kernel before the quantisers.
    p.amax_ops = (backward ? 1 : 1 + wshare) * (cpu ? 1 : 2);
    // fused: the activation before the product measured that operand as it
    // wrote it (the GPU's activation_amax): no read, only the store (the
    // CPU's reads it after the op, a pass as before).
    if (fused && !cpu) p.amax_bytes -= backward ? a * dy : a * x, p.amax_ops -= 1;
    // cast: the op that wrote the operand wrote its copies' bytes too, and
    // the quantiser for it reads nothing (its launch returns at once); W's
    // dy^T is always its own.
    const double in = cast && !cpu ? 0 : a;
    // kept: the forward writes x^T beside x, and the weight gradient reads it (x^T's pass is gone).
    const double xt = kept && !cpu ? 0 : (a + 1) * x;
    if (cpu) {  // each operand rounded to a copy once, inside the product's op (the weight's every time)
        p.quant_bytes = 2 * (a * x + pb * OC * IC + (backward ? a * dy : 0));
    } else if (!backward) {  // x and W as they are
        p.quant_bytes = (in + 1) * x + (pb + 1) * w + (kept && !cpu ? x : 0);
        p.quant_ops = 1 + 1 + wshare;
    } else if (part == 0) {  // dy for dX and dy^T for dW in one pass, W^T for dX, x^T for dW
        p.quant_bytes = (in + 2) * dy + (pb + 1) * w + xt;
        p.quant_ops = 1 + 2 + wshare + (kept ? 1 : 0);  // (kept: and the first step's copy of x^T, a launch)
    } else {  // B: the scales, dy and W^T; W: the scales again, dy^T and x^T (dy read twice)
        p.quant_bytes = part == 1 ? (in + 1) * dy + (pb + 1) * w : (a + 1) * dy + xt;
        p.quant_ops = part == 1 ? 1 + 1 + wshare : 1 + 2 + (kept ? 1 : 0);
    }
    if (part == 2) p.amax_bytes = 0, p.amax_ops = 0;  // W reads B's amaxes from the slot
    return p;
}

// Tiles of tm x tn over the M x N output (either orientation, whichever is
// faster, as a library picks its kernel), in waves of one tile per
// multiprocessor; each wave takes a tile's time at the large-GEMM rate.
// When the tiles cannot fill the multiprocessors (a weight gradient: a small
// output, a long K), K is split over the idle ones, as cuBLAS does, at the
// cost of writing and reading back the fp32 partial sums; a split keeps at
// least 256 of K (an assumption: the split heuristics are not published).
double CostModel::gemm(double M, double N, double K, double batch, double rate) const {
    const double flops = 2.0 * M * N * K * batch;
    if (flops <= 0) return 0;
    if (rate <= 0) rate = hw_.matmul_flops;
    if (hw_.sm_count <= 0 || hw_.gemm_tile_m <= 0 || hw_.gemm_tile_n <= 0) return flops / rate + hw_.launch_s;
    const double S = hw_.sm_count, rate_sm = rate / S;
    auto time = [&](double tm, double tn) {
        const double tiles = batch * std::ceil(M / tm) * std::ceil(N / tn);
        const double split = tiles >= S ? 1 : std::max(1.0, std::min(std::floor(S / tiles), std::floor(K / 256)));
        const double waves = std::ceil(tiles * split / S);
        const double partials = split > 1 ? 2.0 * split * batch * M * N * 4 / hw_.mem_bw : 0;
        return waves * 2.0 * tm * tn * std::ceil(K / split) / rate_sm + partials;
    };
    return std::min(time(hw_.gemm_tile_m, hw_.gemm_tile_n), time(hw_.gemm_tile_n, hw_.gemm_tile_m)) + hw_.launch_s;
}

// The block's four linear products: (in, out) of QKV, the attention's
// projection, fc (Llama: gate and up) and its projection, on this rank.
namespace {
struct Linear {
    double in, out;
};
}  // namespace

// One block's four products forward (backward: dX and dW of each); with
// --fp8 1 at the FP8 rate, their operands' amax and quantisation beside
// them (fp8_passes), and an expert block's delayed scaling op after each amax. Mixtral
// (docs/moe.md): the MLP's two become the router's (C -> E, replicated
// over tp) and, for each of the E experts, the two over its rows, N·K/E of
// them under an even routing: E products of a launch each (with --fp8 1
// each block's operands their own passes, the router in the compute type). Under expert
// parallelism the same: each of the E/ep local experts takes a block of
// N·K/E rows from each of the ep ranks, E blocks in all.
double CostModel::block_gemms(bool backward, int layer, bool weights_only) const {
    const double C = c_.channels, tp = l_.tp, N = (double)l_.B * l_.T_local(), H = c_.hidden() / tp;
    const double Ckv = (double)c_.kv_heads() * c_.head_size() / tp, Wfc = c_.llama() ? 2 * H : H;
    const Linear ls[] = {{C, C / tp + 2 * Ckv}, {C / tp, C}, {C, Wfc}, {H, C}};
    auto product = [&](double rows, const Linear& x, double rate = 0) {
        if (weights_only) return gemm(x.in, x.out, rows, 1, rate);
        return backward ? gemm(rows, x.in, x.out, 1, rate) + gemm(x.in, x.out, rows, 1, rate)
                        : gemm(rows, x.out, x.in, 1, rate);
    };
    // fused: the op that writes the operand measures it as it writes it (a
    // GPU's): forward the norms QKV's and fc's inputs and the activation
    // fcproj's; backward the activation fc's output gradient and the norms'
    // backward attention's projection's and fcproj's (a pipeline stage's
    // last fcproj receives its gradient and measures it: not counted). Not
    // the norms' under sp, whose rows the product gathers.
    auto measured = [&](int i) {
        if (backward) return i == 2 || (!l_.sp && (i == 1 || i == 3));
        return i == 3 || (!l_.sp && (i == 0 || i == 2));
    };
    // A zero-bubble schedule splits each backward into B and W (each its
    // own passes); weights_only: W's alone.
    const bool split = backward && this->split();
    // Under delayed scaling the activation casts what it writes (fp8.cpp's
    // fp8_cast): fcproj's input forward, fc's output gradient backward; and
    // where ln1 and ln2 are kept (kept_ln) the norms QKV's and fc's inputs
    // forward (GPT::norm_cast), keeping their transposed copies, which the
    // weight gradients then read instead of x^T's pass.
    auto norm_cast = [&](int i) { return !backward && kept_ln(i); };
    auto cast = [&](int i) { return l_.fp8_history > 0 && (i == (backward ? 2 : 3) || norm_cast(i)); };
    auto kept = [&](int i) { return (i == 3 && kept_h()) || kept_ln(i); };
    // Delayed scaling's bookkeeping is in a dense product's scales launch
    // (Fp8Delayed); an expert block's is an op per operand measured.
    // A dense layer's weight is measured and quantised once per step (its
    // copies kept: GPT::fp8_weight), not under ZeRO-3; an expert's per block.
    const double wshare = l_.zero >= 3 || !l_.fp8_weight_copies ? 1.0 : 1.0 / std::max(1, l_.micro_batches());
    auto fp8 = [&](const Linear& x, double rows, bool fused = false, bool cast_in = false, bool kept = false,
                   bool expert = false) {
        auto part = [&](int k) {
            const Fp8Passes p = fp8_passes(hw_.device == "cpu", a_, pb_, rows, x.in, x.out, backward, fused, k,
                                           cast_in, kept, expert ? 1.0 : wshare);
            const int delayed = expert && l_.fp8_history > 0 && k != 2 ? (backward ? 1 : 2) : 0;
            return (p.amax_bytes + p.quant_bytes) / hw_.mem_bw + (p.amax_ops + p.quant_ops + delayed) * hw_.launch_s;
        };
        if (!split) return part(0);
        return weights_only ? part(2) : part(1) + part(2);
    };
    double t = 0;
    for (int i = 0; i < (c_.moe() ? 2 : 4); i++)
        if (layer < 0 || layer == i)
            t += fp8_on(i) ? product(N, ls[i], rate8_) + fp8(ls[i], N, measured(i), cast(i), kept(i))
                           : product(N, ls[i]);
    if (c_.moe()) {  // the experts' blocks, each on FP8 operands of its own under --fp8 1
        const double E = c_.experts, rows = N * c_.top_k / E;
        if (layer < 0) t += product(N, {C, E});
        for (int i = 2; i < 4; i++)
            if (layer < 0 || layer == i)
                t += E * (fp8_on(i) ? product(rows, ls[i], rate8_) + fp8(ls[i], rows, false, false, false, true)
                                    : product(rows, ls[i]));
    }
    return t;
}

// (The norm's kernel then writes the residual and the statistics, and the
// cast reads the row again and writes the output's FP8 copies: one more
// launch, the output's store traded for that read.)
bool CostModel::kept_ln(int i) const {
    return (i == 0 || (i == 2 && !c_.moe())) && fp8_on(i) && l_.fp8_history > 0 && hw_.device != "cpu" && !l_.sp &&
           l_.recompute != Recompute::full;
}

bool CostModel::kept_h() const {
    return fp8_on(3) && l_.fp8_history > 0 && hw_.device != "cpu" && !c_.moe() &&
           (l_.recompute == Recompute::none || !split());
}

Cost CostModel::predict(const std::vector<size_t>& stage_params, size_t unit0,
                        const std::vector<size_t>& stage_experts) const {
    const Layout& l = l_;
    const double C = c_.channels, T = l.T, Tl = l.T_local(), B = l.B, tp = l.tp, cp = l.cp;
    const double N = B * Tl, Ns = l.sp ? N / tp : N, H = c_.hidden() / tp;
    const double Ckv = (double)c_.kv_heads() * c_.head_size() / tp, Wfc = c_.llama() ? 2 * H : H;
    const double Vl = std::ceil((double)c_.padded_vocab_size / tp);
    const Recompute rc = l.recompute;
    const bool full = rc == Recompute::full, attn_again = rc == Recompute::selective || full;
    const Link ltp = link(l.tp), lcp = link(l.tp * l.cp), ldp = link(l.tp * l.cp * l.dp()), lpp = link(l.world);
    const double launch = hw_.launch_s;

    // One block, one micro-batch, this rank. Attention: flash-style, QK^T
    // and PV over the causal half at the attention rate, backward 2.5 times
    // the forward (it recomputes the scores); or standard, the full square
    // as batched products (QK^T, PV forward; dP, dV, dQ, dK backward) by the
    // wave model, and the scores (B·NH/tp·T_local·T elements, 16-bit)
    // through memory, beside the products' tiles, not hidden under them.
    // Forward: QK^T writes them (2 bytes), the fused scale-mask-softmax
    // reads and writes them (4), dropout reads them and writes them and its
    // 1-byte mask (5), PV reads them (2): 13. Backward: PV's gradient reads
    // the kept probabilities and writes their gradient (4), dropout's
    // backward reads it and the mask and writes (5), softmax's backward
    // reads the probabilities and the gradient and writes (6), QK^T's
    // gradient reads it (2): 17.
    const double hs = c_.head_size(), heads = B * c_.num_heads / tp;
    double attn_f, attn_b, scores_f = 0, scores_b = 0;
    if (standard_) {
        attn_f = gemm(Tl, T, hs, heads) + gemm(Tl, hs, T, heads);
        attn_b = gemm(Tl, T, hs, heads) + gemm(T, hs, Tl, heads) + gemm(Tl, hs, T, heads) + gemm(T, hs, Tl, heads);
        const double S = heads * Tl * T;
        scores_f = 13 * S / hw_.mem_bw;
        scores_b = 17 * S / hw_.mem_bw;
    } else {
        const double flops = 2.0 * B * Tl * T * C / tp;
        attn_f = flops / hw_.attn_flops + launch;
        attn_b = 2.5 * flops / hw_.attn_flops + launch;
    }
    // Memory-bound kernels: this trainer's LayerNorms, residual adds and
    // activation; with standard, Megatron-LM's too: the attention output's
    // transpose to [s, b, h] (read and written, both ways) and the 1-byte
    // dropout masks of the two residual branches (bias-dropout-add: written
    // forward; read backward, with the gradient read and written again).
    // Mixtral: the activation over the N·K routed rows, and the rows moved
    // to the grouped order and back (dispatch and combine, and their
    // backward), with the routing kernels.
    const double Nm = c_.moe() ? N * c_.top_k : N;
    const double moe_mv = c_.moe() ? 2 * a_ * (Nm * C + N * C) : 0;
    double mem_f = a_ * (9 * Ns * C + Nm * (Wfc + H)) + moe_mv;
    double mem_b = a_ * (8 * Ns * C + Nm * (Wfc + 2 * H)) + moe_mv;
    // Delayed scaling on a GPU: the activation's backward of a whole backward
    // writes fc's output gradient only as FP8 bytes (fp8_passes) when fc
    // has no bias (Llama's, Qwen2's) to take its gradient from it.
    if (fp8_on(2) && l.fp8_history > 0 && hw_.device != "cpu" && c_.llama() && !c_.moe() && !split()) mem_b -= a_ * N * Wfc;
    // ... and its forward writes fcproj's input only as FP8 bytes where it
    // keeps the transposed copy (kept_h); a recompute then writes that copy.
    if (kept_h()) mem_f -= a_ * N * H;
    int kern_f = 5, kern_b = 6;  // LN, residual, LN, activation, residual; their backward and the bias gradients
    if (c_.moe()) kern_f += 4, kern_b += 3;  // routing (and its grouping), dispatch, combine; their backward
    kern_f += kept_ln(0) + kept_ln(2);  // the norms' casts (QKV's input; fc's but a Mixtral's)
    if (standard_) {
        // and QKV's bias, added by its own kernel after the product (a 3-D
        // F.linear in the PyTorch of 2021).
        mem_f += 2 * a_ * N * C / tp + 2 * Ns * C + 2 * a_ * N * (C / tp + 2 * Ckv);
        mem_b += 2 * a_ * N * C / tp + 2 * Ns * C * (1 + 2 * a_);
        kern_f += 4, kern_b += 3;  // softmax, dropout, transpose, bias; their backward
    }
    const double mem_rec = full ? mem_f : rc == Recompute::none ? 0 : Nm * (Wfc * a_ + H * (kept_h() ? 1 : a_));
    const int kern_rec = full ? kern_f : rc == Recompute::none ? 0 : 1;
    const double gm_f = block_gemms(false), gm_b = block_gemms(true);
    const double blk_compute = gm_f + gm_b + (full ? gm_f : 0) + attn_f + attn_b + (attn_again ? attn_f : 0) +
                               (mem_f + mem_b + mem_rec) / hw_.mem_bw + scores_f * (attn_again ? 2 : 1) + scores_b +
                               (kern_f + kern_b + kern_rec) * launch;
    // tp: f and g as the runtime issues them, blocking: the compute stream
    // waits for each (an overlapped tp would hide them behind the products
    // they feed and leave only what does not fit under them).
    const double nb = N * C * a_;
    double blk_tp = 0;
    if (l.tp > 1) {
        if (!l.sp) blk_tp = (4 + (full ? 2 : 0)) * all_reduce(nb, l.tp, ltp);
        else blk_tp = ((6 + (full ? 2 : 0)) + (4 + (full ? 2 : 0))) * gather_scatter(nb, l.tp, ltp);
    }
    // --fp8 1: an amax of a tensor split over the group is a max over it,
    // one number, blocking (llmc/model/fp8.cpp). Of the FP8 layers (four,
    // a Mixtral's two), under tp the forward's every weight and the
    // row-parallel layers' input, the backward's the column-parallel ones'
    // output gradient; under cp every input forward, every output gradient
    // backward (the backward reads the forward's input and weight amaxes).
    // A Mixtral's experts: each of their two products' block amaxes in one
    // max of 3E numbers, forward and backward (fp8.cpp's expert_amax).
    // Only --fp8-layers' layers.
    double f8 = 0, f8row = 0, f8col = 0, f8e = 0;
    const double passes = full ? 2 : 1;
    for (int i = 0; i < 4; i++) {
        if (!fp8_on(i)) continue;
        if (c_.moe() && i >= 2) {
            f8e += passes + 1;
            continue;
        }
        f8 += 1;
        (i % 2 ? f8row : f8col) += 1;
    }
    const double f8e_bytes = 24.0 * c_.experts;
    if (l.tp > 1)
        blk_tp += (passes * (f8 + f8row) + f8col) * all_reduce(8, l.tp, ltp) + f8e * all_reduce(f8e_bytes, l.tp, ltp);
    // cp, hybrid (--cp-impl hybrid): the all-to-all over a group of n =
    // cp_a2a consecutive ranks and the ring over the cp/n groups; a2a alone
    // is n = cp (no ring), the ring alone n = 1 (no all-to-all).
    double blk_cp = 0;
    if (l.cp > 1) blk_cp = (passes * f8 + f8) * all_reduce(8, l.cp, lcp) + f8e * all_reduce(f8e_bytes, l.cp, lcp);
    const double n = l.cp > 1 ? l.cp_a2a : 1, ring = cp / n;
    if (n > 1) {
        // all-to-all: blocking exchanges of X channels per token, each
        // sending (n-1)/n of N·X elements in n-1 messages, its blocks packed
        // and placed by copies (read and written on both sides; n per column
        // segment and 2·n chunk runs, each a launch). Forward QKV (3
        // segments) and the output; backward QKV, output and its gradient,
        // then dQKV back. The group spans tp·n ranks.
        const double W = C / tp + 2 * Ckv, Cl = C / tp;
        const Link la = link(l.tp * (int)n);
        auto exchange = [&](double X, int segs) {
            const double bytes = N * X * a_;
            return p2p((n - 1) / n * bytes, la) + (n - 2) * hw_.p2p_lat + 4 * bytes / hw_.mem_bw +
                   (n * segs + 2 * n) * launch;
        };
        const double f = exchange(W, 3) + exchange(Cl, 1), b = 2 * exchange(W, 3) + 2 * exchange(Cl, 1);
        blk_cp += f + b + (attn_again ? f : 0);
    }
    if (ring > 1) {
        // the ring: K,V blocks forward, K,V and dK,dV backward, each step's
        // transfer beside that step's attention. In the hybrid's head layout
        // a block is n times the tokens for 1/n of the heads: the same bytes.
        // Its ranks are n·tp apart: the ring spans the cp group.
        const double kv = B * Tl * 2 * Ckv * a_, dkv = B * Tl * 2 * Ckv * st_;
        const double f = (ring - 1) * p2p(kv, lcp), b = (ring - 1) * p2p(kv, lcp) + ring * p2p(dkv, lcp);
        blk_cp += expose(f, attn_f) + expose(b, attn_b) + (attn_again ? expose(f, attn_f) : 0);
    }
    // ep (Mixtral, --ep): the grouped rows (N·K of C, whole on every tp
    // rank) to the experts' ranks and back, forward and backward, (ep-1)/ep
    // of them leaving in ep-1 messages (an even routing), blocking; the
    // counts' all-gather before each forward's. The group's ranks are
    // tp·cp apart (dp ranks).
    double blk_ep = 0;
    if (l.ep > 1 && c_.moe()) {
        const double e = l.ep, rows = N * c_.top_k * C * a_;
        const Link le = link(l.tp * l.cp * l.ep);
        const double x = p2p((e - 1) / e * rows, le) + (e - 2) * hw_.p2p_lat + 2 * launch;
        const double counts = gather_scatter(e * c_.experts * 4, l.ep, le);
        blk_ep = (full ? 2 : 1) * (2 * x + counts) + 2 * x;
    }
    // Embeddings (first stage) and the head (last stage), per micro-batch.
    // Megatron-LM's loss (standard) runs in fp32 on a copy of the logits:
    // the cast (2 bytes read, 4 written), max, subtract, exp, sum and
    // divide forward (34), the gradient in place and its cast back (14): 52
    // bytes a logit, against this trainer's 3 passes of 16 bits.
    const double logit_bytes = standard_ ? 52 : 3 * a_;
    const double emb = 3 * Ns * C * a_ / hw_.mem_bw + 4 * launch +
                       (l.tp > 1 ? (l.sp ? 2 * gather_scatter(nb, l.tp, ltp) : all_reduce(nb, l.tp, ltp)) : 0);
    const double head = gemm(N, Vl, C) + gemm(N, C, Vl) + gemm(C, Vl, N) +
                        (logit_bytes * N * Vl + a_ * 8 * Ns * C) / hw_.mem_bw + 5 * launch +
                        (l.tp > 1 ? 3 * all_reduce(N * st_, l.tp, ltp) +
                                        (l.sp ? 3 * gather_scatter(nb, l.tp, ltp) : all_reduce(nb, l.tp, ltp))
                                  : 0);
    // Megatron-LM (standard) adds each micro-batch's weight gradients to
    // its 16-bit main-gradient buffer by a kernel per tensor after the
    // backward (param.main_grad.add_(param.grad) in its DDP of 2021; this
    // trainer accumulates inside the weight-gradient product): the stage's
    // gradients read, the buffer read and written, per micro-batch.
    // A block's parameter tensors: GPT-2's 12; Llama's 9 (q, k, v, o, gate,
    // up, down, two norms), Qwen2's 12 with the q, k, v biases.
    const int blocks = c_.num_layers / l.pp, tensors = !c_.llama() || c_.qkv_bias() ? 12 : 9;
    auto accumulate = [&](size_t P) { return standard_ ? 3 * gb_ * P / hw_.mem_bw + blocks * tensors * launch : 0; };
    // The slowest stage sets the pace.
    double t_max = 0, c_max = 0, tp_max = 0, cp_max = 0, ep_max = 0;
    for (int s = 0; s < l.pp; s++) {
        double comp = blocks * blk_compute + accumulate(stage_params[s]), tpc = blocks * blk_tp, cpc = blocks * blk_cp;
        const double epc = blocks * blk_ep;
        if (s == 0) comp += emb;
        if (s == pipe_stage_of(l.pp_order, l.pp, l.pp * l.vpp - 1)) comp += head;  // (ZBV: stage 0)
        if (comp + tpc + cpc + epc > t_max)
            t_max = comp + tpc + cpc + epc, c_max = comp, tp_max = tpc, cp_max = cpc, ep_max = epc;
    }
    const double m = l.micro_batches(), V = l.vpp;
    Cost k;
    // The compute by op class, for a stage holding the whole model (pp = 1;
    // with pp, the block classes of one stage and the ends of the first and
    // the last).
    {
        Cost::Classes& cl = k.classes;
        double* layer[] = {&cl.qkv, &cl.attproj, &cl.fc, &cl.fcproj};
        for (int i = 0; i < 4; i++)
            *layer[i] = m * blocks * (block_gemms(false, i) * (full ? 2 : 1) + block_gemms(true, i));
        cl.attention_fwd = m * blocks * (attn_f + scores_f) * (attn_again ? 2 : 1);
        cl.attention_bwd = m * blocks * (attn_b + scores_b);
        cl.memory_bound = m * blocks * ((mem_f + mem_b + mem_rec) / hw_.mem_bw + (kern_f + kern_b + kern_rec) * launch);
        cl.embed = m * emb;
        cl.head = m * head;
    }
    k.compute = m * c_max;
    k.tp = m * tp_max;
    k.cp = m * cp_max;
    k.ep = m * ep_max;
    // The bubble: (pp-1)/V of a micro-batch's stage time; ZB-H1 (pp-1) times
    // F + B - W, the stage time less twice its W (the blocks' weight-gradient
    // products), which fill the cool-down; ZBV the same of a chunk, half a
    // stage (llmc/parallel/pipeline_schedule.h).
    k.bubble = l.pp > 1 ? (l.pp - 1) / V * t_max : 0;
    const double f_b_w = std::max(0.0, t_max - 2 * blocks * block_gemms(true, -1, true));
    if (l.pp > 1 && l.pp_order == PipeOrder::zb_h1) k.bubble = (l.pp - 1) * f_b_w;
    if (l.pp > 1 && l.pp_order == PipeOrder::zbv) k.bubble = (l.pp - 1) * f_b_w / 2;
    if (l.pp > 1) {
        const double hop = p2p(Ns * C * a_, lpp);
        // Fill and drain (ZBV's turn of the V is no transfer); and every
        // transfer without overlap.
        const int hops = l.pp * (int)V - 1 - (l.pp_order == PipeOrder::zbv ? 1 : 0);
        k.pp = 2 * hops * hop + (1 - ov_) * 2 * m * V * hop;
    }
    // dp: the gradients of the stage over dp x cp, overlapped with the
    // backward as the runtime does it; under expert parallelism the experts'
    // over the expert-data group (dp/ep x cp ranks, every ep-th dp rank).
    size_t P = 0, Pe = 0;
    for (int s = 0; s < l.pp; s++)
        if (stage_params[s] >= P) P = stage_params[s], Pe = s < (int)stage_experts.size() ? stage_experts[s] : 0;
    const int D = l.dp() * l.cp, De = D / std::max(1, l.ep);
    const double t_bwd = 2.0 / 3.0 * t_max, t_fwd = t_max / 3.0;
    const int units = blocks + 2;
    auto reduce = [&](double Pn, int g, Link k) {
        if (g <= 1 || Pn <= 0) return 0.0;
        const double red_ar = all_reduce(Pn * gb_, g, k), red_rs = gather_scatter(Pn * gb_, g, k);
        const double gather = gather_scatter(Pn * pb_, g, k);
        switch (l.zero) {
            case 0: return std::max(red_ar / units, expose(red_ar, t_bwd));
            case 1: return std::max(red_rs / units, expose(red_rs, t_bwd)) + gather;
            case 2: return m * std::max(red_rs / units, expose(red_rs, t_bwd)) + gather;
            default: return m * (expose(gather, t_fwd) + std::max(red_rs / units, expose(gather + red_rs, t_bwd)));
        }
    };
    double dpt = reduce((double)(P - Pe), D, ldp) + reduce((double)Pe, De, ldp);
    if (l.pp > 1 && c_.tied) dpt += all_reduce(unit0 * gb_, 2, lpp);  // the tied embeddings
    k.dp = dpt;
    // AdamW over the rank's part: read params, grads, master, m, v; write params, master, m, v
    // (m and v: 4 bytes each, or 2 with --optimizer-dtype bf16).
    const double owned = l.zero >= 1 ? (double)(P - Pe) / D + (double)Pe / De : (double)P;
    const double moments = l.bf16_optimizer ? 8 : 16;
    k.optimizer = owned * (2 * pb_ + gb_ + moments + (master_ ? 8 : 0)) / hw_.mem_bw + 4 * launch;
    k.classes.optimizer = k.optimizer;
    k.step = m * t_max + k.bubble + k.pp + k.dp + k.optimizer;
    return k;
}

// A group spanning `span` consecutive ranks sits in a node when it fits.
CostModel::Link CostModel::link(int span) const {
    return span <= G_ ? Link{hw_.intra_bw, hw_.intra_lat} : Link{hw_.inter_bw, hw_.inter_lat};
}
// Ring collectives (docs/design.md section 10); n bytes of the full buffer.
double CostModel::all_reduce(double n, int g, Link k) {
    return g > 1 ? 2.0 * (g - 1) * k.lat + 2.0 * n * (g - 1) / (g * k.bw) : 0;
}
double CostModel::gather_scatter(double n, int g, Link k) {
    return g > 1 ? (g - 1) * k.lat + n * (g - 1) / (g * k.bw) : 0;
}
double CostModel::p2p(double n, Link k) const { return hw_.p2p_lat + n / (hw_.p2p_bw > 0 ? hw_.p2p_bw : k.bw); }
// What of a transfer the compute beside it does not hide.
double CostModel::expose(double comm, double compute) const {
    return (1 - ov_) * comm + ov_ * std::max(0.0, comm - compute);
}
