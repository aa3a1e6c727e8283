// llmc/backend/backend_recorder.cpp: recorded regions on any backend, by
// recording calls (backend_recorder.h). Every op either runs at once or,
// inside a region being recorded, is kept as a call with its arguments
// copied (pointers, sizes, the attention shape) and run when the region ends
// and at every replay. Ops a CUDA graph could not hold inside a region
// (transfers, allocation, synchronisation, the optimizer's and the norm's
// host-side tables and results) end the run with a message naming the op:
// they are where a region's code broke the rules of docs/design.md 2.9.
#include "llmc/backend/backend_recorder.h"

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "llmc/backend/backend_wrapper.h"

namespace {

class RecordingBackend final : public BackendWrapper {
  public:
    explicit RecordingBackend(Backend* inner) : BackendWrapper(inner) {}

    // ---- regions -------------------------------------------------------------------------
    bool region_replay(uint64_t key) override {
        host_op("region_replay");  // regions do not nest
        auto it = recordings_.find(key);
        if (it == recordings_.end()) return false;
        for (const auto& call : it->second) call();
        stats_.replays++;
        return true;
    }
    bool region_begin(uint64_t key) override {
        host_op("region_begin");
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
