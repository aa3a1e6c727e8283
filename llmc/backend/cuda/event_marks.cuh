// llmc/backend/cuda/event_marks.cuh: the CUDA backend's timing marks
// (Backend::mark, backend.h): CUDA events recorded on the compute stream,
// kept in a pool that grows to the most marks a step has placed, so the
// time between two marks is the device's time between them, whatever the
// host did meanwhile.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

class EventMarks {
  public:
    int mark(cudaStream_t stream) {
        if (used_ == events_.size()) {
            cudaEvent_t e;
            CUDA_CHECK(cudaEventCreate(&e));
            events_.push_back(e);
        }
        CUDA_CHECK(cudaEventRecord(events_[used_], stream));
        return (int)used_++;
    }
    double ms(int a, int b) const {
        float t = 0;
        CUDA_CHECK(cudaEventSynchronize(events_.at(b)));
        CUDA_CHECK(cudaEventElapsedTime(&t, events_.at(a), events_.at(b)));
        return t;
    }
    void clear() { used_ = 0; }
    void release() {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
        events_.clear();
        used_ = 0;
    }

  private:
    std::vector<cudaEvent_t> events_;
    size_t used_ = 0;
};

}  // namespace llmc_cuda
