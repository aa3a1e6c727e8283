// llmc/run/startup.h: what every mode of train_gpt does first, on every
// rank: agree on errors found while setting up (so all ranks exit together
// with one message), check that the ranks were given the same flags, share
// the node's CPU cores between its ranks, and read the model shape that -e
// names.
#pragma once
#include <string>

#include "llmc/base/args.h"
#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "llmc/model/config.h"
#include "llmc/run/train_config.h"

// Setup errors: every rank reaches the same check, so the ranks agree on
// the outcome; rank 0 prints the first failing rank's message as
// "train_gpt: error: ..." and every rank exits with status 1.
void setup_check(bool ok, const std::string& msg);

// Errors during training, possibly on one rank only: end the whole job
// (llmc/comm/dist.h dist_abort).
[[noreturn]] void end_job(const std::string& msg);

// Every rank must run with the same flags (mpirun -np 1 A : -np 1 B would
// otherwise hang or train wrong): rank 0's values go to every rank, each
// compares them with its own, and the lowest rank that differs names the
// first flag where it does (a setup_check). Called right after parsing,
// before the run's mode is chosen: one rank given --help, --plan or
// --calibrate while the others train would otherwise leave them waiting.
void check_same_flags(const ArgParser& parser, bool help);

// Why an output the run writes only at its end (--export-model,
// --export-hf, --trace) could not be written, or "" when it can: checked
// before the first step, so that a typo does not cost the whole run.
// directory: the path is a folder to create or fill, else a file.
std::string output_path_problem(const std::string& path, bool directory);

// Every rank must read the same data: rank 0's fingerprint of the loader
// (DataLoader::fingerprint) goes to every rank, and a rank whose files differ
// (another working directory, another copy) ends the job with one line
// naming the flag and the pattern, instead of training on other data and
// hanging at the end of a shorter epoch. Then every token id is checked
// against the vocabulary (DataLoader::check_ids, the ranks sharing the
// reading), so a bad id stops the run before the first step.
// Returns the fingerprint (checkpoints keep it, so a resume sees other data).
std::string check_same_data(DataLoader& data, const char* flag, const std::string& pattern);

// CPU threads: unless OMP_NUM_THREADS says otherwise, the ranks on a node
// share its cores (every rank starting as many threads as the node has
// cores runs several times slower), and no rank runs more threads than the
// cores mpirun bound it to. Returns the line for the settings.
std::string choose_threads();

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

// -t when none is given: the model's context, at most kDefaultMaxT.
int default_seq_len(const GPTConfig& mc);

// The model shape named by -e: sizes, a descriptor, a model file's header,
// or a Hugging Face directory's config.json.
bool model_config(const TrainConfig& cfg, GPTConfig* mc, std::string* err);

// --convert PATH: a run's output directory (its latest complete checkpoint)
// or one of its ckpt_SSSSSSSS directories (that one): the directory the
// checkpoints are in and the step. False with a one-line *err otherwise.
bool convert_source(const std::string& path, std::string* root, int* step, std::string* err);
