// train_gpt.cu: the trainer's entry point. main() is the outline of a run:
// set up (flags, process grid, model, parallel modes), then per optimizer
// step the pipeline schedule over the micro-batches, the optimizer, and the
// step's reports (log line, validation, samples, checkpoints).
// Built by nvcc's host compiler with the CUDA backend when nvcc is present,
// by g++ otherwise; the code is the same either way: everything
// device-specific is behind the Backend and Comm interfaces.
//
// Launch: ./train_gpt (one process) or mpirun -np N ./train_gpt (parallel
// over N ranks, laid out by --pp, --tp, --cp and what remains for data
// parallel; the global batch, and so the run, is the same).
//
// Where each parallel mode lives: llmc/data_parallel.* (dp, ZeRO),
// llmc/tensor_parallel.* (tp, sp), llmc/context_parallel.* (cp),
// llmc/pipeline_parallel.* (pp and its schedules).
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/base/args.h"
#include "llmc/plan/calibrate.h"
#include "llmc/backend/backend_measure.h"
#include "llmc/backend/backends.h"
#include "llmc/io/checkpoint.h"
#include "llmc/model/config.h"
#include "llmc/model/context_parallel.h"
#include "llmc/parallel/data_parallel.h"
#include "llmc/io/dataloader.h"
#include "llmc/base/fileio.h"
#include "llmc/model/gpt.h"
#include "llmc/io/hf.h"
#include "llmc/parallel/layout.h"
#include "llmc/run/metrics.h"
#include "llmc/io/model_io.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/pipeline_parallel.h"
#include "llmc/plan/planner.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/run/report.h"
#include "llmc/base/rng.h"
#include "llmc/model/tensor_parallel.h"
#include "llmc/io/tokenizer.h"
#include "llmc/base/trace.h"
#include "llmc/run/trace_file.h"
#include "llmc/run/train_config.h"

// Setup errors: every rank reaches the same check, so the ranks agree on the
// outcome, rank 0 prints the first failing rank's message, and all exit 1.
static void setup_check(bool ok, const std::string& msg) {
    std::string err;
    if (dist_all_ok(ok, msg, &err)) return;
    if (dist_world_rank() == 0) std::fprintf(stderr, "train_gpt: error: %s\n", err.c_str());
    dist_finalize();
    std::exit(1);
}

// Errors during training, possibly on one rank only: end the whole job.
[[noreturn]] static void fail(const std::string& msg) { dist_abort(msg); }

// Every rank must run with the same flags (mpirun -np 1 A : -np 1 B would
// otherwise hang or train wrong): rank 0's values go to every rank, each
// compares them with its own, and the lowest rank that differs names the
// first flag where it does.
static void check_same_flags(const ArgParser& parser) {
    std::string mine;
    for (const Option& o : parser.options()) mine += std::string(o.name) + "=" + option_value_string(o) + "\n";
    std::string first = mine;
    dist_broadcast(&first);
    std::string msg;
    if (first != mine) {
        size_t a = 0, b = 0;
        while (a < mine.size() && b < first.size()) {
            size_t ea = mine.find('\n', a), eb = first.find('\n', b);
            std::string la = mine.substr(a, ea - a), lb = first.substr(b, eb - b);
            if (la != lb) {
                size_t eq = la.find('=');
                msg = "ranks were given different flags: --" + la.substr(0, eq) + " is '" + la.substr(eq + 1) +
                      "' on rank " + std::to_string(dist_world_rank()) + " but '" + lb.substr(lb.find('=') + 1) +
                      "' on rank 0";
                break;
            }
            a = ea + 1;
            b = eb + 1;
        }
        if (msg.empty()) msg = "ranks were given different flags";
    }
    setup_check(msg.empty(), msg);
}

// CPU threads: unless OMP_NUM_THREADS says otherwise, the ranks on a node
// share its cores (every rank starting as many threads as the node has cores
// runs several times slower), and no rank runs more threads than the cores
// mpirun bound it to. Returns the line for the settings.
static std::string choose_threads() {
    const char* env = std::getenv("OMP_NUM_THREADS");
    if (env && *env) return std::to_string(omp_get_max_threads()) + " (OMP_NUM_THREADS)";
    const int cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), bound = omp_get_num_procs();
    const int local = std::max(1, dist_local_size());
    const int n = std::max(1, std::min(bound, cores / local));
    omp_set_num_threads(n);
    return std::to_string(n) + " (" + std::to_string(cores) + " cores / " + std::to_string(local) +
           " rank(s) on this node" + (bound < cores ? ", " + std::to_string(bound) + " bound to this rank" : "") + ")";
}

// Training FLOPs per token as llm.c counts them (shared/reference.md section
// 10): 6 per weight plus 6·L·C·T for attention, so MFU figures compare.
static double flops_per_token(const GPTConfig& c, size_t params, int T) {
    return 6.0 * (double)params + 6.0 * c.num_layers * (double)c.channels * T;
}

// Draws a token from the softmax of logits with one uniform number.
static int sample_token(const std::vector<float>& logits, double u) {
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max(mx, (double)x);
    for (float x : logits) sum += std::exp((double)x - mx);
    double acc = 0, target = u * sum;
    for (size_t i = 0; i < logits.size(); i++) {
        acc += std::exp((double)logits[i] - mx);
        if (acc > target) return (int)i;
    }
    return (int)logits.size() - 1;
}

static bool model_config(const TrainConfig& cfg, GPTConfig* mc, std::string* err);

// Everything a run holds, built in dependency order by setup(). Members are
// destroyed in reverse order, parallel modes before the model before the
// backend.
struct Trainer {
    TrainConfig cfg;
    int rank = 0;
    bool main_rank = true;
    std::unique_ptr<Backend> be;
    ProcessGrid grid;
    GPTConfig mc;
    int resume_step = -1;
    int T_local = 0, accum = 1;
    long long rows_per_step = 0;
    DataLoader train, val;
    bool use_val = false;
    Tokenizer tok;
    Layout lay;     // how the run splits over the ranks
    ModelStack s;   // this rank's model and parallel modes
    TrainState st;
    std::string threads;  // CPU threads per rank, for the settings
    Rng rng{1};
    MetricsLog metrics;
    OptimConfig oc;
    std::vector<int> full_in, full_tg, inputs, targets;  // host rows of one micro-batch
    std::string err;

    void setup(const ArgParser& parser);
    void build(Backend& b, ModelStack* stack);
    void check_memory();
    RunInfo run_info() const;
    void report_resume(const RunInfo& saved);
    CheckpointOwner owner() const;
    void export_weights();
    void read_micro_batch(DataLoader& dl, uint64_t first_row);
    StepMetrics train_step(int step);
    double validate();
    void sample();
    void checkpoint();
    void finish();
    bool due(int every, int step) const { return every > 0 && ((step + 1) % every == 0 || step + 1 == cfg.max_steps); }
};


void Trainer::setup(const ArgParser& parser) {
    check_same_flags(parser);
    threads = choose_threads();
    Recompute rc_mode = Recompute::none;
    parse_recompute(cfg.recompute, &rc_mode);  // the parser allows only its names
    cfg.recompute = recompute_name(rc_mode);   // "1" reads as "gelu" from here on
    setup_check(!cfg.resume || !cfg.output_dir.empty(), "flag -y: resuming needs an output directory (-o)");
    setup_check(cfg.total_batch == -1 || cfg.total_batch > 0,
                "flag -d: " + std::to_string(cfg.total_batch) + " tokens per step (give a positive count, or -1 for B*T)");
    setup_check(cfg.eps > 0, "flag --eps: AdamW's epsilon must be positive (0 divides by zero where v is 0)");
    if (main_rank && cfg.checkpoint_every > 0 && cfg.output_dir.empty())
        std::fprintf(stderr, "train_gpt: warning: -n %d without -o: no checkpoints will be written\n",
                     cfg.checkpoint_every);
    be.reset(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
    setup_check(be != nullptr, err);
    be->set_memory_budget((size_t)(cfg.memory_budget * 1024 * 1024));
    lay.world = dist_world_size();
    lay.pp = cfg.pp;
    lay.vpp = cfg.vpp;
    lay.tp = cfg.tp;
    lay.cp = cfg.cp;
    lay.sp = cfg.sp;
    lay.zero = cfg.zero;
    lay.B = cfg.B;
    lay.T = cfg.T;
    lay.total_batch = cfg.total_batch;
    parse_recompute(cfg.recompute, &lay.recompute);
    setup_check(check_world(lay, &err), err);
    setup_check(make_process_grid(cfg.tp, cfg.cp, cfg.pp, cfg.comm, *be, &grid, &err), err);

    // Model shape: from a resumed checkpoint, a model file, or sizes.
    if (cfg.resume) {
        resume_step = latest_checkpoint(cfg.output_dir);
        if (resume_step < 0 && main_rank)
            std::fprintf(stderr, "train_gpt: warning: -y 1: no complete checkpoint in %s, starting fresh\n",
                         cfg.output_dir.c_str());
    }
    bool ok = true;
    if (resume_step >= 0) {
        ok = read_checkpoint_config(cfg.output_dir, resume_step, &mc, &err);
        // A model named on the command line must be the checkpoint's.
        GPTConfig named;
        std::string why;
        if (ok && parser.given("model") && model_config(cfg, &named, &why) && named != mc) {
            ok = false;
            err = "flag -e: " + cfg.model + " is " + config_string(named) + ", but the checkpoint in " +
                  cfg.output_dir + " is " + config_string(mc) + " (resume with the checkpoint's model, or drop -e)";
        }
    } else {
        ok = model_config(cfg, &mc, &err);
    }
    setup_check(ok, err);
    setup_check(!(mc.llama() && !cfg.export_model.empty()),
                "flag --export-model: llm.c model files hold GPT-2 only, and the model is " + config_string(mc));
    // The layout against the model: sequence, heads, batch, pipeline.
    setup_check(check_layout(&lay, mc, &err), err);
    T_local = lay.T_local();
    cfg.total_batch = lay.total_batch;
    accum = lay.micro_batches();
    rows_per_step = cfg.total_batch / cfg.T;

    setup_check(train.open(cfg.train_data, cfg.T, mc.vocab_size, &err), err);
    use_val = !cfg.val_data.empty() && cfg.val_every > 0;
    setup_check(!use_val || val.open(cfg.val_data, cfg.T, mc.vocab_size, &err), err);
    // A Hugging Face -e DIR brings its tokenizer.json unless --tokenizer says otherwise.
    if (!parser.given("tokenizer") && is_hf_dir(cfg.model) && !hf_tokenizer_path(cfg.model).empty())
        cfg.tokenizer = hf_tokenizer_path(cfg.model);
    if (file_size(cfg.tokenizer) >= 0) setup_check(tok.load(cfg.tokenizer, &err), err);
    else tok.init_bytes();
    if (cfg.max_steps < 0) cfg.max_steps = (int)std::max<long long>(1, (long long)train.rows_per_epoch() / rows_per_step);

    // The parallel modes and the model, first counted, then built.
    check_memory();
    build(*be, &s);

    // Weights: a checkpoint, a model file, or the seeded initialisation.
    rng = Rng((uint64_t)cfg.seed);
    if (resume_step >= 0) {
        RunInfo saved;
        ok = load_checkpoint(cfg.output_dir, resume_step, *s.model, &st, &saved, &err);
        rng.state = st.rng_state;
        if (ok) report_resume(saved);
    } else if (is_hf_dir(cfg.model)) {
        ok = load_hf(cfg.model, *s.model, &err);
    } else if (spec_is_file(cfg.model)) {
        ok = load_model(cfg.model, *s.model, &err);
    } else {
        s.model->init_random((uint64_t)cfg.seed);
    }
    setup_check(ok, err);

    if (main_rank) {
        std::printf("+---------------------------+--------------------------------------------------+\n");
        for (const Option& o : parser.options())
            std::printf("| %-25s | %-48s |\n", o.name, option_value_string(o).c_str());
        std::printf("| %-25s | %-48s |\n", "threads per rank", threads.c_str());
        std::printf("+---------------------------+--------------------------------------------------+\n");
        std::printf("device %s, params %s, grads %s, activations %s; world %d = pp %d x dp %d x cp %d x tp %d%s, "
                    "ZeRO %d\n",
                    be->name(), dtype_name(s.model->precision().param), dtype_name(s.model->precision().grad),
                    dtype_name(s.model->precision().act), grid.world_size, grid.pp, grid.dp, grid.cp, grid.tp,
                    cfg.sp ? " (sequence parallel)" : "", cfg.zero);
        std::printf("model %s, %zu parameters (%zu on this rank's stage and tensor-parallel slice)\n",
                    config_string(mc).c_str(), s.model->table().file_params, s.model->table().params);
        if (grid.pp > 1)
            std::printf("pipeline: %d stages x %d chunk(s) of %d block(s), %s schedule, %d micro-batches per step\n",
                        grid.pp, cfg.vpp, mc.num_layers / (grid.pp * cfg.vpp), cfg.vpp > 1 ? "interleaved 1F1B" : "1F1B",
                        accum);
        std::printf("train data: %zu tokens in %zu shard(s); %lld rows/step = %d micro-step(s) x B=%d x dp=%d; "
                    "T=%d (%d per rank); %d steps\n",
                    train.total_tokens(), train.files().size(), rows_per_step, accum, cfg.B, grid.dp, cfg.T, T_local,
                    cfg.max_steps);
    }
    std::fflush(stdout);
    print_whole_line(memory_line("start", rank, *s.model, s.comm_bytes(), grid.pp_rank, grid.pp));

    ok = true;
    if (main_rank && !cfg.output_dir.empty()) {
        ok = make_dirs(cfg.output_dir, &err) &&
             metrics.open(cfg.output_dir + "/metrics.jsonl", resume_step >= 0 ? st.step : -1, &err);
        // What a killed run left: temporaries and checkpoints never finished.
        if (ok) {
            const int n = clean_checkpoints(cfg.output_dir, 0);
            if (n > 0) std::printf("removed %d leftover(s) of an interrupted run from %s\n", n, cfg.output_dir.c_str());
        }
    }
    setup_check(ok, err);
    if (!cfg.trace.empty()) {
        const std::string label = "rank " + std::to_string(rank) + ": stage " + std::to_string(grid.pp_rank) + ", dp " +
                                  std::to_string(grid.dp_rank) + ", cp " + std::to_string(grid.cp_rank) + ", tp " +
                                  std::to_string(grid.tp_rank);
        trace::start(cfg.trace, *grid.world, label, be.get());
    }

    oc.lr = cfg.lr;
    oc.beta1 = cfg.beta1;
    oc.beta2 = cfg.beta2;
    oc.eps = cfg.eps;
    oc.weight_decay = cfg.weight_decay;
    oc.grad_clip = cfg.grad_clip;
    oc.warmup_steps = cfg.warmup;
    oc.final_lr_frac = cfg.final_lr_frac;
    oc.max_steps = cfg.max_steps;
    const size_t BT = (size_t)cfg.B * cfg.T;
    full_in.resize(BT);
    full_tg.resize(BT);
    inputs.resize(BT);
    targets.resize(BT);
}

// The model and its parallel modes on backend b (llmc/parallel/layout.h).
void Trainer::build(Backend& b, ModelStack* stack) {
    RankGroups g{grid.tp_group.get(), grid.cp_group.get(), grid.dpcp_group.get(), grid.pp_group.get(),
                 grid.embed_group.get(), grid.cp_rank};
    bool ok = true;
    try {
        build_stack(b, mc, lay, g, stack);
    } catch (const std::invalid_argument& e) {
        ok = false;
        err = e.what();
    }
    setup_check(ok, err);
}

// What this rank will hold, counted on a backend that allocates nothing (the
// same buffers, so the memory line's accounting), against --memory-budget or
// the device's free memory: a clear line instead of the OOM killer.
void Trainer::check_memory() {
    MeasureBackend mb(*be);
    std::string held;
    {
        ModelStack counted;
        build(mb, &counted);
        held = memory_line("needed", rank, *counted.model, counted.comm_bytes(), grid.pp_rank, grid.pp);
    }
    const size_t need = mb.bytes_peak();
    const size_t budget = (size_t)(cfg.memory_budget * 1024 * 1024);
    const size_t avail = budget ? budget : be->free_memory(dist_local_size());
    std::string where = budget ? "--memory-budget " + human_bytes((double)budget)
                               : std::string("the ") + be->name() + " device's free memory, " + human_bytes((double)avail) +
                                     (std::string(be->name()) == "cpu" ? " (available RAM shared by the node's ranks)" : "");
    setup_check(avail == 0 || need <= avail, "out of memory: rank " + std::to_string(rank) + " would hold " +
                                                 human_bytes((double)need) + ", more than " + where + " [" +
                                                 held.substr(held.find(':') + 2) + "]");
}

// B rows from first_row on, this rank's tokens of them: whole rows, or this
// cp rank's chunks.
void Trainer::read_micro_batch(DataLoader& dl, uint64_t first_row) {
    if (!dl.read_rows(first_row, cfg.B, full_in.data(), full_tg.data(), &err)) fail(err);
    s.cp->shard_rows(full_in.data(), cfg.B, cfg.T, inputs.data());
    s.cp->shard_rows(full_tg.data(), cfg.B, cfg.T, targets.data());
}

// One optimizer step: the pipeline schedule runs the forwards and backwards
// of the step's micro-batches (without pp: forward, backward, one after the
// other), then the optimizer.
StepMetrics Trainer::train_step(int step) {
    auto t0 = std::chrono::steady_clock::now();
    trace::set_step(step);
    s.model->zero_grad();
    auto load = [&](int micro, const int** in, const int** tg) {
        // Rank r's micro-step k takes rows (k·dp + r)·B of the step's rows.
        uint64_t first = cfg.overfit ? (uint64_t)grid.dp_rank * cfg.B
                                     : st.rows_consumed + ((uint64_t)micro * grid.dp + grid.dp_rank) * cfg.B;
        read_micro_batch(train, first);
        *in = inputs.data();
        *tg = targets.data();
    };
    double loss = s.pipe->train_step(*s.model, load, cfg.B, T_local, 1.0 / (double)cfg.total_batch);
    // The mean over the global batch: the last stage's sum over the dp x cp
    // ranks (each a mean over its tokens), then to every stage.
    loss = grid.dpcp_group->host_all_reduce(loss, ReduceOp::Sum) / (accum * grid.dpcp_group->size());
    loss = s.pipe->sum_over_stages(grid.pp_rank == grid.pp - 1 ? loss : 0.0);
    double norm;
    {
        trace::Scope span("optimizer", "optimizer");
        norm = s.step(oc, step);
    }
    be->synchronize();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    st.rows_consumed += (uint64_t)rows_per_step;
    st.step = step + 1;

    StepMetrics m{};
    m.step = step;
    m.loss = loss;
    m.lr = lr_at(oc, step);
    m.grad_norm = norm;
    m.ms = ms;
    m.tokens = (unsigned long long)st.step * (unsigned long long)cfg.total_batch;
    m.tokens_per_s = cfg.total_batch / (ms / 1000.0);
    const double peak = backend_peak_flops(*be);
    m.mfu = peak > 0 ? flops_per_token(mc, s.model->table().file_params, cfg.T) * m.tokens_per_s / (peak * grid.world_size)
                     : 0;
    m.val_loss = -1;
    std::string comm_text = comm_summary(grid, &m.comm_json);
    if (main_rank) {
        std::printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s", step + 1, cfg.max_steps,
                    loss, m.lr, norm, ms, m.tokens_per_s);
        if (m.mfu > 0) std::printf(" | MFU %.1f%%", 100 * m.mfu);
        if (!comm_text.empty()) std::printf(" |%s", comm_text.c_str());
        std::printf("\n");
    }
    if (!std::isfinite(loss)) fail("loss is not finite at step " + std::to_string(step + 1));
    return m;
}

// Validation micro-batches are dealt round robin over the data-parallel
// ranks; every rank runs the same number of forwards (the extra ones are
// discarded), each through the whole pipeline.
double Trainer::validate() {
    trace::set_step(-1);
    double sum = 0, count = 0;
    for (int k0 = 0; k0 < cfg.val_steps; k0 += grid.dp) {
        int k = k0 + grid.dp_rank;
        bool mine = k < cfg.val_steps;
        read_micro_batch(val, (size_t)(mine ? k : 0) * cfg.B);
        double l = s.pipe->forward_only(*s.model, inputs.data(), targets.data(), cfg.B, T_local);
        if (mine) sum += l, count += 1;
    }
    sum = grid.dpcp_group->host_all_reduce(sum, ReduceOp::Sum);
    count = grid.dpcp_group->host_all_reduce(count, ReduceOp::Sum);
    reset_counts(grid);  // validation traffic is not step traffic
    if (main_rank) std::printf("val loss %.6f\n", sum / count);
    return sum / count;
}

// Every rank runs the same forwards (ZeRO-3 gathers need all of them) with
// the same RNG; rank 0 prints. Each forward runs on the whole window of T
// tokens (as llm.c does): causal attention keeps the padding after position
// t from mattering, and the shape stays one that sequence parallelism can
// split.
void Trainer::sample() {
    trace::set_step(-1);
    const int V = mc.vocab_size, T = cfg.T;
    std::vector<int> tokens(T, tok.eot() < V ? tok.eot() : 0), local(T / s.cp->size());
    std::vector<float> logits(V);
    std::string text;
    int n = std::min(cfg.gen_tokens, T - 1);
    for (int t = 1; t <= n; t++) {
        s.cp->shard_rows(tokens.data(), 1, T, local.data());
        s.pipe->forward_only(*s.model, local.data(), nullptr, 1, T / s.cp->size());
        s.pipe->logits_row(*s.model, 0, t - 1, logits.data());
        int next = sample_token(logits, rng.uniform());
        tokens[t] = next;
        text += tok.decode(next);
    }
    if (main_rank) std::printf("---- sample ----\n%s\n----------------\n", Tokenizer::printable(text).c_str());
    reset_counts(grid);
}

// Which elements this rank writes to checkpoints and exports: each has one owner.
CheckpointOwner Trainer::owner() const {
    return {grid.world.get(), grid.dpcp_group->rank() == 0, grid.tp_rank == 0};
}

RunInfo Trainer::run_info() const {
    RunInfo r;
    r.max_steps = cfg.max_steps;
    r.total_batch = cfg.total_batch;
    r.B = cfg.B;
    r.T = cfg.T;
    r.world = grid.world_size;
    r.pp = grid.pp;
    r.vpp = cfg.vpp;
    r.dp = grid.dp;
    r.cp = grid.cp;
    r.tp = grid.tp;
    r.sp = cfg.sp;
    r.zero = cfg.zero;
    r.recompute = cfg.recompute;
    return r;
}

// What a resume changes: the schedule (-x) or the batch (-d) deserve a
// warning; another layout trains the same model, which is worth a line.
void Trainer::report_resume(const RunInfo& saved) {
    if (!main_rank || saved.world == 0) return;  // nothing recorded (earlier format)
    const RunInfo now = run_info();
    if (saved.max_steps != now.max_steps)
        std::fprintf(stderr, "train_gpt: warning: resuming with -x %d where the checkpoint's run had -x %d: the learning-rate "
                             "schedule (warmup, cosine decay to the last step) changes from here on\n",
                     now.max_steps, saved.max_steps);
    if (saved.total_batch != now.total_batch)
        std::fprintf(stderr, "train_gpt: warning: resuming with -d %lld where the checkpoint's run had -d %lld: each step "
                             "now takes another number of rows of the data\n",
                     now.total_batch, saved.total_batch);
    if (saved.layout() != now.layout() || saved.T != now.T)
        std::printf("resume: checkpoint of step %d written at %s (T=%d); continuing at %s (T=%d)\n", st.step,
                    saved.layout().c_str(), saved.T, now.layout().c_str(), now.T);
}

// Every rank writes its own shard; rank 0 the index, then DONE.
void Trainer::checkpoint() {
    st.rng_state = rng.state;
    if (!save_checkpoint(cfg.output_dir, *s.model, owner(), st, run_info(), &err)) fail(err);
    if (main_rank) {
        std::printf("checkpoint: %s\n", checkpoint_dir(cfg.output_dir, st.step).c_str());
        if (cfg.keep_checkpoints > 0) clean_checkpoints(cfg.output_dir, cfg.keep_checkpoints);
    }
}

// The final weights as an llm.c model file, tensor by tensor: into -o (as
// model_SSSSSSSS.bin) and to --export-model; and as a Hugging Face directory
// to --export-hf.
void Trainer::export_weights() {
    const int version = s.model->precision().param == DType::BF16 ? 5 : 3;
    std::vector<std::string> paths;
    // llm.c's model files hold GPT-2 only; a Llama's weights are in the checkpoints.
    if (!cfg.output_dir.empty() && !s.model->config().llama()) {
        char name[32];
        std::snprintf(name, sizeof(name), "/model_%08d.bin", st.step);
        paths.push_back(cfg.output_dir + name);
    }
    if (!cfg.export_model.empty()) paths.push_back(cfg.export_model);
    for (const std::string& p : paths) {
        if (!export_model(p, *s.model, owner(), version, &err)) fail(err);
        if (main_rank) std::printf("model: %s\n", p.c_str());
    }
    if (!cfg.export_hf.empty()) {  // with the run's tokenizer.json, if it has one
        const bool json = cfg.tokenizer.size() > 5 && cfg.tokenizer.compare(cfg.tokenizer.size() - 5, 5, ".json") == 0;
        if (!export_hf(cfg.export_hf, *s.model, owner(), &err, json ? cfg.tokenizer : "")) fail(err);
        if (main_rank) std::printf("hugging face model: %s\n", cfg.export_hf.c_str());
    }
}

// End of the run: the replicas' agreement, the model export, the trace and
// its bubble, memory.
void Trainer::finish() {
    // Replicas of the tensor-parallel-replicated parameters must agree.
    if (grid.tp > 1) {
        double c = s.model->replicated_checksum();
        double hi = grid.tp_group->host_all_reduce(c, ReduceOp::Max);
        double lo = -grid.tp_group->host_all_reduce(-c, ReduceOp::Max);
        if (main_rank) std::printf("tp replicas of LayerNorm, wpe and row-parallel biases: %s\n", hi == lo ? "identical" : "DIFFER");
        if (hi != lo) fail("replicated parameters differ across the tensor-parallel group");
    }
    // The two copies of the tied embeddings (first and last stage) must agree.
    if (grid.pp > 1 && mc.tied) {
        const bool same = s.pipe->tied_embeddings_agree(*s.model);
        if (main_rank) std::printf("pp tied embeddings (first and last stage): %s\n", same ? "identical" : "DIFFER");
        if (!same) fail("the tied embeddings of the first and the last pipeline stage differ");
    }
    export_weights();
    if (!cfg.trace.empty()) {
        std::vector<double> bubble = s.pipe->measured_bubble();
        if (main_rank && grid.pp > 1 && !bubble.empty()) {
            std::printf("pipeline bubble (idle / busy, steps 2..%d, from the trace):", cfg.max_steps);
            for (size_t s = 0; s < bubble.size(); s++) std::printf(" stage %zu %.3f", s, bubble[s]);
            std::printf("; formula (pp-1)/(m*vpp) = %.3f\n", s.pipe->bubble_formula());
        }
        bool ok = trace::finish(*grid.world, &err);
        if (!ok) fail(err);
        if (main_rank) std::printf("trace: %s\n", cfg.trace.c_str());
    }
    print_whole_line(memory_line("end", rank, *s.model, s.comm_bytes(), grid.pp_rank, grid.pp));
}

// The model shape named by -e: sizes, a descriptor, a model file's header,
// or a Hugging Face directory's config.json.
static bool model_config(const TrainConfig& cfg, GPTConfig* mc, std::string* err) {
    if (is_hf_dir(cfg.model)) return read_hf_config(cfg.model, mc, err);
    if (spec_is_file(cfg.model)) {
        int version;
        return read_model_header(cfg.model, mc, &version, err);
    }
    if (parse_model_spec(cfg.model, mc, err)) return true;
    *err = "flag -e: " + *err;
    return false;
}

// --plan: the layouts of this model on a planned world, without training
// (rank 0 alone; llmc/plan/planner.h).
static int plan_main(const ArgParser& parser, const TrainConfig& cfg) {
    std::string err;
    PlanRequest r;
    GPTConfig mc;
    bool ok = model_config(cfg, &mc, &err) && load_hardware(cfg.hardware, &r.hw, &err);
    if (ok) {
        r.mode = cfg.plan;
        if (cfg.gpus_per_node > 0) r.hw.gpus_per_node = cfg.gpus_per_node;
        Layout& b = r.base;
        b.world = cfg.world > 0 ? cfg.world : dist_world_size();
        b.pp = cfg.pp, b.vpp = cfg.vpp, b.tp = cfg.tp, b.cp = cfg.cp, b.sp = cfg.sp, b.zero = cfg.zero;
        b.B = cfg.B, b.T = cfg.T, b.total_batch = cfg.total_batch;
        parse_recompute(cfg.recompute, &b.recompute);
        if (b.total_batch < 0) b.total_batch = (long long)b.B * b.T * std::max(1, b.world / (b.pp * b.tp * b.cp));
        r.fix_pp = parser.given("pp"), r.fix_vpp = parser.given("vpp"), r.fix_tp = parser.given("tp");
        r.fix_cp = parser.given("cp"), r.fix_sp = parser.given("sp"), r.fix_zero = parser.given("zero");
        r.fix_B = parser.given("batch-size"), r.fix_recompute = parser.given("recompute");
        r.device = cfg.device == "auto" ? r.hw.device : cfg.device;
        r.dtype = cfg.dtype == "auto" ? r.hw.dtype : cfg.dtype;
        r.json_path = cfg.plan_json;
        r.attention = cfg.plan_attention;
        r.top = cfg.plan_top;
        ok = dist_world_rank() != 0 || run_planner(mc, r, &err);
    }
    setup_check(ok, err);
    dist_finalize();
    return 0;
}

// --calibrate: measure this machine (its device and the links between the
// ranks of this launch) and write a hardware profile.
static int calibrate_main(const TrainConfig& cfg) {
    std::string err;
    GPTConfig mc;
    setup_check(model_config(cfg, &mc, &err), err);
    std::unique_ptr<Backend> be(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
    setup_check(be != nullptr, err);
    choose_threads();
    ProcessGrid grid;
    setup_check(make_process_grid(1, 1, 1, cfg.comm, *be, &grid, &err), err);
    Hardware hw;
    bool ok = calibrate(*be, grid, mc, cfg.B, cfg.T, cfg.calibrate, &hw, &err);
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

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    std::unique_ptr<Trainer> run(new Trainer);  // released before MPI ends
    Trainer& r = *run;
    r.rank = dist_world_rank();
    r.main_rank = r.rank == 0;
    ArgParser parser("train_gpt", "Trains GPT-2 on llm.c token shards (CPU or CUDA backend; mpirun for the parallel modes).");
    add_train_options(parser, r.cfg);
    bool help = false;
    std::string err;
    setup_check(parser.parse(argc, argv, &help, &err), err);
    if (help) {
        if (r.main_rank) std::printf("%s", parser.usage().c_str());
        dist_finalize();
        return 0;
    }
    if (!r.cfg.plan.empty()) return plan_main(parser, r.cfg);
    if (!r.cfg.calibrate.empty()) return calibrate_main(r.cfg);
    try {
        const TrainConfig& cfg = r.cfg;
        r.setup(parser);
        for (int step = r.st.step; step < cfg.max_steps; step++) {
            StepMetrics m = r.train_step(step);
            if (r.use_val && r.due(cfg.val_every, step)) m.val_loss = r.validate();
            if (r.main_rank && !r.metrics.write(m, &err)) fail(err);
            if (r.due(cfg.sample_every, step)) r.sample();
            if (!cfg.output_dir.empty() && r.due(cfg.checkpoint_every, step)) r.checkpoint();
            std::fflush(stdout);
        }
        r.finish();
        run.reset();
    } catch (const std::bad_alloc&) {
        fail(r.cfg.memory_budget > 0
                 ? "out of memory within --memory-budget " + std::to_string((long long)r.cfg.memory_budget) + " MiB"
                 : "out of memory");
    } catch (const std::exception& e) {
        fail(e.what());
    }
    dist_finalize();
    return 0;
}
