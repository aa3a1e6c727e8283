// train_gpt.cu: the trainer's entry point. Parses the flags, builds the
// backend and the model, then runs the training loop: gradient accumulation
// up to the total batch, AdamW, validation, samples, checkpoints, logs.
// Built by nvcc when it is present (CUDA backend included), by g++ otherwise;
// the code is the same either way: everything device-specific is behind the
// Backend interface.
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
#include "llmc/dataloader.h"
#include "llmc/fileio.h"
#include "llmc/gpt.h"
#include "llmc/metrics.h"
#include "llmc/model_io.h"
#include "llmc/optimizer.h"
#include "llmc/rng.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"

// Every error ends the run with one line and a non-zero exit.
[[noreturn]] static void fail(const std::string& msg) {
    std::fprintf(stderr, "train_gpt: error: %s\n", msg.c_str());
    std::exit(1);
}

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

static void print_memory_report(GPT& model) {
    std::printf("memory (bytes held by the backend):\n");
    std::vector<std::pair<std::string, size_t>> groups;
    for (const BufferInfo& b : model.buffers()) {
        bool found = false;
        for (auto& g : groups)
            if (g.first == b.group) g.second += b.bytes, found = true;
        if (!found) groups.push_back({b.group, b.bytes});
    }
    for (auto& g : groups) std::printf("  %-12s %12zu  (%s)\n", g.first.c_str(), g.second, human_bytes((double)g.second).c_str());
    std::printf("  %-12s %12zu  (%s)\n", "total", model.backend().bytes_in_use(),
                human_bytes((double)model.backend().bytes_in_use()).c_str());
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

static void print_sample(GPT& model, const Tokenizer& tok, Rng& rng, int gen_tokens, int T) {
    const int V = model.config().vocab_size;
    std::vector<int> tokens(T, tok.eot() < V ? tok.eot() : 0);
    std::vector<float> logits(V);
    std::string text;
    int n = std::min(gen_tokens, T - 1);
    for (int t = 1; t <= n; t++) {
        model.forward(tokens.data(), nullptr, 1, t);
        model.logits_row(0, t - 1, logits.data(), DType::F32);
        int next = sample_token(logits, rng.uniform());
        tokens[t] = next;
        text += tok.decode(next);
    }
    std::printf("---- sample ----\n%s\n----------------\n", Tokenizer::printable(text).c_str());
}

int main(int argc, char** argv) {
    TrainConfig cfg;
    ArgParser parser("train_gpt", "Trains GPT-2 on llm.c token shards (CPU or CUDA backend).");
    add_train_options(parser, cfg);
    bool help = false;
    std::string err;
    if (!parser.parse(argc, argv, &help, &err)) fail(err);
    if (help) {
        std::printf("%s", parser.usage().c_str());
        return 0;
    }
    try {
        if (cfg.zero != 0) fail("flag -z: ZeRO stage " + std::to_string(cfg.zero) + " needs data parallel ranks (mpirun); a single process runs stage 0");
        if (cfg.resume && cfg.output_dir.empty()) fail("flag -y: resuming needs an output directory (-o)");

        std::unique_ptr<Backend> be(make_backend(cfg.device, cfg.dtype, &err));
        if (!be) fail(err);

        // Model shape: from a resumed checkpoint, a model file, or sizes.
        GPTConfig mc;
        int resume_step = -1;
        if (cfg.resume) {
            resume_step = latest_checkpoint(cfg.output_dir);
            if (resume_step < 0) std::printf("resume: no checkpoint in %s, starting fresh\n", cfg.output_dir.c_str());
        }
        if (resume_step >= 0) {
            if (!read_checkpoint_config(cfg.output_dir, resume_step, &mc, &err)) fail(err);
        } else if (spec_is_file(cfg.model)) {
            int version;
            if (!read_model_header(cfg.model, &mc, &version, &err)) fail(err);
        } else if (!parse_model_spec(cfg.model, &mc, &err)) {
            fail("flag -e: " + err);
        }
        if (cfg.T > mc.max_seq_len)
            fail("flag -t: T=" + std::to_string(cfg.T) + " exceeds the model's maxT=" + std::to_string(mc.max_seq_len));
        const long long BT = (long long)cfg.B * cfg.T;
        if (cfg.total_batch < 0) cfg.total_batch = BT;
        if (cfg.total_batch % BT != 0)
            fail("flag -d: total batch " + std::to_string(cfg.total_batch) + " tokens is not a multiple of B*T = " +
                 std::to_string(BT));
        const int accum = (int)(cfg.total_batch / BT);
        const long long rows_per_step = cfg.total_batch / cfg.T;

        DataLoader train;
        if (!train.open(cfg.train_data, cfg.T, mc.vocab_size, &err)) fail(err);
        DataLoader val;
        if (!cfg.val_data.empty() && cfg.val_every > 0 && !val.open(cfg.val_data, cfg.T, mc.vocab_size, &err)) fail(err);
        Tokenizer tok;
        if (file_size(cfg.tokenizer) >= 0) {
            if (!tok.load(cfg.tokenizer, &err)) fail(err);
        } else {
            tok.init_bytes();
        }
        if (cfg.max_steps < 0) cfg.max_steps = (int)std::max<long long>(1, (long long)train.rows_per_epoch() / rows_per_step);

        GPT model(be.get(), mc, cfg.B, cfg.T, cfg.recompute != 0);
        TrainState st;
        Rng rng((uint64_t)cfg.seed);
        if (resume_step >= 0) {
            if (!load_checkpoint(cfg.output_dir, resume_step, model, &st, &err)) fail(err);
            rng.state = st.rng_state;
        } else if (spec_is_file(cfg.model)) {
            if (!load_model(cfg.model, model, &err)) fail(err);
        } else {
            model.init_random((uint64_t)cfg.seed);
        }

        // Startup table.
        std::printf("+---------------------------+--------------------------------------------------+\n");
        for (const Option& o : parser.options())
            std::printf("| %-25s | %-48s |\n", o.name, option_value_string(o).c_str());
        std::printf("+---------------------------+--------------------------------------------------+\n");
        std::printf("device %s, params %s, grads %s, activations %s\n", be->name(), dtype_name(model.precision().param),
                    dtype_name(model.precision().grad), dtype_name(model.precision().act));
        std::printf("model %s, %zu parameters\n", config_string(mc).c_str(), model.table().total);
        std::printf("train data: %zu tokens in %zu shard(s); %lld rows/step, %d micro-step(s) of B=%d T=%d; %d steps\n",
                    train.total_tokens(), train.files().size(), rows_per_step, accum, cfg.B, cfg.T, cfg.max_steps);
        print_memory_report(model);

        MetricsLog metrics;
        if (!cfg.output_dir.empty()) {
            if (!make_dirs(cfg.output_dir, &err)) fail(err);
            if (!metrics.open(cfg.output_dir + "/metrics.jsonl", resume_step >= 0 ? st.step : -1, &err)) fail(err);
        }

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
        const double fpt = flops_per_token(mc, model.table().total, cfg.T);
        std::vector<int> inputs((size_t)BT), targets((size_t)BT);
        for (int step = st.step; step < cfg.max_steps; step++) {
            auto t0 = std::chrono::steady_clock::now();
            model.zero_grad();
            double loss = 0;
            for (int micro = 0; micro < accum; micro++) {
                uint64_t first = cfg.overfit ? 0 : st.rows_consumed + (uint64_t)micro * cfg.B;
                if (!train.read_rows(first, cfg.B, inputs.data(), targets.data(), &err)) fail(err);
                loss += model.forward(inputs.data(), targets.data(), cfg.B, cfg.T, 1.0 / (double)cfg.total_batch);
                model.backward();
            }
            loss /= accum;
            double norm = adamw_step(model, oc, step);
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
            m.mfu = peak > 0 ? fpt * m.tokens_per_s / peak : 0;
            m.val_loss = -1;
            std::printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s", step + 1,
                        cfg.max_steps, loss, m.lr, norm, ms, m.tokens_per_s);
            if (m.mfu > 0) std::printf(" | MFU %.1f%%", 100 * m.mfu);
            std::printf("\n");
            if (!std::isfinite(loss)) fail("loss is not finite at step " + std::to_string(step + 1));

            if (val.is_open() && ((step + 1) % cfg.val_every == 0 || last)) {
                double vl = 0;
                for (int k = 0; k < cfg.val_steps; k++) {
                    if (!val.read_rows((size_t)k * cfg.B, cfg.B, inputs.data(), targets.data(), &err)) fail(err);
                    vl += model.forward(inputs.data(), targets.data(), cfg.B, cfg.T);
                }
                m.val_loss = vl / cfg.val_steps;
                std::printf("val loss %.6f\n", m.val_loss);
            }
            metrics.write(m);
            if (cfg.sample_every > 0 && ((step + 1) % cfg.sample_every == 0 || last))
                print_sample(model, tok, rng, cfg.gen_tokens, cfg.T);
            if (cfg.checkpoint_every > 0 && !cfg.output_dir.empty() &&
                ((step + 1) % cfg.checkpoint_every == 0 || last)) {
                st.rng_state = rng.state;
                if (!save_checkpoint(cfg.output_dir, model, st, &err)) fail(err);
                std::printf("checkpoint: %s\n", checkpoint_path(cfg.output_dir, "state", st.step).c_str());
            }
            std::fflush(stdout);
        }
        std::printf("peak backend memory %s\n", human_bytes((double)be->bytes_peak()).c_str());
    } catch (const std::bad_alloc&) {
        fail("out of memory");
    } catch (const std::exception& e) {
        fail(e.what());
    }
    return 0;
}
