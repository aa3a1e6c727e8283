// llmc/data_parallel.cpp: see data_parallel.h. Every collective of data
// parallelism and ZeRO is issued in this file.
#include "data_parallel.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "pipeline_parallel.h"

void* DataParallel::alloc(size_t bytes) {
    void* p = be_.alloc(bytes);
    owned_.push_back(p);
    comm_bytes_ += bytes;
    return p;
}

DataParallel::DataParallel(GPT& model, Comm& comm, int zero_stage, Comm* tp, PipelineParallel* pp)
    : model_(model), comm_(comm), tp_(tp && tp->size() > 1 ? tp : nullptr), pp_(pp && pp->size() > 1 ? pp : nullptr),
      be_(model.backend()), table_(model.table()), prec_(model.precision()),
      stage_(zero_stage), rank_(comm.rank()), size_(comm.size()) {
    const Sharding& sh = model.sharding();
    Sharding want = Sharding::for_zero(zero_stage, size_, rank_);
    if (sh.shards != want.shards || sh.rank != want.rank || sh.params != want.params || sh.grads != want.grads ||
        sh.optimizer != want.optimizer)
        throw std::logic_error("DataParallel: the model's sharding does not match ZeRO stage and group");
    // Rotating buffers must hold the largest unit other than the embeddings.
    size_t max_other = 0;
    for (int u = 1; u < table_.num_units(); u++) max_other = std::max(max_other, table_.unit_size(u));
    auto make_pool = [&](std::vector<UnitBuffer>& pool, DType t, bool with_shard_tmp) {
        pool.resize(3);  // [0] embeddings, [1], [2] rotating
        for (int i = 0; i < 3; i++) {
            size_t n = i == 0 ? table_.unit_size(0) : max_other;
            pool[i].data = alloc(n * dtype_size(t));
            if (with_shard_tmp) pool[i].shard_tmp = alloc(n / size_ * dtype_size(t));
        }
    };
    if (stage_ >= 3) make_pool(param_bufs_, prec_.param, false);
    if (stage_ >= 2) make_pool(grad_bufs_, prec_.grad, true);
    model_.set_provider(this);
}

DataParallel::~DataParallel() {
    try {
        flush();
    } catch (...) {
    }
    if (!model_.sharding().params && !model_.sharding().grads) model_.set_provider(nullptr);
    for (void* p : owned_) be_.release(p);
}

void* DataParallel::shard_ptr(void* buf, DType t, int unit) const { return elem_ptr(buf, t, table_.shard_begin[unit]); }

DataParallel::UnitBuffer* DataParallel::find(std::vector<UnitBuffer>& pool, int unit) {
    for (UnitBuffer& b : pool)
        if (b.unit == unit) return &b;
    return nullptr;
}

// The embedding unit has its own buffer; the others share two. A buffer
// whose gradient reduction is still in flight is finished first.
DataParallel::UnitBuffer* DataParallel::take_free(std::vector<UnitBuffer>& pool, int unit) {
    const int lo = unit == 0 ? 0 : 1, hi = unit == 0 ? 1 : 3;
    for (int i = lo; i < hi; i++)
        if (pool[i].state == Free) return &pool[i];
    for (int i = lo; i < hi; i++)
        if (pool[i].state == Reducing) {
            finish_grad_reduce(pool[i]);
            return &pool[i];
        }
    return nullptr;
}

// ---- parameters (stage 3 gathers them; earlier stages hold them whole) ------------------

void DataParallel::start_gather(UnitBuffer& b, int unit) {
    b.unit = unit;
    b.state = Gathering;
    b.pending = comm_.start_all_gather(shard_ptr(model_.params(), prec_.param, unit), b.data, table_.shard_size(unit),
                                       prec_.param);
}

void DataParallel::prefetch(int unit) {
    if (stage_ < 3 || find(param_bufs_, unit)) return;
    if (UnitBuffer* b = take_free(param_bufs_, unit)) start_gather(*b, unit);
}

const void* DataParallel::acquire(int unit) {
    if (stage_ < 3) return elem_ptr(model_.params(), prec_.param, table_.unit_begin[unit]);
    UnitBuffer* b = find(param_bufs_, unit);
    if (!b) {
        b = take_free(param_bufs_, unit);
        if (!b) throw std::logic_error("ZeRO-3: no free buffer to gather unit " + std::to_string(unit));
        start_gather(*b, unit);
    }
    if (b->state == Gathering) {
        comm_.wait(b->pending);
        b->state = InUse;
    }
    return b->data;
}

void DataParallel::release(int unit) {
    if (stage_ < 3) return;
    if (UnitBuffer* b = find(param_bufs_, unit)) {
        b->unit = -1;
        b->state = Free;
    }
}

// ---- gradients --------------------------------------------------------------------------------

void* DataParallel::grads(int unit) {
    if (stage_ < 2) return elem_ptr(model_.grads(), prec_.grad, table_.unit_begin[unit]);
    UnitBuffer* b = take_free(grad_bufs_, unit);
    if (!b) throw std::logic_error("ZeRO-2: no free gradient buffer for unit " + std::to_string(unit));
    b->unit = unit;
    b->state = InUse;
    be_.zero(b->data, table_.unit_size(unit) * dtype_size(prec_.grad));
    return b->data;
}

void DataParallel::grads_done(int unit) {
    const DType gt = prec_.grad;
    void* g = model_.grads();
    // Sequence-parallel partial gradients are summed right before the unit's
    // reduction, i.e. once per accumulation for stages 0-1 (gradients
    // accumulate in place) and every micro-step for stages 2-3.
    if (stage_ >= 2) model_.sum_partial_grads(unit, find(grad_bufs_, unit)->data);
    else if (last_micro_) model_.sum_partial_grads(unit, elem_ptr(g, gt, table_.unit_begin[unit]));
    if (stage_ == 0) {
        if (last_micro_)
            pending_.push_back(comm_.start_all_reduce(elem_ptr(g, gt, table_.unit_begin[unit]), table_.unit_size(unit), gt,
                                                      ReduceOp::Sum));
    } else if (stage_ == 1) {
        // In place: this rank's slice of the unit receives the sum of everyone's slice.
        if (last_micro_)
            pending_.push_back(comm_.start_reduce_scatter(elem_ptr(g, gt, table_.unit_begin[unit]),
                                                          elem_ptr(g, gt, table_.slice_begin(unit, rank_)),
                                                          table_.shard_size(unit), gt));
    } else {
        UnitBuffer* b = find(grad_bufs_, unit);
        if (!b) throw std::logic_error("ZeRO-2: gradients of unit " + std::to_string(unit) + " were never handed out");
        b->state = Reducing;
        b->pending = comm_.start_reduce_scatter(b->data, b->shard_tmp, table_.shard_size(unit), gt);
    }
}

// Waits for a unit's reduce-scatter and adds the result into the rank's
// gradient shard (micro-steps accumulate there).
void DataParallel::finish_grad_reduce(UnitBuffer& b) {
    if (b.state != Reducing) return;
    comm_.wait(b.pending);
    be_.accumulate(shard_ptr(model_.grads(), prec_.grad, b.unit), b.shard_tmp, table_.shard_size(b.unit));
    b.unit = -1;
    b.state = Free;
}

void DataParallel::flush() {
    for (CommHandle h : pending_) comm_.wait(h);
    pending_.clear();
    for (UnitBuffer& b : grad_bufs_) finish_grad_reduce(b);
}

// ---- the optimizer step -------------------------------------------------------------------------

// The flat-buffer range [lo, hi) of unit u whose reduced gradients this rank
// owns (all of it at stage 0, its slice otherwise), and where lo lives in
// the gradient buffer (at).
void DataParallel::owned_range(int u, size_t* lo, size_t* hi, size_t* at) const {
    *lo = stage_ == 0 ? table_.unit_begin[u] : table_.slice_begin(u, rank_);
    *hi = *lo + (stage_ == 0 ? table_.unit_size(u) : table_.shard_size(u));
    *at = stage_ >= 2 ? table_.shard_begin[u] : *lo;
}

// Squares of the whole model's gradient. Each rank sums what it owns: all
// of it (stage 0: every data-parallel rank holds the same), or its slices
// (stages 1-3, summed over the group). Under tensor parallelism the split
// tensors are summed over the tp group and the replicated ones, equal on
// every tp rank, are counted by tp rank 0 only. Under pipeline parallelism
// the stages' sums are added and the last stage's copy of the embeddings is
// left out (the first stage counts them).
double DataParallel::grad_sum_squares() {
    const DType gt = prec_.grad;
    void* grads = model_.grads();
    const bool count_replicated = !tp_ || tp_->rank() == 0;
    double ss = 0;
    if (!tp_ && stage_ != 1 && !table_.stage.embedding_copy) {
        // Nothing to tell apart: one sum over the whole buffer (padding is zero).
        ss = be_.sum_squares(grads, gt, stage_ == 0 ? table_.total : table_.shard_total);
        if (stage_ >= 2) ss = comm_.host_all_reduce(ss, ReduceOp::Sum);
        return pp_ ? pp_->sum_over_stages(ss) : ss;
    }
    for (int u = 0; u < table_.num_units(); u++) {
        if (table_.unit_size(u) == 0) continue;  // another stage's
        size_t lo, hi, at;
        owned_range(u, &lo, &hi, &at);
        for (const TensorEntry& e : table_.entries) {
            if (e.unit != u || (!e.split && !count_replicated) || e.tied_copy) continue;
            size_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
            if (b < en) ss += be_.sum_squares(elem_ptr(grads, gt, at + (b - lo)), gt, en - b);
        }
    }
    if (stage_ >= 1) ss = comm_.host_all_reduce(ss, ReduceOp::Sum);
    if (tp_) ss = tp_->host_all_reduce(ss, ReduceOp::Sum);
    return pp_ ? pp_->sum_over_stages(ss) : ss;
}

double DataParallel::step(const OptimConfig& o, int step) {
    flush();
    const DType pt = prec_.param, gt = prec_.grad, mt = prec_.master, ot = prec_.opt;
    const int U = table_.num_units();
    void *params = model_.params(), *grads = model_.grads(), *master = model_.master();
    void *m = model_.adam_m(), *v = model_.adam_v();

    // The two copies of the tied embedding unit (first and last pipeline
    // stage) add their gradients, the part this rank owns (an untied
    // model's last stage holds no embedding unit: nothing to add).
    if (pp_ && model_.config().tied && table_.held(0)) {
        size_t lo, hi, at;
        owned_range(0, &lo, &hi, &at);
        pp_->tie_embedding_grads(elem_ptr(grads, gt, at), hi - lo, gt);
    }
    double norm = std::sqrt(grad_sum_squares());
    AdamArgs args = adam_args(o, step, clip_scale(o, norm));

    // This rank's part of every unit, updated in one multi-tensor call.
    std::vector<UpdateSpan> spans;
    for (int u = 0; u < U; u++) {
        if (table_.unit_size(u) == 0) continue;  // another stage's
        UpdateSpan s;
        if (stage_ == 0) {
            size_t b = table_.unit_begin[u];
            s = {b, table_.unit_size(u), elem_ptr(params, pt, b), master ? elem_ptr(master, mt, b) : nullptr,
                 elem_ptr(grads, gt, b), elem_ptr(m, ot, b), elem_ptr(v, ot, b)};
        } else {
            size_t g0 = table_.slice_begin(u, rank_), sb = table_.shard_begin[u];
            s = {g0, table_.shard_size(u), elem_ptr(params, pt, stage_ >= 3 ? sb : g0),
                 master ? elem_ptr(master, mt, sb) : nullptr, elem_ptr(grads, gt, stage_ == 1 ? g0 : sb),
                 elem_ptr(m, ot, sb), elem_ptr(v, ot, sb)};
        }
        spans.push_back(s);
    }
    adamw_spans(be_, prec_, table_, spans, o, args);

    // Stages 1 and 2: every rank needs every updated parameter again.
    if (stage_ == 1 || stage_ == 2) {
        std::vector<CommHandle> hs;
        for (int u = 0; u < U; u++)
            if (table_.unit_size(u) > 0)
                hs.push_back(comm_.start_all_gather(elem_ptr(params, pt, table_.slice_begin(u, rank_)),
                                                    elem_ptr(params, pt, table_.unit_begin[u]), table_.shard_size(u),
                                                    pt));
        for (CommHandle h : hs) comm_.wait(h);
    }
    return norm;
}
