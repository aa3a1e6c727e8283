// llmc/run/generate.cpp: the --generate mode (llmc/run/generate.h): the
// prompt's ids, the model and its weights, the prefill and the token loop,
// the sampler, the printed text.
#include "llmc/run/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "llmc/backend/backends.h"
#include "llmc/comm/dist.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/hf.h"
#include "llmc/io/model_io.h"
#include "llmc/io/tokenizer.h"
#include "llmc/model/gpt.h"
#include "llmc/model/kv_cache.h"
#include "llmc/run/report.h"
#include "llmc/run/model_source.h"
#include "llmc/run/startup.h"

bool generate_requested(const ArgParser& parser) { return parser.given("generate") || parser.given("prompt-ids"); }

int pick_token(const std::vector<double>& logits, const SamplingParams& sp, Rng& rng) {
    const int V = (int)logits.size();
    if (sp.temperature == 0) return (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<double> z(V);
    for (int i = 0; i < V; i++) z[i] = logits[i] / sp.temperature;
    std::vector<char> keep(V, 1);
    if (sp.top_k > 0 && sp.top_k < V) {
        std::vector<double> sorted = z;
        std::nth_element(sorted.begin(), sorted.begin() + (sp.top_k - 1), sorted.end(), std::greater<double>());
        const double kth = sorted[sp.top_k - 1];
        for (int i = 0; i < V; i++) keep[i] = z[i] >= kth;
    }
    const double mx = *std::max_element(z.begin(), z.end());
    std::vector<double> p(V, 0.0);
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (keep[i]) sum += p[i] = std::exp(z[i] - mx);
    if (sp.top_p < 1) {
        std::vector<int> order(V);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
        double before = 0, kept = 0;
        for (int r = 0; r < V; r++) {
            const int i = order[r];
            if (r > 0 && before >= sp.top_p * sum) p[i] = 0;  // the mass before it already reached top_p
            before += std::exp(z[i] - mx) * keep[i];
            kept += p[i];
        }
        sum = kept;
    }
    // One uniform number against the cumulative probabilities, in id order.
    const double target = rng.uniform() * sum;
    double acc = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        acc += p[i];
        last = i;
        if (acc > target) return i;
    }
    return last;
}

// "1,2,3" -> ids, each in [0, V).
static std::vector<int> parse_ids(const std::string& text, int V) {
    std::vector<int> ids;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        item.erase(0, item.find_first_not_of(" \t"));
        item.erase(item.find_last_not_of(" \t") + 1);
        char* end = nullptr;
        const long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
        setup_check(!item.empty() && *end == 0, "flag --prompt-ids: '" + item + "' is not a token id (give ids as 1,2,3)");
        setup_check(v >= 0 && v < V, "flag --prompt-ids: id " + item + " is outside the model's vocabulary of " +
                                         std::to_string(V) + " tokens");
        ids.push_back((int)v);
        i = j + 1;
    }
    return ids;
}

// Where generation stops: config.json's eos_token_id for a Hugging Face
// directory (Llama's tokenizer names its start token <s>, not its end),
// else the tokenizer's end-of-text token.
static std::vector<int> stop_ids(const TrainConfig& cfg, const Tokenizer& tok) {
    std::vector<int> ids;
    if (is_hf_dir(cfg.model)) ids = hf_eos_ids(cfg.model);
    if (ids.empty()) ids.push_back(tok.eot());
    return ids;
}

int generate_main(const ArgParser& parser, TrainConfig& cfg) {
    std::string err;
    setup_check(dist_world_size() == 1, "flag --generate: generation runs in one process, not " +
                                            std::to_string(dist_world_size()) +
                                            " ranks (start ./train_gpt --generate without mpirun)");
    for (const auto& f : {std::make_pair("--tp", cfg.tp != 1), std::make_pair("--cp", cfg.cp != 1),
                          std::make_pair("--pp", cfg.pp != 1), std::make_pair("--vpp", cfg.vpp != 1),
                          std::make_pair("--sp", cfg.sp != 0), std::make_pair("-z", cfg.zero != 0)})
        setup_check(!f.second, std::string("flag ") + f.first + ": --generate runs the whole model in one process");
    setup_check(cfg.generate.empty() || cfg.prompt_ids.empty(),
                "flag --prompt-ids: give the prompt as text (--generate) or as ids (--prompt-ids), not both");

    // The model's shape: the latest checkpoint in -o with -y, else -e.
    GPTConfig mc;
    int step = -1;
    bool ok;
    if (cfg.resume) {
        setup_check(!cfg.output_dir.empty(), "flag -y: loading a checkpoint needs its output directory (-o)");
        step = latest_checkpoint(cfg.output_dir);
        setup_check(step >= 0, "flag -y: no complete checkpoint in " + cfg.output_dir);
        ok = read_checkpoint_config(cfg.output_dir, step, &mc, &err);
        // As for a resumed run: a model named beside -y must be the checkpoint's.
        GPTConfig named;
        std::string why;
        if (ok && parser.given("model") && model_config(cfg, &named, &why) && named != mc) {
            ok = false;
            err = "flag -e: " + cfg.model + " is " + config_string(named) + ", but the checkpoint in " +
                  cfg.output_dir + " is " + config_string(mc) + " (drop -e to generate from the checkpoint)";
        }
    } else {
        ok = model_config(cfg, &mc, &err);
    }
    setup_check(ok, err);
    Tokenizer tok;
    setup_tokenizer(parser, cfg, &tok);
    const int V = mc.vocab_size, maxT = mc.max_seq_len;

    // The prompt's ids; none: start from the end-of-text token, as samples do.
    std::vector<int> prompt;
    if (!cfg.prompt_ids.empty()) {
        prompt = parse_ids(cfg.prompt_ids, V);
    } else if (!cfg.generate.empty()) {
        // The run's tokenizer, with the special tokens its post-processor
        // adds (Llama's <s>), as transformers' tokenizer(text) does; err
        // names the tokenizer's file.
        ok = tok.encode(cfg.generate, &prompt, &err);  // before the message that quotes err is built
        setup_check(ok, "flag --generate: " + err + ": give the prompt's ids with --prompt-ids");
        for (int id : prompt)
            setup_check(id < V, "flag --generate: the prompt's token " + std::to_string(id) +
                                    " is outside the model's vocabulary of " + std::to_string(V) + " tokens");
    }
    if (prompt.empty()) prompt.push_back(tok.eot() >= 0 && tok.eot() < V ? tok.eot() : 0);
    const int P = (int)prompt.size();
    setup_check(P <= maxT, std::string("flag ") + (cfg.prompt_ids.empty() ? "--generate" : "--prompt-ids") +
                               ": the prompt has " + std::to_string(P) +
                               " tokens, more than the model's maxT of " + std::to_string(maxT));
    const int total = (int)std::min<long long>((long long)P + cfg.max_new_tokens, maxT);

    std::unique_ptr<Backend> be(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
    setup_check(be != nullptr, err);
    be->set_memory_budget((size_t)(cfg.memory_budget * 1024 * 1024));
    choose_threads();
    try {
        // The model holds the weights (no gradients, no Adam state); its
        // activations are for the no-cache check only (the KV cache has its
        // own rows: B = T = 1 then).
        ModelOptions o(1, cfg.kv_cache ? 1 : total);
        o.training = false;
        GPT model(be.get(), mc, o);
        be->reserve_workspace(model.workspace());
        if (step >= 0) {
            TrainState st;
            RunInfo info;
            ok = load_checkpoint(cfg.output_dir, step, model, &st, &info, &err);
        } else if (is_hf_dir(cfg.model)) {
            ok = load_hf(cfg.model, model, &err);
        } else if (spec_is_file(cfg.model)) {
            ok = load_model(cfg.model, model, &err);
        } else {
            model.init_random((uint64_t)cfg.seed);
        }
        setup_check(ok, err);
        std::unique_ptr<KVCache> kv;
        if (cfg.kv_cache) kv = std::make_unique<KVCache>(model, total, P);

        const SamplingParams sp{cfg.temperature, cfg.top_k, cfg.top_p};
        const std::vector<int> stops = stop_ids(cfg, tok);
        Rng rng((uint64_t)cfg.seed);
        std::vector<int> seq = prompt;
        std::vector<double> logits(V);
        const char* why = "--max-new-tokens";
        const auto t0 = std::chrono::steady_clock::now();
        double prefill_ms = 0;
        for (int i = 0; i < cfg.max_new_tokens; i++) {
            if ((int)seq.size() >= maxT) {
                why = "the model's maxT";
                break;
            }
            // The logits of the sequence's last token: over the cache (the
            // whole prompt first, then the one token drawn last), or
            // without it by the training forward over the whole sequence.
            if (kv && kv->len == 0) model.decode(*kv, seq.data(), P, logits.data(), DType::F64);
            else if (kv) model.decode(*kv, &seq.back(), 1, logits.data(), DType::F64);
            else {
                model.forward(seq.data(), nullptr, 1, (int)seq.size());
                model.logits_row(0, (int)seq.size() - 1, logits.data(), DType::F64);
            }
            if (i == 0)
                prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            const int next = pick_token(logits, sp, rng);
            seq.push_back(next);
            if (!cfg.ignore_eos && std::find(stops.begin(), stops.end(), next) != stops.end()) {
                why = "the end-of-text token";
                break;
            }
        }
        be->synchronize();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        // The text as Hugging Face's tokenizers decode the ids (byte tokens
        // joined into characters), then made safe for a terminal.
        const std::string text = tok.decode_text(seq);
        std::string ids;
        for (size_t i = 0; i < seq.size(); i++) ids += (i ? "," : "") + std::to_string(seq[i]);
        const int made = (int)seq.size() - P;
        std::printf("%s\nids: %s\n", Tokenizer::printable(text).c_str(), ids.c_str());
        std::printf("generate: %s, %s on %s; %d prompt tokens, %d new (stopped at %s), %.1f ms (prompt %.1f ms, "
                    "then %.2f ms per token); %s held, %s\n",
                    config_string(mc).c_str(), dtype_name(model.precision().act), be->name(), P, made, why, ms,
                    prefill_ms, made > 1 ? (ms - prefill_ms) / (made - 1) : 0.0,
                    human_bytes((double)be->bytes_in_use()).c_str(),
                    kv ? ("KV cache " + human_bytes((double)kv->bytes)).c_str() : "no KV cache (--kv-cache 0)");
    } catch (const std::bad_alloc&) {
        setup_check(false, "out of memory");
    } catch (const std::exception& e) {
        setup_check(false, e.what());
    }
    be.reset();
    dist_finalize();
    return 0;
}
