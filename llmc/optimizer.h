// llmc/optimizer.h: AdamW with decoupled weight decay, global-norm gradient
// clipping and the warmup + cosine learning-rate schedule, exactly as
// shared/reference.md section 2 defines them. Which tensors decay comes
// from the tensor table; the update itself is a backend op.
#pragma once
#include "gpt.h"

struct OptimConfig {
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double weight_decay = 0.0;
    double grad_clip = 1.0;  // <= 0 disables clipping
    int warmup_steps = 0;
    double final_lr_frac = 1.0;  // lr decays to lr·final_lr_frac by the last step
    int max_steps = 1;
};

// Learning rate at step (0-based).
double lr_at(const OptimConfig& o, int step);

// A contiguous range of the flat buffers sharing one weight-decay setting.
struct DecayRange {
    size_t begin, end;
    bool decay;
};
// Maximal ranges of consecutive table entries with the same decay flag.
std::vector<DecayRange> decay_ranges(const TensorTable& t);

// One optimizer step (t = step + 1, 1-based, for bias correction). Returns
// the gradient norm measured before clipping.
double adamw_step(GPT& model, const OptimConfig& o, int step);
