// llmc/plan/modes.cpp: --plan and --calibrate (llmc/plan/modes.h).
#include "llmc/plan/modes.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>

#include "llmc/backend/backends.h"
#include "llmc/comm/dist.h"
#include "llmc/model/tensors.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/plan/calibrate.h"
#include "llmc/plan/hardware.h"
#include "llmc/plan/planner.h"
#include "llmc/run/model_source.h"
#include "llmc/run/startup.h"

// The global batch of a plan without -d: what published runs of a model of
// P parameters used (Brown et al. 2020, "Language Models are Few-Shot
// Learners", table 2.1: 0.5M tokens up to 760M parameters, 1M at 1.3B and
// 2.7B, 2M at 6.7B and 13B, 3.2M at 175B; Llama 2 trained every size on 4M),
// in a power-of-two count of rows of T (the layouts' divisors), at least one.
static long long realistic_batch(size_t P, int T) {
    const long long tokens = P < 1000000000ULL    ? 1LL << 19
                             : P < 4000000000ULL  ? 1LL << 20
                             : P < 20000000000ULL ? 1LL << 21
                                                  : 1LL << 22;
    long long rows = 1;
    while (rows * 2 * T <= tokens) rows *= 2;
    return rows * T;
}
static std::string realistic_batch_source() {
    return "the global batch of published runs of this size, GPT-3's table 2.1 and Llama 2: 0.5M tokens under 1B "
           "parameters, 1M under 4B, 2M under 20B, 4M above";
}

// --plan: the layouts of this model on a planned world, without training
// (rank 0 alone; llmc/plan/planner.h).
// A value as one shell word: as it is when plain, else in single quotes.
static std::string shell_word(const std::string& v) {
    const bool plain = !v.empty() && v.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./=:,+-@%") == std::string::npos;
    if (plain) return v;
    std::string q = "'";
    for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// The training flags the user gave beside the planner's (data, output,
// steps, learning rate, ...), as " --name value" each, for the winner's
// launch command: the layout's flags are the planner's to choose, the
// planner's own and other modes' do not belong in a training run.
static std::string run_flags(const ArgParser& parser) {
    static const char* const not_passed[] = {
        "model", "batch-size", "seq-len", "total-batch", "zero", "tp", "sp", "cp", "cp-impl", "cp-a2a", "ep", "pp",
        "vpp", "pp-schedule", "recompute", "config", "plan", "world", "gpus-per-node", "hardware", "plan-json", "plan-attention",
        "plan-top", "calibrate", "convert", "generate", "prompt-ids", "max-new-tokens", "temperature", "top-k",
        "top-p", "ignore-eos", "kv-cache"};
    std::string out;
    for (const Option& o : parser.options()) {
        if (!parser.given(o.name) ||
            std::any_of(std::begin(not_passed), std::end(not_passed), [&](const char* n) { return std::string(n) == o.name; }))
            continue;
        std::string v = option_value_string(o);
        if (v == "\"\"") v.clear();
        out += std::string(" --") + o.name + " " + (v.empty() ? "''" : shell_word(v));
    }
    return out;
}

int plan_main(const ArgParser& parser, const TrainConfig& cfg) {
    std::string err;
    PlanRequest r;
    GPTConfig mc;
    std::string defaults_note;  // what was chosen for the flags not given
    // --plan eval plans the run its flags describe: where --device, --dtype
    // and --hardware are not given, the device training would run on here
    // and, on a CPU, this machine's profile (hardware.h cpu_host).
    const bool eval = cfg.plan == "eval";
    const std::string run_device = resolve_device(cfg.device);
    const bool cpu_here = eval && run_device == "cpu" && !parser.given("hardware");
    bool ok = model_config(cfg, &mc, &err) && load_hardware(cpu_here ? "cpu" : cfg.hardware, &r.hw, &err);
    auto note = [&](const std::string& s) { defaults_note += (defaults_note.empty() ? "" : "; ") + s; };
    if (ok) {
        r.mode = cfg.plan;
        if (cfg.gpus_per_node > 0) r.hw.gpus_per_node = cfg.gpus_per_node;
        Layout& b = r.base;
        b.world = cfg.world > 0 ? cfg.world : dist_world_size();
        b.pp = cfg.pp, b.vpp = cfg.vpp, b.tp = cfg.tp, b.cp = cfg.cp, b.sp = cfg.sp, b.zero = cfg.zero, b.ep = cfg.ep;
        // T: the model's context (a run's: at most kDefaultMaxT; a search
        // plans the whole context, long context being its point).
        b.B = cfg.B, b.total_batch = cfg.total_batch;
        b.T = cfg.T > 0 ? cfg.T : eval ? std::min(mc.max_seq_len, kDefaultMaxT) : mc.max_seq_len;
        parse_recompute(cfg.recompute, &b.recompute);
        b.head_chunk = cfg.head_chunk;
        b.bf16_optimizer = cfg.optimizer_dtype == "bf16";
        b.fp8 = cfg.fp8 != 0;
        b.fp8_history = cfg.fp8 ? cfg.fp8_history : 0;
        b.fp8_weight_copies = cfg.fp8_weight_copies != 0;
        if (!linear_layers_from_names(cfg.fp8_layers, &b.fp8_layers, &err)) {
            err = "flag --fp8-layers: " + err;
            ok = false;
        }
        // The degrees' product in 64 bits: --tp 65536 --cp 65536 wraps an int to 0.
        const long long degrees = (long long)b.pp * b.tp * b.cp;
        if (cfg.T == 0) note("-t " + std::to_string(b.T) + " (no -t: the model's context" +
                             (b.T < mc.max_seq_len ? ", capped as training caps it)" : ")"));
        if (b.total_batch < 0 && eval) {
            // The run's own: one micro-batch per data-parallel rank, as training does.
            b.total_batch = (long long)b.B * b.T * std::max(1LL, b.world / std::max(1LL, degrees));
            note("-d " + std::to_string(b.total_batch) + " (no -d: B x T x dp, as training)");
        } else if (b.total_batch < 0) {
            b.total_batch = realistic_batch(model_param_count(mc), b.T);
            note("-d " + std::to_string(b.total_batch) + " (no -d: " + realistic_batch_source() + ")");
        }
        r.fix_pp = parser.given("pp"), r.fix_vpp = parser.given("vpp"), r.fix_tp = parser.given("tp");
        r.fix_cp = parser.given("cp"), r.fix_cp_impl = parser.given("cp-impl"), r.fix_ep = parser.given("ep");
        r.cp_impl = cfg.cp_impl, r.cp_a2a = cfg.cp_a2a;
        r.fix_sp = parser.given("sp"), r.fix_zero = parser.given("zero");
        r.fix_B = parser.given("batch-size"), r.fix_recompute = parser.given("recompute");
        // Without --hardware an eval plans the device training would take
        // here, in its default dtype (bf16 on CUDA, fp32 on the CPU:
        // backends.h); a profile named plans that profile's device.
        const bool here = eval && !parser.given("hardware");
        r.device = cfg.device == "auto" ? (here ? run_device : r.hw.device) : cfg.device;
        r.dtype = cfg.dtype == "auto" ? (here ? (r.device == "cuda" ? "bf16" : "fp32") : r.hw.dtype) : cfg.dtype;
        if (here && cfg.device == "auto")
            note("device " + r.device + " (no --device: " + (r.device == "cpu" ? "no GPU here" : "a GPU here") + ")");
        if (here && cfg.dtype == "auto") note("dtype " + r.dtype + " (no --dtype: the device's)");
        if (cpu_here) note("hardware cpu (this machine's cores and memory, speeds assumed; --calibrate measures them)");
        r.json_path = cfg.plan_json;
        r.attention = cfg.plan_attention;
        r.top = cfg.plan_top;
        r.model_flag = cfg.model;
        r.run_flags = run_flags(parser);
        if (dist_world_rank() == 0 && !defaults_note.empty()) std::printf("plan: %s\n", defaults_note.c_str());
        // --cp-impl and --cp-a2a against --cp; a search over cp checks what
        // does not depend on it here and tries only the cp that N divides.
        if (r.mode == "eval" || r.fix_cp) ok = cp_a2a_of(cfg.cp_impl, b.cp, cfg.cp_a2a, &b.cp_a2a, &err);
        else if (cfg.cp_impl != "hybrid" || cfg.cp_a2a <= 1)
            ok = cp_a2a_of(cfg.cp_impl, b.world, cfg.cp_a2a, &b.cp_a2a, &err);
        ok = ok && pipe_order_of(cfg.pp_schedule, cfg.vpp, &b.pp_order, &err);
        if (ok) b.vpp = pipe_chunks_per_stage(b.pp_order, b.vpp);
        r.fix_pp_schedule = parser.given("pp-schedule");
        ok = ok && (dist_world_rank() != 0 || run_planner(mc, r, &err));
    }
    setup_check(ok, err);
    dist_finalize();
    return 0;
}

// --calibrate: measure this machine (its device and the links between the
// ranks of this launch) and write a hardware profile.
int calibrate_main(const TrainConfig& cfg) {
    std::string err;
    GPTConfig mc;
    setup_check(model_config(cfg, &mc, &err), err);
    std::unique_ptr<Backend> be(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
    setup_check(be != nullptr, err);
    choose_threads();
    ProcessGrid grid;
    Layout world;  // every rank its own: only the world group is measured
    world.world = dist_world_size();
    setup_check(make_process_grid(world, cfg.comm, *be, &grid, &err), err);
    Hardware hw;
    bool ok = calibrate(*be, grid, mc, cfg.B, cfg.T > 0 ? cfg.T : default_seq_len(mc), cfg.calibrate, &hw, &err);
    if (ok && dist_world_rank() == 0) {
        ok = save_hardware(cfg.calibrate, hw, &err);
        if (ok) std::printf("calibrate: %s\n%s\n", cfg.calibrate.c_str(), hw.source.c_str());
    }
    setup_check(ok, err);
    grid = ProcessGrid();
    be.reset();
    dist_finalize();
    return 0;
}
