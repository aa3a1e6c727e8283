// train_gpt.cu: the trainer's entry point. Parses the flags, builds the
// process grid, the backend and the model, then runs the training loop:
// gradient accumulation up to the total batch, data parallel / ZeRO through
// llmc/data_parallel.cpp, AdamW, validation, samples, checkpoints, logs.
// Built by nvcc's host compiler with the CUDA backend when nvcc is present,
// by g++ otherwise; the code is the same either way: everything
// device-specific is behind the Backend and Comm interfaces.
//
// Launch: ./train_gpt (one process) or mpirun -np N ./train_gpt (data
// parallel over N ranks; the global batch, and so the run, is the same).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/backends.h"
#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/context_parallel.h"
#include "llmc/data_parallel.h"
#include "llmc/dataloader.h"
#include "llmc/fileio.h"
#include "llmc/gpt.h"
#include "llmc/metrics.h"
#include "llmc/model_io.h"
#include "llmc/optimizer.h"
#include "llmc/process_grid.h"
#include "llmc/rng.h"
#include "llmc/tensor_parallel.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"

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

static std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    char s[32];
    std::snprintf(s, sizeof(s), "%.1f %s", b, units[u]);
    return s;
}

// Approximate training FLOPs per token (PaLM appendix B): 6 per weight plus
// attention's 12·L·C·T.
static double flops_per_token(const GPTConfig& c, size_t params, int T) {
    return 6.0 * (double)params + 12.0 * c.num_layers * (double)c.channels * T;
}

// One line per rank: the bytes it holds, by kind (machine-readable).
static void print_memory(const char* when, int rank, GPT& model, const DataParallel& dp, size_t cp_bytes) {
    size_t bytes[6] = {};  // params grads master optimizer activations comm
    const char* names[6] = {"params", "grads", "master", "optimizer", "activations", "comm"};
    for (const BufferInfo& b : model.buffers())
        for (int k = 0; k < 5; k++)
            if (b.group == names[k] || (k == 4 && b.group == "scratch")) bytes[k] += b.bytes;
    bytes[5] = dp.comm_buffer_bytes() + cp_bytes;
    std::string line = "memory[" + std::to_string(rank) + "] " + when + ":";
    for (int k = 0; k < 6; k++) line += " " + std::string(names[k]) + "=" + std::to_string(bytes[k]);
    line += " layer_activations=" + std::to_string(model.layer_activation_bytes());
    line += " total=" + human_bytes((double)model.backend().bytes_in_use()) +
            " peak=" + human_bytes((double)model.backend().bytes_peak());
    std::printf("%s\n", line.c_str());
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

// Every rank runs the same forwards (ZeRO-3 gathers need all of them) with
// the same RNG; rank 0 prints.
// Each forward runs on the whole window of T tokens (as llm.c does): causal
// attention keeps the padding after position t from mattering, and the
// shape stays one that sequence parallelism can split.
static void print_sample(GPT& model, const Tokenizer& tok, Rng& rng, int gen_tokens, int T, ContextParallel& cp,
                         bool print) {
    const int V = model.config().vocab_size;
    std::vector<int> tokens(T, tok.eot() < V ? tok.eot() : 0), local(T / cp.size());
    std::vector<float> logits(V);
    std::string text;
    int n = std::min(gen_tokens, T - 1);
    for (int t = 1; t <= n; t++) {
        cp.shard_rows(tokens.data(), 1, T, local.data());
        model.forward(local.data(), nullptr, 1, T / cp.size());
        model.logits_row(0, t - 1, logits.data(), DType::F32);
        int next = sample_token(logits, rng.uniform());
        tokens[t] = next;
        text += tok.decode(next);
    }
    if (print) std::printf("---- sample ----\n%s\n----------------\n", Tokenizer::printable(text).c_str());
}

static void reset_counts(ProcessGrid& g) {
    for (Comm* c : {g.world.get(), g.dpcp_group.get(), g.tp_group.get(), g.cp_group.get()}) c->counts().reset();
}

// Communication of the last step: "group kind bytes" for every kind used.
static std::string comm_summary(ProcessGrid& g, std::string* json) {
    std::string text;
    *json = "{";
    Comm* groups[] = {g.dpcp_group.get(), g.tp_group.get(), g.cp_group.get()};
    const char* names[] = {"dp", "tp", "cp"};
    bool first = true;
    for (int i = 0; i < 3; i++) {
        CommCounts& c = groups[i]->counts();
        if (groups[i]->size() <= 1) continue;
        for (int k = 0; k < (int)CommKind::count; k++) {
            if (!c.calls[k]) continue;
            std::string key = std::string(names[i]) + "_" + comm_kind_name((CommKind)k);
            *json += (first ? "" : ", ") + ("\"" + key + "\": {\"calls\": " + std::to_string(c.calls[k]) +
                                           ", \"bytes\": " + std::to_string(c.bytes[k]) + "}");
            text += " " + key + " " + human_bytes((double)c.bytes[k]);
            first = false;
        }
        c.reset();
    }
    *json += "}";
    return text;
}

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    const int rank = dist_world_rank();
    const bool main_rank = rank == 0;
    TrainConfig cfg;
    ArgParser parser("train_gpt", "Trains GPT-2 on llm.c token shards (CPU or CUDA backend; mpirun for data parallel).");
    add_train_options(parser, cfg);
    bool help = false;
    std::string err;
    setup_check(parser.parse(argc, argv, &help, &err), err);
    if (help) {
        if (main_rank) std::printf("%s", parser.usage().c_str());
        dist_finalize();
        return 0;
    }
    try {
        setup_check(!cfg.resume || !cfg.output_dir.empty(), "flag -y: resuming needs an output directory (-o)");
        std::unique_ptr<Backend> be(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
        setup_check(be != nullptr, err);
        be->set_memory_budget((size_t)(cfg.memory_budget * 1024 * 1024));
        const int world = dist_world_size();
        setup_check(cfg.tp <= world, "flag --tp: " + std::to_string(cfg.tp) + " is larger than the world size " +
                                         std::to_string(world));
        setup_check(cfg.tp * cfg.cp <= world, "flag --cp: tp*cp = " + std::to_string(cfg.tp * cfg.cp) +
                                                  " is larger than the world size " + std::to_string(world));
        setup_check(world % (cfg.tp * cfg.cp) == 0, std::string(cfg.cp > 1 ? "flag --cp" : "flag --tp") + ": world size " +
                                                        std::to_string(world) + " is not a multiple of tp*cp = " +
                                                        std::to_string(cfg.tp * cfg.cp));
        setup_check(!cfg.sp || cfg.tp > 1, "flag --sp: sequence parallel needs --tp > 1");
        ProcessGrid grid;
        setup_check(make_process_grid(cfg.tp, cfg.cp, cfg.comm, *be, &grid, &err), err);
        // Rows of the batch are split over the dp ranks; gradients and ZeRO
        // shards over the dp x cp group (cp ranks share rows, not tokens).
        const int dp = grid.dp, dp_rank = grid.dp_rank;
        const int shards = grid.dpcp_group->size(), shard_rank = grid.dpcp_group->rank();
        TensorParallel tpar(*grid.tp_group, cfg.sp != 0);

        // Model shape: from a resumed checkpoint, a model file, or sizes.
        GPTConfig mc;
        int resume_step = -1;
        if (cfg.resume) {
            resume_step = latest_checkpoint(cfg.output_dir);
            if (resume_step < 0 && main_rank) std::printf("resume: no checkpoint in %s, starting fresh\n", cfg.output_dir.c_str());
        }
        bool ok = true;
        if (resume_step >= 0) {
            ok = read_checkpoint_config(cfg.output_dir, resume_step, &mc, &err);
        } else if (spec_is_file(cfg.model)) {
            int version;
            ok = read_model_header(cfg.model, &mc, &version, &err);
        } else if (!parse_model_spec(cfg.model, &mc, &err)) {
            ok = false;
            err = "flag -e: " + err;
        }
        setup_check(ok, err);
        setup_check(cfg.T <= mc.max_seq_len, "flag -t: T=" + std::to_string(cfg.T) + " exceeds the model's maxT=" +
                                                 std::to_string(mc.max_seq_len));
        setup_check(mc.num_heads % cfg.tp == 0, "flag --tp: " + std::to_string(cfg.tp) + " does not divide the " +
                                                    std::to_string(mc.num_heads) + " attention heads");
        setup_check(cfg.T % (2 * cfg.cp) == 0, "flag --cp: the sequence length T=" + std::to_string(cfg.T) +
                                                   " does not cut into 2*cp = " + std::to_string(2 * cfg.cp) + " chunks");
        const int T_local = cfg.T / cfg.cp;
        setup_check(!cfg.sp || T_local % cfg.tp == 0, "flag --sp: the sequence length T/cp=" + std::to_string(T_local) +
                                                          " does not divide by --tp " + std::to_string(cfg.tp));
        const long long rows_per_micro = (long long)cfg.B * dp;  // rows of one micro-step over all ranks
        if (cfg.total_batch < 0) cfg.total_batch = rows_per_micro * cfg.T;
        setup_check(cfg.total_batch % (rows_per_micro * cfg.T) == 0,
                    "flag -d: total batch " + std::to_string(cfg.total_batch) + " tokens is not a multiple of B*T*dp = " +
                        std::to_string(rows_per_micro * cfg.T) + " (B=" + std::to_string(cfg.B) +
                        ", T=" + std::to_string(cfg.T) + ", dp=" + std::to_string(dp) + ")");
        const int accum = (int)(cfg.total_batch / (rows_per_micro * cfg.T));
        const long long rows_per_step = cfg.total_batch / cfg.T;

        DataLoader train;
        setup_check(train.open(cfg.train_data, cfg.T, mc.vocab_size, &err), err);
        DataLoader val;
        bool use_val = !cfg.val_data.empty() && cfg.val_every > 0;
        setup_check(!use_val || val.open(cfg.val_data, cfg.T, mc.vocab_size, &err), err);
        Tokenizer tok;
        if (file_size(cfg.tokenizer) >= 0) setup_check(tok.load(cfg.tokenizer, &err), err);
        else tok.init_bytes();
        if (cfg.max_steps < 0) cfg.max_steps = (int)std::max<long long>(1, (long long)train.rows_per_epoch() / rows_per_step);

        ContextParallel cpar(*grid.cp_group, *be, cfg.B, T_local, mc.num_heads / cfg.tp, mc.channels / mc.num_heads);
        GPT model(be.get(), mc, cfg.B, T_local, cfg.recompute != 0, Sharding::for_zero(cfg.zero, shards, shard_rank),
                  &tpar, &cpar);
        model.set_positions(ContextParallel::positions(cfg.T, cfg.cp, grid.cp_rank));
        DataParallel dpar(model, *grid.dpcp_group, cfg.zero, grid.tp_group.get());
        TrainState st;
        Rng rng((uint64_t)cfg.seed);
        if (resume_step >= 0) {
            ok = load_checkpoint(cfg.output_dir, resume_step, model, &st, &err);
            rng.state = st.rng_state;
        } else if (spec_is_file(cfg.model)) {
            ok = load_model(cfg.model, model, &err);
        } else {
            model.init_random((uint64_t)cfg.seed);
        }
        setup_check(ok, err);

        if (main_rank) {
            std::printf("+---------------------------+--------------------------------------------------+\n");
            for (const Option& o : parser.options())
                std::printf("| %-25s | %-48s |\n", o.name, option_value_string(o).c_str());
            std::printf("+---------------------------+--------------------------------------------------+\n");
            std::printf("device %s, params %s, grads %s, activations %s; world %d = dp %d x cp %d x tp %d%s, ZeRO %d\n",
                        be->name(), dtype_name(model.precision().param), dtype_name(model.precision().grad),
                        dtype_name(model.precision().act), grid.world_size, grid.dp, grid.cp, grid.tp,
                        cfg.sp ? " (sequence parallel)" : "", cfg.zero);
            std::printf("model %s, %zu parameters (%zu on each tensor-parallel rank)\n", config_string(mc).c_str(),
                        model.table().file_params, model.table().params);
            std::printf("train data: %zu tokens in %zu shard(s); %lld rows/step = %d micro-step(s) x B=%d x dp=%d; "
                        "T=%d (%d per rank); %d steps\n",
                        train.total_tokens(), train.files().size(), rows_per_step, accum, cfg.B, dp, cfg.T, T_local,
                        cfg.max_steps);
        }
        std::fflush(stdout);
        print_memory("start", rank, model, dpar, cpar.size() > 1 ? cpar.buffer_bytes() : 0);

        MetricsLog metrics;
        if (main_rank && !cfg.output_dir.empty()) {
            ok = make_dirs(cfg.output_dir, &err) &&
                 metrics.open(cfg.output_dir + "/metrics.jsonl", resume_step >= 0 ? st.step : -1, &err);
        }
        setup_check(ok, err);

        OptimConfig oc;
        oc.lr = cfg.lr;
        oc.beta1 = cfg.beta1;
        oc.beta2 = cfg.beta2;
        oc.eps = cfg.eps;
        oc.weight_decay = cfg.weight_decay;
        oc.grad_clip = cfg.grad_clip;
        oc.warmup_steps = cfg.warmup;
        oc.final_lr_frac = cfg.final_lr_frac;
        oc.max_steps = cfg.max_steps;

        const double peak = backend_peak_flops(*be);
        const double fpt = flops_per_token(mc, model.table().file_params, cfg.T);
        const int BT = cfg.B * cfg.T;
        std::vector<int> full_in(BT), full_tg(BT), inputs(BT), targets(BT);
        // Rows for this rank: whole rows, or this cp rank's chunks of them.
        auto read = [&](DataLoader& dl, uint64_t first_row) {
            if (!dl.read_rows(first_row, cfg.B, full_in.data(), full_tg.data(), &err)) fail(err);
            cpar.shard_rows(full_in.data(), cfg.B, cfg.T, inputs.data());
            cpar.shard_rows(full_tg.data(), cfg.B, cfg.T, targets.data());
        };
        for (int step = st.step; step < cfg.max_steps; step++) {
            auto t0 = std::chrono::steady_clock::now();
            model.zero_grad();
            double loss = 0;
            for (int micro = 0; micro < accum; micro++) {
                // Rank r's micro-step k takes rows (k·dp + r)·B of the step's rows.
                uint64_t first = cfg.overfit ? (uint64_t)dp_rank * cfg.B
                                             : st.rows_consumed + ((uint64_t)micro * dp + dp_rank) * cfg.B;
                read(train, first);
                loss += model.forward(inputs.data(), targets.data(), cfg.B, T_local, 1.0 / (double)cfg.total_batch);
                dpar.set_last_micro_step(micro == accum - 1);
                model.backward();
            }
            loss = grid.dpcp_group->host_all_reduce(loss, ReduceOp::Sum) / (accum * shards);
            double norm = dpar.step(oc, step);
            be->synchronize();
            double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            st.rows_consumed += (uint64_t)rows_per_step;
            st.step = step + 1;
            bool last = step + 1 == cfg.max_steps;

            StepMetrics m{};
            m.step = step;
            m.loss = loss;
            m.lr = lr_at(oc, step);
            m.grad_norm = norm;
            m.ms = ms;
            m.tokens = (unsigned long long)st.step * (unsigned long long)cfg.total_batch;
            m.tokens_per_s = cfg.total_batch / (ms / 1000.0);
            m.mfu = peak > 0 ? fpt * m.tokens_per_s / (peak * grid.world_size) : 0;
            m.val_loss = -1;
            std::string comm_json, comm_text = comm_summary(grid, &comm_json);
            m.comm_json = comm_json;
            if (main_rank) {
                std::printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s", step + 1,
                            cfg.max_steps, loss, m.lr, norm, ms, m.tokens_per_s);
                if (m.mfu > 0) std::printf(" | MFU %.1f%%", 100 * m.mfu);
                if (!comm_text.empty()) std::printf(" |%s", comm_text.c_str());
                std::printf("\n");
            }
            if (!std::isfinite(loss)) fail("loss is not finite at step " + std::to_string(step + 1));

            if (use_val && ((step + 1) % cfg.val_every == 0 || last)) {
                // Validation micro-batches are dealt round robin over the
                // data-parallel ranks; every rank runs the same number of
                // forwards (the extra ones are discarded).
                double sum = 0, count = 0;
                for (int k0 = 0; k0 < cfg.val_steps; k0 += dp) {
                    int k = k0 + dp_rank;
                    bool mine = k < cfg.val_steps;
                    read(val, (size_t)(mine ? k : 0) * cfg.B);
                    double l = model.forward(inputs.data(), targets.data(), cfg.B, T_local);
                    if (mine) sum += l, count += 1;
                }
                sum = grid.dpcp_group->host_all_reduce(sum, ReduceOp::Sum);
                count = grid.dpcp_group->host_all_reduce(count, ReduceOp::Sum);
                m.val_loss = sum / count;
                reset_counts(grid);  // validation traffic is not step traffic
                if (main_rank) std::printf("val loss %.6f\n", m.val_loss);
            }
            if (main_rank) metrics.write(m);
            if (cfg.sample_every > 0 && ((step + 1) % cfg.sample_every == 0 || last)) {
                print_sample(model, tok, rng, cfg.gen_tokens, cfg.T, cpar, main_rank);
                reset_counts(grid);
            }
            if (cfg.checkpoint_every > 0 && !cfg.output_dir.empty() && ((step + 1) % cfg.checkpoint_every == 0 || last)) {
                st.rng_state = rng.state;
                const Precision& p = model.precision();
                const size_t P = model.table().file_params;
                std::vector<char> w(P * dtype_size(model.weights_dtype())), mm(P * dtype_size(p.opt)), vv(P * dtype_size(p.opt));
                const bool whole = shard_rank == 0, repl = grid.tp_rank == 0;  // one owner per element
                gather_file_order(model, *grid.world, model.weights(), model.weights_sharded(), model.weights_dtype(),
                                  w.data(), model.weights_dtype(), whole, repl);
                gather_file_order(model, *grid.world, model.adam_m(), model.sharding().optimizer, p.opt, mm.data(), p.opt,
                                  whole, repl);
                gather_file_order(model, *grid.world, model.adam_v(), model.sharding().optimizer, p.opt, vv.data(), p.opt,
                                  whole, repl);
                ok = true;
                if (main_rank) {
                    CheckpointData d{mc, w.data(), model.weights_dtype(), mm.data(), vv.data(), p.opt,
                                     p.param == DType::BF16 ? 5 : 3};
                    ok = write_checkpoint(cfg.output_dir, d, st, &err);
                    if (ok) std::printf("checkpoint: %s\n", checkpoint_path(cfg.output_dir, "state", st.step).c_str());
                }
                if (!dist_all_ok(ok, err, &err)) fail(err);
            }
            std::fflush(stdout);
        }
        // Replicas of the tensor-parallel-replicated parameters must agree.
        if (grid.tp > 1) {
            double c = model.replicated_checksum();
            double hi = grid.tp_group->host_all_reduce(c, ReduceOp::Max);
            double lo = -grid.tp_group->host_all_reduce(-c, ReduceOp::Max);
            if (main_rank) std::printf("tp replicas of LayerNorm, wpe and row-parallel biases: %s\n", hi == lo ? "identical" : "DIFFER");
            if (hi != lo) fail("replicated parameters differ across the tensor-parallel group");
        }
        print_memory("end", rank, model, dpar, cpar.size() > 1 ? cpar.buffer_bytes() : 0);
    } catch (const std::bad_alloc&) {
        fail(cfg.memory_budget > 0 ? "out of memory within --memory-budget " + std::to_string((long long)cfg.memory_budget) + " MiB"
                                   : "out of memory");
    } catch (const std::exception& e) {
        fail(e.what());
    }
    dist_finalize();
    return 0;
}
