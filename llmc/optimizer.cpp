// llmc/optimizer.cpp: schedule, clipping and the AdamW step.
#include "optimizer.h"

#include <cmath>

double lr_at(const OptimConfig& o, int step) {
    if (step < o.warmup_steps) return o.lr * (double)(step + 1) / (double)o.warmup_steps;
    if (o.max_steps <= o.warmup_steps) return o.lr;
    double ratio = (double)(step - o.warmup_steps) / (double)(o.max_steps - o.warmup_steps);
    double lr_min = o.lr * o.final_lr_frac;
    double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
    return lr_min + coeff * (o.lr - lr_min);
}

std::vector<DecayRange> decay_ranges(const TensorTable& t) {
    std::vector<DecayRange> out;
    for (const TensorEntry& e : t.entries) {
        if (!out.empty() && out.back().decay == e.decay && out.back().end == e.offset)
            out.back().end = e.offset + e.numel;
        else
            out.push_back({e.offset, e.offset + e.numel, e.decay});
    }
    return out;
}

double adamw_step(GPT& model, const OptimConfig& o, int step) {
    Backend& be = model.backend();
    const Precision& p = model.precision();
    const size_t P = model.table().total;
    double norm = std::sqrt(be.sum_squares(model.grads(), p.grad, P));
    double scale = (o.grad_clip > 0 && norm > o.grad_clip) ? o.grad_clip / norm : 1.0;
    int t = step + 1;
    AdamArgs a;
    a.lr = lr_at(o, step);
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.grad_scale = scale;
    a.bias_corr1 = 1.0 - std::pow((double)o.beta1, t);
    a.bias_corr2 = 1.0 - std::pow((double)o.beta2, t);
    for (const DecayRange& r : decay_ranges(model.table())) {
        a.weight_decay = r.decay ? o.weight_decay : 0.0;
        size_t n = r.end - r.begin;
        void* master = model.master() ? elem_ptr(model.master(), p.master, r.begin) : nullptr;
        be.adamw_update(elem_ptr(model.params(), p.param, r.begin), master, elem_ptr(model.grads(), p.grad, r.begin),
                        elem_ptr(model.adam_m(), p.opt, r.begin), elem_ptr(model.adam_v(), p.opt, r.begin), n, a);
    }
    return norm;
}
