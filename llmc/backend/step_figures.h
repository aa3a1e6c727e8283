// llmc/backend/step_figures.h: the step's decision on its figures (the loss
// and the gradient norm: skip the update or not, and by how much to clip),
// one definition for the host, the CPU backend and the CUDA kernel, so a
// step that keeps its figures on the device (--sync-free) decides exactly as
// one that reads them (docs/design.md sections 2.5, 2.8 and 2.10).
#pragma once
#include <cmath>

#include "llmc/backend/backend.h"

#ifdef __CUDACC__
#define LLMC_FIG_HD __host__ __device__ __forceinline__
#else
#define LLMC_FIG_HD inline
#endif

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

// s: a block of step_figure::count doubles; see StepVerdict (backend.h).
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
