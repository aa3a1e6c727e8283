// llmc/backend/step_figures.h: the step's decision on its figures (the loss
// and the gradient norm: skip the update or not, and by how much to clip),
// one definition for the host, the CPU backend and the CUDA kernel, so a
// step that keeps its figures on the device (--sync-free) decides exactly as
// one that reads them (docs/design.md sections 2.5, 2.8 and 2.10); and the
// layout of those figures in backend memory (Backend::step_verdict's).
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define LLMC_FIG_HD __host__ __device__ __forceinline__
#else
#define LLMC_FIG_HD inline
#endif

// The step's figures as doubles in backend memory, at these indices, for a
// step whose loss, gradient norm, clipping and skip decision never visit the
// host before its end (--sync-free; docs/design.md section 2.10).
namespace step_figure {
enum : int {
    loss = 0,       // the step's loss: this rank's sum of micro-batch means, reduced, then the global mean
    aux,            // Mixtral's load-balancing loss: the sum of the micro-batches', reduced, then the mean
    moe_maxvio,     // Mixtral: the step's loads' imbalance (moe_balance)
    sumsq,          // the squared gradient norm (this rank's part, then reduced)
    sumsq_experts,  // the expert segments' part before it is added (expert parallel)
    norm,           // its square root
    scale,          // the clip scale AdamW multiplies gradients by
    skip,           // 1: the update is skipped (a bad step), else 0
    loss_mean,      // the running mean of accepted losses (--skip-spikes)
    loss_count,     // accepted steps counted in it
    updates,        // updates applied so far (steps not skipped): the schedule's and Adam's count
    lr,             // the step's learning rate, at `updates` before its update
    bias_corr1,     // 1 - beta1^t and 1 - beta2^t, t = updates + 1
    bias_corr2,
    step,           // the step's number (0-based, skipped steps counted): stochastic rounding's key
    count           // the block's size in doubles
};
}  // namespace step_figure

// What step_verdict needs besides the figures: phase 0 (after the loss is
// reduced) sets loss = loss / loss_divisor (aux likewise) and skip when the loss is not
// finite or (skip_spikes > 0, five steps accepted) a spike over
// skip_spikes x loss_mean; phase 1 (after the squared norm is reduced)
// sets norm, skip also when the norm is not finite, and scale = grad_clip /
// norm when grad_clip > 0 and norm > grad_clip (else 1); phase 2 (once the
// ranks agreed on skip), for a step not skipped, counts its loss into the
// running mean (plain over 20, then exponential), sets lr (the schedule of
// lr, warmup, max_steps and final_lr_frac at `updates`: schedule_lr) and
// the bias corrections of t = updates + 1, and counts the update: a skipped
// step is one that never happened (docs/design.md section 2.8); phase 3
// starts the next step (loss = aux = 0, step + 1), so that nothing the host
// passes differs from step to step.
struct StepVerdict {
    int phase = 0;
    double loss_divisor = 1;
    double skip_spikes = 0;
    double grad_clip = 0;
    double lr = 0, final_lr_frac = 1, beta1 = 0.9, beta2 = 0.95;
    int warmup = 0, max_steps = 1;
};

LLMC_FIG_HD bool figure_finite(double x) {
#ifdef __CUDA_ARCH__
    return isfinite(x);
#else
    return std::isfinite(x);
#endif
}

// The learning rate after `update` updates (0-based): linear warmup over
// `warmup` updates, then a cosine from lr to lr·final_frac at max_steps
// (docs/design.md section 2.6); one definition for the host (lr_at) and
// the device (phase 2 of the verdict).
LLMC_FIG_HD double schedule_lr(double lr, int warmup, int max_steps, double final_frac, int update) {
    if (update < warmup) return lr * (double)(update + 1) / (double)warmup;
    if (max_steps <= warmup) return lr;
    const double ratio = (double)(update - warmup) / (double)(max_steps - warmup);
    const double lr_min = lr * final_frac;
#ifdef __CUDA_ARCH__
    const double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
#else
    const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * ratio));
#endif
    return lr_min + coeff * (lr - lr_min);
}
LLMC_FIG_HD double bias_correction(double beta, int t) {
#ifdef __CUDA_ARCH__
    return 1.0 - pow(beta, (double)t);
#else
    return 1.0 - std::pow(beta, (double)t);
#endif
}
// An accepted step's loss into the running mean: plain over the first 20,
// then exponential.
LLMC_FIG_HD void accept_loss(double* s) {
    namespace f = step_figure;
    s[f::loss_count] += 1;
    s[f::loss_mean] += (s[f::loss] - s[f::loss_mean]) / (s[f::loss_count] < 20 ? s[f::loss_count] : 20.0);
}

// s: a block of step_figure::count doubles; see StepVerdict (above).
LLMC_FIG_HD void apply_verdict(double* s, const StepVerdict& v) {
    namespace f = step_figure;
    if (v.phase == 3) {
        s[f::loss] = 0;
        s[f::aux] = 0;
        s[f::step] += 1;
        return;
    }
    if (v.phase == 0) {
        const double l = s[f::loss] / v.loss_divisor;
        s[f::loss] = l;
        s[f::aux] = s[f::aux] / v.loss_divisor;
        const bool spike = v.skip_spikes > 0 && s[f::loss_count] >= 5 && l > v.skip_spikes * s[f::loss_mean];
        s[f::skip] = (!figure_finite(l) || spike) ? 1.0 : 0.0;
        return;
    }
    if (v.phase == 2) {
        if (s[f::skip] != 0.0) return;
        accept_loss(s);
        const int u = (int)s[f::updates];
        s[f::lr] = schedule_lr(v.lr, v.warmup, v.max_steps, v.final_lr_frac, u);
        s[f::bias_corr1] = bias_correction(v.beta1, u + 1);
        s[f::bias_corr2] = bias_correction(v.beta2, u + 1);
        s[f::updates] = u + 1;
        return;
    }
#ifdef __CUDA_ARCH__
    const double n = sqrt(s[f::sumsq]);
#else
    const double n = std::sqrt(s[f::sumsq]);
#endif
    s[f::norm] = n;
    if (!figure_finite(n)) s[f::skip] = 1.0;
    s[f::scale] = (v.grad_clip > 0 && n > v.grad_clip) ? v.grad_clip / n : 1.0;
}
