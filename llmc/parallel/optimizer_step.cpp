// llmc/parallel/optimizer_step.cpp: the optimizer step of every layout
// (llmc/parallel/optimizer_step.h).
#include "llmc/parallel/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// A group that takes part: one of more than one rank, else null.
Comm* real(Comm* c) { return c && c->size() > 1 ? c : nullptr; }

// The ZeRO stage a model's sharding was made for (Sharding::for_zero).
int zero_stage(const Sharding& s) { return s.params ? 3 : s.grads ? 2 : s.optimizer ? 1 : 0; }

struct Step {
    GPT& model;
    Backend& be;
    const TensorTable& table;
    Precision prec;
    int stage, rank, erank;
    Comm *dp, *tp, *pp, *embed, *ep;

    // The flat-buffer range [lo, hi) of segment g whose reduced gradients
    // this rank owns (all of it at stage 0, its slice otherwise: of the dp
    // group's, or of the expert-data group's for an expert segment), and
    // where lo lives in the gradient buffer (at).
    void owned_range(const UnitSegment& g, size_t* lo, size_t* hi, size_t* at) const {
        *lo = stage == 0 ? g.begin : g.slice_begin(g.experts ? erank : rank);
        *hi = *lo + (stage == 0 ? g.size : g.slice_size());
        *at = stage >= 2 ? g.shard_begin : *lo;
    }

    double sum_over_stages(double x) { return pp ? pp->host_all_reduce(x, ReduceOp::Sum) : x; }

    // The figures' double at index i: a device all-reduce (the same sum the
    // host all-reduce of that value makes).
    static void reduce_figure(Comm* c, void* figures, int i) {
        if (c) c->all_reduce(elem_ptr(figures, DType::F64, i), 1, DType::F64, ReduceOp::Sum);
    }

    // Squares of the whole model's gradient. Each rank sums what it owns:
    // all of it (stage 0: every data-parallel rank holds the same), or its
    // slices (stages 1-3, summed over the group). Under tensor parallelism
    // the split tensors are summed over the tp group and the replicated
    // ones, equal on every tp rank, are counted by tp rank 0 only. Under
    // pipeline parallelism the stages' sums are added and the last stage's
    // copy of the embeddings is left out (the first stage counts them).
    // Under expert parallelism the expert segments differ across the ep
    // group: at stage 0 their sums are added over it; at stages 1-3 the
    // dp x cp ranks' slices of them are disjoint, so the one sum over the
    // dp group counts every expert once.
    double grad_sum_squares(void* figures = nullptr) {
        const DType gt = prec.grad;
        void* grads = model.grads();
        const bool count_replicated = !tp || tp->rank() == 0;
        // With the step's figures on the device (figures not null) every sum
        // and reduction below stays there, in the same order, into
        // step_figure::sumsq; the host value returned is then 0.
        const int sumsq = step_figure::sumsq, sumsq_experts = step_figure::sumsq_experts;
        void* ssf = figures ? elem_ptr(figures, DType::F64, sumsq) : nullptr;
        void* sxf = figures ? elem_ptr(figures, DType::F64, sumsq_experts) : nullptr;
        double ss = 0;
        if (!tp && stage != 1 && !table.stage.embedding_copy && table.ep == 1) {
            // Nothing to tell apart: one sum over the whole buffer (padding is zero).
            const SumSpan all{grads, stage == 0 ? table.total : table.shard_total};
            if (figures) {
                be.sum_squares_to(ssf, &all, 1, gt, nullptr);
                if (stage >= 2) reduce_figure(dp, figures, sumsq);
                reduce_figure(pp, figures, sumsq);
                return 0;
            }
            ss = be.sum_squares(all.x, gt, all.n);
            if (stage >= 2 && dp) ss = dp->host_all_reduce(ss, ReduceOp::Sum);
            return sum_over_stages(ss);
        }
        // The tensors' pieces this rank counts, summed in one backend call
        // per kind of segment (one synchronisation each on a GPU), in this order.
        std::vector<SumSpan> spans[2];  // dense, experts
        for (int u = 0; u < table.num_units(); u++) {
            if (table.unit_size(u) == 0) continue;  // another stage's
            for (const UnitSegment& g : table.segments[u]) {
                size_t lo, hi, at;
                owned_range(g, &lo, &hi, &at);
                for (const TensorEntry& e : table.entries) {
                    if (e.unit != u || (!e.split && !count_replicated) || e.tied_copy) continue;
                    size_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
                    if (b < en) spans[g.experts].push_back({elem_ptr(grads, gt, at + (b - lo)), en - b});
                }
            }
        }
        if (figures) {
            if (!spans[1].empty()) {
                be.sum_squares_to(sxf, spans[1].data(), (int)spans[1].size(), gt, nullptr);
                if (stage == 0) reduce_figure(ep, figures, sumsq_experts);
            }
            be.sum_squares_to(ssf, spans[0].data(), (int)spans[0].size(), gt, spans[1].empty() ? nullptr : sxf);
            if (stage >= 1) reduce_figure(dp, figures, sumsq);
            reduce_figure(tp, figures, sumsq);
            reduce_figure(pp, figures, sumsq);
            return 0;
        }
        ss = be.sum_squares_multi(spans[0].data(), (int)spans[0].size(), gt);
        double sx = spans[1].empty() ? 0.0 : be.sum_squares_multi(spans[1].data(), (int)spans[1].size(), gt);
        if (stage == 0 && ep) sx = ep->host_all_reduce(sx, ReduceOp::Sum);
        ss += sx;
        if (stage >= 1 && dp) ss = dp->host_all_reduce(ss, ReduceOp::Sum);
        if (tp) ss = tp->host_all_reduce(ss, ReduceOp::Sum);
        return sum_over_stages(ss);
    }
};

}  // namespace

double optimizer_step(GPT& model, const StepGroups& g, const OptimConfig& o, int step, int update, bool skip,
                      bool* skipped, void* figures) {
    const TensorTable& table = model.table();
    Step s{model, model.backend(), table, model.precision(), zero_stage(model.sharding()), model.sharding().rank,
           model.sharding().expert_rank, real(g.dp), real(g.tp), real(g.pp), real(g.embed), real(g.ep)};
    const Precision& prec = s.prec;
    const DType pt = prec.param, gt = prec.grad, mt = prec.master, ot = prec.opt;
    const int U = table.num_units(), stage = s.stage;
    void *params = model.params(), *grads = model.grads(), *master = model.master();
    void *m = model.adam_m(), *v = model.adam_v();

    // 1. The two copies of the tied embedding unit (first and last pipeline
    // stage) add their gradients, the part this rank owns (an untied
    // model's last stage holds no embedding unit: nothing to add).
    if (s.pp && model.config().tied && table.held(0) && s.embed) {
        size_t lo, hi, at;
        s.owned_range(table.segments[0].front(), &lo, &hi, &at);
        s.embed->all_reduce(elem_ptr(grads, gt, at), hi - lo, gt, ReduceOp::Sum);
    }
    // 2. The global norm, and 3. clipping and AdamW on this rank's part of
    // every unit, in one multi-tensor call.
    double norm = 0;
    AdamArgs args;
    if (figures) {
        // The norm, the clip scale and the decision on the device; AdamW
        // reads them there and does nothing on a bad step.
        s.grad_sum_squares(figures);
        StepVerdict v;
        v.phase = 1;
        v.grad_clip = o.grad_clip;
        s.be.step_verdict(figures, v);
        if (real(g.world))
            g.world->all_reduce(elem_ptr(figures, DType::F64, step_figure::skip), 1, DType::F64, ReduceOp::Max);
        // Phase 2: the learning rate and bias corrections at the device's
        // count of updates (a skipped step does not count).
        v.phase = 2;
        v.lr = o.lr, v.warmup = o.warmup_steps, v.max_steps = o.max_steps, v.final_lr_frac = o.final_lr_frac;
        v.beta1 = o.beta1, v.beta2 = o.beta2;
        s.be.step_verdict(figures, v);
        args = adam_args(o, step, update, 1.0);
        args.figures = figures;
        if (skipped) *skipped = false;  // the figures say
    } else {
        norm = std::sqrt(s.grad_sum_squares());
        bool bad = skip || !std::isfinite(norm);
        if (real(g.world)) bad = g.world->host_all_reduce(bad ? 1.0 : 0.0, ReduceOp::Max) > 0;
        if (skipped) *skipped = bad;
        if (bad) return norm;  // a bad step: no update on any rank
        args = adam_args(o, step, update, clip_scale(o, norm));
    }
    std::vector<UpdateSpan> spans;
    for (int u = 0; u < U; u++) {
        if (table.unit_size(u) == 0) continue;  // another stage's
        for (const UnitSegment& sg : table.segments[u]) {
            size_t g0, hi, at;  // the owned range; at: where it lives in the sharded buffers
            s.owned_range(sg, &g0, &hi, &at);
            const size_t sb = stage == 0 ? g0 : sg.shard_begin;
            spans.push_back({g0, hi - g0, elem_ptr(params, pt, stage >= 3 ? sb : g0),
                             master ? elem_ptr(master, mt, sb) : nullptr, elem_ptr(grads, gt, at), elem_ptr(m, ot, sb),
                             elem_ptr(v, ot, sb)});
        }
    }
    adamw_spans(s.be, prec, table, spans, o, args);

    // 4. ZeRO stages 1 and 2: every rank needs every updated parameter again.
    // (Each segment over its group: the expert segments over the expert-data one.)
    if ((stage == 1 || stage == 2) && g.dp) {
        std::vector<std::pair<Comm*, CommHandle>> hs;
        for (int u = 0; u < U; u++)
            for (const UnitSegment& sg : table.segments[u]) {
                if (sg.size == 0) continue;
                Comm* c = sg.experts && g.edp ? g.edp : g.dp;
                hs.push_back({c, c->start_all_gather(elem_ptr(params, pt, sg.slice_begin(c->rank())),
                                                     elem_ptr(params, pt, sg.begin), sg.slice_size(), pt)});
            }
        for (auto& h : hs) h.first->wait(h.second);
    }
    return norm;
}
