// llmc/parallel/data_parallel.cpp: see data_parallel.h. Every collective of data
// parallelism and ZeRO is issued in this file.
#include "llmc/parallel/data_parallel.h"

#include <algorithm>
#include <stdexcept>

void* DataParallel::alloc(size_t bytes) {
    void* p = be_.alloc(bytes);
    owned_.push_back(p);
    comm_bytes_ += bytes;
    return p;
}

DataParallel::DataParallel(GPT& model, Comm& comm, int zero_stage, Comm* expert_comm)
    : model_(model), comm_(comm), ecomm_(expert_comm ? expert_comm : &comm), be_(model.backend()),
      table_(model.table()), prec_(model.precision()), stage_(zero_stage), rank_(comm.rank()), size_(comm.size()) {
    const Sharding& sh = model.sharding();
    Sharding want = Sharding::for_zero(zero_stage, size_, rank_, ecomm_->size(), ecomm_->rank());
    if (sh.shards != want.shards || sh.rank != want.rank || sh.params != want.params || sh.grads != want.grads ||
        sh.optimizer != want.optimizer || (table_.ep > 1 && (sh.expert_shards != want.expert_shards ||
                                                             sh.expert_rank != want.expert_rank)))
        throw std::logic_error("DataParallel: the model's sharding does not match ZeRO stage and group");
    // Rotating buffers must hold the largest unit other than the embeddings
    // (and its shard).
    size_t max_other = 0, max_shard = 0;
    for (int u = 1; u < table_.num_units(); u++) {
        max_other = std::max(max_other, table_.unit_size(u));
        max_shard = std::max(max_shard, table_.shard_size(u));
    }
    auto make_pool = [&](std::vector<UnitBuffer>& pool, DType t, bool with_shard_tmp) {
        pool.resize(3);  // [0] embeddings, [1], [2] rotating
        for (int i = 0; i < 3; i++) {
            size_t n = i == 0 ? table_.unit_size(0) : max_other;
            pool[i].data = alloc(n * dtype_size(t));
            if (with_shard_tmp) pool[i].shard_tmp = alloc((i == 0 ? table_.shard_size(0) : max_shard) * dtype_size(t));
        }
    };
    if (stage_ >= 3) make_pool(param_bufs_, prec_.param, false);
    if (stage_ >= 2) make_pool(grad_bufs_, prec_.grad, true);
    model_.set_provider(this);
}

DataParallel::~DataParallel() {
    try {
        finish_reductions();
    } catch (...) {
    }
    if (!model_.sharding().params && !model_.sharding().grads) model_.set_provider(nullptr);
    for (void* p : owned_) be_.release(p);
}

void* DataParallel::shard_ptr(void* buf, DType t, int unit) const { return elem_ptr(buf, t, table_.shard_begin[unit]); }

void DataParallel::wait_all(std::vector<Pending>& hs) {
    for (const Pending& p : hs) p.comm->wait(p.handle);
    hs.clear();
}

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
    const DType pt = prec_.param;
    for (const UnitSegment& g : table_.segments[unit]) {
        Comm& c = comm_of(g);
        b.pending.push_back({&c, c.start_all_gather(elem_ptr(model_.params(), pt, g.shard_begin),
                                                    elem_ptr(b.data, pt, g.begin - table_.unit_begin[unit]),
                                                    g.slice_size(), pt)});
    }
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
        wait_all(b->pending);
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
    // The unit's reduction of an earlier micro-step may still be in flight
    // when its next backward starts (always so when a backward hands out a
    // single rotating unit, a pipeline chunk of one block). It is finished
    // and its buffer reused rather than another buffer taken, so that a
    // unit never has two buffers (grads_done would find the older one and
    // reduce it twice, dropping the new gradients) and its shard receives
    // the micro-steps in order.
    UnitBuffer* b = find(grad_bufs_, unit);
    if (b) {
        if (b->state != Reducing)
            throw std::logic_error("ZeRO-2: gradients of unit " + std::to_string(unit) + " handed out twice");
        finish_grad_reduce(*b);
    } else {
        b = take_free(grad_bufs_, unit);
    }
    if (!b) throw std::logic_error("ZeRO-2: no free gradient buffer for unit " + std::to_string(unit));
    b->unit = unit;
    b->state = InUse;
    be_.zero(b->data, table_.unit_size(unit) * dtype_size(prec_.grad));
    return b->data;
}

void DataParallel::grads_done(int unit, bool last_micro_step) {
    const DType gt = prec_.grad;
    void* g = model_.grads();
    UnitBuffer* b = stage_ >= 2 ? find(grad_bufs_, unit) : nullptr;
    if (stage_ >= 2 && (!b || b->state != InUse))
        throw std::logic_error("ZeRO-2: gradients of unit " + std::to_string(unit) + " were never handed out");
    // Sequence-parallel partial gradients are summed right before the unit's
    // reduction, i.e. once per accumulation for stages 0-1 (gradients
    // accumulate in place) and every micro-step for stages 2-3.
    if (stage_ >= 2) model_.sum_partial_grads(unit, b->data);
    else if (last_micro_step) model_.sum_partial_grads(unit, elem_ptr(g, gt, table_.unit_begin[unit]));
    if (stage_ < 2 && !last_micro_step) return;
    if (stage_ >= 2) b->state = Reducing;
    for (const UnitSegment& s : table_.segments[unit]) {
        Comm& c = comm_of(s);
        if (stage_ == 0) {
            pending_.push_back({&c, c.start_all_reduce(elem_ptr(g, gt, s.begin), s.size, gt, ReduceOp::Sum)});
        } else if (stage_ == 1) {
            // In place: this rank's slice of the segment receives the sum of everyone's slice.
            void* mine = elem_ptr(g, gt, s.slice_begin(c.rank()));
            pending_.push_back({&c, c.start_reduce_scatter(elem_ptr(g, gt, s.begin), mine, s.slice_size(), gt)});
        } else {
            const size_t at = s.begin - table_.unit_begin[unit], shard_at = s.shard_begin - table_.shard_begin[unit];
            void* out = elem_ptr(b->shard_tmp, gt, shard_at);
            b->pending.push_back({&c, c.start_reduce_scatter(elem_ptr(b->data, gt, at), out, s.slice_size(), gt)});
        }
    }
}

// Waits for a unit's reduce-scatter and adds the result into the rank's
// gradient shard (micro-steps accumulate there).
void DataParallel::finish_grad_reduce(UnitBuffer& b) {
    if (b.state != Reducing) return;
    wait_all(b.pending);
    be_.accumulate(shard_ptr(model_.grads(), prec_.grad, b.unit), b.shard_tmp, table_.shard_size(b.unit));
    b.unit = -1;
    b.state = Free;
}

void DataParallel::finish_reductions() {
    wait_all(pending_);
    for (UnitBuffer& b : grad_bufs_) finish_grad_reduce(b);
}
