// llmc/plan/planner.cpp: the layout planner (llmc/plan/planner.h): memory by building
// each rank on a counting backend, time by the cost model below, the search
// over layouts, and the report.
#include "llmc/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_measure.h"
#include "llmc/run/report.h"

using json = nlohmann::json;

namespace {

// ---- memory: every rank built on a counting backend -------------------------------------------

// A group of the planned world, for its shape only: the stack's constructors
// ask for sizes and ranks and never communicate.
class ShapeComm : public Comm {
  public:
    ShapeComm(const std::string& name, int size, int rank) {
        name_ = name;
        size_ = size;
        rank_ = rank;
    }
    double host_all_reduce(double x, ReduceOp) override { return x; }

  protected:
    [[noreturn]] static void none() { throw std::logic_error("planner: a planned group does not communicate"); }
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { none(); }
    CommHandle do_reduce_scatter(const void*, void*, size_t, DType) override { none(); }
    CommHandle do_all_gather(const void*, void*, size_t, DType) override { none(); }
    void do_broadcast(void*, size_t, DType, int) override { none(); }
    CommHandle do_send_recv(const void*, int, void*, int, size_t, DType) override { none(); }
    void do_p2p(const std::vector<P2POp>&, DType, std::vector<CommHandle>*) override { none(); }
    void do_wait(CommHandle) override {}
};

// What one rank holds, as the memory line says it.
struct RankMemory {
    int rank = 0, stage = 0;
    size_t total = 0;          // bytes the backend would hold
    size_t model_states = 0;   // params + grads + master + optimizer
    size_t params_elems = 0;   // parameters of this rank (its tensors, unpadded)
    size_t unit0_elems = 0;    // its embedding unit (padded), 0 when it holds none
    size_t layer_acts = 0, stage_acts = 0;
    std::string line;          // the memory line
};

// The backend the plan is for: the real CPU backend's precision and
// rounding when planning for the CPU, CUDA's precision otherwise (no GPU
// needed: nothing is allocated).
struct Proto {
    std::unique_ptr<Backend> cpu;
    std::string name;
    Precision prec;
};

bool make_proto(const std::string& device, const std::string& dtype, Proto* p, std::string* err) {
    if (device == "cpu") {
        const DType t = dtype == "fp64" ? DType::F64 : DType::F32;
        p->cpu.reset(dtype == "bf16" ? make_cpu_bf16_backend() : make_cpu_backend(t));
        (void)err;  // every --dtype the trainer takes runs on the cpu
        p->name = "cpu";
        p->prec = p->cpu->precision();
        return true;
    }
    p->name = "cuda";
    if (dtype == "fp32") p->prec = {DType::F32, DType::F32, DType::F32, false, DType::F32, DType::F32, DType::F32};
    else p->prec = {DType::BF16, DType::BF16, DType::F32, true, DType::F32, DType::BF16, DType::F32};
    return true;
}

// Rank r's coordinates: tp fastest, then cp, dp, and pp outermost
// (llmc/parallel/process_grid.h).
struct Place {
    int tp, cp, dp, pp;
};
Place place_of(const Layout& l, int r) {
    const int dp = l.dp();
    return {r % l.tp, (r / l.tp) % l.cp, (r / (l.tp * l.cp)) % dp, r / (l.tp * l.cp * dp)};
}

RankMemory measure_rank(const GPTConfig& mc, const Layout& l, int r, const Proto& proto) {
    const Place p = place_of(l, r);
    const int dp = l.dp();
    ShapeComm tp("tp", l.tp, p.tp), cp("cp", l.cp, p.cp), dpcp("dpcp", dp * l.cp, p.dp * l.cp + p.cp),
        pp("pp", l.pp, p.pp);
    const bool end = p.pp == 0 || p.pp == l.pp - 1;
    ShapeComm embed("embed", l.pp > 1 && end ? 2 : 1, l.pp > 1 && p.pp == l.pp - 1 ? 1 : 0);
    std::unique_ptr<MeasureBackend> mb(proto.cpu ? new MeasureBackend(*proto.cpu)
                                                 : new MeasureBackend(proto.name.c_str(), proto.prec));
    RankMemory m;
    m.rank = r;
    m.stage = p.pp;
    {
        ModelStack s;
        build_stack(*mb, mc, l, {&tp, &cp, &dpcp, &pp, &embed, p.cp}, &s);
        m.line = memory_line("plan", r, *s.model, s.comm_bytes(), p.pp, l.pp);
        for (const BufferInfo& b : s.model->buffers()) {
            if (b.group == "params" || b.group == "grads" || b.group == "master" || b.group == "optimizer")
                m.model_states += b.bytes;
            if (b.per_layer) m.stage_acts += b.bytes;
        }
        m.layer_acts = s.model->layer_activation_bytes();
        m.params_elems = s.model->table().params;
        m.unit0_elems = s.model->table().unit_size(0);
    }
    m.total = mb->bytes_peak();
    return m;
}

// The ranks whose memory differs: one per stage (dp, cp, tp rank 0) and, for
// the vocabulary slices, the last tp rank; all of them when asked.
std::vector<int> ranks_to_measure(const Layout& l, bool all) {
    std::vector<int> rs;
    if (all) {
        for (int r = 0; r < l.world; r++) rs.push_back(r);
        return rs;
    }
    const int per_stage = l.world / l.pp;
    for (int s = 0; s < l.pp; s++) {
        rs.push_back(s * per_stage);
        if (l.tp > 1) rs.push_back(s * per_stage + l.tp - 1);
    }
    return rs;
}

// ---- time: the cost model ------------------------------------------------------------------

struct Link {
    double bw, lat;
};

struct Cost {
    double compute = 0, tp = 0, cp = 0, pp = 0, dp = 0, bubble = 0, optimizer = 0, step = 0;  // seconds per step
};

class CostModel {
  public:
    CostModel(const GPTConfig& c, const Layout& l, const Hardware& hw, const Precision& prec, int gpus_per_node,
              bool standard_attention)
        : c_(c), l_(l), hw_(hw), G_(std::max(1, gpus_per_node)), standard_(standard_attention) {
        a_ = (double)dtype_size(prec.act);
        st_ = (double)dtype_size(prec.stat);
        pb_ = (double)dtype_size(prec.param);
        gb_ = (double)dtype_size(prec.grad);
        master_ = prec.has_master;
        ov_ = std::min(1.0, std::max(0.0, hw.comm_overlap));
    }

    // stage_params[s]: parameters a rank of stage s holds; unit0: its
    // embedding unit (for the tied all-reduce).
    Cost predict(const std::vector<size_t>& stage_params, size_t unit0) const {
        const Layout& l = l_;
        const double C = c_.channels, T = l.T, Tl = l.T_local(), B = l.B, tp = l.tp, cp = l.cp;
        const double N = B * Tl, Ns = l.sp ? N / tp : N, H = c_.hidden() / tp;
        // Widths of the column-parallel outputs on this rank: QKV (Llama's
        // K and V have NKV heads) and fc (Llama's gate and up: 2H).
        const double Ckv = (double)c_.kv_heads() * c_.head_size() / tp;
        const double Wqkv = C / tp + 2 * Ckv, Wfc = c_.llama() ? 2 * H : H;
        const double Vl = std::ceil((double)c_.padded_vocab_size / tp);
        const Recompute rc = l.recompute;
        const bool full = rc == Recompute::full, attn_again = rc == Recompute::selective || full;
        const Link ltp = link(l.tp), lcp = link(l.tp * l.cp), ldp = link(l.tp * l.cp * l.dp()), lpp = link(l.world);

        // One block, one micro-batch, this rank.
        const double mm_f = 2.0 * N * C * (Wqkv + C / tp + Wfc + H);  // QKV, attproj, fc, fcproj (GPT-2: 24NC²/tp)
        // Attention: flash-style, QK^T and PV over the causal half at the
        // attention rate; or standard, the full square as batched matrix
        // products, and the scores (B·NH/tp·T_local·T elements, 16-bit)
        // through memory. Forward: QK^T writes them (2 bytes), the fused
        // scale-mask-softmax reads and writes them (4), dropout reads them
        // and writes them and its 1-byte mask (5), PV reads them (2): 13.
        // Backward: PV's gradient reads the kept probabilities and writes
        // their gradient (4), dropout's backward reads it and the mask and
        // writes (5), softmax's backward reads the probabilities and the
        // gradient and writes (6), QK^T's gradient reads it (2): 17.
        double attn_f = 2.0 * B * Tl * T * C / tp, t_attn_f = attn_f / hw_.attn_flops, scores_f = 0, scores_b = 0;
        if (standard_) {
            attn_f = 4.0 * B * Tl * T * C / tp;
            t_attn_f = attn_f / hw_.matmul_flops;
            const double S = B * (c_.num_heads / tp) * Tl * T;
            scores_f = 13 * S / hw_.mem_bw;
            scores_b = 17 * S / hw_.mem_bw;
        }
        const double mem_f = a_ * (9 * Ns * C + N * (Wfc + H)), mem_b = a_ * (8 * Ns * C + N * (Wfc + 2 * H));
        const double mem_rec = full ? mem_f : rc == Recompute::none ? 0 : N * (Wfc + H) * a_;
        const int kernels = 20 + (full ? 8 : attn_again ? 2 : rc == Recompute::gelu ? 1 : 0);
        const double blk_compute = (3 * mm_f + (full ? mm_f : 0)) / hw_.matmul_flops +
                                   (3.5 + (attn_again ? 1 : 0)) * t_attn_f + (mem_f + mem_b + mem_rec) / hw_.mem_bw +
                                   scores_f * (attn_again ? 2 : 1) + scores_b + kernels * hw_.launch_s;
        // tp: f and g as the runtime issues them (blocking).
        const double nb = N * C * a_;
        double blk_tp = 0;
        if (l.tp > 1) {
            if (!l.sp) blk_tp = (4 + (full ? 2 : 0)) * all_reduce(nb, l.tp, ltp);
            else blk_tp = ((6 + (full ? 2 : 0)) + (4 + (full ? 2 : 0))) * gather_scatter(nb, l.tp, ltp);
        }
        // cp: the ring's K,V blocks forward, K,V and dK,dV backward, each
        // step's transfer beside that step's attention.
        double blk_cp = 0;
        if (l.cp > 1) {
            const double kv = B * Tl * 2 * Ckv * a_, dkv = B * Tl * 2 * Ckv * st_;
            const double f = (cp - 1) * p2p(kv, lcp), b = (cp - 1) * p2p(kv, lcp) + cp * p2p(dkv, lcp);
            blk_cp = expose(f, t_attn_f) + expose(b, 2.5 * t_attn_f) + (attn_again ? expose(f, t_attn_f) : 0);
        }
        // Embeddings (first stage) and the head (last stage), per micro-batch.
        const double emb = 3 * Ns * C * a_ / hw_.mem_bw + 4 * hw_.launch_s +
                           (l.tp > 1 ? (l.sp ? 2 * gather_scatter(nb, l.tp, ltp) : all_reduce(nb, l.tp, ltp)) : 0);
        const double head = 3 * 2 * N * C * Vl / hw_.matmul_flops + a_ * (3 * N * Vl + 8 * Ns * C) / hw_.mem_bw +
                            8 * hw_.launch_s +
                            (l.tp > 1 ? 3 * all_reduce(N * st_, l.tp, ltp) +
                                            (l.sp ? 3 * gather_scatter(nb, l.tp, ltp) : all_reduce(nb, l.tp, ltp))
                                      : 0);
        // The slowest stage sets the pace.
        const int blocks = c_.num_layers / l.pp;
        double t_max = 0, c_max = 0, tp_max = 0, cp_max = 0;
        for (int s = 0; s < l.pp; s++) {
            double comp = blocks * blk_compute, tpc = blocks * blk_tp, cpc = blocks * blk_cp;
            if (s == 0) comp += emb;
            if (s == l.pp - 1) comp += head;
            if (comp + tpc + cpc > t_max) t_max = comp + tpc + cpc, c_max = comp, tp_max = tpc, cp_max = cpc;
        }
        const double m = l.micro_batches(), V = l.vpp;
        Cost k;
        k.compute = m * c_max;
        k.tp = m * tp_max;
        k.cp = m * cp_max;
        k.bubble = l.pp > 1 ? (l.pp - 1) / V * t_max : 0;
        if (l.pp > 1) {
            const double hop = p2p(Ns * C * a_, lpp);
            k.pp = 2 * (l.pp * V - 1) * hop + (1 - ov_) * 2 * m * V * hop;  // fill and drain; and every transfer without overlap
        }
        // dp: the gradients of the stage over dp x cp, overlapped with the
        // backward as the runtime does it.
        const size_t P = *std::max_element(stage_params.begin(), stage_params.end());
        const int D = l.dp() * l.cp;
        const double t_bwd = 2.0 / 3.0 * t_max, t_fwd = t_max / 3.0;
        const int units = blocks + 2;
        double dpt = 0;
        if (D > 1) {
            const double red_ar = all_reduce(P * gb_, D, ldp), red_rs = gather_scatter(P * gb_, D, ldp);
            const double gather = gather_scatter(P * pb_, D, ldp);
            switch (l.zero) {
                case 0: dpt = std::max(red_ar / units, expose(red_ar, t_bwd)); break;
                case 1: dpt = std::max(red_rs / units, expose(red_rs, t_bwd)) + gather; break;
                case 2: dpt = m * std::max(red_rs / units, expose(red_rs, t_bwd)) + gather; break;
                default: dpt = m * (expose(gather, t_fwd) + std::max(red_rs / units, expose(gather + red_rs, t_bwd))); break;
            }
        }
        if (l.pp > 1 && c_.tied) dpt += all_reduce(unit0 * gb_, 2, lpp);  // the tied embeddings
        k.dp = dpt;
        // AdamW over the rank's part: read params, grads, master, m, v; write params, master, m, v.
        const double owned = l.zero >= 1 ? (double)P / D : (double)P;
        k.optimizer = owned * (2 * pb_ + gb_ + 16 + (master_ ? 8 : 0)) / hw_.mem_bw + 4 * hw_.launch_s;
        k.step = m * t_max + k.bubble + k.pp + k.dp + k.optimizer;
        return k;
    }

  private:
    // A group spanning `span` consecutive ranks sits in a node when it fits.
    Link link(int span) const {
        return span <= G_ ? Link{hw_.intra_bw, hw_.intra_lat} : Link{hw_.inter_bw, hw_.inter_lat};
    }
    // Ring collectives (docs/design.md section 10); n bytes of the full buffer.
    static double all_reduce(double n, int g, Link k) {
        return g > 1 ? 2.0 * (g - 1) * k.lat + 2.0 * n * (g - 1) / (g * k.bw) : 0;
    }
    static double gather_scatter(double n, int g, Link k) {
        return g > 1 ? (g - 1) * k.lat + n * (g - 1) / (g * k.bw) : 0;
    }
    double p2p(double n, Link k) const { return hw_.p2p_lat + n / (hw_.p2p_bw > 0 ? hw_.p2p_bw : k.bw); }
    // What of a transfer the compute beside it does not hide.
    double expose(double comm, double compute) const {
        return (1 - ov_) * comm + ov_ * std::max(0.0, comm - compute);
    }

    const GPTConfig& c_;
    const Layout& l_;
    const Hardware& hw_;
    int G_;
    bool standard_;
    double a_, st_, pb_, gb_, ov_;
    bool master_;
};

// ---- a planned layout ------------------------------------------------------------------------

struct Planned {
    Layout l;
    std::vector<RankMemory> mem;  // the measured ranks
    size_t max_bytes = 0;
    bool fits = true;
    Cost cost;
    double tokens_per_s = 0, tflops = 0, mfu = 0;
};

double flops_per_token(const GPTConfig& c, size_t params, int T) {
    return 6.0 * (double)params + 6.0 * c.num_layers * (double)c.channels * T;  // llm.c's convention
}

Planned plan_one(const GPTConfig& mc, const Layout& l, const PlanRequest& r, const Proto& proto, bool all_ranks) {
    Planned p;
    p.l = l;
    std::vector<size_t> stage_params(l.pp, 0);
    size_t unit0 = 0;
    for (int rank : ranks_to_measure(l, all_ranks)) {
        RankMemory m = measure_rank(mc, l, rank, proto);
        p.max_bytes = std::max(p.max_bytes, m.total);
        stage_params[m.stage] = std::max(stage_params[m.stage], m.params_elems);
        unit0 = std::max(unit0, m.unit0_elems);
        p.mem.push_back(std::move(m));
    }
    p.fits = r.hw.mem_bytes <= 0 || (double)p.max_bytes + r.hw.reserve_bytes <= r.hw.mem_bytes;
    p.cost = CostModel(mc, l, r.hw, proto.prec, r.hw.gpus_per_node, r.attention == "standard").predict(stage_params, unit0);
    p.tokens_per_s = (double)l.total_batch / p.cost.step;
    p.tflops = flops_per_token(mc, model_param_count(mc), l.T) * p.tokens_per_s / l.world;
    p.mfu = r.hw.peak_flops > 0 ? p.tflops / r.hw.peak_flops : 0;
    return p;
}

json to_json(const Planned& p) {
    const Layout& l = p.l;
    const double ms = 1e3;
    json j = {{"dp", l.dp()}, {"tp", l.tp}, {"pp", l.pp}, {"vpp", l.vpp}, {"cp", l.cp}, {"sp", l.sp},
              {"zero", l.zero}, {"B", l.B}, {"recompute", recompute_name(l.recompute)},
              {"micro_batches", l.micro_batches()}, {"memory_bytes", p.max_bytes}, {"fits", p.fits},
              {"step_ms", p.cost.step * ms}, {"tokens_per_s", p.tokens_per_s}, {"tflops_per_gpu", p.tflops / 1e12},
              {"mfu", p.mfu}};
    j["breakdown_ms"] = {{"compute", p.cost.compute * ms}, {"tp", p.cost.tp * ms},         {"cp", p.cost.cp * ms},
                         {"pp_p2p", p.cost.pp * ms},        {"dp", p.cost.dp * ms},         {"bubble", p.cost.bubble * ms},
                         {"optimizer", p.cost.optimizer * ms}};
    json ranks = json::array();
    for (const RankMemory& m : p.mem) ranks.push_back({{"rank", m.rank}, {"stage", m.stage}, {"bytes", m.total}});
    j["ranks"] = ranks;
    return j;
}

std::string gib(double b) { return human_bytes(b); }

void print_row(const Planned& p, int i, const char* mark) {
    const Layout& l = p.l;
    const Cost& k = p.cost;
    std::printf("%3d  pp %-2d vpp %d dp %-4d cp %-2d tp %-2d sp %d z%d B %-3d %-9s %10s %s %9.1f %12.0f %7.1f %5.1f%%"
                "  | comp %.1f tp %.1f cp %.1f pp %.1f dp %.1f bubble %.1f opt %.1f\n",
                i, l.pp, l.vpp, l.dp(), l.cp, l.tp, l.sp, l.zero, l.B, recompute_name(l.recompute),
                gib((double)p.max_bytes).c_str(), mark, k.step * 1e3, p.tokens_per_s, p.tflops / 1e12,
                100 * p.mfu, k.compute * 1e3, k.tp * 1e3, k.cp * 1e3, k.pp * 1e3, k.dp * 1e3, k.bubble * 1e3,
                k.optimizer * 1e3);
}

// The winner as a command to paste: its launch, the flags that make its
// layout, and what each device does per step.
static void print_launch(const Planned& w, const PlanRequest& r) {
    const Layout& l = w.l;
    std::string cmd = (l.world > 1 ? "mpirun -np " + std::to_string(l.world) + " " : std::string()) + "./train_gpt";
    if (!r.model_flag.empty()) cmd += " -e " + r.model_flag;
    cmd += " -t " + std::to_string(l.T) + " -d " + std::to_string(l.total_batch) + " -b " + std::to_string(l.B);
    if (l.zero) cmd += " -z " + std::to_string(l.zero);
    if (l.tp > 1) cmd += " --tp " + std::to_string(l.tp) + (l.sp ? " --sp 1" : "");
    if (l.cp > 1) cmd += " --cp " + std::to_string(l.cp);
    if (l.pp > 1) cmd += " --pp " + std::to_string(l.pp);
    if (l.vpp > 1) cmd += " --vpp " + std::to_string(l.vpp);
    if (l.recompute != Recompute::none) cmd += std::string(" -r ") + recompute_name(l.recompute);
    std::printf("launch: %s\n", cmd.c_str());
    const long long micro = l.total_batch / ((long long)l.B * l.T * l.dp());
    std::printf("per device: %.0f tokens/s, %lld micro-batch(es) of B=%d x T=%d per step, %s at most\n",
                w.tokens_per_s / l.world, micro, l.B, l.T, gib((double)w.max_bytes).c_str());
}

// Why the first beats the second: the parts of the step that differ most.
std::string why(const Planned& a, const Planned& b) {
    const char* names[] = {"compute", "tp communication", "cp communication", "pipeline transfers",
                           "dp communication", "pipeline bubble", "optimizer"};
    const double da[] = {a.cost.compute, a.cost.tp, a.cost.cp, a.cost.pp, a.cost.dp, a.cost.bubble, a.cost.optimizer};
    const double db[] = {b.cost.compute, b.cost.tp, b.cost.cp, b.cost.pp, b.cost.dp, b.cost.bubble, b.cost.optimizer};
    int best = 0;
    for (int i = 1; i < 7; i++)
        if (db[i] - da[i] > db[best] - da[best]) best = i;
    char s[256];
    std::snprintf(s, sizeof(s), "%.1f%% faster than %s, which spends %.1f ms more per step in %s", 
                  100 * (a.tokens_per_s / b.tokens_per_s - 1), b.l.describe().c_str(), (db[best] - da[best]) * 1e3,
                  names[best]);
    return s;
}

// The textbook figures (docs/design.md sections 4 and 6) beside the
// exact count, for the chosen layout.
void print_textbook(const GPTConfig& mc, const Planned& p, const Proto& proto) {
    const Layout& l = p.l;
    const double P = (double)model_param_count(mc), Nd = l.dp() * l.cp, mp = l.tp * l.pp;
    const bool mixed = proto.prec.has_master;
    const double b2 = mixed ? 2 : (double)dtype_size(proto.prec.param), k = mixed ? 12 : 2 * (double)dtype_size(proto.prec.opt);
    const double states[] = {(2 * b2 + k) * P, 2 * b2 * P + k * P / Nd, b2 * P + (b2 + k) * P / Nd, (2 * b2 + k) * P / Nd};
    const RankMemory& m = p.mem.front();
    std::printf("textbook model states (ZeRO-%d over %g ranks, divided by tp*pp = %g): %s per rank; exact here: %s "
                "(tensors split unevenly over stages, units padded, replicated LayerNorms and biases under tp)\n",
                l.zero, Nd, mp, gib(states[std::min(3, l.zero)] / mp).c_str(), gib((double)m.model_states).c_str());
    const double s = l.T_local(), b = l.B, h = mc.channels, a = mc.num_heads, t = l.tp;
    double per = s * b * h * (34 + 5 * a * s / h);
    const char* form = "sbh(34 + 5as/h)";
    if (l.tp > 1 && !l.sp) per = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), form = "sbh(10 + 24/t + 5as/(ht))";
    if (l.tp > 1 && l.sp) per = s * b * h / t * (34 + 5 * a * s / h), form = "(sbh/t)(34 + 5as/h)";
    if (l.recompute == Recompute::full) per = 2 * s * b * h / (l.sp ? t : 1), form = "2sbh (full recompute)";
    std::printf("textbook activations per layer %s = %s (16-bit); exact here: %s per layer and micro-batch "
                "(no T x T scores or dropout masks are kept; attention is flash-style)\n",
                form, gib(per).c_str(), gib((double)m.layer_acts).c_str());
}

std::vector<int> divisors(int n) {
    std::vector<int> d;
    for (int i = 1; i <= n; i++)
        if (n % i == 0) d.push_back(i);
    return d;
}

}  // namespace

bool run_planner(const GPTConfig& mc, const PlanRequest& r, std::string* err) {
    Proto proto;
    if (!make_proto(r.device, r.dtype, &proto, err)) return false;
    std::vector<Planned> plans;
    const Layout& b = r.base;
    if (r.mode == "eval") {
        Layout l = b;
        if (!check_layout(&l, mc, err)) return false;
        plans.push_back(plan_one(mc, l, r, proto, l.world <= 64));
    } else {
        // Every layout the fixed flags allow.
        const long long rows = b.total_batch / b.T;
        std::vector<Recompute> rcs = {Recompute::none, Recompute::selective, Recompute::full};
        if (r.fix_recompute) rcs = {b.recompute};
        for (int pp : r.fix_pp ? std::vector<int>{b.pp} : divisors(b.world))
            for (int tp : r.fix_tp ? std::vector<int>{b.tp} : divisors(b.world / std::max(1, pp)))
                for (int cp : r.fix_cp ? std::vector<int>{b.cp} : divisors(b.world / std::max(1, pp * tp))) {
                    if (b.world % (pp * tp * cp) != 0) continue;
                    const int dp = b.world / (pp * tp * cp);
                    if (rows % dp != 0) continue;
                    std::vector<int> Bs;
                    if (r.fix_B) Bs = {b.B};
                    else
                        for (long long x = 1; x <= rows / dp && x <= 64; x *= 2)
                            if ((rows / dp) % x == 0) Bs.push_back((int)x);
                    for (int B : Bs)
                        for (int vpp : r.fix_vpp ? std::vector<int>{b.vpp} : std::vector<int>{1, 2, 4})
                            for (int sp : r.fix_sp ? std::vector<int>{b.sp} : std::vector<int>{0, 1})
                                for (int zero : r.fix_zero ? std::vector<int>{b.zero} : std::vector<int>{0, 1, 2, 3})
                                    for (Recompute rc : rcs) {
                                        Layout l = b;
                                        l.pp = pp, l.tp = tp, l.cp = cp, l.B = B, l.vpp = vpp, l.sp = sp, l.zero = zero;
                                        l.recompute = rc;
                                        std::string why_not;
                                        if (vpp > 1 && pp == 1) continue;
                                        if (sp && tp == 1) continue;
                                        if (!check_layout(&l, mc, &why_not)) continue;
                                        plans.push_back(plan_one(mc, l, r, proto, false));
                                    }
                }
        if (plans.empty()) {
            *err = "--plan search: no layout of " + std::to_string(b.world) +
                   " ranks fits this model, -t and -d (with the flags given)";
            return false;
        }
    }
    std::stable_sort(plans.begin(), plans.end(), [](const Planned& x, const Planned& y) {
        if (x.fits != y.fits) return x.fits;
        return x.tokens_per_s > y.tokens_per_s;
    });

    // The report.
    const Hardware& hw = r.hw;
    std::printf("plan: model %s, %zu parameters; T=%d, %lld tokens per step; world %d (%d per node); hardware %s "
                "(%s %s)\n",
                config_string(mc).c_str(), model_param_count(mc), b.T, b.total_batch, b.world, hw.gpus_per_node,
                hw.name.c_str(), proto.name.c_str(), dtype_name(proto.prec.param));
    if (r.mode == "eval") {
        const Planned& p = plans.front();
        for (const RankMemory& m : p.mem) std::printf("%s\n", m.line.c_str());
        std::printf("plan eval: %s: %s per rank at most%s; step %.2f ms, %.0f tokens/s, %.1f TFLOP/s per device, "
                    "MFU %.1f%%\n",
                    p.l.describe().c_str(), gib((double)p.max_bytes).c_str(),
                    p.fits ? "" : (" (does not fit " + gib(hw.mem_bytes - hw.reserve_bytes) + ")").c_str(),
                    p.cost.step * 1e3, p.tokens_per_s, p.tflops / 1e12, 100 * p.mfu);
        std::printf("plan breakdown (ms per step): compute %.2f, tp %.2f, cp %.2f, pp transfers %.2f, dp %.2f, "
                    "bubble %.2f, optimizer %.2f\n",
                    p.cost.compute * 1e3, p.cost.tp * 1e3, p.cost.cp * 1e3, p.cost.pp * 1e3, p.cost.dp * 1e3,
                    p.cost.bubble * 1e3, p.cost.optimizer * 1e3);
        print_textbook(mc, p, proto);
    } else {
        size_t fitting = 0;
        for (const Planned& p : plans) fitting += p.fits;
        std::printf("%zu layouts, %zu fit in %s per device (less %s for the runtime); the best %d:\n", plans.size(),
                    fitting, gib(hw.mem_bytes).c_str(), gib(hw.reserve_bytes).c_str(), std::min<int>(r.top, (int)plans.size()));
        std::printf("  #  layout                                            memory    step ms     tokens/s  TFLOP/s   MFU"
                    "  | ms per step\n");
        const Planned& w = plans.front();
        auto tie = [&](const Planned& p) { return p.fits && w.fits && p.tokens_per_s >= (1 - kPlanTieBand) * w.tokens_per_s; };
        for (int i = 0; i < r.top && i < (int)plans.size(); i++)
            print_row(plans[i], i + 1, !plans[i].fits ? "!" : i > 0 && tie(plans[i]) ? "~" : " ");
        if (!w.fits) {
            std::printf("no layout fits: the smallest needs %s per device\n", gib((double)w.max_bytes).c_str());
        } else {
            std::printf("winner: %s", w.l.describe().c_str());
            if (plans.size() > 1 && plans[1].fits) std::printf(", %s", why(w, plans[1]).c_str());
            std::printf("\n");
            print_launch(w, r);
            const long ties = std::count_if(plans.begin() + 1, plans.end(), tie);
            if (ties > 0)
                std::printf("ties: %ld more layout(s) within %.0f%% of the winner (marked ~ above), the time model's own "
                            "error: measure them (--plan eval, then a few steps) before committing to one\n",
                            ties, 100 * kPlanTieBand);
            for (const Planned& p : plans)
                if (!p.fits && p.tokens_per_s > w.tokens_per_s) {
                    std::printf("faster but does not fit: %s at %.0f tokens/s needs %s\n", p.l.describe().c_str(),
                                p.tokens_per_s, gib((double)p.max_bytes).c_str());
                    break;
                }
            print_textbook(mc, w, proto);
        }
    }
    if (!r.json_path.empty()) {
        std::ofstream out(r.json_path);
        for (const Planned& p : plans) out << to_json(p).dump() << "\n";
        if (!out) {
            *err = "flag --plan-json: cannot write " + r.json_path;
            return false;
        }
    }
    return true;
}
