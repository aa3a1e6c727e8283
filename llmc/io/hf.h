// llmc/io/hf.h: Hugging Face checkpoints of LlamaForCausalLM,
// MixtralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel in and out
// (docs/design.md section 9; config.json: llmc/io/hf_config.h).
//
// A directory holds config.json and the weights as model.safetensors, or as
// shards model-0000N-of-0000M.safetensors listed by
// model.safetensors.index.json ({"weight_map": {tensor: file}}); tensors may
// be fp32, bf16, fp16 or fp64. Every Hugging Face tensor maps to one
// contiguous range of our model file order (llmc/model/tensors.h):
//   Llama  model.embed_tokens.weight        wte (V rows)
//          model.layers.L.input_layernorm   ln1w
//          ...self_attn.{q,k,v}_proj        qkvw rows [Q; K; V]  (each (out, in))
//          ...self_attn.{q,k,v}_proj.bias   qkvb rows [Q; K; V]  (Qwen2 only)
//          ...self_attn.o_proj              attprojw
//          ...post_attention_layernorm      ln2w
//          ...mlp.{gate,up}_proj            fcw rows [gate; up]
//          ...mlp.down_proj                 fcprojw
//          model.norm                       lnfw
//          lm_head.weight                   lm_head (untied models only)
//   Mixtral  Llama's, with block_sparse_moe's router and experts for the MLP
//   GPT-2  [transformer.]wte, wpe, h.L.ln_1, attn.c_attn, attn.c_proj, ln_2,
//          mlp.c_fc, mlp.c_proj, ln_f: Conv1D weights are stored (in, out)
//          and transposed on the way in and out; biases as they are.
// Our models from Hugging Face have Vp = V (no padding rows).
#pragma once
#include <string>
#include <vector>

#include "llmc/io/hf_config.h"
#include "llmc/io/hf_meta.h"
#include "llmc/io/weight_gather.h"
#include "llmc/model/config.h"
#include "llmc/model/gpt.h"

// Whether path is a directory: a model named by a directory is a Hugging
// Face one (read_hf_config then says when config.json is missing).
bool is_hf_dir(const std::string& path);

// Sets every weight this rank holds from DIR's safetensors, one tensor at a
// time (GPT::set_weights_file_range), after checking that every expected
// tensor is present with its shape and a floating dtype and that no
// unexpected one is. The model's shape must be DIR's. Not collective: each
// rank reads what it needs.
bool load_hf(const std::string& dir, GPT& model, std::string* err);

// Writes DIR/config.json and DIR/model.safetensors (extras.dtype, or with
// "auto" F32; BF16 when the parameters are bf16; F64 when the weights are
// fp64) in the layout above, loadable by transformers' from_pretrained as it
// is, with the token ids, tokenizer and generation files of
// llmc/io/hf_meta.h. Collective over own.world, tensor by tensor as
// export_model (llmc/io/model_io.h): each tensor is gathered from its owners
// and rank 0 writes it. Every rank returns the same verdict.
bool export_hf(const std::string& dir, GPT& model, const Ownership& own, std::string* err,
               const HfExtras& extras = HfExtras());

// DIR/tokenizer.json when it exists, else "".
std::string hf_tokenizer_path(const std::string& dir);
