// llmc/run/generate.h: the --generate mode of train_gpt: text from a model
// (any -e the trainer loads: an llm.c model file, a Hugging Face directory,
// sizes with the seeded random weights, or with -o DIR -y the latest
// checkpoint in DIR), one token at a time over a KV cache
// (llmc/model/kv_cache.h), greedy or sampled. One process: refused under
// mpirun with more than one rank (the model is whole on one device).
#pragma once
#include <vector>

#include "llmc/base/args.h"
#include "llmc/base/rng.h"
#include "llmc/run/train_config.h"

// Whether the flags ask for generation (--generate or --prompt-ids given).
bool generate_requested(const ArgParser& parser);

// The mode: prints the prompt and its continuation as text, then a line
// "ids: " with every token id (prompt first, comma-separated), then a line
// of counts and speed. Returns main()'s exit status; errors end the process
// with one line "train_gpt: error: ...".
int generate_main(const ArgParser& parser, TrainConfig& cfg);

// How the next token is drawn from a row of logits (HF's order of warpers:
// temperature, then top-k, then top-p). temperature 0: the first id of
// the largest logit (greedy), no random number drawn. top_k 0 and top_p 1
// are off. Ties at top-k's threshold are all kept, as transformers keeps
// them; top-p keeps the most likely ids, in order, until the probability
// before the next one reaches top_p (the first is always kept).
struct SamplingParams {
    double temperature = 1.0;
    int top_k = 0;
    double top_p = 1.0;
};
int pick_token(const std::vector<double>& logits, const SamplingParams& sp, Rng& rng);
