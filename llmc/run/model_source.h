// llmc/run/model_source.h: what a run's flags name as its model and its
// tokenizer: the model shape -e names (sizes, a descriptor, a model file, a
// Hugging Face directory; the planner reads it too), the sequence length
// without -t, the checkpoint --convert names and the flags it takes from
// the run that wrote it, the checkpoint a resume starts from, and the
// tokenizer for samples and --generate.
#pragma once
#include <string>

#include "llmc/base/args.h"
#include "llmc/io/tokenizer.h"
#include "llmc/model/config.h"
#include "llmc/run/train_config.h"

// -t when none is given: the model's context, at most kDefaultMaxT.
int default_seq_len(const GPTConfig& mc);

// The model shape named by -e: sizes, a descriptor, a model file's header,
// or a Hugging Face directory's config.json.
bool model_config(const TrainConfig& cfg, GPTConfig* mc, std::string* err);

// --convert PATH: a run's output directory (its latest complete checkpoint;
// without one, its newest model_SSSSSSSS.bin), one of its ckpt_SSSSSSSS
// directories (that one), or an llm.c model file: the directory the run's
// files are in, and the checkpoint's step or (step -1) the model file.
// False with a one-line *err otherwise.
bool convert_source(const std::string& path, std::string* root, int* step, std::string* model_file,
                    std::string* err);

// -y 1: the newest complete checkpoint in dir that passes
// checkpoint_problem(), or -1 when there is none at all (*err empty). An
// older one is taken when newer ones fail, with one line (on main) naming
// each damaged one and the one taken; nothing is deleted. When every one
// fails: -1 and *err naming the newest and why.
int newest_sound_checkpoint(const std::string& dir, bool main, std::string* err);
// The newest complete checkpoint in dir older than step that passes
// checkpoint_problem() and holds the model mc, or -1.
int older_sound_checkpoint(const std::string& dir, int step, const GPTConfig& mc);
// --resume-from NAME (ckpt_SSSSSSSS or S): that complete checkpoint of dir,
// checked; false with a one-line *err naming the flag otherwise.
bool named_checkpoint(const std::string& dir, const std::string& name, int* step, std::string* err);

// The tokenizer file scripts/prepare_data.py writes beside the shards it
// makes (tokenizer.json or tokenizer.bin in the directory of the -i
// pattern), or "" when there is none: the record of how the data was made.
std::string shards_tokenizer(const std::string& pattern);

// --convert: the flags of the run that wrote the checkpoints in root
// (root/run_config.json) that the export describes itself with: -e (an HF
// source directory's tokenizer and side files), -i (the shards' tokenizer)
// and --tokenizer, each unless given here. Returns what it took ("" for
// nothing: no such file, or none of them in it).
std::string inherit_run_flags(const std::string& root, const ArgParser& parser, TrainConfig& cfg);

// The run's tokenizer (samples, --generate): --tokenizer; without it a
// Hugging Face -e DIR's tokenizer.json, else the shards' tokenizer, else
// byte-level (cfg.tokenizer is set to the file chosen; "" is byte-level). A
// --tokenizer named but missing is an error (a setup_check): a typo would
// otherwise print byte-level text without a word.
void setup_tokenizer(const ArgParser& parser, TrainConfig& cfg, Tokenizer* tok);

// A warning on rank 0 when the training shards were made with another
// tokenizer than the run's (vocabulary size, end-of-text id or any token's
// bytes differ): the ids would mean other text to the model. Silent when
// the shards carry no tokenizer.
void warn_tokenizer_mismatch(const TrainConfig& cfg, const Tokenizer& tok);
