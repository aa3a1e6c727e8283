// llmc/model/config.h: the shape of a model, GPT-2, Llama, Qwen2 or Mixtral
// (docs/design.md section 9), and the ways to name one:
//   a descriptor   "d12" (GPT-2 124M), "d24", "d36", "d48": L = N, C = 64·L,
//                  NH = C/64, V = 50257, Vp = 50304, maxT = 1024;
//   explicit sizes "L=2,C=48,NH=3,V=97,T=64[,Vp=128]" for small or odd
//                  test models (Vp defaults to V rounded up to 128);
//                  "arch=llama,L=..,C=..,NH=..,NKV=..,F=..,V=..,T=..
//                  [,theta=..,eps=..,tied=0|1,Vp=..]" for Llama (NKV: key
//                  and value heads, F: the MLP's hidden size; Vp = V unless
//                  given, as Hugging Face models have no padding);
//                  "arch=qwen2,.." for Qwen2 (Llama's keys; eps defaults
//                  to 1e-6, Qwen2Config's, where Llama's sizes take 1e-5);
//                  "arch=mixtral,..,E=..,K=..[,aux=..]" for Mixtral (Llama's
//                  keys, F the experts' width; E experts, K per token, aux
//                  the load-balancing loss's coefficient, default 0.01);
//   a model file   "FILE.bin", or any file that exists (the sizes come
//                  from its header);
//   a Hugging Face directory with config.json (llmc/io/hf.h).
#pragma once
#include <string>

// GPT-2: learned positions, LayerNorm, GELU MLP of 4C, biases, tied head.
// Llama: rotary positions, RMSNorm, SwiGLU MLP of F, grouped-query
// attention, no biases, tied or untied head.
// Mixtral: Llama whose every MLP is a sparse mixture of E SwiGLU experts,
// each token to its top K by a softmax router (docs/moe.md).
// Qwen2: Llama with a bias on the Q, K and V projections (qkvb); o_proj,
// the MLP and the norms have none.
enum class Arch : int { gpt2 = 0, llama = 1, mixtral = 2, qwen2 = 3 };

struct GPTConfig {
    Arch arch = Arch::gpt2;
    int max_seq_len = 0;        // maxT: rows of wpe (GPT-2); longest sequence (Llama)
    int vocab_size = 0;         // V: real tokens
    int padded_vocab_size = 0;  // Vp: rows of wte (>= V), padded for speed
    int num_layers = 0;         // L
    int num_heads = 0;          // NH
    int channels = 0;           // C
    int num_kv_heads = 0;       // Llama: NKV key/value heads (divides NH); 0 means NH
    int ffn = 0;                // Llama: F, the MLP's hidden size; 0 means 4C (GPT-2)
    double rope_theta = 10000;  // Llama: rotary base
    double norm_eps = 1e-5;     // LayerNorm / RMSNorm epsilon
    bool tied = true;           // LM head shares wte
    int experts = 0;            // Mixtral: E experts per layer (0: a dense MLP)
    int top_k = 0;              // Mixtral: K experts per token
    double aux_coef = 0.01;     // Mixtral: weight of the load-balancing loss in the objective

    // Llama's attention, norms and SwiGLU (Llama, Mixtral and Qwen2).
    bool llama() const { return arch != Arch::gpt2; }
    bool moe() const { return arch == Arch::mixtral; }
    // A bias on the QKV product: GPT-2's and Qwen2's.
    bool qkv_bias() const { return arch == Arch::gpt2 || arch == Arch::qwen2; }
    int head_size() const { return channels / num_heads; }
    int kv_heads() const { return num_kv_heads ? num_kv_heads : num_heads; }
    int hidden() const { return ffn ? ffn : 4 * channels; }
    // --fp8-history's amax slots per layer (docs/fp8.md): 4 linear layers x
    // 3 operands, then a Mixtral's E experts x 2 products x 3 operands.
    int fp8_slots_per_layer() const { return 12 + (moe() ? 6 * experts : 0); }
    bool operator==(const GPTConfig& o) const {
        return arch == o.arch && max_seq_len == o.max_seq_len && vocab_size == o.vocab_size &&
               padded_vocab_size == o.padded_vocab_size && num_layers == o.num_layers &&
               num_heads == o.num_heads && channels == o.channels && kv_heads() == o.kv_heads() &&
               hidden() == o.hidden() && rope_theta == o.rope_theta && norm_eps == o.norm_eps && tied == o.tied &&
               experts == o.experts && top_k == o.top_k && aux_coef == o.aux_coef;
    }
    bool operator!=(const GPTConfig& o) const { return !(*this == o); }
};

// A block's four linear layers as the FP8 code numbers them (docs/fp8.md):
// 0 QKV, 1 attention output, 2 MLP up (a Mixtral's experts' gate and up),
// 3 MLP down (the experts' down). --fp8-layers names a set of them, held as
// a mask (bit i: layer i).
constexpr unsigned kLinearLayersAll = 0xFu;
inline bool linear_layer_in(unsigned mask, int i) { return (mask >> i & 1u) != 0; }
const char* linear_layer_name(int i);  // "qkv", "attproj", "fc", "fcproj"
// "qkv,fc" (any order, each once; "all": the four) to a mask; false with a
// reason naming the part that is none of them.
bool linear_layers_from_names(const std::string& list, unsigned* mask, std::string* err);
std::string linear_layers_names(unsigned mask);  // the mask as a list, in the layers' order

// An architecture's name in sizes (arch=...), checkpoint indexes and
// config_string: "gpt2", "llama", "mixtral", "qwen2"; and back (false for
// a name that is none of them).
const char* arch_name(Arch a);
bool arch_from_name(const std::string& name, Arch* a);

// Vp for a vocabulary: V rounded up to a multiple of 128 (50257 -> 50304).
int default_padded_vocab(int V);

// Parse a descriptor or explicit-size string. On failure returns false and
// sets *err to a one-line reason naming the offending part.
bool parse_model_spec(const std::string& spec, GPTConfig* cfg, std::string* err);

// True when spec names a model file rather than sizes: a file that exists,
// or a name ending in ".bin".
bool spec_is_file(const std::string& spec);

// Shape checks shared by every way of making a model: positive sizes,
// C % NH == 0, Vp >= V; for Llama NKV dividing NH, an even head size (RoPE)
// and F > 0. Returns false with a reason otherwise.
bool validate_config(const GPTConfig& cfg, std::string* err);

// One line such as "L=12 C=768 NH=12 V=50257 Vp=50304 maxT=1024" (Llama:
// "llama L=.. C=.. NH=.. NKV=.. F=.. V=.. Vp=.. maxT=.. theta=.. eps=..
// untied"; Qwen2 the same after "qwen2", Mixtral after "mixtral").
std::string config_string(const GPTConfig& cfg);
