// llmc/io/hf_config.h: a Hugging Face directory's config.json: the model
// shape read from it (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
// Qwen2ForCausalLM; docs/hf.md), the one written for an export, and the
// JSON reading both and the weights' index share (llmc/io/hf.h loads and
// exports the weights).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmc/model/config.h"

// The model shape from DIR/config.json. Refuses, with a one-line reason
// naming config.json and the field, what the model code does not compute:
// rope_scaling, Llama's attention or MLP biases, Qwen2's sliding-window
// attention (use_sliding_window true), Mixtral's below the context, an
// activation other than SiLU (Llama, Mixtral, Qwen2) or tanh GELU (GPT-2),
// a head size other than C/NH, GPT-2 LayerNorm eps other than 1e-5, an
// untied or resized GPT-2 MLP. Dropout settings are ignored (the trainer
// has none).
bool read_hf_config(const std::string& dir, GPTConfig* cfg, std::string* err);

// The ids config.json names as eos_token_id (a number or a list; where
// generation stops), or none when it names none or cannot be read.
std::vector<int> hf_eos_ids(const std::string& dir);

// The architectures entry of a model: GPT2LMHeadModel, LlamaForCausalLM,
// MixtralForCausalLM or Qwen2ForCausalLM.
const char* hf_architecture(const GPTConfig& c);

// The config.json of an export: architectures, model_type and every field
// transformers needs for the model c, weights of torch_dtype.
nlohmann::ordered_json hf_config_json(const GPTConfig& c, const char* torch_dtype);

// A JSON object from a file; false with *err naming the file when it cannot
// be opened, is not JSON, or is not an object.
bool read_json_object(const std::string& path, nlohmann::json* out, std::string* err);
