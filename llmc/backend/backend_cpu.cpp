// llmc/backend/backend_cpu.cpp: Backend on the CPU. Memory is host memory; each op
// forwards to the typed template in cpu_ops.h.
#include "llmc/backend/backend_cpu.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "llmc/backend/cpu_moe.h"
#include "llmc/backend/cpu_fp8.h"
#include "llmc/base/test_hooks.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/step_figures.h"

namespace {

template <typename F>
class CpuBackend : public Backend {
    using P = F*;
    using CP = const F*;
    static P f(void* p) { return static_cast<P>(p); }
    static CP f(const void* p) { return static_cast<CP>(p); }
    static constexpr DType kType = sizeof(F) == 8 ? DType::F64 : DType::F32;

    std::unordered_map<void*, size_t> sizes_;
    std::vector<F> fp8_[3];  // the FP8 operand copies: input, weight, output gradient
    F* fp8_copy(int i, const F* x, size_t n, double amax, fp8::Format fmt) {
        if (fp8_[i].size() < n) fp8_[i].resize(n);
        cpu::fp8_round(fp8_[i].data(), x, n, amax, (int)fmt);
        return fp8_[i].data();
    }
    size_t in_use_ = 0, peak_ = 0;

  public:
    const char* name() const override { return "cpu"; }
    Precision precision() const override { return {kType, kType, kType, false, kType, kType, kType}; }
    bool deterministic() const override { return true; }

    size_t alloc_size(size_t bytes) const override { return bytes ? ((bytes + 63) / 64) * 64 : 0; }
    // The node's available memory (MemAvailable), shared by its ranks.
    size_t free_memory(int local_ranks) const override {
        FILE* f = std::fopen("/proc/meminfo", "r");
        if (!f) return 0;
        char line[256];
        unsigned long long kib = 0;
        while (std::fgets(line, sizeof(line), f))
            if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
        std::fclose(f);
        return (size_t)(kib * 1024ull / (unsigned long long)(local_ranks > 0 ? local_ranks : 1));
    }

    void* alloc(size_t bytes) override {
        size_t rounded = ((bytes + 63) / 64) * 64;
        if (over_budget(rounded)) throw std::bad_alloc();
        void* p = std::aligned_alloc(64, rounded ? rounded : 64);
        if (!p) throw std::bad_alloc();
        std::memset(p, 0, rounded);
        sizes_[p] = rounded;
        in_use_ += rounded;
        if (in_use_ > peak_) peak_ = in_use_;
        return p;
    }
    void release(void* p) override {
        if (!p) return;
        auto it = sizes_.find(p);
        if (it != sizes_.end()) {
            in_use_ -= it->second;
            sizes_.erase(it);
        }
        std::free(p);
    }
    ~CpuBackend() override {
        for (auto& kv : sizes_) std::free(kv.first);
    }
    void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
    void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
    void upload(void* dst, DType dt, const void* src, DType st, size_t n) override { convert_host(dst, dt, src, st, n); }
    void download(void* dst, DType dt, const void* src, DType st, size_t n) override {
        convert_host(dst, dt, src, st, n);
    }
    void convert(void* dst, DType dt, const void* src, DType st, size_t n) override {
        convert_host(dst, dt, src, st, n);
    }
    void synchronize() override {}
    size_t bytes_in_use() const override { return in_use_; }
    size_t bytes_peak() const override { return peak_; }

    void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte, const void* wpe, int B,
                         int T, int C, int v_begin, int v_end) override {
        cpu::encoder_forward(f(out), tokens, pos, f(wte), f(wpe), B, T, C, v_begin, v_end);
    }
    void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos, int B, int T,
                          int C, int v_begin, int v_end) override {
        cpu::encoder_backward(f(dwte), f(dwpe), f(dout), tokens, pos, B, T, C, v_begin, v_end);
    }
    void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w, const void* b, int N,
                           int C) override {
        cpu::layernorm_forward(f(out), f(mean), f(rstd), f(inp), f(w), f(b), N, C);
    }
    void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                                    const void* w, const void* bias, int N, int C) override {
        cpu::residual_layernorm_forward(f(residual), f(out), f(mean), f(rstd), f(a), f(b), f(w), f(bias), N, C);
    }
    void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C) override {
        cpu::layernorm_backward(f(dinp), f(dw), f(db), f(dout), f(inp), f(w), f(mean), f(rstd), N, C);
    }
    void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps) override {
        cpu::rmsnorm_forward(f(out), f(rstd), f(inp), f(w), N, C, eps);
    }
    void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b, const void* w,
                                  int N, int C, double eps) override {
        cpu::residual_rmsnorm_forward(f(residual), f(out), f(rstd), f(a), f(b), f(w), N, C, eps);
    }
    void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const void* rstd,
                          int N, int C) override {
        cpu::rmsnorm_backward(f(dinp), f(dw), f(dout), f(inp), f(w), f(rstd), N, C);
    }
    void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
              bool inverse) override {
        cpu::rope(f(x), row_stride, heads, HS, pos, B, T, theta, inverse);
    }
    void swiglu_forward(void* out, const void* gu, int N, int H) override { cpu::swiglu_forward(f(out), f(gu), N, H); }
    void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) override {
        cpu::swiglu_backward(f(dgu), f(gu), f(dout), N, H);
    }
    void moe_route(void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv, const void* logits, int N,
                   int E, int K, const void* bias) override {
        cpu::moe_route(f(probs), f(topw), topi, offsets, perm, inv, f(logits), N, E, K, bias ? f(bias) : nullptr);
    }
    void moe_route_backward(void* dlogits, const void* probs, const int* topi, const void* dtopw, const void* aux_grad,
                            int N, int E, int K) override {
        cpu::moe_route_backward(f(dlogits), f(probs), topi, f(dtopw), f(aux_grad), N, E, K);
    }
    void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N, int K,
                      int C) override {
        cpu::moe_dispatch(f(xg), f(dw), f(x), f(yg), f(w), inv, N, K, C);
    }
    void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) override {
        cpu::moe_combine(f(out), f(yg), f(w), inv, N, K, C);
    }
    int fp8() const override { return test_hooks::fp8_align(); }
    void amax_to(void* dst, const void* x, DType t, size_t n) override {
        *static_cast<double*>(dst) = t == DType::F64 ? cpu::amax(static_cast<const double*>(x), n)
                                     : t == DType::F32 ? cpu::amax(static_cast<const float*>(x), n)
                                                       : throw std::invalid_argument("cpu amax_to: unsupported type");
    }
    void fp8_delayed(void* amax, void* step_max, const void* history, int len, bool record) override {
        cpu::fp8_delayed(static_cast<double*>(amax), static_cast<double*>(step_max),
                         static_cast<const double*>(history), len, record);
    }
    void fp8_history_push(void* history, void* step_max, int slots, int len, const void* figures, bool skip) override {
        cpu::fp8_history_push(static_cast<double*>(history), static_cast<double*>(step_max), slots, len,
                              static_cast<const double*>(figures), skip);
    }
    // The operands' rounded copies (cpu_fp8.h) in host scratch, then the
    // ordinary product of the copies.
    // The amaxes the operands scale by: as given (the weight's where wq
    // keeps it), or under delayed scaling their histories' (fp8::delayed_amax,
    // recording the measured ones).
    static std::array<double, 3> scaled_by(const void* amax, const Fp8Delayed* d, const Fp8Weight* wq, int n) {
        const double* a = static_cast<const double*>(amax);
        std::array<double, 3> am{a[0], wq ? *static_cast<const double*>(wq->amax) : a[1], n > 2 ? a[2] : 0.0};
        if (!d) return am;
        double* step = static_cast<double*>(d->step_max);
        const double* hist = static_cast<const double*>(d->history);
        for (int i = 0; i < n; i++)
            am[i] = fp8::delayed_amax(am[i], step + i, hist + (size_t)i * d->len, d->len, (d->record >> i) & 1u);
        return am;
    }
    void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC,
                            const void* amax, const Fp8Delayed* d, const Fp8Weight* w8) override {
        const std::array<double, 3> am = scaled_by(amax, d, w8, 2);
        F* xq = fp8_copy(0, f(inp), (size_t)N * IC, am[0], fp8::Format::e4m3);
        F* wq = fp8_copy(1, f(weight), (size_t)OC * IC, am[1], fp8::Format::e4m3);
        cpu::matmul_forward(f(out), xq, wq, f(bias), N, IC, OC);
    }
    // (kept: the GPU's FP8 bytes of x^T; the copies here are rounded from inp itself)
    void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                             const void* weight, int N, int IC, int OC, const void* amax, const Fp8Kept*,
                             const Fp8Delayed* d, const Fp8Weight* w8) override {
        const std::array<double, 3> am = scaled_by(amax, d, w8, 3);
        F* dq = fp8_copy(2, f(dout), (size_t)N * OC, am[2], fp8::Format::e5m2);
        F* xq = fp8_copy(0, f(inp), (size_t)N * IC, am[0], fp8::Format::e4m3);
        F* wq = fp8_copy(1, f(weight), (size_t)OC * IC, am[1], fp8::Format::e4m3);
        cpu::matmul_backward(f(dinp), f(dweight), (F*)nullptr, dq, xq, wq, N, IC, OC);
        if (dbias) cpu::bias_backward(f(dbias), f(dout), N, OC);  // from the unrounded gradient
    }
    void moe_expert_matmul_forward(void* out, const void* inp, const void* weight, const int* offsets, int rows, int E,
                                   int IC, int OC) override {
        cpu::expert_matmul_forward(*this, out, inp, weight, offsets, rows, E, IC, OC);
    }
    void moe_expert_matmul_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* weight,
                                    const int* offsets, int rows, int E, int IC, int OC) override {
        cpu::expert_matmul_backward(*this, dinp, dweight, dout, inp, weight, offsets, rows, E, IC, OC);
    }
    void moe_route_stats(void* stats, void* loads, const void* probs, const int* offsets, int N, int E) override {
        cpu::moe_route_stats(static_cast<double*>(stats), static_cast<double*>(loads), f(probs), offsets, N, E);
    }
    void moe_aux_loss(void* grad, void* aux_acc, void* stats, int E, double LN, double gscale) override {
        cpu::moe_aux_loss(f(grad), static_cast<double*>(aux_acc), static_cast<double*>(stats), E, LN, gscale);
    }
    void moe_balance(void* figures, void* bias, void* bias64, void* loads, int L, int E, double divisor,
                     double rate) override {
        cpu::moe_balance(static_cast<double*>(figures), f(bias), static_cast<double*>(bias64),
                         static_cast<double*>(loads), L, E, divisor, rate);
    }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        cpu::matmul_forward(f(out), f(inp), f(weight), f(bias), N, IC, OC);
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                         const void* weight, int N, int IC, int OC) override {
        cpu::matmul_backward(f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), N, IC, OC);
    }
    void add_bias(void* out, const void* bias, int N, int OC) override { cpu::add_bias(f(out), f(bias), N, OC); }
    void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N, int Vl,
                            int v_begin, int V) override {
        cpu::crossentropy_stats(f(logits), targets, f(row_max), f(target_logit), N, Vl, v_begin, V);
    }
    void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                             int V) override {
        cpu::crossentropy_sumexp(f(logits), f(row_max), f(sumexp), N, Vl, v_begin, V);
    }
    void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max, const void* sumexp,
                             const void* target_logit, double dloss, int N, int Vl, int v_begin, int V,
                             bool write_grad) override {
        cpu::crossentropy_finish(f(logits), f(losses), targets, f(row_max), f(sumexp), f(target_logit), dloss, N, Vl,
                                 v_begin, V, write_grad);
    }
    void gelu_forward(void* out, const void* inp, size_t n) override { cpu::gelu_forward(f(out), f(inp), n); }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        cpu::gelu_backward(f(dinp), f(inp), f(dout), n);
    }
    void residual_forward(void* out, const void* a, const void* b, size_t n) override {
        cpu::residual_forward(f(out), f(a), f(b), n);
    }
    void accumulate(void* dst, const void* src, size_t n) override {
        cpu::residual_forward(f(dst), f(dst), f(src), n);
    }
    void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                           const AttnShape& s) override {
        cpu::attention_forward(f(out), f(lse), f(q), f(k), f(v), s);
    }
    void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                            const void* v, const void* out, const void* lse, const AttnShape& s) override {
        cpu::attention_backward(f(dq), f(dk), f(dv), f(dout), f(q), f(k), f(v), f(out), f(lse), s);
    }
    void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                 const AttnShape& s, bool first) override {
        cpu::attention_block_forward(f(out_acc), f(lse_acc), f(q), f(k), f(v), s, first);
    }
    void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                  const void* v, const void* out, const void* lse, const AttnShape& s) override {
        cpu::attention_block_backward(f(dq), f(dk), f(dv), f(dout), f(q), f(k), f(v), f(out), f(lse), s);
    }
    void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                DType t) override {
        if (t == DType::F64) cpu::copy2d((double*)dst, dst_pitch, (const double*)src, src_pitch, rows, cols);
        else if (t == DType::F32 || t == DType::I32) cpu::copy2d((float*)dst, dst_pitch, (const float*)src, src_pitch, rows, cols);
        else cpu::copy2d((uint16_t*)dst, dst_pitch, (const uint16_t*)src, src_pitch, rows, cols);
    }
    void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V, int Vp,
                              bool write_grad) override {
        cpu::softmax_crossentropy(f(logits), f(losses), targets, dloss, N, V, Vp, write_grad);
    }
    void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                      const AdamArgs& a) override {
        AdamArgs ai = a;
        if (!with_figures(&ai)) return;  // a skipped step
        cpu::adamw_update_state(f(param), f(master), f(grad), m, v, n, ai);
    }
    // The multi-tensor update is the per-run update in order: on the CPU
    // there is no launch to save, and the results stay bit for bit those of
    // adamw_update.
    void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) override {
        AdamArgs ai = a;
        if (!with_figures(&ai)) return;  // a skipped step
        for (int i = 0; i < count; i++) {
            const AdamSpan& s = spans[i];
            ai.weight_decay = s.decay ? a.weight_decay : 0.0;
            adamw_update(s.param, s.master, s.grad, s.m, s.v, s.n, ai);
        }
    }
    double sum_squares(const void* x, DType t, size_t n) override {
        if (t == DType::F64) return cpu::sum_squares(static_cast<const double*>(x), n);
        if (t == DType::F32) return cpu::sum_squares(static_cast<const float*>(x), n);
        throw std::invalid_argument("cpu sum_squares: unsupported type");
    }
    // The loop of single calls, in order (no launch to save on the CPU).
    double sum_squares_multi(const SumSpan* spans, int count, DType t) override {
        double ss = 0;
        for (int i = 0; i < count; i++) ss += sum_squares(spans[i].x, t, spans[i].n);
        return ss;
    }
    // The step's figures live in host memory here: the same arithmetic as
    // the host's, in place.
    void sum_to_figure(void* acc, const void* x, DType t, size_t n, double divisor) override {
        double sum = 0;
        if (t == DType::F64) {
            for (size_t i = 0; i < n; i++) sum += static_cast<const double*>(x)[i];
        } else if (t == DType::F32) {
            for (size_t i = 0; i < n; i++) sum += (double)static_cast<const float*>(x)[i];
        } else {
            throw std::invalid_argument("cpu sum_to_figure: unsupported type");
        }
        *static_cast<double*>(acc) += sum / divisor;
    }
    void sum_squares_to(void* dst, const SumSpan* spans, int count, DType t, const void* add) override {
        double ss = sum_squares_multi(spans, count, t);
        if (add) ss += *static_cast<const double*>(add);
        *static_cast<double*>(dst) = ss;
    }
    void step_verdict(void* figures, const StepVerdict& v) override {
        apply_verdict(static_cast<double*>(figures), v);
    }

  private:
    // AdamArgs with the step's figures in memory: the clip scale, the
    // learning rate and the bias corrections from them; false when they say
    // the step is skipped.
    static bool with_figures(AdamArgs* a) {
        if (!a->figures) return true;
        const double* s = static_cast<const double*>(a->figures);
        if (s[step_figure::skip] != 0.0) return false;
        a->grad_scale = s[step_figure::scale];
        a->lr = s[step_figure::lr];
        a->bias_corr1 = s[step_figure::bias_corr1];
        a->bias_corr2 = s[step_figure::bias_corr2];
        a->round_key = state_round::step_key(a->round_seed, (long long)s[step_figure::step]);
        a->figures = nullptr;
        return true;
    }
};

}  // namespace

Backend* make_cpu_backend(DType dtype) {
    cpu::blas_one_thread();
    if (dtype == DType::F32) return new CpuBackend<float>();
    if (dtype == DType::F64) return new CpuBackend<double>();
    throw std::invalid_argument(std::string("cpu backend: unsupported dtype ") + dtype_name(dtype));
}
