// llmc/model/weights.cpp: the model's weights in file order: moving them
// between host arrays in model-file order and this rank's part of a flat
// buffer (whole or a ZeRO shard, a tensor-parallel slice, a pipeline
// stage's units), which elements this rank owns, checksums of replicas, and
// the seeded initialisation.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "llmc/base/rng.h"
#include "llmc/model/gpt.h"

template <typename Fn>
void GPT::for_each_piece(bool sharded, Fn fn, Tensors which, bool skip_copies, size_t file_begin, size_t file_end,
                         bool dense, bool experts) const {
    // One run of the tensor's local memory <-> the file, cut to this rank's
    // slice of the tensor's unit segment when the buffer is sharded (the
    // expert segments are sliced over the expert-data group).
    auto emit = [&](const TensorEntry& e, size_t local, size_t file, size_t n) {
        size_t g = e.offset + local;
        if (!sharded) return fn(file, g, n);
        const UnitSegment& s = table_.segment_of(e.unit, e.offset);
        size_t lo = s.slice_begin(s.experts ? sharding_.expert_rank : sharding_.rank), hi = lo + s.slice_size();
        size_t b = std::max(lo, g), en = std::min(hi, g + n);
        if (b < en) fn(file + (b - g), s.shard_begin + (b - lo), en - b);
    };
    for (const TensorEntry& e : table_.entries) {
        if ((which == Tensors::split && !e.split) || (which == Tensors::replicated && e.split)) continue;
        if (!(table_.ep_split(e) ? experts : dense)) continue;
        if (skip_copies && e.tied_copy) continue;
        if (e.file_offset >= file_end || e.file_offset + e.file_rows * e.file_cols <= file_begin) continue;
        for (const RowRun& r : e.runs) {
            if (e.cols == e.file_cols) {  // whole rows: one contiguous run
                emit(e, r.local * e.cols, e.file_offset + r.global * e.file_cols, r.count * e.cols);
                continue;
            }
            for (size_t i = 0; i < r.count; i++)  // a column slice: one run per row
                emit(e, (r.local + i) * e.cols, e.file_offset + (r.global + i) * e.file_cols + e.col_begin, e.cols);
        }
    }
}

void GPT::set_file_range(void* buf, bool sharded, DType buf_t, const void* host, DType src_t, size_t file_begin,
                         size_t file_end) {
    for_each_piece(
        sharded,
        [&](size_t f, size_t o, size_t n) {
            size_t b = std::max(f, file_begin), e = std::min(f + n, file_end);
            if (b < e)
                be_->upload(elem_ptr(buf, buf_t, o + (b - f)), buf_t, elem_ptr(host, src_t, b - file_begin), src_t,
                            e - b);
        },
        Tensors::all, false, file_begin, file_end);
}

void GPT::for_each_owned(bool sharded, bool whole_owner, bool replicated_owner, bool expert_owner,
                         const std::function<void(size_t, size_t, size_t)>& fn) const {
    if (!sharded && !whole_owner && !expert_owner) return;
    for_each_piece(sharded, fn, replicated_owner ? Tensors::all : Tensors::split, true, 0, SIZE_MAX,
                   sharded || whole_owner, sharded || expert_owner);
}

void GPT::set_weights_file_range(const void* host, DType t, size_t file_begin, size_t file_end) {
    set_file_range(params_, sharding_.params, prec_.param, host, t, file_begin, file_end);
    if (master_) set_file_range(master_, sharding_.optimizer, prec_.master, host, t, file_begin, file_end);
}

void GPT::set_file_order(void* buf, bool sharded, DType buf_t, const void* host, DType src_t) {
    set_file_range(buf, sharded, buf_t, host, src_t, 0, table_.file_params);
}

void GPT::get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t, Tensors which) {
    for_each_piece(
        sharded, [&](size_t f, size_t o, size_t n) {
            be_->download(elem_ptr(host, dst_t, f), dst_t, elem_ptr(buf, src_t, o), src_t, n);
        },
        which, true);
}

double GPT::replicated_checksum() {
    double ss = 0;
    for_each_piece(
        sharding_.params,
        [&](size_t, size_t o, size_t n) { ss += be_->sum_squares(elem_ptr(params_, prec_.param, o), prec_.param, n); },
        Tensors::replicated);
    return ss;
}

double GPT::unit_checksum(int u) {
    if (table_.unit_size(u) == 0) return 0;
    const size_t at = sharding_.params ? table_.shard_begin[u] : table_.unit_begin[u];
    const size_t n = sharding_.params ? table_.shard_size(u) : table_.unit_size(u);
    return be_->sum_squares(elem_ptr(params_, prec_.param, at), prec_.param, n);
}

void GPT::set_weights_file_order(const void* host, DType t) {
    set_file_order(params_, sharding_.params, prec_.param, host, t);
    if (master_) set_file_order(master_, sharding_.optimizer, prec_.master, host, t);
}

void GPT::init_random(uint64_t seed) {
    // Drawn on the host in file order for the whole model, tensor by tensor,
    // so the values do not depend on the memory layout or on which rank holds
    // what: every rank draws every tensor of the whole model (the table of
    // one process lists them) and keeps its own part.
    Rng rng(seed);
    // GPT-2 (llm.c): N(0, 0.02), the projections into the residual stream
    // scaled by 1/sqrt(2L). Llama (Hugging Face): N(0, 0.02) everywhere.
    const double std_base = 0.02;
    const double std_resid = cfg_.llama() ? std_base : 0.02 / std::sqrt(2.0 * cfg_.num_layers);
    const TensorTable whole(cfg_);
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : whole.entries) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](const TensorEntry* x, const TensorEntry* y) { return x->file_offset < y->file_offset; });
    std::vector<double> host;
    for (const TensorEntry* e : order) {
        const size_t n = e->file_rows * e->file_cols;
        host.assign(n, 0.0);
        double* x = host.data();
        switch (e->kind) {
            case Param::ln1w: case Param::ln2w: case Param::lnfw:
                for (size_t i = 0; i < n; i++) x[i] = 1.0;
                break;
            case Param::wte: case Param::lm_head:  // padded rows V..Vp-1 stay zero: they never see a gradient
                for (size_t i = 0; i < (size_t)cfg_.vocab_size * e->file_cols; i++) x[i] = std_base * rng.normal();
                break;
            case Param::attprojw: case Param::fcprojw:
                for (size_t i = 0; i < n; i++) x[i] = std_resid * rng.normal();
                break;
            default:
                if (e->decay)
                    for (size_t i = 0; i < n; i++) x[i] = std_base * rng.normal();
                break;  // biases stay zero
        }
        size_t fb = e->file_offset, fe = fb + n;
        set_file_range(params_, sharding_.params, prec_.param, x, DType::F64, fb, fe);
        if (master_) set_file_range(master_, sharding_.optimizer, prec_.master, x, DType::F64, fb, fe);
    }
}
