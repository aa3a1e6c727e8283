// llmc/model/weight_walk.h: walks over the tensor table that relate a
// rank's part of a flat buffer to the model file's order: every run of
// elements a rank holds (whole buffer or ZeRO shard, tensor-parallel
// slice, pipeline stage, expert-parallel experts), the runs it owns when
// every element must have one owner (checkpoints, exports), and the copies
// between host arrays in file order and backend memory that ride on them.
// Free functions of the table and the sharding, so I/O and checks use them
// on any buffer without the model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "llmc/backend/backend.h"
#include "llmc/model/tensors.h"

// Which tensors a walk visits: all, or only those split over (or only those
// replicated across) the tensor-parallel ranks.
enum class Tensors { all, split, replicated };

// fn(file_offset, buffer_offset, n): a run of n elements, at file_offset in
// the model file's payload and buffer_offset in the flat buffer walked.
using PieceFn = std::function<void(size_t, size_t, size_t)>;

// What a walk visits besides the buffer's kind (sharded: a shard buffer).
struct WalkFilter {
    Tensors which = Tensors::all;
    // Leave out the last pipeline stage's copy of the embeddings (so that
    // gathering over the stages sees every tensor once).
    bool skip_copies = false;
    // Only tensors that meet the file range [file_begin, file_end).
    size_t file_begin = 0, file_end = SIZE_MAX;
    // Whether the tensors that are the same on every ep rank, and those of
    // this ep rank's experts (ep > 1), are visited.
    bool dense = true, experts = true;
};

// Calls fn for every run of elements of a (sharded or whole) flat buffer
// that holds real parameters, in memory order.
void for_each_piece(const TensorTable& t, const Sharding& s, bool sharded, const PieceFn& fn,
                    const WalkFilter& f = WalkFilter());

// Calls fn for every run of elements this rank owns of a flat buffer
// (sharded: its shard) when every element of the model has exactly one
// owner: shards belong to their rank; a whole buffer to the rank with
// whole_owner (dp x cp rank 0); tensors replicated over tp to the rank with
// replicated_owner (tp rank 0); the last pipeline stage's copy of the
// embeddings to nobody (the first stage owns them). Under expert
// parallelism the ep ranks hold different experts: in whole buffers an
// expert tensor belongs to expert_owner (the first rank of its expert-data
// group), the other tensors to whole_owner. Runs come in memory order.
void for_each_owned(const TensorTable& t, const Sharding& s, bool sharded, bool whole_owner, bool replicated_owner,
                    bool expert_owner, const PieceFn& fn);

// Host values of type src_t for the file elements [file_begin, file_end)
// (host points at element file_begin) into buf (type buf_t; a shard buffer
// when sharded): the elements this rank holds.
void upload_file_range(Backend& be, const TensorTable& t, const Sharding& s, void* buf, bool sharded, DType buf_t,
                       const void* host, DType src_t, size_t file_begin, size_t file_end);
// The elements this rank holds of buf into host (model-file order, type
// dst_t); the rest of host is left untouched. which = split lets one rank
// of a tp group contribute the replicated tensors when gathering.
void download_file_order(Backend& be, const TensorTable& t, const Sharding& s, void* host, DType dst_t,
                         const void* buf, bool sharded, DType src_t, Tensors which = Tensors::all);
// Sum of squares of the elements this rank holds of buf among `which`.
double sum_squares(Backend& be, const TensorTable& t, const Sharding& s, const void* buf, bool sharded, DType dt,
                   Tensors which);
