// llmc/io/hf_config.cpp: a Hugging Face directory's config.json, read into
// a model shape and written for an export (see hf_config.h), with
// nlohmann-json.
#include "llmc/io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

bool read_json_object(const std::string& path, json* out, std::string* err) {
    std::ifstream in(path);
    if (!in) {
        *err = path + ": cannot open";
        return false;
    }
    try {
        *out = json::parse(in);
    } catch (const json::exception& e) {
        std::string m = e.what();
        std::replace(m.begin(), m.end(), '\n', ' ');
        *err = path + ": not valid JSON (" + m + ")";
        return false;
    }
    if (!out->is_object()) {
        *err = path + ": not a JSON object";
        return false;
    }
    return true;
}

// ---- config.json --------------------------------------------------------------------------------

std::vector<int> hf_eos_ids(const std::string& dir) {
    json j;
    std::string err;
    std::vector<int> ids;
    if (!read_json_object(dir + "/config.json", &j, &err) || !j.contains("eos_token_id")) return ids;
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) ids.push_back(e.get<int>());
    if (e.is_array())
        for (const json& x : e)
            if (x.is_number_integer()) ids.push_back(x.get<int>());
    return ids;
}

namespace {
// Fields of config.json with transformers' defaults when absent.
struct ConfigReader {
    const json& j;
    std::string path;
    std::string* err;
    bool ok = true;
    bool fail(const std::string& m) {
        if (ok) *err = path + ": " + m;
        ok = false;
        return false;
    }
    int integer(const char* key, long long def = -1) {
        if (!j.contains(key) || j[key].is_null()) {
            if (def < 0) fail(std::string("missing ") + key);
            return (int)def;
        }
        const json& v = j[key];
        if (!v.is_number_integer() || v.get<long long>() <= 0 || v.get<long long>() > (1LL << 30)) {
            fail(std::string(key) + " is " + v.dump() + ", not a positive integer");
            return 0;
        }
        return (int)v.get<long long>();
    }
    double real(const char* key, double def, bool zero_ok = false) {
        if (!j.contains(key) || j[key].is_null()) return def;
        const json& v = j[key];
        if (!v.is_number() || !(v.get<double>() > 0 || (zero_ok && v.get<double>() == 0))) {
            fail(std::string(key) + " is " + v.dump() + (zero_ok ? ", not a number >= 0" : ", not a positive number"));
            return def;
        }
        return v.get<double>();
    }
    bool boolean(const char* key, bool def) {
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_boolean()) {
            fail(std::string(key) + " is " + j[key].dump() + ", not true or false");
            return def;
        }
        return j[key].get<bool>();
    }
    std::string str(const char* key, const std::string& def) {
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_string()) {
            fail(std::string(key) + " is " + j[key].dump() + ", not a string");
            return def;
        }
        return j[key].get<std::string>();
    }
};
}  // namespace

bool read_hf_config(const std::string& dir, GPTConfig* cfg, std::string* err) {
    const std::string path = dir + "/config.json";
    json j;
    if (!read_json_object(path, &j, err)) return false;
    ConfigReader r{j, path, err};
    std::string arch;
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string())
        arch = j["architectures"][0].get<std::string>();
    const std::string type = r.str("model_type", "");
    const char* known = "LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel";
    if (!arch.empty() && arch != "LlamaForCausalLM" && arch != "GPT2LMHeadModel" && arch != "MixtralForCausalLM" &&
        arch != "Qwen2ForCausalLM")
        return r.fail("architecture " + arch + " is not supported (" + known + ")");
    const bool mixtral = arch == "MixtralForCausalLM" || (arch.empty() && type == "mixtral");
    const bool qwen2 = arch == "Qwen2ForCausalLM" || (arch.empty() && type == "qwen2");
    const bool llama = mixtral || qwen2 || arch == "LlamaForCausalLM" || (arch.empty() && type == "llama");
    const bool gpt2 = arch == "GPT2LMHeadModel" || (arch.empty() && type == "gpt2");
    if (!llama && !gpt2)
        return r.fail("model_type '" + type + "' is not supported (llama, mixtral, qwen2 or gpt2, or architectures " +
                      known + ")");
    GPTConfig c;
    if (llama) {
        c.arch = mixtral ? Arch::mixtral : qwen2 ? Arch::qwen2 : Arch::llama;
        if (mixtral) {  // transformers' MixtralConfig defaults where a key is absent
            c.experts = r.integer("num_local_experts", 8);
            c.top_k = r.integer("num_experts_per_tok", 2);
            c.aux_coef = r.real("router_aux_loss_coef", 0.001, true);
            if (r.real("router_jitter_noise", 0.0, true) != 0.0)
                return r.fail("router_jitter_noise " + j["router_jitter_noise"].dump() + " is not supported (0)");
        }
        c.channels = r.integer("hidden_size");
        c.num_heads = r.integer("num_attention_heads");
        c.num_kv_heads = r.integer("num_key_value_heads", c.num_heads > 0 ? c.num_heads : 1);
        c.ffn = r.integer("intermediate_size");
        c.num_layers = r.integer("num_hidden_layers");
        c.vocab_size = r.integer("vocab_size");
        c.max_seq_len = r.integer("max_position_embeddings", mixtral ? 131072 : qwen2 ? 32768 : 2048);
        c.rope_theta = r.real("rope_theta", 10000.0);
        c.norm_eps = r.real("rms_norm_eps", 1e-6);
        c.tied = r.boolean("tie_word_embeddings", false);
        if (!r.ok) return false;
        if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
            return r.fail("rope_scaling " + j["rope_scaling"].dump() + " is not supported (plain RoPE only)");
        // Mixtral's sliding window changes attention only past its width.
        if (mixtral && j.contains("sliding_window") && !j["sliding_window"].is_null() &&
            r.integer("sliding_window") < c.max_seq_len)
            return r.fail("sliding_window " + j["sliding_window"].dump() +
                          " below max_position_embeddings is not supported (full causal attention)");
        // Qwen2 has the Q, K and V biases whatever these keys (Llama's) say.
        if (!qwen2 && r.boolean("attention_bias", false))
            return r.fail("attention_bias true is not supported (Llama without biases)");
        if (!qwen2 && r.boolean("mlp_bias", false)) return r.fail("mlp_bias true is not supported (Llama without biases)");
        // Qwen2's sliding window is off unless use_sliding_window turns it on
        // (sliding_window and max_window_layers then say where); on, it is refused.
        if (qwen2 && r.boolean("use_sliding_window", false))
            return r.fail("use_sliding_window true is not supported (full causal attention)");
        const std::string act = r.str("hidden_act", "silu");
        if (act != "silu") return r.fail("hidden_act '" + act + "' is not supported (silu)");
        if (j.contains("head_dim") && !j["head_dim"].is_null() && c.num_heads > 0 &&
            r.integer("head_dim") != c.channels / c.num_heads)
            return r.fail("head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads = " +
                          std::to_string(c.channels / c.num_heads) + " (not supported)");
    } else {
        c.arch = Arch::gpt2;
        c.channels = r.integer("n_embd", 768);
        c.num_heads = r.integer("n_head", 12);
        c.num_layers = r.integer("n_layer", 12);
        c.vocab_size = r.integer("vocab_size", 50257);
        c.max_seq_len = r.integer("n_positions", 1024);
        const double eps = r.real("layer_norm_epsilon", 1e-5);
        if (!r.ok) return false;
        // The LayerNorm here uses 1e-5 (docs/design.md section 2).
        if (std::fabs(eps - 1e-5) > 1e-12) return r.fail("layer_norm_epsilon " + j["layer_norm_epsilon"].dump() +
                                                      " is not supported (GPT-2's LayerNorm here uses 1e-5)");
        c.norm_eps = 1e-5;
        const std::string act = r.str("activation_function", "gelu_new");
        if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
            return r.fail("activation_function '" + act + "' is not supported (the tanh GELU: gelu_new)");
        if (j.contains("n_inner") && !j["n_inner"].is_null() && r.integer("n_inner") != 4 * c.channels)
            return r.fail("n_inner " + j["n_inner"].dump() + " is not supported (GPT-2's MLP is 4 x n_embd)");
        if (!r.boolean("scale_attn_weights", true)) return r.fail("scale_attn_weights false is not supported");
        if (r.boolean("scale_attn_by_inverse_layer_idx", false))
            return r.fail("scale_attn_by_inverse_layer_idx true is not supported");
        if (r.boolean("add_cross_attention", false)) return r.fail("add_cross_attention true is not supported");
        if (!r.boolean("tie_word_embeddings", true))
            return r.fail("tie_word_embeddings false is not supported for GPT-2 (its LM head is wte)");
    }
    if (!r.ok) return false;
    c.padded_vocab_size = c.vocab_size;  // Hugging Face models have no padding rows
    std::string why;
    if (!validate_config(c, &why)) return r.fail(why);
    *cfg = c;
    return true;
}

const char* hf_architecture(const GPTConfig& c) {
    switch (c.arch) {
        case Arch::llama: return "LlamaForCausalLM";
        case Arch::mixtral: return "MixtralForCausalLM";
        case Arch::qwen2: return "Qwen2ForCausalLM";
        default: return "GPT2LMHeadModel";
    }
}

ojson hf_config_json(const GPTConfig& c, const char* torch_dtype) {
    ojson j;
    j["architectures"] = {hf_architecture(c)};
    if (c.llama()) {
        j["model_type"] = "llama";
        j["hidden_size"] = c.channels;
        j["intermediate_size"] = c.hidden();
        j["num_attention_heads"] = c.num_heads;
        j["num_key_value_heads"] = c.kv_heads();
        j["head_dim"] = c.head_size();
        j["num_hidden_layers"] = c.num_layers;
        j["vocab_size"] = c.vocab_size;
        j["max_position_embeddings"] = c.max_seq_len;
        j["rope_theta"] = c.rope_theta;
        j["rope_scaling"] = nullptr;
        j["rms_norm_eps"] = c.norm_eps;
        j["tie_word_embeddings"] = c.tied;
        j["hidden_act"] = "silu";
        j["attention_bias"] = false;
        j["mlp_bias"] = false;
        j["attention_dropout"] = 0.0;
        j["pretraining_tp"] = 1;
        j["initializer_range"] = 0.02;
        // MixtralConfig and Qwen2Config have no head_dim, bias or
        // pretraining_tp keys (Qwen2's Q, K, V biases are implied). Neither
        // has a sliding window: null, not a width, because transformers
        // 4.40.2 builds its eager and SDPA causal masks with sliding_window
        // even when use_sliding_window is false, which would cut attention
        // past that many tokens. (The keys keep the order earlier exports
        // wrote them in.)
        if (c.moe() || c.arch == Arch::qwen2)
            for (const char* k : {"head_dim", "attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);
        if (c.moe()) {
            j["model_type"] = "mixtral";
            j["num_local_experts"] = c.experts;
            j["num_experts_per_tok"] = c.top_k;
            j["router_aux_loss_coef"] = c.aux_coef;
            j["output_router_logits"] = true;  // its training then adds the load-balancing loss, as ours did
            j["router_jitter_noise"] = 0.0;
            j["sliding_window"] = nullptr;
        }
        if (c.arch == Arch::qwen2) {
            j["model_type"] = "qwen2";
            j["use_sliding_window"] = false;
            j["sliding_window"] = nullptr;
            j["max_window_layers"] = c.num_layers;
        }
    } else {
        j["model_type"] = "gpt2";
        j["n_embd"] = c.channels;
        j["n_head"] = c.num_heads;
        j["n_layer"] = c.num_layers;
        j["n_positions"] = c.max_seq_len;
        j["n_ctx"] = c.max_seq_len;
        j["n_inner"] = nullptr;
        j["vocab_size"] = c.vocab_size;
        j["layer_norm_epsilon"] = 1e-5;
        j["activation_function"] = "gelu_new";
        // No dropout: the weights were trained without it.
        j["resid_pdrop"] = 0.0;
        j["embd_pdrop"] = 0.0;
        j["attn_pdrop"] = 0.0;
        j["scale_attn_weights"] = true;
        j["scale_attn_by_inverse_layer_idx"] = false;
        j["reorder_and_upcast_attn"] = false;
        j["tie_word_embeddings"] = true;
        j["initializer_range"] = 0.02;
    }
    j["use_cache"] = true;
    j["torch_dtype"] = torch_dtype;
    j["transformers_version"] = "4.40.2";
    return j;
}
