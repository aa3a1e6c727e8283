// llmc/io/checksum.h: FNV-1a 64 checksums of a byte stream cut into
// consecutive pieces of known lengths, one checksum per piece, fed in
// whatever blocks the stream arrives in (a checkpoint shard's payload as it
// is written, and again as it is read back).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "llmc/base/fnv.h"  // fnv1a64, kFnvStart


class PieceHasher {
  public:
    // bounds: the byte length of each piece, in payload order.
    explicit PieceHasher(std::vector<uint64_t> bounds) : bounds_(std::move(bounds)) { skip_empty(); }
    void feed(const char* p, size_t n) {
        while (n > 0 && k_ < bounds_.size()) {
            const size_t take = (size_t)std::min<uint64_t>(n, bounds_[k_] - done_);
            h_ = fnv1a64(h_, p, take);
            p += take, n -= take, done_ += take;
            if (done_ == bounds_[k_]) next();
        }
    }
    const std::vector<uint64_t>& sums() const { return sums_; }

  private:
    void next() {
        sums_.push_back(h_);
        h_ = kFnvStart, done_ = 0, k_++;
        skip_empty();
    }
    void skip_empty() {
        while (k_ < bounds_.size() && bounds_[k_] == 0) sums_.push_back(kFnvStart), k_++;
    }
    std::vector<uint64_t> bounds_, sums_;
    uint64_t h_ = kFnvStart, done_ = 0;
    size_t k_ = 0;
};
