// llmc/model/optimizer.h: AdamW with decoupled weight decay, global-norm gradient
// clipping and the warmup + cosine learning-rate schedule, exactly as
// docs/design.md section 2 defines them. Which tensors decay comes
// from the tensor table; the update itself is a backend op.
#pragma once
#include <vector>

#include "llmc/model/gpt.h"

struct OptimConfig {
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double weight_decay = 0.0;
    double grad_clip = 1.0;  // <= 0 disables clipping
    int warmup_steps = 0;
    double final_lr_frac = 1.0;  // lr decays to lr·final_lr_frac by the last step
    int max_steps = 1;
    // Adam's moments held in bf16 (the model's precision().opt says so):
    // rounded to nearest, or stochastically with bits drawn from this seed
    // and the step (llmc/base/state_round.h).
    bool stochastic_rounding = false;
    unsigned long long round_seed = 0;
};

// Learning rate after `update` updates (0-based; skipped steps do not
// count: docs/design.md section 2.8): schedule_lr of step_figures.h.
double lr_at(const OptimConfig& o, int update);

// The AdamW arguments of step `step` (0-based), the run's update number
// `update` (the steps before it, less those skipped): the learning rate at
// `update`, t = update + 1 for bias correction, gradients scaled by
// grad_scale (clipping), stochastic rounding's key from `step`, weight
// decay still unset.
AdamArgs adam_args(const OptimConfig& o, int step, int update, double grad_scale);

// clip / norm when the norm exceeds the clip, else 1.
double clip_scale(const OptimConfig& o, double norm);

// A run of the flat buffers [begin, begin + n) (table offsets) to update,
// with pointers to its first element in each buffer (master null without
// mixed precision). The buffers may be whole or shards: only the pointers
// say where the run lives.
struct UpdateSpan {
    size_t begin, n;
    void* param;
    void* master;
    const void* grad;
    void* m;
    void* v;
};
// AdamW on a span, split by tensor so each gets its weight decay; padding
// between tensors is left alone.
void adamw_span(Backend& be, const Precision& p, const TensorTable& t, const UpdateSpan& s, const OptimConfig& o,
                AdamArgs a);

// AdamW on many spans with one backend call (one kernel launch on a GPU:
// Backend::adamw_update_multi), each span split by tensor as adamw_span
// splits it; the per-element math and the weight decay of every tensor are
// those of adamw_span, so the two give the same result.
void adamw_spans(Backend& be, const Precision& p, const TensorTable& t, const std::vector<UpdateSpan>& spans,
                 const OptimConfig& o, const AdamArgs& a);

// One optimizer step on a model with whole buffers (one process): norm,
// clipping, AdamW. Returns the gradient norm measured before clipping.
double adamw_step(GPT& model, const OptimConfig& o, int step);
