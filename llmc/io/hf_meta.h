// llmc/io/hf_meta.h: what a Hugging Face directory holds besides the weights
// and the model shape, written by export_hf (llmc/io/hf.h): the special
// token ids in config.json, the tokenizer's files (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, and a slow tokenizer's
// vocab.json / merges.txt / tokenizer.model), and generation_config.json.
//
// A model loaded from a Hugging Face directory gets back every one of these
// that the directory had, as it was (so AutoTokenizer and generate behave as
// they did on the original); whatever is missing, and everything for a model
// that did not come from one, is written from the run's tokenizer: its
// end-of-text token is bos and eos (GPT-2's convention), the fast tokenizer
// class over the run's tokenizer.json.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

// Everything an export may carry beyond the weights (all optional).
struct HfExtras {
    std::string tokenizer_json;  // copied as DIR/tokenizer.json ("" none)
    std::string tokenizer_json_text;  // else written as DIR/tokenizer.json ("" none; tokenizer_export.h)
    std::string source_dir;      // the Hugging Face directory the run loaded ("" none)
    int eot = -1;                // the run tokenizer's end-of-text id (-1: unknown)
    std::string dtype = "auto";  // the weights' file type: auto (the run's), fp32, bf16 or fp64
};

// bos_token_id, eos_token_id and pad_token_id into a config.json being
// written: the source directory's where it names them, else the end-of-text
// id as bos and eos.
void hf_token_ids(nlohmann::ordered_json& config, const HfExtras& x);

// The source directory's config.json fields for training elsewhere, which
// the weights do not depend on, into a config.json being written, as they
// were: the dropouts (GPT-2's resid_pdrop, embd_pdrop, attn_pdrop,
// summary_first_dropout; attention_dropout), Mixtral's output_router_logits
// and router_jitter_noise, initializer_range, use_cache. Without a source
// the export's own (no dropout: ours trained without; Mixtral's router
// logits on, so that training it adds the load-balancing loss, as ours did).
void hf_keep_source_fields(nlohmann::ordered_json& config, const HfExtras& x);

// Writes or copies the tokenizer and generation files into dir (see above).
// max_len: the model's context, the tokenizer's model_max_length. False with
// *err naming the file on a failure.
bool hf_write_side_files(const std::string& dir, const HfExtras& x, int max_len, std::string* err);

// The files hf_write_side_files may write (an export removes their leftover
// temporaries, and tests list them).
extern const char* const kHfSideFiles[];
extern const int kHfSideFileCount;
