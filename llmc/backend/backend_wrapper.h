// llmc/backend/backend_wrapper.h: a backend in front of another, forwarding
// every call to it, for the backends that watch the ops of another rather
// than compute: the recording of regions (backend_recorder.h) and the
// timing of the step's breakdown (backend_profile.h). Each call goes
// through one of two hooks, so a wrapper overrides those and nothing else:
//   device_op(name, fn)  device work a recorded region may hold (the model's
//                        ops, copies within the backend): fn runs it, now or
//                        later (its arguments are captured by value);
//   host_op(name)        before a call that touches the host (allocation,
//                        transfers, synchronisation, a new table of runs for
//                        the optimizer or the norm, host-side values and
//                        results), which then runs at once; the optimizer's
//                        ops and the norm's sums also pass through device_op,
//                        after host_op when they touch the host, for what
//                        they compute.
// The wrapper owns the backend it wraps.
#pragma once
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"

class BackendWrapper : public Backend {
  public:
    explicit BackendWrapper(Backend* inner) : in_(inner) {}
    ~BackendWrapper() override { delete in_; }

    const char* name() const override { return in_->name(); }
    Precision precision() const override { return in_->precision(); }
    bool deterministic() const override { return in_->deterministic(); }
    std::string compute_path() const override { return in_->compute_path(); }

    // ---- memory and transfers ---------------------------------------------------------------
    void* alloc(size_t bytes) override {
        host_op("alloc");
        if (over_budget(in_->alloc_size(bytes))) throw std::bad_alloc();
        return in_->alloc(bytes);
    }
    void release(void* p) override { host_op("release"), in_->release(p); }
    void* alloc_host(size_t bytes) override { return host_op("alloc_host"), in_->alloc_host(bytes); }
    void release_host(void* p) override { host_op("release_host"), in_->release_host(p); }
    void zero(void* p, size_t bytes) override { device_op("zero", [=] { in_->zero(p, bytes); }); }
    void copy(void* dst, const void* src, size_t bytes) override {
        device_op("copy", [=] { in_->copy(dst, src, bytes); });
    }
    void upload(void* dst, DType dt, const void* host_src, DType st, size_t n) override {
        host_op("upload"), in_->upload(dst, dt, host_src, st, n);
    }
    void download(void* host_dst, DType dt, const void* src, DType st, size_t n) override {
        host_op("download"), in_->download(host_dst, dt, src, st, n);
    }
    void convert(void* dst, DType dt, const void* src, DType st, size_t n) override {
        device_op("convert", [=] { in_->convert(dst, dt, src, st, n); });
    }
    void synchronize() override { host_op("synchronize"), in_->synchronize(); }
    void* native_stream() override { return in_->native_stream(); }
    size_t bytes_in_use() const override { return in_->bytes_in_use(); }
    size_t bytes_peak() const override { return in_->bytes_peak(); }
    size_t alloc_size(size_t bytes) const override { return in_->alloc_size(bytes); }
    void reserve_workspace(const Workspace& w) override { host_op("reserve_workspace"), in_->reserve_workspace(w); }
    size_t free_memory(int local_ranks) const override { return in_->free_memory(local_ranks); }

    // ---- model ops: device work a region may hold ---------------------------------------
    void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte, const void* wpe, int B, int T,
                         int C, int v_begin, int v_end) override {
        device_op("encoder_forward", [=] { in_->encoder_forward(out, tokens, pos, wte, wpe, B, T, C, v_begin, v_end); });
    }
    void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos, int B, int T,
                          int C, int v_begin, int v_end) override {
        device_op("encoder_backward", [=] { in_->encoder_backward(dwte, dwpe, dout, tokens, pos, B, T, C, v_begin, v_end); });
    }
    void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w, const void* b, int N,
                           int C) override {
        device_op("layernorm_forward", [=] { in_->layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
    }
    void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                                    const void* w, const void* bias, int N, int C) override {
        device_op("residual_layernorm_forward", [=] { in_->residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C); });
    }
    void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C) override {
        device_op("layernorm_backward", [=] { in_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
    }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        device_op("matmul_forward", [=] { in_->matmul_forward(out, inp, weight, bias, N, IC, OC); });
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         int N, int IC, int OC) override {
        device_op("matmul_backward", [=] { in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); });
    }
    void matmul_gelu_forward(void* pre, void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                             int OC) override {
        device_op("matmul_gelu_forward", [=] { in_->matmul_gelu_forward(pre, out, inp, weight, bias, N, IC, OC); });
    }
    void matmul_backward_gelu(void* dpre, void* dweight, void* dbias, const void* dout, const void* inp,
                              const void* weight, const void* pre, int N, int IC, int OC) override {
        device_op("matmul_backward_gelu", [=] { in_->matmul_backward_gelu(dpre, dweight, dbias, dout, inp, weight, pre, N, IC, OC); });
    }
    void add_bias(void* out, const void* bias, int N, int OC) override {
        device_op("add_bias", [=] { in_->add_bias(out, bias, N, OC); });
    }
    void gelu_forward(void* out, const void* inp, size_t n) override { device_op("gelu_forward", [=] { in_->gelu_forward(out, inp, n); }); }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        device_op("gelu_backward", [=] { in_->gelu_backward(dinp, inp, dout, n); });
    }
    void residual_forward(void* out, const void* a, const void* b, size_t n) override {
        device_op("residual_forward", [=] { in_->residual_forward(out, a, b, n); });
    }
    void accumulate(void* dst, const void* src, size_t n) override { device_op("accumulate", [=] { in_->accumulate(dst, src, n); }); }
    void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                           const AttnShape& s) override {
        device_op("attention_forward", [=] { in_->attention_forward(out, lse, q, k, v, s); });
    }
    void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* lse, const AttnShape& s) override {
        device_op("attention_backward", [=] { in_->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s); });
    }
    void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps) override {
        device_op("rmsnorm_forward", [=] { in_->rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
    }
    void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b, const void* w,
                                  int N, int C, double eps) override {
        device_op("residual_rmsnorm_forward", [=] { in_->residual_rmsnorm_forward(residual, out, rstd, a, b, w, N, C, eps); });
    }
    void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const void* rstd,
                          int N, int C) override {
        device_op("rmsnorm_backward", [=] { in_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
    }
    void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
              bool inverse) override {
        device_op("rope", [=] { in_->rope(x, row_stride, heads, HS, pos, B, T, theta, inverse); });
    }
    void swiglu_forward(void* out, const void* gu, int N, int H) override {
        device_op("swiglu_forward", [=] { in_->swiglu_forward(out, gu, N, H); });
    }
    void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) override {
        device_op("swiglu_backward", [=] { in_->swiglu_backward(dgu, gu, dout, N, H); });
    }
    void moe_route(void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv, const void* logits, int N,
                   int E, int K, const void* bias) override {
        device_op("moe_route", [=] { in_->moe_route(probs, topw, topi, offsets, perm, inv, logits, N, E, K, bias); });
    }
    void moe_route_backward(void* dlogits, const void* probs, const int* topi, const void* dtopw, const void* aux_grad,
                            int N, int E, int K) override {
        device_op("moe_route_backward", [=] { in_->moe_route_backward(dlogits, probs, topi, dtopw, aux_grad, N, E, K); });
    }
    void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N, int K,
                      int C) override {
        device_op("moe_dispatch", [=] { in_->moe_dispatch(xg, dw, x, yg, w, inv, N, K, C); });
    }
    void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) override {
        device_op("moe_combine", [=] { in_->moe_combine(out, yg, w, inv, N, K, C); });
    }
    int fp8() const override { return in_->fp8(); }
    void amax_to(void* dst, const void* x, DType t, size_t n) override {
        device_op("amax_to", [=] { in_->amax_to(dst, x, t, n); });
    }
    void activation_amax(bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                         const Fp8Cast* cast) override {
        const Fp8Cast c = cast ? *cast : Fp8Cast{};  // by value: a recorded op outlives the call
        const bool has = cast != nullptr;
        device_op("activation_amax", [=] { in_->activation_amax(swiglu, out, a, dout, N, H, amax, has ? &c : nullptr); });
    }
    void norm_amax(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                   const void* w, const void* bias, int N, int C, double eps, void* amax, const Fp8Cast* cast) override {
        const Fp8Cast c = cast ? *cast : Fp8Cast{};  // (by value, as activation_amax's)
        const bool has = cast != nullptr;
        device_op("norm_amax", [=] {
            in_->norm_amax(rms, residual, out, mean, rstd, a, b, w, bias, N, C, eps, amax, has ? &c : nullptr);
        });
    }
    void norm_backward_amax(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C, void* amax) override {
        device_op("norm_backward_amax",
                  [=] { in_->norm_backward_amax(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C, amax); });
    }
    void fp8_delayed(void* amax, void* step_max, const void* history, int len, bool record) override {
        device_op("fp8_delayed", [=] { in_->fp8_delayed(amax, step_max, history, len, record); });
    }
    void fp8_history_push(void* history, void* step_max, int slots, int len, const void* figures, bool skip) override {
        device_op("fp8_history_push", [=] { in_->fp8_history_push(history, step_max, slots, len, figures, skip); });
    }
    void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC,
                            const void* amax, const Fp8Delayed* delayed, const Fp8Weight* wq) override {
        const Fp8Delayed d = delayed ? *delayed : Fp8Delayed{};  // by value, as the cast
        const Fp8Weight q = wq ? *wq : Fp8Weight{};
        const bool hd = delayed != nullptr, hq = wq != nullptr;
        device_op("matmul_forward_fp8", [=] {
            in_->matmul_forward_fp8(out, inp, weight, bias, N, IC, OC, amax, hd ? &d : nullptr, hq ? &q : nullptr);
        });
    }
    void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                             const void* weight, int N, int IC, int OC, const void* amax, const Fp8Kept* kept,
                             const Fp8Delayed* delayed, const Fp8Weight* wq) override {
        const Fp8Kept k = kept ? *kept : Fp8Kept{};
        const Fp8Delayed d = delayed ? *delayed : Fp8Delayed{};
        const Fp8Weight q = wq ? *wq : Fp8Weight{};
        const bool hk = kept != nullptr, hd = delayed != nullptr, hq = wq != nullptr;
        device_op("matmul_backward_fp8", [=] {
            in_->matmul_backward_fp8(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, amax, hk ? &k : nullptr,
                                     hd ? &d : nullptr, hq ? &q : nullptr);
        });
    }
    void moe_expert_matmul_forward(void* out, const void* inp, const void* weight, const int* offsets, int rows, int E,
                                   int IC, int OC) override {
        device_op("moe_expert_matmul_forward",
                  [=] { in_->moe_expert_matmul_forward(out, inp, weight, offsets, rows, E, IC, OC); });
    }
    void moe_expert_matmul_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* weight,
                                    const int* offsets, int rows, int E, int IC, int OC) override {
        device_op("moe_expert_matmul_backward",
                  [=] { in_->moe_expert_matmul_backward(dinp, dweight, dout, inp, weight, offsets, rows, E, IC, OC); });
    }
    void moe_route_stats(void* stats, void* loads, const void* probs, const int* offsets, int N, int E) override {
        device_op("moe_route_stats", [=] { in_->moe_route_stats(stats, loads, probs, offsets, N, E); });
    }
    void moe_aux_loss(void* grad, void* aux_acc, void* stats, int E, double LN, double gscale) override {
        device_op("moe_aux_loss", [=] { in_->moe_aux_loss(grad, aux_acc, stats, E, LN, gscale); });
    }
    void moe_balance(void* figures, void* bias, void* bias64, void* loads, int L, int E, double divisor,
                     double rate) override {
        device_op("moe_balance", [=] { in_->moe_balance(figures, bias, bias64, loads, L, E, divisor, rate); });
    }
    void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                 const AttnShape& s, bool first) override {
        device_op("attention_block_forward", [=] { in_->attention_block_forward(out_acc, lse_acc, q, k, v, s, first); });
    }
    void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                  const void* v, const void* out, const void* lse, const AttnShape& s) override {
        device_op("attention_block_backward", [=] { in_->attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, s); });
    }
    void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                DType t) override {
        device_op("copy2d", [=] { in_->copy2d(dst, dst_pitch, src, src_pitch, rows, cols, t); });
    }
    void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V, int Vp,
                              bool write_grad) override {
        device_op("softmax_crossentropy", [=] { in_->softmax_crossentropy(logits, losses, targets, dloss, N, V, Vp, write_grad); });
    }
    void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N, int Vl,
                            int v_begin, int V) override {
        device_op("crossentropy_stats", [=] { in_->crossentropy_stats(logits, targets, row_max, target_logit, N, Vl, v_begin, V); });
    }
    void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                             int V) override {
        device_op("crossentropy_sumexp", [=] { in_->crossentropy_sumexp(logits, row_max, sumexp, N, Vl, v_begin, V); });
    }
    void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max, const void* sumexp,
                             const void* target_logit, double dloss, int N, int Vl, int v_begin, int V,
                             bool write_grad) override {
        device_op("crossentropy_finish", [=] {
            in_->crossentropy_finish(logits, losses, targets, row_max, sumexp, target_logit, dloss, N, Vl, v_begin, V,
                                     write_grad);
        });
    }

    // ---- optimizer: host-side tables and results ----------------------------------------------
    void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                      const AdamArgs& a) override {
        host_op("adamw_update");
        device_op("adamw_update", [&] { in_->adamw_update(param, master, grad, m, v, n, a); });
    }
    // The multi-tensor update keeps its table of runs on the device while
    // the runs are those of its last call (a GPU uploads it when they
    // change: cuda/adamw.cuh), and with the step's figures
    // (AdamArgs::figures) nothing else of the step comes from the host: then
    // it is device work that a region may hold. A new table is an upload;
    // the host's learning rate and clip scale are values a replay would
    // repeat.
    void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) override {
        std::vector<AdamSpan> runs(spans, spans + count);
        if (!same_runs(runs, adam_runs_)) {
            adam_runs_ = runs;
            host_op("adamw_update_multi with new runs (its table uploaded)");
        }
        if (!a.figures) host_op("adamw_update_multi with the step's values from the host (no --sync-free figures)");
        device_op("adamw_update_multi", [=] { in_->adamw_update_multi(runs.data(), (int)runs.size(), a); });
    }
    double sum_squares(const void* x, DType t, size_t n) override {
        host_op("sum_squares");
        double r = 0;
        device_op("sum_squares", [&] { r = in_->sum_squares(x, t, n); });
        return r;
    }
    double sum_squares_multi(const SumSpan* spans, int count, DType t) override {
        sumsq_runs_.assign(spans, spans + count);  // the table sum_squares_to shares on a GPU
        host_op("sum_squares_multi");
        double r = 0;
        device_op("sum_squares_multi", [&] { r = in_->sum_squares_multi(spans, count, t); });
        return r;
    }

    // ---- the step's figures: device work (no result to the host) ----------------------------
    void sum_to_figure(void* acc, const void* x, DType t, size_t n, double divisor) override {
        device_op("sum_to_figure", [=] { in_->sum_to_figure(acc, x, t, n, divisor); });
    }
    void sum_squares_to(void* dst, const SumSpan* spans, int count, DType t, const void* add) override {
        // The runs' table is the host's until the call returns: copied for a
        // later run. On a GPU it goes to the device when the runs change, as
        // adamw_update_multi's.
        std::vector<SumSpan> runs(spans, spans + count);
        if (!same_runs(runs, sumsq_runs_)) {
            sumsq_runs_ = runs;
            host_op("sum_squares_to with new runs (its table uploaded)");
        }
        device_op("sum_squares_to", [=] { in_->sum_squares_to(dst, runs.data(), (int)runs.size(), t, add); });
    }
    void step_verdict(void* figures, const StepVerdict& v) override {
        device_op("step_verdict", [=] { in_->step_verdict(figures, v); });
    }
    void download_late(int slot, const void* src, int n) override {
        host_op("download_late"), in_->download_late(slot, src, n);
    }
    void wait_late(int slot, double* dst) override { host_op("wait_late"), in_->wait_late(slot, dst); }

    // ---- matmul algorithms: host work (the timing waits for the device) ----------------------
    std::string matmul_scope() const override { return in_->matmul_scope(); }
    std::vector<MatmulTrial> time_matmul_candidates(int candidates) override {
        host_op("time_matmul_candidates");
        return in_->time_matmul_candidates(candidates);
    }
    int choose_matmul_algorithms(const MatmulChoices& choices) override {
        host_op("choose_matmul_algorithms");
        return in_->choose_matmul_algorithms(choices);
    }

  protected:
    virtual void device_op(const char* name, std::function<void()> fn) {
        (void)name;
        fn();
    }
    virtual void host_op(const char* name) { (void)name; }
    Backend* in_;

  private:
    static bool same_span(const AdamSpan& a, const AdamSpan& b) {
        return a.param == b.param && a.master == b.master && a.grad == b.grad && a.m == b.m && a.v == b.v &&
               a.n == b.n && a.decay == b.decay;
    }
    static bool same_span(const SumSpan& a, const SumSpan& b) { return a.x == b.x && a.n == b.n; }
    template <typename S>
    static bool same_runs(const std::vector<S>& a, const std::vector<S>& b) {
        if (a.size() != b.size()) return false;
        for (size_t i = 0; i < a.size(); i++)
            if (!same_span(a[i], b[i])) return false;
        return true;
    }
    // The runs of the last multi-tensor update and of the last sum of
    // squares over runs: the tables a GPU holds.
    std::vector<AdamSpan> adam_runs_;
    std::vector<SumSpan> sumsq_runs_;
};
