// llmc/backend/backend_recorder.cpp: recorded regions on any backend, by
// recording calls (backend_recorder.h). Every op either runs at once or,
// inside a region being recorded, is kept as a call with its arguments
// copied (pointers, sizes, the attention shape) and run when the region ends
// and at every replay. Ops a CUDA graph could not hold inside a region
// (transfers, allocation, synchronisation, new tables of runs for the
// optimizer and the norm, host-side values and results) end the run with a
// message naming the op:
// they are where a region's code broke the rules of docs/design.md 2.9.
#include "llmc/backend/backend_recorder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "llmc/backend/backend_wrapper.h"
#include "llmc/base/fnv.h"

namespace {

class RecordingBackend final : public BackendWrapper {
  public:
    explicit RecordingBackend(Backend* inner) : BackendWrapper(inner) {}

    // ---- regions -------------------------------------------------------------------------
    bool region_replay(uint64_t key) override {
        if (recording_) return false;  // a region inside one being recorded folds into it
        auto it = recordings_.find(key);
        if (it == recordings_.end()) return false;
        for (const auto& call : it->second) call();
        stats_.replays++;
        return true;
    }
    bool region_begin(uint64_t key) override {
        if (recording_) return false;
        recording_ = &recordings_[key];
        recording_->clear();
        return true;
    }
    void region_end() override {
        if (!recording_) throw std::logic_error("region_end without region_begin");
        std::vector<std::function<void()>>* calls = recording_;
        recording_ = nullptr;
        stats_.recorded = (int)recordings_.size();
        for (const auto& call : *calls) call();  // recorded, not yet run: run it now, as a graph launch would
    }
    RegionStats region_stats() const override { return stats_; }

  private:
    // Device work: kept inside a region, run at once outside.
    void device_op(const char*, std::function<void()> fn) override {
        if (recording_) recording_->emplace_back(std::move(fn));
        else fn();
    }
    void host_op(const char* what) override {
        if (recording_)
            throw std::logic_error(std::string("recorded region: ") + what +
                                   " inside a region (regions hold device work only: docs/design.md 2.9)");
    }

    std::map<uint64_t, std::vector<std::function<void()>>> recordings_;
    std::vector<std::function<void()>>* recording_ = nullptr;
    RegionStats stats_{true, 0, 0};
};

}  // namespace

Backend* make_recording_backend(Backend* inner) { return new RecordingBackend(inner); }

namespace {

class ReadCountingBackend final : public BackendWrapper {
  public:
    explicit ReadCountingBackend(Backend* inner) : BackendWrapper(inner) {}
    std::string take() {
        std::string out;
        for (const auto& c : counts_) out += (out.empty() ? "" : ", ") + c.first + " " + std::to_string(c.second);
        counts_.clear();
        return out.empty() ? "none" : out;
    }

  private:
    void host_op(const char* what) override {
        static const char* const reads[] = {"download",    "synchronize", "sum_squares", "sum_squares_multi",
                                            "download_late", "wait_late"};
        for (const char* r : reads)
            if (std::string(r) == what) {
                for (auto& c : counts_)
                    if (c.first == what) return (void)c.second++;
                counts_.push_back({what, 1});
            }
    }
    std::vector<std::pair<std::string, int>> counts_;
};

}  // namespace

Backend* make_read_counting_backend(Backend* inner) { return new ReadCountingBackend(inner); }

std::string take_host_reads(Backend& be) {
    ReadCountingBackend* c = dynamic_cast<ReadCountingBackend*>(&be);
    return c ? c->take() : "";
}

namespace {

class StandInTuningBackend final : public BackendWrapper {
  public:
    StandInTuningBackend(Backend* inner, int rank) : BackendWrapper(inner), rank_(rank) {}

    std::string matmul_scope() const override { return "stand-in algorithms (LLMC_TEST_MATMUL_TUNE)"; }
    void* alloc(size_t bytes) override {
        void* p = BackendWrapper::alloc(bytes);
        sizes_[p] = bytes;
        return p;
    }
    // A product's output in memory given back before the timing: the real
    // timing would write it (it keeps the last call's pointers), so it is
    // printed.
    void release(void* p) override {
        const size_t n = sizes_.count(p) ? sizes_[p] : 0;
        for (auto it = outputs_.begin(); it != outputs_.end();)
            if ((char*)it->first >= (char*)p && (char*)it->first < (char*)p + n) {
                std::fprintf(stderr, "stand-in matmul[%d]: a product's output was released\n", rank_);
                it = outputs_.erase(it);
            } else {
                ++it;
            }
        for (auto it = inputs_.begin(); it != inputs_.end();)
            if ((const char*)*it >= (char*)p && (const char*)*it < (char*)p + n) {
                std::fprintf(stderr, "stand-in matmul[%d]: a product's operand was released\n", rank_);
                it = inputs_.erase(it);
            } else {
                ++it;
            }
        sizes_.erase(p);
        BackendWrapper::release(p);
    }
    void matmul_forward(void* out, const void* inp, const void* w, const void* b, int N, int IC, int OC) override {
        seen("forward", N, IC, OC, b != nullptr);
        output(out, act(), (size_t)N * OC), input({inp, w, b});
        BackendWrapper::matmul_forward(out, inp, w, b, N, IC, OC);
    }
    void matmul_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w, int N,
                         int IC, int OC) override {
        seen("backward", N, IC, OC, db != nullptr);
        output(dinp, act(), (size_t)N * IC), output(dw, grad(), (size_t)OC * IC), output(db, grad(), (size_t)OC);
        input({dout, inp, w});
        BackendWrapper::matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    }
    void matmul_gelu_forward(void* pre, void* out, const void* inp, const void* w, const void* b, int N, int IC,
                             int OC) override {
        seen("gelu_forward", N, IC, OC, b != nullptr);
        output(pre, act(), (size_t)N * OC), output(out, act(), (size_t)N * OC), input({inp, w, b});
        BackendWrapper::matmul_gelu_forward(pre, out, inp, w, b, N, IC, OC);
    }
    void matmul_backward_gelu(void* dpre, void* dw, void* db, const void* dout, const void* inp, const void* w,
                              const void* pre, int N, int IC, int OC) override {
        seen("backward_gelu", N, IC, OC, db != nullptr);
        output(dpre, act(), (size_t)N * IC), output(dw, grad(), (size_t)OC * IC), output(db, grad(), (size_t)OC);
        input({dout, inp, w, pre});
        BackendWrapper::matmul_backward_gelu(dpre, dw, db, dout, inp, w, pre, N, IC, OC);
    }
    // Each shape not yet timed or chosen: algorithms s0, s1, s2 (at most
    // `candidates`), ms = 1 + ((fnv1a64(shape + "/" + id) + 389 rank) mod
    // 1000) / 1000, so ranks rank them differently. And, as a real timing
    // writes the outputs of the products it runs again, every output of
    // the products run since the last timing is overwritten with NaN: a
    // run that still read one would show it.
    std::vector<MatmulTrial> time_matmul_candidates(int candidates) override {
        std::vector<MatmulTrial> out;
        for (const std::string& shape : order_) {
            if (settled_.count(shape)) continue;
            settled_.insert({shape, "s0"});
            MatmulTrial t;
            t.shape = shape;
            for (int i = 0; i < 3 && i < candidates; i++) {
                t.ids.push_back("s" + std::to_string(i));
                const std::string key = shape + "/" + t.ids.back();
                const uint64_t h = fnv1a64(kFnvStart, key.data(), key.size());
                t.ms.push_back(1.0 + (double)((h % 1000 + 389 * (uint64_t)rank_) % 1000) / 1000.0);
            }
            out.push_back(t);
        }
        size_t poisoned = 0;
        for (const auto& o : outputs_) {
            const std::vector<float> nan(o.second.second, std::nanf(""));
            in_->upload(o.first, o.second.first, nan.data(), DType::F32, nan.size());
            poisoned += nan.size();
        }
        outputs_.clear(), inputs_.clear();
        timed_ = true;  // the run times once: later outputs are not written
        // On stderr, unbuffered: each line in one write, whole among the ranks'.
        std::fprintf(stderr, "stand-in matmul[%d]: %zu shapes timed, %zu output elements set to NaN\n", rank_,
                     out.size(), poisoned);
        for (const MatmulTrial& t : out) {
            std::string line = "stand-in matmul trial[" + std::to_string(rank_) + "]: " + t.shape;
            for (size_t i = 0; i < t.ids.size(); i++) line += "\t" + t.ids[i] + "\t" + std::to_string(t.ms[i]);
            std::fprintf(stderr, "%s\n", line.c_str());
        }
        return out;
    }
    int choose_matmul_algorithms(const MatmulChoices& choices) override {
        int changed = 0;
        for (const auto& c : choices) {
            std::fprintf(stderr, "stand-in matmul chosen[%d]: %s\t%s%s\n", rank_, c.first.c_str(),
                         c.second.c_str(), settled_.count(c.first) ? "" : "\t(not run here yet)");
            std::string& cur = settled_[c.first];
            changed += !cur.empty() && cur != c.second;
            cur = c.second;
        }
        return changed;
    }

  private:
    DType act() const { return in_->precision().act; }
    DType grad() const { return in_->precision().grad; }
    void seen(const char* op, int N, int IC, int OC, bool bias) {
        const std::string shape = std::string(op) + " N=" + std::to_string(N) + " IC=" + std::to_string(IC) +
                                  " OC=" + std::to_string(OC) + (bias ? " bias" : "");
        if (known_.insert(shape).second) order_.push_back(shape);
    }
    void input(std::initializer_list<const void*> ps) {
        for (const void* p : ps)
            if (p && !timed_) inputs_.insert(p);
    }
    void output(void* p, DType t, size_t n) {
        if (!p || timed_) return;
        auto& o = outputs_[p];
        o.first = t, o.second = std::max(o.second, n);
    }
    int rank_;
    bool timed_ = false;
    std::vector<std::string> order_;  // the shapes run, in first-run order
    std::set<std::string> known_;
    std::map<std::string, std::string> settled_;           // timed (the untuned s0) or chosen: the algorithm
    std::map<void*, std::pair<DType, size_t>> outputs_;    // the products' outputs since the last timing
    std::set<const void*> inputs_;                         // their operands
    std::map<void*, size_t> sizes_;                        // allocations, for release()
};

}  // namespace

Backend* make_standin_tuning_backend(Backend* inner, int rank) { return new StandInTuningBackend(inner, rank); }
