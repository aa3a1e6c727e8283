// llmc/io/weight_gather.cpp: gathering whole tensors from their owners
// (llmc/io/weight_gather.h).
#include "llmc/io/weight_gather.h"

#include <algorithm>

#include "llmc/comm/dist.h"

bool all_ranks_ok(bool ok, std::string* err) {
    std::string msg = ok ? std::string() : *err;
    return dist_all_ok(ok, msg, err);
}

WeightGather::~WeightGather() {
    if (tmp_) model_.backend().release(tmp_);
}

const std::vector<char>& WeightGather::gather(size_t fo, size_t n) {
    Backend& be = model_.backend();
    const DType wt = model_.weights_dtype();
    const size_t ws = dtype_size(wt);
    host_.assign(n * ws, 0);
    for_each_owned(model_.table(), model_.sharding(), model_.weights_sharded(), own_.whole_owner,
                   own_.replicated_owner, own_.expert_owner, [&](size_t fr, size_t o, size_t k) {
                       const size_t b = std::max(fr, fo), en = std::min(fr + k, fo + n);
                       if (b < en)
                           be.download(host_.data() + (b - fo) * ws, wt, elem_ptr(model_.weights(), wt, o + (b - fr)),
                                       wt, en - b);
                   });
    if (own_.world && own_.world->size() > 1) {
        if (n > tmp_elems_) {
            if (tmp_) be.release(tmp_);
            tmp_ = be.alloc(n * ws);
            tmp_elems_ = n;
        }
        CommCounts saved = own_.world->counts();  // export traffic is not step traffic
        be.upload(tmp_, wt, host_.data(), wt, n);
        own_.world->all_reduce(tmp_, n, wt, ReduceOp::Sum);
        be.download(host_.data(), wt, tmp_, wt, n);
        own_.world->counts() = saved;
    }
    return host_;
}
