// tests/unit/test_norm_multi.cpp: the global norm's one backend call over
// many runs (Backend::sum_squares_multi, used by llmc/parallel/optimizer_step.cpp
// under ZeRO and tensor parallelism). On the CPU backend it must give the
// bits of the loop of sum_squares it replaced (the runs' sums added in
// order); the CUDA kernel's partition (llmc/backend/cuda/kernel_index.h: chunks of
// kSumSqChunk, blocks numbered run after run, find_piece) is replayed on the
// host: every element of every run summed once, the partials bounded by the
// reserved count, the sum equal to the loop's up to rounding.
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_measure.h"
#include "llmc/backend/cuda/kernel_index.h"
#include "tests/lib/check.h"

using namespace llmc_idx;

namespace {

// Runs over one buffer of `total` elements: random lengths (empty ones,
// single elements, and some past the CPU's 65536-element chunk and the
// GPU's kSumSqChunk), in buffer order, with gaps between some.
struct Runs {
    std::vector<size_t> off, len;
};
Runs make_runs(size_t total, int count, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> kind(0, 5);
    Runs r;
    size_t at = 0;
    for (int i = 0; i < count && at < total; i++) {
        size_t n = 0;
        switch (kind(rng)) {
            case 0: n = 0; break;
            case 1: n = 1; break;
            case 2: n = 65536 + rng() % 70000; break;
            case 3: n = kSumSqChunk + rng() % 3; break;
            default: n = rng() % 5000; break;
        }
        n = std::min(n, total - at);
        r.off.push_back(at);
        r.len.push_back(n);
        at += n + (rng() % 3 == 0 ? rng() % 100 : 0);
    }
    return r;
}

template <typename F>
void cpu_bitwise(DType t, const char* name) {
    std::unique_ptr<Backend> be(make_cpu_backend(t));
    const size_t total = 600000;
    F* buf = static_cast<F*>(be->alloc(total * sizeof(F)));
    std::mt19937_64 rng(3);
    std::normal_distribution<double> nd(0.0, 1e-2);
    for (size_t i = 0; i < total; i++) buf[i] = (F)nd(rng);
    int bad = 0, cases = 0;
    for (int count : {0, 1, 2, 7, 50, 200}) {
        const Runs r = make_runs(total, count, 11 + count);
        std::vector<SumSpan> spans;
        double loop = 0;  // what optimizer_step summed before: one call per run, added in order
        for (size_t i = 0; i < r.len.size(); i++) {
            spans.push_back({buf + r.off[i], r.len[i]});
            loop += be->sum_squares(buf + r.off[i], t, r.len[i]);
        }
        const double multi = be->sum_squares_multi(spans.data(), (int)spans.size(), t);
        cases++;
        if (std::memcmp(&multi, &loop, sizeof(double)) != 0) {
            bad++;
            std::printf("  %s, %d runs: multi %.17g, loop %.17g\n", name, count, multi, loop);
        }
    }
    CHECK(bad == 0, "cpu %s: sum_squares_multi differs from the loop of sum_squares in %d of %d cases", name, bad,
          cases);
    be->release(buf);
}

// The CUDA launch of SumSqMulti::run replayed: pieces (non-empty runs),
// first blocks, each block's chunk summed by kNormBlock threads (thread t
// takes t, t + kNormBlock, ...), the threads added in order (the kernel's
// fixed tree adds the same doubles in another fixed order), the host's
// per-run then per-piece additions.
void replay_partition() {
    const size_t total = 900000;
    std::vector<float> x(total);
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    int bad_visit = 0, bad_bound = 0, bad_sum = 0, cases = 0;
    for (int count : {1, 3, 40, 300}) {
        const Runs r = make_runs(total, count, 21 + count);
        std::vector<size_t> off, len, first;
        size_t blocks = 0, elems = 0;
        for (size_t i = 0; i < r.len.size(); i++) {
            elems += r.len[i];
            if (r.len[i] == 0) continue;
            off.push_back(r.off[i]);
            len.push_back(r.len[i]);
            first.push_back(blocks);
            blocks += sumsq_blocks(r.len[i]);
        }
        cases++;
        if (blocks > sumsq_max_blocks(elems, (int)r.len.size())) bad_bound++;
        std::vector<int> seen(total, 0);
        std::vector<double> partial(blocks, 0.0);
        for (size_t b = 0; b < blocks; b++) {
            const int i = find_piece(first.data(), (int)first.size(), b);
            const size_t lo = (b - first[i]) * kSumSqChunk, hi = std::min(len[i], lo + kSumSqChunk);
            if (lo >= hi) bad_visit++;  // a block with nothing to do: the block count is off
            double acc = 0;
            for (int t = 0; t < kNormBlock; t++) {
                double th = 0;
                for (size_t k = lo + t; k < hi; k += kNormBlock) {
                    seen[off[i] + k]++;
                    th += (double)x[off[i] + k] * (double)x[off[i] + k];
                }
                acc += th;
            }
            partial[b] = acc;
        }
        for (size_t i = 0; i < r.len.size(); i++)
            for (size_t k = 0; k < r.len[i]; k++) seen[r.off[i] + k]--;  // each run element once, nothing else
        for (int s : seen) bad_visit += s != 0;
        double total_sum = 0, loop = 0;
        for (size_t i = 0; i < first.size(); i++) {
            const size_t end = i + 1 < first.size() ? first[i + 1] : blocks;
            double run_sum = 0;
            for (size_t b = first[i]; b < end; b++) run_sum += partial[b];
            total_sum += run_sum;
        }
        for (size_t i = 0; i < r.len.size(); i++)
            for (size_t k = 0; k < r.len[i]; k++) loop += (double)x[r.off[i] + k] * (double)x[r.off[i] + k];
        if (std::fabs(total_sum - loop) > 1e-12 * loop) bad_sum++;
    }
    CHECK(bad_visit == 0, "sum_squares_multi partition: %d elements or blocks visited other than once", bad_visit);
    CHECK(bad_bound == 0, "sum_squares_multi partition: %d of %d cases need more partials than sumsq_max_blocks",
          bad_bound, cases);
    CHECK(bad_sum == 0, "sum_squares_multi replay: %d of %d sums off the loop's by more than 1e-12", bad_sum, cases);
}

}  // namespace

int main() {
    cpu_bitwise<float>(DType::F32, "fp32");
    cpu_bitwise<double>(DType::F64, "fp64");
    replay_partition();
    // Small pieces of the partition's arithmetic.
    CHECK(sumsq_blocks(0) == 0 && sumsq_blocks(1) == 1 && sumsq_blocks(kSumSqChunk) == 1 &&
              sumsq_blocks(kSumSqChunk + 1) == 2,
          "sumsq_blocks: whole chunks of %zu", kSumSqChunk);
    CHECK(sum_squares_blocks(1) == 1 && sum_squares_blocks((size_t)1 << 40) == kNormMaxBlocks,
          "sum_squares_blocks: at least one block, at most kNormMaxBlocks");
    {
        Precision p{DType::F32, DType::F32, DType::F32, false, DType::F32, DType::F32, DType::F32};
        MeasureBackend mb("cuda", p);
        SumSpan s{nullptr, 10};
        CHECK(mb.sum_squares_multi(&s, 1, DType::F32) == 0.0, "the measuring backend sums nothing");
    }
    return check_summary();
}
