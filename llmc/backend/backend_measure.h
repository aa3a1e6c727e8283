// llmc/backend/backend_measure.h: a backend that allocates nothing and computes
// nothing, only counts the bytes it is asked for. The trainer builds the
// model and its parallel modes on one first, with the real backend's
// precision, so it knows what each rank will hold (the same buffers, so the
// same accounting as the memory line) before a byte is allocated, and can
// stop with a clear line instead of being killed by the kernel's OOM killer.
// The pointers it hands out are distinct but point at nothing: only code
// that allocates and never touches the memory may run on it (constructors).
#pragma once
#include <cstdint>

#include "llmc/backend/backend.h"

class MeasureBackend : public Backend {
  public:
    // Counts as `real` would allocate (its precision and rounding).
    explicit MeasureBackend(const Backend& real)
        : name_(real.name()), prec_(real.precision()), real_(&real) {}
    // Counts for a device that is not here (the planner sizing GPU layouts
    // on a CPU machine): its name, precision, and exact byte counts.
    MeasureBackend(const char* name, const Precision& p) : name_(name), prec_(p) {}
    const char* name() const override { return name_; }
    Precision precision() const override { return prec_; }
    bool deterministic() const override { return true; }

    void* alloc(size_t bytes) override {
        in_use_ += real_ ? real_->alloc_size(bytes) : bytes;
        if (in_use_ > peak_) peak_ = in_use_;
        next_ += 4096;  // distinct, never dereferenced
        return reinterpret_cast<void*>(next_);
    }
    void release(void*) override {}  // what was asked for stays counted (the peak)
    size_t bytes_in_use() const override { return in_use_; }
    size_t bytes_peak() const override { return peak_; }

    // Nothing runs here.
    void zero(void*, size_t) override {}
    void copy(void*, const void*, size_t) override {}
    void upload(void*, DType, const void*, DType, size_t) override {}
    void download(void*, DType, const void*, DType, size_t) override {}
    void convert(void*, DType, const void*, DType, size_t) override {}
    void synchronize() override {}
    void encoder_forward(void*, const int*, const int*, const void*, const void*, int, int, int, int, int) override {}
    void encoder_backward(void*, void*, const void*, const int*, const int*, int, int, int, int, int) override {}
    void layernorm_forward(void*, void*, void*, const void*, const void*, const void*, int, int) override {}
    void residual_layernorm_forward(void*, void*, void*, void*, const void*, const void*, const void*, const void*, int,
                                    int) override {}
    void layernorm_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*, int,
                            int) override {}
    void rmsnorm_forward(void*, void*, const void*, const void*, int, int, double) override {}
    void residual_rmsnorm_forward(void*, void*, void*, const void*, const void*, const void*, int, int, double) override {}
    void rmsnorm_backward(void*, void*, const void*, const void*, const void*, const void*, int, int) override {}
    void rope(void*, size_t, int, int, const int*, int, int, double, bool) override {}
    void swiglu_forward(void*, const void*, int, int) override {}
    void swiglu_backward(void*, const void*, const void*, int, int) override {}
    void moe_route(void*, void*, int*, int*, int*, int*, const void*, int, int, int, const void*) override {}
    void moe_route_backward(void*, const void*, const int*, const void*, const void*, int, int, int) override {}
    void moe_dispatch(void*, void*, const void*, const void*, const void*, const int*, int, int, int) override {}
    void moe_combine(void*, const void*, const void*, const int*, int, int, int) override {}
    int fp8() const override { return real_ ? real_->fp8() : 1; }
    void amax_to(void*, const void*, DType, size_t) override {}
    void fp8_delayed(void*, void*, const void*, int, bool) override {}
    void fp8_history_push(void*, void*, int, int, const void*, bool) override {}
    void matmul_forward_fp8(void*, const void*, const void*, const void*, int, int, int, const void*,
                            const Fp8Delayed*, const Fp8Weight*) override {}
    void matmul_backward_fp8(void*, void*, void*, const void*, const void*, const void*, int, int, int,
                             const void*, const Fp8Kept*, const Fp8Delayed*, const Fp8Weight*) override {}
    void moe_expert_matmul_forward(void*, const void*, const void*, const int*, int, int, int, int) override {}
    void moe_expert_matmul_backward(void*, void*, const void*, const void*, const void*, const int*, int, int, int,
                                    int) override {}
    void moe_route_stats(void*, void*, const void*, const int*, int, int) override {}
    void moe_aux_loss(void*, void*, void*, int, double, double) override {}
    void moe_balance(void*, void*, void*, void*, int, int, double, double) override {}
    void matmul_forward(void*, const void*, const void*, const void*, int, int, int) override {}
    void matmul_backward(void*, void*, void*, const void*, const void*, const void*, int, int, int) override {}
    void add_bias(void*, const void*, int, int) override {}
    void gelu_forward(void*, const void*, size_t) override {}
    void gelu_backward(void*, const void*, const void*, size_t) override {}
    void residual_forward(void*, const void*, const void*, size_t) override {}
    void accumulate(void*, const void*, size_t) override {}
    void attention_forward(void*, void*, const void*, const void*, const void*, const AttnShape&) override {}
    void attention_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*,
                            const void*, const AttnShape&) override {}
    void attention_block_forward(void*, void*, const void*, const void*, const void*, const AttnShape&, bool) override {}
    void attention_block_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*,
                                  const void*, const AttnShape&) override {}
    void copy2d(void*, size_t, const void*, size_t, size_t, size_t, DType) override {}
    void softmax_crossentropy(void*, void*, const int*, double, int, int, int, bool) override {}
    void crossentropy_stats(const void*, const int*, void*, void*, int, int, int, int) override {}
    void crossentropy_sumexp(const void*, const void*, void*, int, int, int, int) override {}
    void crossentropy_finish(void*, void*, const int*, const void*, const void*, const void*, double, int, int, int, int,
                             bool) override {}
    void adamw_update(void*, void*, const void*, void*, void*, size_t, const AdamArgs&) override {}
    void adamw_update_multi(const AdamSpan*, int, const AdamArgs&) override {}
    double sum_squares(const void*, DType, size_t) override { return 0; }
    double sum_squares_multi(const SumSpan*, int, DType) override { return 0; }
    void sum_to_figure(void*, const void*, DType, size_t, double) override {}
    void sum_squares_to(void*, const SumSpan*, int, DType, const void*) override {}
    void step_verdict(void*, const StepVerdict&) override {}

  private:
    const char* name_;
    Precision prec_;
    const Backend* real_ = nullptr;
    size_t in_use_ = 0, peak_ = 0;
    uintptr_t next_ = 4096;
};
