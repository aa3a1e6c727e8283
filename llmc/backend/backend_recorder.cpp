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
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

class RecordingBackend final : public Backend {
  public:
    explicit RecordingBackend(Backend* inner) : in_(inner) {}
    ~RecordingBackend() override { delete in_; }

    const char* name() const override { return in_->name(); }
    Precision precision() const override { return in_->precision(); }
    bool deterministic() const override { return in_->deterministic(); }
    std::string compute_path() const override { return in_->compute_path(); }

    // ---- memory and transfers: never inside a region --------------------------------
    void* alloc(size_t bytes) override {
        host_op("alloc");
        if (over_budget(in_->alloc_size(bytes))) throw std::bad_alloc();
        return in_->alloc(bytes);
    }
    void release(void* p) override { host_op("release"), in_->release(p); }
    void zero(void* p, size_t bytes) override { op([=] { in_->zero(p, bytes); }); }
    void copy(void* dst, const void* src, size_t bytes) override { op([=] { in_->copy(dst, src, bytes); }); }
    void upload(void* dst, DType dt, const void* host_src, DType st, size_t n) override {
        host_op("upload"), in_->upload(dst, dt, host_src, st, n);
    }
    void download(void* host_dst, DType dt, const void* src, DType st, size_t n) override {
        host_op("download"), in_->download(host_dst, dt, src, st, n);
    }
    void convert(void* dst, DType dt, const void* src, DType st, size_t n) override {
        op([=] { in_->convert(dst, dt, src, st, n); });
    }
    void synchronize() override { host_op("synchronize"), in_->synchronize(); }
    void* native_stream() override { return in_->native_stream(); }
    size_t bytes_in_use() const override { return in_->bytes_in_use(); }
    size_t bytes_peak() const override { return in_->bytes_peak(); }
    size_t alloc_size(size_t bytes) const override { return in_->alloc_size(bytes); }
    void reserve_workspace(const Workspace& w) override { host_op("reserve_workspace"), in_->reserve_workspace(w); }
    size_t free_memory(int local_ranks) const override { return in_->free_memory(local_ranks); }

    // ---- model ops: recorded inside a region --------------------------------------------
    void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte, const void* wpe, int B, int T,
                         int C, int v_begin, int v_end) override {
        op([=] { in_->encoder_forward(out, tokens, pos, wte, wpe, B, T, C, v_begin, v_end); });
    }
    void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos, int B, int T,
                          int C, int v_begin, int v_end) override {
        op([=] { in_->encoder_backward(dwte, dwpe, dout, tokens, pos, B, T, C, v_begin, v_end); });
    }
    void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w, const void* b, int N,
                           int C) override {
        op([=] { in_->layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
    }
    void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                                    const void* w, const void* bias, int N, int C) override {
        op([=] { in_->residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C); });
    }
    void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C) override {
        op([=] { in_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
    }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        op([=] { in_->matmul_forward(out, inp, weight, bias, N, IC, OC); });
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         int N, int IC, int OC) override {
        op([=] { in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); });
    }
    void matmul_gelu_forward(void* pre, void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                             int OC) override {
        op([=] { in_->matmul_gelu_forward(pre, out, inp, weight, bias, N, IC, OC); });
    }
    void matmul_backward_gelu(void* dpre, void* dweight, void* dbias, const void* dout, const void* inp,
                              const void* weight, const void* pre, int N, int IC, int OC) override {
        op([=] { in_->matmul_backward_gelu(dpre, dweight, dbias, dout, inp, weight, pre, N, IC, OC); });
    }
    void add_bias(void* out, const void* bias, int N, int OC) override {
        op([=] { in_->add_bias(out, bias, N, OC); });
    }
    void gelu_forward(void* out, const void* inp, size_t n) override { op([=] { in_->gelu_forward(out, inp, n); }); }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        op([=] { in_->gelu_backward(dinp, inp, dout, n); });
    }
    void residual_forward(void* out, const void* a, const void* b, size_t n) override {
        op([=] { in_->residual_forward(out, a, b, n); });
    }
    void accumulate(void* dst, const void* src, size_t n) override { op([=] { in_->accumulate(dst, src, n); }); }
    void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                           const AttnShape& s) override {
        op([=] { in_->attention_forward(out, lse, q, k, v, s); });
    }
    void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* lse, const AttnShape& s) override {
        op([=] { in_->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s); });
    }
    void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps) override {
        op([=] { in_->rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
    }
    void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b, const void* w,
                                  int N, int C, double eps) override {
        op([=] { in_->residual_rmsnorm_forward(residual, out, rstd, a, b, w, N, C, eps); });
    }
    void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const void* rstd,
                          int N, int C) override {
        op([=] { in_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
    }
    void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
              bool inverse) override {
        op([=] { in_->rope(x, row_stride, heads, HS, pos, B, T, theta, inverse); });
    }
    void swiglu_forward(void* out, const void* gu, int N, int H) override {
        op([=] { in_->swiglu_forward(out, gu, N, H); });
    }
    void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) override {
        op([=] { in_->swiglu_backward(dgu, gu, dout, N, H); });
    }
    void moe_route(void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv, const void* logits, int N,
                   int E, int K, const void* bias) override {
        op([=] { in_->moe_route(probs, topw, topi, offsets, perm, inv, logits, N, E, K, bias); });
    }
    void moe_route_backward(void* dlogits, const void* probs, const int* topi, const void* dtopw, const void* aux_grad,
                            int N, int E, int K) override {
        op([=] { in_->moe_route_backward(dlogits, probs, topi, dtopw, aux_grad, N, E, K); });
    }
    void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N, int K,
                      int C) override {
        op([=] { in_->moe_dispatch(xg, dw, x, yg, w, inv, N, K, C); });
    }
    void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) override {
        op([=] { in_->moe_combine(out, yg, w, inv, N, K, C); });
    }
    void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                 const AttnShape& s, bool first) override {
        op([=] { in_->attention_block_forward(out_acc, lse_acc, q, k, v, s, first); });
    }
    void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                  const void* v, const void* out, const void* lse, const AttnShape& s) override {
        op([=] { in_->attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, s); });
    }
    void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                DType t) override {
        op([=] { in_->copy2d(dst, dst_pitch, src, src_pitch, rows, cols, t); });
    }
    void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V, int Vp,
                              bool write_grad) override {
        op([=] { in_->softmax_crossentropy(logits, losses, targets, dloss, N, V, Vp, write_grad); });
    }
    void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N, int Vl,
                            int v_begin, int V) override {
        op([=] { in_->crossentropy_stats(logits, targets, row_max, target_logit, N, Vl, v_begin, V); });
    }
    void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                             int V) override {
        op([=] { in_->crossentropy_sumexp(logits, row_max, sumexp, N, Vl, v_begin, V); });
    }
    void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max, const void* sumexp,
                             const void* target_logit, double dloss, int N, int Vl, int v_begin, int V,
                             bool write_grad) override {
        op([=] {
            in_->crossentropy_finish(logits, losses, targets, row_max, sumexp, target_logit, dloss, N, Vl, v_begin, V,
                                     write_grad);
        });
    }

    // ---- optimizer: host-side tables and results, never inside a region -------------
    void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                      const AdamArgs& a) override {
        host_op("adamw_update"), in_->adamw_update(param, master, grad, m, v, n, a);
    }
    void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) override {
        host_op("adamw_update_multi"), in_->adamw_update_multi(spans, count, a);
    }
    double sum_squares(const void* x, DType t, size_t n) override {
        host_op("sum_squares");
        return in_->sum_squares(x, t, n);
    }
    double sum_squares_multi(const SumSpan* spans, int count, DType t) override {
        host_op("sum_squares_multi");
        return in_->sum_squares_multi(spans, count, t);
    }

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
    template <typename Fn>
    void op(Fn&& fn) {
        if (recording_) recording_->emplace_back(std::forward<Fn>(fn));
        else fn();
    }
    void host_op(const char* what) const {
        if (recording_)
            throw std::logic_error(std::string("recorded region: ") + what +
                                   " inside a region (regions hold device work only: docs/design.md 2.9)");
    }

    Backend* in_;
    std::map<uint64_t, std::vector<std::function<void()>>> recordings_;
    std::vector<std::function<void()>>* recording_ = nullptr;
    RegionStats stats_{true, 0, 0};
};

}  // namespace

Backend* make_recording_backend(Backend* inner) { return new RecordingBackend(inner); }
