// llmc/model/optimizer.cpp: schedule, clipping and the AdamW step.
#include "llmc/model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "llmc/backend/step_figures.h"
#include "llmc/base/state_round.h"

double lr_at(const OptimConfig& o, int update) {
    return schedule_lr(o.lr, o.warmup_steps, o.max_steps, o.final_lr_frac, update);
}

AdamArgs adam_args(const OptimConfig& o, int step, int update, double grad_scale) {
    const int t = update + 1;
    AdamArgs a;
    a.lr = lr_at(o, update);
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = 0.0;
    a.grad_scale = grad_scale;
    a.bias_corr1 = bias_correction(o.beta1, t);
    a.bias_corr2 = bias_correction(o.beta2, t);
    a.stochastic = o.stochastic_rounding;
    a.round_key = state_round::step_key(o.round_seed, step);
    a.round_seed = o.round_seed;
    return a;
}

double clip_scale(const OptimConfig& o, double norm) {
    return (o.grad_clip > 0 && norm > o.grad_clip) ? o.grad_clip / norm : 1.0;
}

void adamw_span(Backend& be, const Precision& p, const TensorTable& t, const UpdateSpan& s, const OptimConfig& o,
                AdamArgs a) {
    const size_t end = s.begin + s.n;
    for (const TensorEntry& e : t.entries) {
        size_t b = std::max(s.begin, e.offset), en = std::min(end, e.offset + e.numel);
        if (b >= en) continue;
        size_t k = b - s.begin;  // position inside the span
        a.weight_decay = e.decay ? o.weight_decay : 0.0;
        a.bf16_state = p.opt == DType::BF16;
        be.adamw_update(elem_ptr(s.param, p.param, k), s.master ? elem_ptr(s.master, p.master, k) : nullptr,
                        elem_ptr(s.grad, p.grad, k), elem_ptr(s.m, p.opt, k), elem_ptr(s.v, p.opt, k), en - b, a);
    }
}

void adamw_spans(Backend& be, const Precision& p, const TensorTable& t, const std::vector<UpdateSpan>& spans,
                 const OptimConfig& o, const AdamArgs& a) {
    std::vector<AdamSpan> runs;
    for (const UpdateSpan& s : spans) {
        const size_t end = s.begin + s.n;
        for (const TensorEntry& e : t.entries) {
            size_t b = std::max(s.begin, e.offset), en = std::min(end, e.offset + e.numel);
            if (b >= en) continue;
            size_t k = b - s.begin;  // position inside the span
            runs.push_back({elem_ptr(s.param, p.param, k), s.master ? elem_ptr(s.master, p.master, k) : nullptr,
                            elem_ptr(s.grad, p.grad, k), elem_ptr(s.m, p.opt, k), elem_ptr(s.v, p.opt, k), en - b,
                            e.decay});
        }
    }
    AdamArgs args = a;
    args.weight_decay = o.weight_decay;  // applied to the runs whose tensor decays
    args.bf16_state = p.opt == DType::BF16;
    be.adamw_update_multi(runs.data(), (int)runs.size(), args);
}

double adamw_step(GPT& model, const OptimConfig& o, int step) {
    Backend& be = model.backend();
    const Precision& p = model.precision();
    const TensorTable& t = model.table();
    double norm = std::sqrt(be.sum_squares(model.grads(), p.grad, t.total));
    const std::vector<UpdateSpan> spans{
        {0, t.total, model.params(), model.master(), model.grads(), model.adam_m(), model.adam_v()}};
    adamw_spans(be, p, t, spans, o, adam_args(o, step, step, clip_scale(o, norm)));
    return norm;
}
