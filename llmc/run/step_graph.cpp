// llmc/run/step_graph.cpp: the whole training step as one recorded region
// (llmc/run/step_graph.h).
#include "llmc/run/step_graph.h"

#include <stdexcept>

#include "llmc/base/fnv.h"

std::string StepGraph::why_not(bool regions, bool sync_free, int world) {
    if (!regions) return "the backend records no regions";
    if (!sync_free) return "the step reads its loss and norm on the host (--sync-free 0)";
    if (world > 1) return "the step communicates (more than one rank)";
    return "";
}

void StepGraph::start(Backend* be, int micro, int B, int T, bool docs) {
    release();
    rows_ = (size_t)B * T;
    micro_ = micro;
    const size_t bytes = (size_t)micro * rows_ * sizeof(int);
    be_ = be;
    in_ = static_cast<int*>(be->alloc(bytes));
    tg_ = static_cast<int*>(be->alloc(bytes));
    dc_ = docs ? static_cast<int*>(be->alloc(bytes)) : nullptr;
    // The region's key: what makes two steps' work differ (one model per
    // run: its shapes and micro-batch count).
    const uint64_t fields[] = {0x5354455047524150ull /* "STEPGRAP" */, (uint64_t)B, (uint64_t)T,
                               (uint64_t)micro, (uint64_t)docs};
    key_ = fnv1a64(kFnvStart, fields, sizeof fields);
    seen_ = false;
}

void StepGraph::stage(int k, const int* in, const int* tg, const int* dc) {
    if (!on() || k < 0 || k >= micro_) throw std::logic_error("StepGraph::stage: no such micro-batch");
    be_->upload(in_ + (size_t)k * rows_, DType::I32, in, DType::I32, rows_);
    be_->upload(tg_ + (size_t)k * rows_, DType::I32, tg, DType::I32, rows_);
    if (dc_) {
        if (!dc) throw std::logic_error("StepGraph::stage: the document mask is on and no document starts were given");
        be_->upload(dc_ + (size_t)k * rows_, DType::I32, dc, DType::I32, rows_);
    }
}

void StepGraph::run(const std::function<void()>& ops, bool plain) {
    if (!on() || plain || !seen_) {
        seen_ = seen_ || on();
        plain_ += on();
        ops();
        return;
    }
    if (be_->region_replay(key_)) {
        replays_++;
        return;
    }
    const bool recording = be_->region_begin(key_);
    ops();
    if (recording) be_->region_end(), recorded_++;
}

void StepGraph::release() {
    if (!be_) return;
    for (int* p : {in_, tg_, dc_})
        if (p) be_->release(p);
    be_ = nullptr;
    in_ = tg_ = dc_ = nullptr;
}
