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
    int stage, rank;
    Comm *dp, *tp, *pp, *embed;

    // The flat-buffer range [lo, hi) of unit u whose reduced gradients this
    // rank owns (all of it at stage 0, its slice otherwise), and where lo
    // lives in the gradient buffer (at).
    void owned_range(int u, size_t* lo, size_t* hi, size_t* at) const {
        *lo = stage == 0 ? table.unit_begin[u] : table.slice_begin(u, rank);
        *hi = *lo + (stage == 0 ? table.unit_size(u) : table.shard_size(u));
        *at = stage >= 2 ? table.shard_begin[u] : *lo;
    }

    double sum_over_stages(double x) { return pp ? pp->host_all_reduce(x, ReduceOp::Sum) : x; }

    // Squares of the whole model's gradient. Each rank sums what it owns:
    // all of it (stage 0: every data-parallel rank holds the same), or its
    // slices (stages 1-3, summed over the group). Under tensor parallelism
    // the split tensors are summed over the tp group and the replicated
    // ones, equal on every tp rank, are counted by tp rank 0 only. Under
    // pipeline parallelism the stages' sums are added and the last stage's
    // copy of the embeddings is left out (the first stage counts them).
    double grad_sum_squares() {
        const DType gt = prec.grad;
        void* grads = model.grads();
        const bool count_replicated = !tp || tp->rank() == 0;
        double ss = 0;
        if (!tp && stage != 1 && !table.stage.embedding_copy) {
            // Nothing to tell apart: one sum over the whole buffer (padding is zero).
            ss = be.sum_squares(grads, gt, stage == 0 ? table.total : table.shard_total);
            if (stage >= 2 && dp) ss = dp->host_all_reduce(ss, ReduceOp::Sum);
            return sum_over_stages(ss);
        }
        // The tensors' pieces this rank counts, summed in one backend call
        // (one synchronisation on a GPU), in this order.
        std::vector<SumSpan> spans;
        for (int u = 0; u < table.num_units(); u++) {
            if (table.unit_size(u) == 0) continue;  // another stage's
            size_t lo, hi, at;
            owned_range(u, &lo, &hi, &at);
            for (const TensorEntry& e : table.entries) {
                if (e.unit != u || (!e.split && !count_replicated) || e.tied_copy) continue;
                size_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
                if (b < en) spans.push_back({elem_ptr(grads, gt, at + (b - lo)), en - b});
            }
        }
        ss = be.sum_squares_multi(spans.data(), (int)spans.size(), gt);
        if (stage >= 1 && dp) ss = dp->host_all_reduce(ss, ReduceOp::Sum);
        if (tp) ss = tp->host_all_reduce(ss, ReduceOp::Sum);
        return sum_over_stages(ss);
    }
};

}  // namespace

double optimizer_step(GPT& model, const StepGroups& g, const OptimConfig& o, int step, bool skip, bool* skipped) {
    const TensorTable& table = model.table();
    Step s{model, model.backend(), table, model.precision(), zero_stage(model.sharding()), model.sharding().rank,
           real(g.dp), real(g.tp), real(g.pp), real(g.embed)};
    const Precision& prec = s.prec;
    const DType pt = prec.param, gt = prec.grad, mt = prec.master, ot = prec.opt;
    const int U = table.num_units(), stage = s.stage, rank = s.rank;
    void *params = model.params(), *grads = model.grads(), *master = model.master();
    void *m = model.adam_m(), *v = model.adam_v();

    // 1. The two copies of the tied embedding unit (first and last pipeline
    // stage) add their gradients, the part this rank owns (an untied
    // model's last stage holds no embedding unit: nothing to add).
    if (s.pp && model.config().tied && table.held(0) && s.embed) {
        size_t lo, hi, at;
        s.owned_range(0, &lo, &hi, &at);
        s.embed->all_reduce(elem_ptr(grads, gt, at), hi - lo, gt, ReduceOp::Sum);
    }
    // 2. The global norm, and 3. clipping and AdamW on this rank's part of
    // every unit, in one multi-tensor call.
    const double norm = std::sqrt(s.grad_sum_squares());
    if (skipped) *skipped = skip || !std::isfinite(norm);
    if (skip || !std::isfinite(norm)) return norm;  // a bad step: no update on any rank
    const AdamArgs args = adam_args(o, step, clip_scale(o, norm));
    std::vector<UpdateSpan> spans;
    for (int u = 0; u < U; u++) {
        if (table.unit_size(u) == 0) continue;  // another stage's
        UpdateSpan sp;
        if (stage == 0) {
            size_t b = table.unit_begin[u];
            sp = {b, table.unit_size(u), elem_ptr(params, pt, b), master ? elem_ptr(master, mt, b) : nullptr,
                  elem_ptr(grads, gt, b), elem_ptr(m, ot, b), elem_ptr(v, ot, b)};
        } else {
            size_t g0 = table.slice_begin(u, rank), sb = table.shard_begin[u];
            sp = {g0, table.shard_size(u), elem_ptr(params, pt, stage >= 3 ? sb : g0),
                  master ? elem_ptr(master, mt, sb) : nullptr, elem_ptr(grads, gt, stage == 1 ? g0 : sb),
                  elem_ptr(m, ot, sb), elem_ptr(v, ot, sb)};
        }
        spans.push_back(sp);
    }
    adamw_spans(s.be, prec, table, spans, o, args);

    // 4. ZeRO stages 1 and 2: every rank needs every updated parameter again.
    if ((stage == 1 || stage == 2) && g.dp) {
        std::vector<CommHandle> hs;
        for (int u = 0; u < U; u++)
            if (table.unit_size(u) > 0)
                hs.push_back(g.dp->start_all_gather(elem_ptr(params, pt, table.slice_begin(u, rank)),
                                                    elem_ptr(params, pt, table.unit_begin[u]), table.shard_size(u), pt));
        for (CommHandle h : hs) g.dp->wait(h);
    }
    return norm;
}
