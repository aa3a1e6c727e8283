// llmc/model/config.cpp: parsing of model descriptors and explicit sizes.
#include "llmc/model/config.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "llmc/base/fileio.h"

int default_padded_vocab(int V) { return ((V + 127) / 128) * 128; }

static const Arch kArchs[] = {Arch::gpt2, Arch::llama, Arch::mixtral, Arch::qwen2};

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::llama: return "llama";
        case Arch::mixtral: return "mixtral";
        case Arch::qwen2: return "qwen2";
        default: return "gpt2";
    }
}

bool arch_from_name(const std::string& name, Arch* a) {
    for (Arch x : kArchs)
        if (name == arch_name(x)) {
            *a = x;
            return true;
        }
    return false;
}

static const char* const kLinearNames[4] = {"qkv", "attproj", "fc", "fcproj"};

const char* linear_layer_name(int i) { return i >= 0 && i < 4 ? kLinearNames[i] : "?"; }

bool linear_layers_from_names(const std::string& list, unsigned* mask, std::string* err) {
    if (list == "all") {
        *mask = kLinearLayersAll;
        return true;
    }
    unsigned m = 0;
    std::stringstream ss(list);
    std::string part;
    while (std::getline(ss, part, ',')) {
        int i = 0;
        while (i < 4 && part != kLinearNames[i]) i++;
        if (i == 4 || linear_layer_in(m, i)) {
            *err = "'" + part + "'" + (i == 4 ? " is not a linear layer (qkv, attproj, fc, fcproj or all)"
                                               : " is named twice");
            return false;
        }
        m |= 1u << i;
    }
    if (m == 0 || list.back() == ',') {
        *err = "'" + list + "' names no layer (qkv, attproj, fc, fcproj or all)";
        return false;
    }
    *mask = m;
    return true;
}

std::string linear_layers_names(unsigned mask) {
    std::string s;
    for (int i = 0; i < 4; i++)
        if (linear_layer_in(mask, i)) s += (s.empty() ? "" : ",") + std::string(kLinearNames[i]);
    return s;
}

// A file that exists is a file whatever its name; a missing one ending in
// .bin is still meant as a file (and gets "cannot open", not a size error).
bool spec_is_file(const std::string& spec) {
    if (file_size(spec) >= 0) return true;
    return spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".bin") == 0;
}

static bool parse_int(const std::string& s, int* out) {
    if (s.empty()) return false;
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (*end != '\0' || v <= 0 || v > (1L << 30)) return false;
    *out = (int)v;
    return true;
}

bool parse_model_spec(const std::string& spec, GPTConfig* cfg, std::string* err) {
    GPTConfig c;
    if (spec.size() >= 2 && spec[0] == 'd' && spec.find('=') == std::string::npos) {
        int depth = 0;
        if (!parse_int(spec.substr(1), &depth)) {
            *err = "bad model descriptor '" + spec + "' (expected dN, e.g. d12)";
            return false;
        }
        c.num_layers = depth;
        c.channels = 64 * depth;
        c.num_heads = depth;  // head size 64, as GPT-2
        c.vocab_size = 50257;
        c.padded_vocab_size = 50304;
        c.max_seq_len = 1024;
    } else {
        std::stringstream ss(spec);
        std::string item;
        bool tied_given = false, aux_given = false, eps_given = false;
        while (std::getline(ss, item, ',')) {
            size_t eq = item.find('=');
            std::string key = item.substr(0, eq), val = eq == std::string::npos ? "" : item.substr(eq + 1);
            if (key == "arch") {
                if (!arch_from_name(val, &c.arch)) {
                    *err = "unknown arch '" + val + "' in '" + spec + "' (gpt2, llama, mixtral or qwen2)";
                    return false;
                }
                continue;
            }
            if (key == "theta" || key == "eps" || key == "aux") {  // real numbers (aux may be 0)
                char* end = nullptr;
                const double d = eq == std::string::npos ? 0 : std::strtod(val.c_str(), &end);
                const bool aux = key == "aux";
                if (eq == std::string::npos || !end || *end != '\0' || !(aux ? d >= 0 && std::isfinite(d) : d > 0)) {
                    *err = "bad model size '" + item + "' in '" + spec + "' (expected " + key + "=" +
                           (aux ? "non-negative" : "positive") + " number)";
                    return false;
                }
                (aux ? c.aux_coef : key == "theta" ? c.rope_theta : c.norm_eps) = d;
                aux_given = aux_given || aux;
                eps_given = eps_given || key == "eps";
                continue;
            }
            int v = 0;
            if (key == "tied" && (val == "0" || val == "1")) {
                c.tied = val == "1";
                tied_given = true;
                continue;
            }
            if (eq == std::string::npos || !parse_int(val, &v)) {
                *err = "bad model size '" + item + "' in '" + spec + "' (expected KEY=positive integer)";
                return false;
            }
            if (key == "L") c.num_layers = v;
            else if (key == "C") c.channels = v;
            else if (key == "NH") c.num_heads = v;
            else if (key == "NKV") c.num_kv_heads = v;
            else if (key == "F") c.ffn = v;
            else if (key == "V") c.vocab_size = v;
            else if (key == "Vp") c.padded_vocab_size = v;
            else if (key == "T" || key == "maxT") c.max_seq_len = v;
            else if (key == "E") c.experts = v;
            else if (key == "K") c.top_k = v;
            else {
                *err = "unknown model size '" + key + "' in '" + spec +
                       "' (keys: arch, L, C, NH, NKV, F, V, Vp, T, theta, eps, tied, E, K, aux)";
                return false;
            }
        }
        if (!c.num_layers || !c.channels || !c.num_heads || !c.vocab_size || !c.max_seq_len) {
            *err = "model sizes '" + spec + "' must give all of L, C, NH, V, T";
            return false;
        }
        if (!c.llama() && (c.num_kv_heads || c.ffn || !c.tied)) {
            *err = "model sizes '" + spec + "': NKV, F and tied=0 are Llama's (add arch=llama or arch=qwen2)";
            return false;
        }
        if (!c.moe() && (c.experts || c.top_k || aux_given)) {
            *err = "model sizes '" + spec + "': E, K and aux are Mixtral's (add arch=mixtral)";
            return false;
        }
        if (c.moe() && (!c.experts || !c.top_k)) {
            *err = "model sizes '" + spec + "': a Mixtral model needs E (experts) and K (experts per token)";
            return false;
        }
        // Llama's head is untied unless tied=1 says otherwise, as in
        // transformers' LlamaConfig (tie_word_embeddings=False; Qwen2Config
        // and MixtralConfig the same); GPT-2's is tied.
        if (c.llama() && !tied_given) c.tied = false;
        // Qwen2's epsilon is Qwen2Config's default, 1e-6 (the Qwen2 and
        // Qwen2.5 checkpoints' too); Llama's and Mixtral's sizes keep 1e-5.
        if (c.arch == Arch::qwen2 && !eps_given) c.norm_eps = 1e-6;
        if (c.llama() && !c.ffn) {
            const char* who = c.moe() ? "Mixtral" : c.arch == Arch::qwen2 ? "Qwen2" : "Llama";
            *err = "model sizes '" + spec + "': a " + std::string(who) + " model needs F, its MLP's hidden size";
            return false;
        }
        if (!c.padded_vocab_size) c.padded_vocab_size = c.llama() ? c.vocab_size : default_padded_vocab(c.vocab_size);
    }
    if (!validate_config(c, err)) return false;
    *cfg = c;
    return true;
}

bool validate_config(const GPTConfig& c, std::string* err) {
    std::string cs = config_string(c);
    if (c.num_layers <= 0 || c.channels <= 0 || c.num_heads <= 0 || c.vocab_size <= 0 || c.max_seq_len <= 0) {
        *err = "model sizes must be positive (" + cs + ")";
        return false;
    }
    if (c.channels % c.num_heads != 0) {
        *err = "channels C must divide by heads NH (" + cs + ")";
        return false;
    }
    if (c.padded_vocab_size < c.vocab_size) {
        *err = "padded vocab Vp must be >= V (" + cs + ")";
        return false;
    }
    if (c.llama()) {
        if (c.kv_heads() <= 0 || c.num_heads % c.kv_heads() != 0) {
            *err = "key/value heads NKV must divide the heads NH (" + cs + ")";
            return false;
        }
        if (c.head_size() % 2 != 0) {
            *err = "rotary embeddings need an even head size C/NH (" + cs + ")";
            return false;
        }
        if (c.hidden() <= 0) {
            *err = "the MLP's hidden size F must be positive (" + cs + ")";
            return false;
        }
    }
    if (c.moe() && (c.experts <= 0 || c.top_k <= 0 || c.top_k > c.experts || !(c.aux_coef >= 0))) {
        *err = "a Mixtral model needs E >= 1 experts, 1 <= K <= E and aux >= 0 (" + cs + ")";
        return false;
    }
    return true;
}

std::string config_string(const GPTConfig& c) {
    std::ostringstream o;
    if (c.llama()) o << arch_name(c.arch) << " ";
    o << "L=" << c.num_layers << " C=" << c.channels << " NH=" << c.num_heads;
    if (c.llama()) o << " NKV=" << c.kv_heads() << " F=" << c.hidden();
    if (c.moe()) o << " E=" << c.experts << " K=" << c.top_k << " aux=" << c.aux_coef;
    o << " V=" << c.vocab_size << " Vp=" << c.padded_vocab_size << " maxT=" << c.max_seq_len;
    if (c.llama()) o << " theta=" << c.rope_theta << " eps=" << c.norm_eps << (c.tied ? " tied" : " untied");
    return o.str();
}
