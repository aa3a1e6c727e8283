// llmc/model/weight_walk.cpp: the walks over the tensor table between a
// rank's flat buffers and the model file's order (llmc/model/weight_walk.h).
#include "llmc/model/weight_walk.h"

#include <algorithm>

void for_each_piece(const TensorTable& t, const Sharding& s, bool sharded, const PieceFn& fn, const WalkFilter& f) {
    // One run of the tensor's local memory <-> the file, cut to this rank's
    // slice of the tensor's unit segment when the buffer is sharded (the
    // expert segments are sliced over the expert-data group).
    auto emit = [&](const TensorEntry& e, size_t local, size_t file, size_t n) {
        size_t g = e.offset + local;
        if (!sharded) return fn(file, g, n);
        const UnitSegment& seg = t.segment_of(e.unit, e.offset);
        size_t lo = seg.slice_begin(seg.experts ? s.expert_rank : s.rank), hi = lo + seg.slice_size();
        size_t b = std::max(lo, g), en = std::min(hi, g + n);
        if (b < en) fn(file + (b - g), seg.shard_begin + (b - lo), en - b);
    };
    for (const TensorEntry& e : t.entries) {
        if ((f.which == Tensors::split && !e.split) || (f.which == Tensors::replicated && e.split)) continue;
        if (!(t.ep_split(e) ? f.experts : f.dense)) continue;
        if (f.skip_copies && e.tied_copy) continue;
        if (e.file_offset >= f.file_end || e.file_offset + e.file_rows * e.file_cols <= f.file_begin) continue;
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

void for_each_owned(const TensorTable& t, const Sharding& s, bool sharded, bool whole_owner, bool replicated_owner,
                    bool expert_owner, const PieceFn& fn) {
    if (!sharded && !whole_owner && !expert_owner) return;
    WalkFilter f;
    f.which = replicated_owner ? Tensors::all : Tensors::split;
    f.skip_copies = true;
    f.dense = sharded || whole_owner;
    f.experts = sharded || expert_owner;
    for_each_piece(t, s, sharded, fn, f);
}

void upload_file_range(Backend& be, const TensorTable& t, const Sharding& s, void* buf, bool sharded, DType buf_t,
                       const void* host, DType src_t, size_t file_begin, size_t file_end) {
    WalkFilter f;
    f.file_begin = file_begin;
    f.file_end = file_end;
    for_each_piece(
        t, s, sharded,
        [&](size_t fo, size_t o, size_t n) {
            size_t b = std::max(fo, file_begin), e = std::min(fo + n, file_end);
            if (b < e)
                be.upload(elem_ptr(buf, buf_t, o + (b - fo)), buf_t, elem_ptr(host, src_t, b - file_begin), src_t,
                          e - b);
        },
        f);
}

void download_file_order(Backend& be, const TensorTable& t, const Sharding& s, void* host, DType dst_t,
                         const void* buf, bool sharded, DType src_t, Tensors which) {
    WalkFilter f;
    f.which = which;
    f.skip_copies = true;
    for_each_piece(
        t, s, sharded,
        [&](size_t fo, size_t o, size_t n) {
            be.download(elem_ptr(host, dst_t, fo), dst_t, elem_ptr(buf, src_t, o), src_t, n);
        },
        f);
}

double sum_squares(Backend& be, const TensorTable& t, const Sharding& s, const void* buf, bool sharded, DType dt,
                   Tensors which) {
    double ss = 0;
    WalkFilter f;
    f.which = which;
    for_each_piece(
        t, s, sharded, [&](size_t, size_t o, size_t n) { ss += be.sum_squares(elem_ptr(buf, dt, o), dt, n); }, f);
    return ss;
}
