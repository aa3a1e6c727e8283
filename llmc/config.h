// llmc/config.h: the shape of a GPT-2 model and the three ways to name one:
//   a descriptor   "d12" (GPT-2 124M), "d24", "d36", "d48": L = N, C = 64·L,
//                  NH = C/64, V = 50257, Vp = 50304, maxT = 1024;
//   explicit sizes "L=2,C=48,NH=3,V=97,T=64[,Vp=128]" for small or odd
//                  test models (Vp defaults to V rounded up to 128);
//   a model file   "FILE.bin", or any file that exists (the sizes come
//                  from its header).
#pragma once
#include <string>

struct GPTConfig {
    int max_seq_len = 0;        // maxT: rows of wpe
    int vocab_size = 0;         // V: real tokens
    int padded_vocab_size = 0;  // Vp: rows of wte (>= V), padded for speed
    int num_layers = 0;         // L
    int num_heads = 0;          // NH
    int channels = 0;           // C

    int head_size() const { return channels / num_heads; }
    bool operator==(const GPTConfig& o) const {
        return max_seq_len == o.max_seq_len && vocab_size == o.vocab_size &&
               padded_vocab_size == o.padded_vocab_size && num_layers == o.num_layers &&
               num_heads == o.num_heads && channels == o.channels;
    }
    bool operator!=(const GPTConfig& o) const { return !(*this == o); }
};

// Vp for a vocabulary: V rounded up to a multiple of 128 (50257 -> 50304).
int default_padded_vocab(int V);

// Parse a descriptor or explicit-size string. On failure returns false and
// sets *err to a one-line reason naming the offending part.
bool parse_model_spec(const std::string& spec, GPTConfig* cfg, std::string* err);

// True when spec names a model file rather than sizes: a file that exists,
// or a name ending in ".bin".
bool spec_is_file(const std::string& spec);

// Shape checks shared by every way of making a model: positive sizes,
// C % NH == 0, Vp >= V. Returns false with a reason otherwise.
bool validate_config(const GPTConfig& cfg, std::string* err);

// One line such as "L=12 C=768 NH=12 V=50257 Vp=50304 maxT=1024".
std::string config_string(const GPTConfig& cfg);
