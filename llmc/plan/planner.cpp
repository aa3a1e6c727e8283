// llmc/plan/planner.cpp: the layout planner (llmc/plan/planner.h): memory by building
// each rank on a counting backend, time by the cost model
// (llmc/plan/cost_model.h), the search over layouts, and the report.
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
#include "llmc/parallel/model_stack.h"
#include "llmc/plan/cost_model.h"
#include "llmc/run/report.h"

using json = nlohmann::json;

namespace {

// ---- memory: every rank built on a counting backend -------------------------------------------

// What one rank holds, as the memory line says it.
struct RankMemory {
    int rank = 0, stage = 0;
    size_t total = 0;          // bytes the backend would hold
    size_t model_states = 0;   // params + grads + master + optimizer
    size_t params_elems = 0;   // parameters of this rank (its tensors, unpadded)
    size_t unit0_elems = 0;    // its embedding unit (padded), 0 when it holds none
    size_t expert_elems = 0;   // of params_elems, its experts' under expert parallelism
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

RankMemory measure_rank(const GPTConfig& mc, const Layout& l, int r, const Proto& proto) {
    // The groups of rank r, shapes only: the stack's constructors ask for
    // sizes and ranks and never communicate (llmc/parallel/process_grid.h).
    ShapeGroups g;
    make_shape_groups(l, r, true, &g);
    const GridPlace p = grid_place(l, r);
    std::unique_ptr<MeasureBackend> mb(proto.cpu ? new MeasureBackend(*proto.cpu)
                                                 : new MeasureBackend(proto.name.c_str(), proto.prec));
    RankMemory m;
    m.rank = r;
    m.stage = p.pp;
    {
        ModelStack s;
        build_stack(*mb, mc, l, g.groups, &s);
        m.line = memory_line("plan", r, *s.model, s.comm_bytes(), p.pp, l.pp);
        for (const BufferInfo& b : s.model->buffers()) {
            if (b.group == "params" || b.group == "grads" || b.group == "master" || b.group == "optimizer")
                m.model_states += b.bytes;
            if (b.per_layer) m.stage_acts += b.bytes;
        }
        m.layer_acts = s.model->layer_activation_bytes();
        m.params_elems = s.model->table().params;
        for (const TensorEntry& e : s.model->table().entries)
            if (s.model->table().ep_split(e)) m.expert_elems += e.numel;
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

// ---- a planned layout ------------------------------------------------------------------------

struct Planned {
    Layout l;
    std::vector<RankMemory> mem;  // the measured ranks
    size_t max_bytes = 0;
    bool fits = true;
    Cost cost;
    double tokens_per_s = 0, tflops = 0, mfu = 0;
};

Planned plan_one(const GPTConfig& mc, const Layout& l, const PlanRequest& r, const Proto& proto, bool all_ranks) {
    Planned p;
    p.l = l;
    std::vector<size_t> stage_params(l.pp, 0), stage_experts(l.pp, 0);
    size_t unit0 = 0;
    for (int rank : ranks_to_measure(l, all_ranks)) {
        RankMemory m = measure_rank(mc, l, rank, proto);
        p.max_bytes = std::max(p.max_bytes, m.total);
        stage_params[m.stage] = std::max(stage_params[m.stage], m.params_elems);
        stage_experts[m.stage] = std::max(stage_experts[m.stage], m.expert_elems);
        unit0 = std::max(unit0, m.unit0_elems);
        p.mem.push_back(std::move(m));
    }
    p.fits = r.hw.mem_bytes <= 0 || (double)p.max_bytes + r.hw.reserve_bytes <= r.hw.mem_bytes;
    p.cost = CostModel(mc, l, r.hw, proto.prec, r.hw.gpus_per_node, r.attention == "standard")
                 .predict(stage_params, unit0, stage_experts);
    p.tokens_per_s = (double)l.total_batch / p.cost.step;
    p.tflops = train_flops_per_token(mc, l.T) * p.tokens_per_s / l.world;
    p.mfu = r.hw.peak_flops > 0 ? p.tflops / r.hw.peak_flops : 0;
    return p;
}

// --cp-impl of a layout, and its mark in the table (a: a2a, h: hybrid).
const char* cp_impl_name(const Layout& l) {
    return l.cp_hybrid() ? "hybrid" : l.cp > 1 && l.cp_a2a > 1 ? "a2a" : "ring";
}
const char* cp_impl_mark(const Layout& l) {
    return l.cp_hybrid() ? "h" : l.cp > 1 && l.cp_a2a > 1 ? "a" : " ";
}

// One layout as a JSON line; each line also names what was planned (the
// model, the world, the hardware and the memory a rank may use: the device's
// less the runtime's reserve), so a plot of the file needs nothing else.
json to_json(const Planned& p, const GPTConfig& mc, const PlanRequest& r) {
    const Layout& l = p.l;
    const double ms = 1e3;
    json j = {{"dp", l.dp()}, {"tp", l.tp}, {"pp", l.pp}, {"vpp", l.vpp},
              {"pp_schedule", pipe_order_name(l.pp_order, l.vpp)}, {"cp", l.cp}, {"cp_impl", cp_impl_name(l)},
              {"cp_a2a", l.cp_hybrid() ? l.cp_a2a : 0}, {"sp", l.sp}, {"ep", l.ep},
              {"zero", l.zero}, {"B", l.B}, {"recompute", recompute_name(l.recompute)},
              {"micro_batches", l.micro_batches()}, {"memory_bytes", p.max_bytes}, {"fits", p.fits},
              {"step_ms", p.cost.step * ms}, {"tokens_per_s", p.tokens_per_s}, {"tflops_per_gpu", p.tflops / 1e12},
              {"mfu", p.mfu}, {"model", config_string(mc)}, {"params", model_param_count(mc)},
              {"world", l.world}, {"gpus_per_node", r.hw.gpus_per_node}, {"hardware", r.hw.name},
              {"device_memory_bytes", r.hw.mem_bytes},
              {"usable_memory_bytes", r.hw.mem_bytes > 0 ? r.hw.mem_bytes - r.hw.reserve_bytes : 0.0}};
    j["breakdown_ms"] = {{"compute", p.cost.compute * ms}, {"tp", p.cost.tp * ms},         {"cp", p.cost.cp * ms},
                         {"pp_p2p", p.cost.pp * ms},        {"dp", p.cost.dp * ms},         {"bubble", p.cost.bubble * ms},
                         {"optimizer", p.cost.optimizer * ms}, {"ep", p.cost.ep * ms}};
    const Cost::Classes& c = p.cost.classes;
    j["classes_ms"] = {{"qkv", c.qkv * ms},           {"attproj", c.attproj * ms},
                       {"fc", c.fc * ms},             {"fcproj", c.fcproj * ms},
                       {"attention_fwd", c.attention_fwd * ms}, {"attention_bwd", c.attention_bwd * ms},
                       {"memory_bound", c.memory_bound * ms}, {"embed", c.embed * ms},
                       {"head", c.head * ms},         {"optimizer", c.optimizer * ms}};
    json ranks = json::array();
    for (const RankMemory& m : p.mem) ranks.push_back({{"rank", m.rank}, {"stage", m.stage}, {"bytes", m.total}});
    j["ranks"] = ranks;
    return j;
}

std::string gib(double b) { return human_bytes(b); }
std::string fixed(double x, int digits) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", digits, x);
    return b;
}

void print_row(const Planned& p, int i, const char* mark) {
    const Layout& l = p.l;
    const Cost& k = p.cost;
    const std::string ep = l.ep > 1 ? " ep " + std::to_string(l.ep) : "", ep_ms = l.ep > 1 ? " ep " + fixed(k.ep * 1e3, 1) : "";
    std::printf("%3d  pp %-2d vpp %d%s dp %-4d cp %-2d%s tp %-2d sp %d z%d B %-3d %-9s%s %10s %s %9.1f %12.0f %7.1f %5.1f%%"
                "  | comp %.1f tp %.1f cp %.1f pp %.1f dp %.1f bubble %.1f opt %.1f%s\n",
                i, l.pp, l.vpp, l.pp_order == PipeOrder::zb_h1 ? "z" : l.pp_order == PipeOrder::zbv ? "v" : " ", l.dp(), l.cp, cp_impl_mark(l), l.tp, l.sp,
                l.zero, l.B, recompute_name(l.recompute), ep.c_str(), gib((double)p.max_bytes).c_str(), mark, k.step * 1e3, p.tokens_per_s, p.tflops / 1e12,
                100 * p.mfu, k.compute * 1e3, k.tp * 1e3, k.cp * 1e3, k.pp * 1e3, k.dp * 1e3, k.bubble * 1e3,
                k.optimizer * 1e3, ep_ms.c_str());
}

// The winner as a command to paste: its launch, the flags that make its
// layout, and what each device does per step.
static void print_launch(const Planned& w, const PlanRequest& r) {
    const Layout& l = w.l;
    // More ranks than one node holds: Open MPI's hostfile and ranks per node.
    const int per_node = r.hw.gpus_per_node, nodes = (l.world + per_node - 1) / std::max(1, per_node);
    std::string cmd = l.world > 1 ? "mpirun -np " + std::to_string(l.world) + " " : std::string();
    if (nodes > 1) cmd += "--hostfile HOSTS --map-by ppr:" + std::to_string(per_node) + ":node ";
    cmd += "./train_gpt";
    if (!r.model_flag.empty()) cmd += " -e " + r.model_flag;
    cmd += " -t " + std::to_string(l.T) + " -d " + std::to_string(l.total_batch) + " -b " + std::to_string(l.B);
    if (l.zero) cmd += " -z " + std::to_string(l.zero);
    if (l.tp > 1) cmd += " --tp " + std::to_string(l.tp) + (l.sp ? " --sp 1" : "");
    if (l.cp > 1) cmd += " --cp " + std::to_string(l.cp);
    if (l.cp_hybrid()) cmd += " --cp-impl hybrid --cp-a2a " + std::to_string(l.cp_a2a);
    else if (l.cp > 1 && l.cp_a2a > 1) cmd += " --cp-impl a2a";
    if (l.pp > 1) cmd += " --pp " + std::to_string(l.pp);
    if (l.vpp > 1 && l.pp_order != PipeOrder::zbv) cmd += " --vpp " + std::to_string(l.vpp);
    if (l.pp_order != PipeOrder::standard) cmd += std::string(" --pp-schedule ") + pipe_order_name(l.pp_order, l.vpp);
    if (l.ep > 1) cmd += " --ep " + std::to_string(l.ep);
    if (l.recompute != Recompute::none) cmd += std::string(" -r ") + recompute_name(l.recompute);
    cmd += r.run_flags;
    std::printf("launch: %s\n", cmd.c_str());
    if (nodes > 1) std::printf("HOSTS: a file naming the %d nodes, one per line\n", nodes);
    const long long micro = l.total_batch / ((long long)l.B * l.T * l.dp());
    std::printf("per device: %.0f tokens/s, %lld micro-batch(es) of B=%d x T=%d per step, %s at most\n",
                w.tokens_per_s / l.world, micro, l.B, l.T, gib((double)w.max_bytes).c_str());
}

// Why the first beats the second: the parts of the step that differ most.
std::string why(const Planned& a, const Planned& b) {
    const char* names[] = {"compute", "tp communication", "cp communication", "pipeline transfers",
                           "dp communication", "pipeline bubble", "optimizer", "the experts' all-to-all"};
    const double da[] = {a.cost.compute, a.cost.tp, a.cost.cp, a.cost.pp, a.cost.dp, a.cost.bubble, a.cost.optimizer,
                         a.cost.ep};
    const double db[] = {b.cost.compute, b.cost.tp, b.cost.cp, b.cost.pp, b.cost.dp, b.cost.bubble, b.cost.optimizer,
                         b.cost.ep};
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (db[i] - da[i] > db[best] - da[best]) best = i;
    char s[256];
    const double gain = a.tokens_per_s / b.tokens_per_s - 1;
    if (gain < 0.0005)  // would print "0.0% faster": the time model cannot tell them apart
        std::snprintf(s, sizeof(s), "tied in the time model with %s (%.0f tokens/s each); the search order picks it",
                      b.l.describe().c_str(), a.tokens_per_s);
    else
        std::snprintf(s, sizeof(s), "%.1f%% faster than %s, which spends %.1f ms more per step in %s", 100 * gain,
                      b.l.describe().c_str(), (db[best] - da[best]) * 1e3, names[best]);
    return s;
}

// --plan eval --fp8 1: the same plan without FP8, by the same time model,
// so the plan says whether FP8 pays at these shapes: the step, and each of
// the four linear layers with its operands' amax and quantisation passes
// against its products in the compute type (where the passes cost more
// than FP8's rate saves, a layer is slower in FP8). The layers' figures are
// all four's in FP8 whatever --fp8-layers says; where FP8 pays on another
// set of them than the plan's, the plan with that set too (--fp8-layers).
void print_fp8_gain(const GPTConfig& mc, const Planned& p, const PlanRequest& r, const Proto& proto) {
    Layout l = p.l;
    l.fp8 = false, l.fp8_history = 0;
    const Planned q = plan_one(mc, l, r, proto, false);
    l = p.l;
    l.fp8_layers = kLinearLayersAll;
    const Planned all = l.fp8_layers == p.l.fp8_layers ? p : plan_one(mc, l, r, proto, false);
    const Cost::Classes &a = all.cost.classes, &b = q.cost.classes;
    std::printf("plan fp8: %.3fx the tokens/s of the same plan without --fp8 (step %.2f ms against %.2f); the four "
                "layers in FP8, their operands' passes included, against the compute type (ms per step): qkv %.2f "
                "against %.2f, attproj %.2f against %.2f, fc %.2f against %.2f, fcproj %.2f against %.2f\n",
                p.tokens_per_s / q.tokens_per_s, p.cost.step * 1e3, q.cost.step * 1e3, a.qkv * 1e3, b.qkv * 1e3,
                a.attproj * 1e3, b.attproj * 1e3, a.fc * 1e3, b.fc * 1e3, a.fcproj * 1e3, b.fcproj * 1e3);
    const double fa[4] = {a.qkv, a.attproj, a.fc, a.fcproj}, fb[4] = {b.qkv, b.attproj, b.fc, b.fcproj};
    unsigned pays = 0;
    for (int i = 0; i < 4; i++)
        if (fa[i] < fb[i]) pays |= 1u << i;
    if (pays == p.l.fp8_layers) return;
    if (pays == 0) {
        std::printf("plan fp8: FP8 pays on none of the four layers at this plan (leave out --fp8 1)\n");
        return;
    }
    l.fp8_layers = pays;
    const Planned s = plan_one(mc, l, r, proto, false);
    std::printf("plan fp8: FP8 pays on %s at this plan: --fp8-layers %s gives %.3fx (step %.2f ms)\n",
                linear_layers_names(pays).c_str(), linear_layers_names(pays).c_str(), s.tokens_per_s / q.tokens_per_s,
                s.cost.step * 1e3);
}

// The textbook figures (docs/design.md sections 4 and 6) beside the
// exact count, for the chosen layout.
void print_textbook(const GPTConfig& mc, const Planned& p, const Proto& proto) {
    const Layout& l = p.l;
    const double P = (double)model_param_count(mc), Nd = l.dp() * l.cp, mp = l.tp * l.pp;
    const bool mixed = proto.prec.has_master;
    // k: the optimizer's bytes per parameter (master copy, m and v).
    const double b2 = mixed ? 2 : (double)dtype_size(proto.prec.param),
                 mv = 2 * (double)dtype_size(l.bf16_optimizer ? DType::BF16 : proto.prec.opt),
                 k = (mixed ? 4 : 0) + mv;
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

// The expert-parallel degrees a search tries: as --ep says, else every one
// that divides dp and the experts (1 for a dense model).
std::vector<int> ep_sizes(const PlanRequest& r, const GPTConfig& mc, int dp) {
    if (r.fix_ep) return {r.base.ep};
    std::vector<int> out;
    for (int e : divisors(dp))
        if (e == 1 || (mc.moe() && mc.experts % e == 0)) out.push_back(e);
    return out;
}

// The all-to-all group sizes (Layout::cp_a2a) a search tries under cp: as
// --cp-impl says, or all of them (1: the ring, cp: a2a, the divisors
// between: hybrid).
std::vector<int> cp_a2a_sizes(const PlanRequest& r, int cp) {
    if (cp == 1) return {1};
    if (!r.fix_cp_impl) return divisors(cp);
    if (r.cp_impl != "hybrid") return {r.cp_impl == "a2a" ? cp : 1};
    if (r.cp_a2a > 1 && r.cp_a2a < cp && cp % r.cp_a2a == 0) return {r.cp_a2a};
    return {};
}

}  // namespace

bool run_planner(const GPTConfig& mc, const PlanRequest& r, std::string* err) {
    Proto proto;
    if (!make_proto(r.device, r.dtype, &proto, err)) return false;
    std::vector<Planned> plans;
    const Layout& b = r.base;
    if (b.fp8 && r.hw.device == "cuda" && !(r.hw.fp8_matmul_flops > 0)) {
        *err = "flag --fp8: hardware " + r.hw.name +
               " has no FP8 products (its profile gives no fp8_matmul_flops; FP8 tensor cores need compute "
               "capability 8.9 or later)";
        return false;
    }
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
                                    for (Recompute rc : rcs)
                                    for (int a2a : cp_a2a_sizes(r, cp))
                                    for (int ep : ep_sizes(r, mc, dp))
                                    for (PipeOrder po : r.fix_pp_schedule ? std::vector<PipeOrder>{b.pp_order}
                                                                          : std::vector<PipeOrder>{PipeOrder::standard,
                                                                                                   PipeOrder::zb_h1,
                                                                                                   PipeOrder::zbv}) {
                                        Layout l = b;
                                        l.pp = pp, l.tp = tp, l.cp = cp, l.B = B, l.vpp = vpp, l.sp = sp, l.zero = zero;
                                        l.recompute = rc;
                                        l.cp_a2a = a2a;
                                        l.ep = ep;
                                        l.pp_order = po;
                                        std::string why_not;
                                        if (vpp > 1 && pp == 1) continue;
                                        if (po == PipeOrder::zb_h1 && (pp == 1 || vpp > 1)) continue;
                                        if (po == PipeOrder::zbv && (pp == 1 || vpp != 2)) continue;
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
                    "bubble %.2f, optimizer %.2f%s\n",
                    p.cost.compute * 1e3, p.cost.tp * 1e3, p.cost.cp * 1e3, p.cost.pp * 1e3, p.cost.dp * 1e3,
                    p.cost.bubble * 1e3, p.cost.optimizer * 1e3,
                    p.l.ep > 1 ? (", ep all-to-all " + fixed(p.cost.ep * 1e3, 2)).c_str() : "");
        if (p.l.fp8) print_fp8_gain(mc, p, r, proto);
        print_textbook(mc, p, proto);
    } else {
        size_t fitting = 0;
        for (const Planned& p : plans) fitting += p.fits;
        std::printf("%zu layouts, %zu fit in %s per device (less %s for the runtime); the best %d:\n", plans.size(),
                    fitting, gib(hw.mem_bytes).c_str(), gib(hw.reserve_bytes).c_str(), std::min<int>(r.top, (int)plans.size()));
        std::printf("  #  layout (z, v: --pp-schedule zb-h1, zbv)            memory    step ms     tokens/s  TFLOP/s   MFU"
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
        for (const Planned& p : plans) out << to_json(p, mc, r).dump() << "\n";
        if (!out) {
            *err = "flag --plan-json: cannot write " + r.json_path;
            return false;
        }
    }
    return true;
}
