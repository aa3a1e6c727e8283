// llmc/backend/backend_cpu_bf16.cpp: mixed precision on the CPU
// (--device cpu --dtype bf16), the CUDA backend's bookkeeping without a GPU.
//
// Buffers hold exactly what the CUDA bf16 build holds: parameters,
// gradients and activations in bf16; master weights, Adam m and v, and the
// per-row statistics (LayerNorm mean and rstd, attention's log-sum-exp,
// losses and the cross-entropy's row statistics) in fp32. Every op computes
// in fp32 and rounds its bf16 outputs to nearest even on the store, as the
// GPU kernels store; an op that accumulates (+=) into a bf16 buffer adds in
// fp32 and rounds once per call, as the CUDA kernels do.
//
// The matrix products (matmul_forward, matmul_backward) run on the bf16
// buffers themselves through gemm_bf16 (cpu_gemm_bf16.h) into fp32 scratch:
// on a CPU with AVX-512 BF16, its dot products (vdpbf16ps, fp32
// accumulation); elsewhere, or with LLMC_CPU_BF16_DOT=0, the operands
// widened to fp32 and sgemm. The choice is made once, when the backend is
// built, and compute_path() (the "compute:" line under the settings table)
// names it. Machines differ (many have AVX2 only, where the widened path is
// the one the tests check); on a CPU with AVX-512 BF16 the model's tests
// (the reference tier's *_cpu_bf16 runs, tests/distributed/test_bf16.py)
// check the dot path, or the widened one with LLMC_CPU_BF16_DOT=0 exported,
// and tests/unit/test_cpu_bf16_gemm.cpp checks both products. The bias add
// and the bias gradient, like every other op, run the fp32 CPU backend's
// code on widened operands.
//
// How operands reach fp32: each op names its bf16 operands with their
// extents (strided views included: attention reads Q, K and V inside one
// QKV row). Operands whose extents overlap (Q, K and V; an output that
// aliases an input) are widened as one span, so every pointer of the op
// sees one consistent fp32 copy; after the op the spans that hold an
// output are rounded back whole (an element the op did not write goes back
// bit for bit: bf16 -> fp32 -> bf16 is exact). The scratch is host memory
// reused from op to op, like the CUDA backend's scratch not counted in
// bytes_in_use(): that figure is the model's own buffers.
#include "llmc/backend/backend_cpu.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <stdexcept>
#include <vector>

#include "llmc/backend/cpu_gemm_bf16.h"
#include "llmc/backend/cpu_moe.h"
#include "llmc/base/test_hooks.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/base/dtype.h"

namespace {

// A bf16 operand: n elements from p (n = its extent); out: the op writes it.
struct Operand {
    const void* p;
    size_t n;
    bool out;
};

// Elements spanned by a strided [B, T, heads*HS] view: rows t at stride, batches at bstride.
size_t view_extent(int B, size_t bstride, int T, size_t stride, size_t width) {
    return (size_t)(B - 1) * bstride + (size_t)(T - 1) * stride + width;
}

class CpuBf16Backend final : public Backend {
  public:
    CpuBf16Backend() : f_(make_cpu_backend(DType::F32)), dot_(cpu_bf16_dot_available()) {}

    const char* name() const override { return "cpu"; }
    Precision precision() const override {
        return {DType::BF16, DType::BF16, DType::F32, true, DType::F32, DType::BF16, DType::F32};
    }
    bool deterministic() const override { return true; }
    std::string compute_path() const override {
        // The path this backend uses (see the top of this file), and why.
        const std::string base = "bf16 storage, fp32 compute, stores rounded to nearest even; matrix products: ";
        if (dot_) return base + "AVX-512 BF16 dot products (vdpbf16ps) on the bf16 operands";
        return base + "operands widened, sgemm " +
               (cpu_bf16_dot_supported() ? "(AVX-512 BF16 turned off: LLMC_CPU_BF16_DOT=0)"
                                         : "(no AVX-512 BF16 on this CPU)");
    }

    // ---- memory: host memory through the fp32 backend (typed transfers convert) --------
    void* alloc(size_t bytes) override {
        if (over_budget(f_->alloc_size(bytes))) throw std::bad_alloc();
        return f_->alloc(bytes);
    }
    void release(void* p) override { f_->release(p); }
    void zero(void* p, size_t bytes) override { f_->zero(p, bytes); }
    void copy(void* dst, const void* src, size_t bytes) override { f_->copy(dst, src, bytes); }
    void upload(void* dst, DType dt, const void* src, DType st, size_t n) override { f_->upload(dst, dt, src, st, n); }
    void download(void* dst, DType dt, const void* src, DType st, size_t n) override {
        f_->download(dst, dt, src, st, n);
    }
    void convert(void* dst, DType dt, const void* src, DType st, size_t n) override { f_->convert(dst, dt, src, st, n); }
    void synchronize() override {}
    size_t bytes_in_use() const override { return f_->bytes_in_use(); }
    size_t bytes_peak() const override { return f_->bytes_peak(); }
    size_t alloc_size(size_t bytes) const override { return f_->alloc_size(bytes); }
    size_t free_memory(int local_ranks) const override { return f_->free_memory(local_ranks); }
    void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                DType t) override {
        f_->copy2d(dst, dst_pitch, src, src_pitch, rows, cols, t);
    }

    // ---- model ops: fp32 compute on widened operands ----------------------------------
    void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte, const void* wpe, int B, int T,
                         int C, int v_begin, int v_end) override {
        const size_t P = wpe ? positions(pos, T) : 0;
        run({{out, (size_t)B * T * C, true}, {wte, (size_t)(v_end - v_begin) * C, false}, {wpe, P * C, false}},
            [&](float** x) { f_->encoder_forward(x[0], tokens, pos, x[1], x[2], B, T, C, v_begin, v_end); });
    }
    void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos, int B, int T,
                          int C, int v_begin, int v_end) override {
        const size_t P = dwpe ? positions(pos, T) : 0;
        run({{dwte, (size_t)(v_end - v_begin) * C, true}, {dwpe, P * C, true}, {dout, (size_t)B * T * C, false}},
            [&](float** x) { f_->encoder_backward(x[0], x[1], x[2], tokens, pos, B, T, C, v_begin, v_end); });
    }
    void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w, const void* b, int N,
                           int C) override {
        const size_t NC = (size_t)N * C;
        run({{out, NC, true}, {inp, NC, false}, {w, (size_t)C, false}, {b, (size_t)C, false}},
            [&](float** x) { f_->layernorm_forward(x[0], mean, rstd, x[1], x[2], x[3], N, C); });
    }
    void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                                    const void* w, const void* bias, int N, int C) override {
        // Two ops, as the residual is stored in bf16 before the norm reads it.
        residual_forward(residual, a, b, (size_t)N * C);
        layernorm_forward(out, mean, rstd, residual, w, bias, N, C);
    }
    void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C) override {
        const size_t NC = (size_t)N * C;
        run({{dinp, NC, true}, {dw, (size_t)C, true}, {db, (size_t)C, true}, {dout, NC, false}, {inp, NC, false},
             {w, (size_t)C, false}},
            [&](float** x) { f_->layernorm_backward(x[0], x[1], x[2], x[3], x[4], x[5], mean, rstd, N, C); });
    }
    // The products straight from the bf16 buffers into fp32 scratch; the
    // bias added in fp32 (the fp32 backend's add_bias, as its matmul adds
    // it); one rounding on the store. dweight += in fp32 (widened, gemm
    // with beta 1), rounded once.
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        float* y = fp32(0, (size_t)N * OC);
        gemm(false, true, N, OC, IC, 1.f, inp, IC, weight, IC, 0.f, y, OC);
        if (bias) {
            float* b = fp32(1, (size_t)OC);
            f_->convert(b, DType::F32, bias, DType::BF16, (size_t)OC);
            f_->add_bias(y, b, N, OC);
        }
        f_->convert(out, DType::BF16, y, DType::F32, (size_t)N * OC);
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         int N, int IC, int OC) override {
        if (dinp) {
            float* y = fp32(0, (size_t)N * IC);
            gemm(false, false, N, IC, OC, 1.f, dout, OC, weight, IC, 0.f, y, IC);
            f_->convert(dinp, DType::BF16, y, DType::F32, (size_t)N * IC);
        }
        if (dweight) {
            float* w = fp32(0, (size_t)OC * IC);
            f_->convert(w, DType::F32, dweight, DType::BF16, (size_t)OC * IC);
            gemm(true, false, OC, IC, N, 1.f, dout, OC, inp, IC, 1.f, w, IC);
            f_->convert(dweight, DType::BF16, w, DType::F32, (size_t)OC * IC);
        }
        if (dbias)
            run({{dbias, (size_t)OC, true}, {dout, (size_t)N * OC, false}},
                [&](float** x) { cpu::bias_backward(x[0], x[1], N, OC); });
    }
    void add_bias(void* out, const void* bias, int N, int OC) override {
        run({{out, (size_t)N * OC, true}, {bias, (size_t)OC, false}},
            [&](float** x) { f_->add_bias(x[0], x[1], N, OC); });
    }
    void gelu_forward(void* out, const void* inp, size_t n) override {
        run({{out, n, true}, {inp, n, false}}, [&](float** x) { f_->gelu_forward(x[0], x[1], n); });
    }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        run({{dinp, n, true}, {inp, n, false}, {dout, n, false}},
            [&](float** x) { f_->gelu_backward(x[0], x[1], x[2], n); });
    }
    void residual_forward(void* out, const void* a, const void* b, size_t n) override {
        run({{out, n, true}, {a, n, false}, {b, n, false}}, [&](float** x) { f_->residual_forward(x[0], x[1], x[2], n); });
    }
    void accumulate(void* dst, const void* src, size_t n) override {
        run({{dst, n, true}, {src, n, false}}, [&](float** x) { f_->accumulate(x[0], x[1], n); });
    }
    void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                           const AttnShape& s) override {
        run({{out, o_extent(s), true}, {q, q_extent(s), false}, {k, kv_extent(s), false}, {v, kv_extent(s), false}},
            [&](float** x) { f_->attention_forward(x[0], lse, x[1], x[2], x[3], s); });
    }
    void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const void* lse, const AttnShape& s) override {
        const size_t qn = q_extent(s), kn = kv_extent(s), on = o_extent(s);
        run({{dq, qn, true}, {dk, kn, true}, {dv, kn, true}, {dout, on, false}, {q, qn, false}, {k, kn, false},
             {v, kn, false}, {out, on, false}},
            [&](float** x) { f_->attention_backward(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], lse, s); });
    }
    void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps) override {
        const size_t NC = (size_t)N * C;
        run({{out, NC, true}, {inp, NC, false}, {w, (size_t)C, false}},
            [&](float** x) { f_->rmsnorm_forward(x[0], rstd, x[1], x[2], N, C, eps); });
    }
    void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b, const void* w,
                                  int N, int C, double eps) override {
        residual_forward(residual, a, b, (size_t)N * C);
        rmsnorm_forward(out, rstd, residual, w, N, C, eps);
    }
    void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const void* rstd,
                          int N, int C) override {
        const size_t NC = (size_t)N * C;
        run({{dinp, NC, true}, {dw, (size_t)C, true}, {dout, NC, false}, {inp, NC, false}, {w, (size_t)C, false}},
            [&](float** x) { f_->rmsnorm_backward(x[0], x[1], x[2], x[3], x[4], rstd, N, C); });
    }
    void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
              bool inverse) override {
        run({{x, ((size_t)B * T - 1) * row_stride + (size_t)heads * HS, true}},
            [&](float** y) { f_->rope(y[0], row_stride, heads, HS, pos, B, T, theta, inverse); });
    }
    void swiglu_forward(void* out, const void* gu, int N, int H) override {
        run({{out, (size_t)N * H, true}, {gu, (size_t)N * 2 * H, false}},
            [&](float** x) { f_->swiglu_forward(x[0], x[1], N, H); });
    }
    void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) override {
        run({{dgu, (size_t)N * 2 * H, true}, {gu, (size_t)N * 2 * H, false}, {dout, (size_t)N * H, false}},
            [&](float** x) { f_->swiglu_backward(x[0], x[1], x[2], N, H); });
    }
    // Mixtral: router probabilities, the weights' gradient and the
    // load-balancing gradient are of type stat (fp32); the rest bf16.
    void moe_route(void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv, const void* logits, int N,
                   int E, int K, const void* bias) override {
        run({{topw, (size_t)N * K, true}, {logits, (size_t)N * E, false}},
            [&](float** x) { f_->moe_route(probs, x[0], topi, offsets, perm, inv, x[1], N, E, K, bias); });
    }
    void moe_route_backward(void* dlogits, const void* probs, const int* topi, const void* dtopw, const void* aux_grad,
                            int N, int E, int K) override {
        run({{dlogits, (size_t)N * E, true}},
            [&](float** x) { f_->moe_route_backward(x[0], probs, topi, dtopw, aux_grad, N, E, K); });
    }
    void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N, int K,
                      int C) override {
        const size_t NC = (size_t)N * C, G = NC * K;
        run({{xg, G, true}, {x, NC, false}, {yg, yg ? G : 0, false}, {w, w ? (size_t)N * K : 0, false}},
            [&](float** y) { f_->moe_dispatch(y[0], dw, y[1], y[2], y[3], inv, N, K, C); });
    }
    void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) override {
        const size_t NC = (size_t)N * C;
        run({{out, NC, true}, {yg, NC * K, false}, {w, w ? (size_t)N * K : 0, false}},
            [&](float** y) { f_->moe_combine(y[0], y[1], y[2], inv, N, K, C); });
    }
    // FP8 products (docs/fp8.md): the bf16 operands widened, the fp32
    // backend's product of their rounded copies, its outputs rounded to bf16.
    int fp8() const override { return test_hooks::fp8_align(); }
    void amax_to(void* dst, const void* x, DType t, size_t n) override {
        if (t != DType::BF16) return f_->amax_to(dst, x, t, n);
        run({{x, n, false}}, [&](float** y) { f_->amax_to(dst, y[0], DType::F32, n); });
    }
    void fp8_delayed(void* amax, void* step_max, const void* history, int len, bool record) override {
        f_->fp8_delayed(amax, step_max, history, len, record);
    }
    void fp8_history_push(void* history, void* step_max, int slots, int len, const void* figures, bool skip) override {
        f_->fp8_history_push(history, step_max, slots, len, figures, skip);
    }
    void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC,
                            const void* amax, const Fp8Delayed* d, const Fp8Weight* q) override {
        run({{out, (size_t)N * OC, true}, {inp, (size_t)N * IC, false}, {weight, (size_t)OC * IC, false},
             {bias, bias ? (size_t)OC : 0, false}},
            [&](float** x) { f_->matmul_forward_fp8(x[0], x[1], x[2], x[3], N, IC, OC, amax, d, q); });
    }
    void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                             const void* weight, int N, int IC, int OC, const void* amax, const Fp8Kept*,
                             const Fp8Delayed* d, const Fp8Weight* q) override {
        run({{dinp, dinp ? (size_t)N * IC : 0, true}, {dweight, dweight ? (size_t)OC * IC : 0, true},
             {dbias, dbias ? (size_t)OC : 0, true}, {dout, (size_t)N * OC, false}, {inp, (size_t)N * IC, false},
             {weight, (size_t)OC * IC, false}},
            [&](float** x) {
                f_->matmul_backward_fp8(x[0], x[1], x[2], x[3], x[4], x[5], N, IC, OC, amax, nullptr, d, q);
            });
    }
    // The experts' products: this backend's matmul over each group; the
    // routing figures are doubles and fp32 (stat): the fp32 backend's.
    void moe_expert_matmul_forward(void* out, const void* inp, const void* weight, const int* offsets, int rows, int E,
                                   int IC, int OC) override {
        cpu::expert_matmul_forward(*this, out, inp, weight, offsets, rows, E, IC, OC);
    }
    void moe_expert_matmul_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* weight,
                                    const int* offsets, int rows, int E, int IC, int OC) override {
        cpu::expert_matmul_backward(*this, dinp, dweight, dout, inp, weight, offsets, rows, E, IC, OC);
    }
    void moe_route_stats(void* stats, void* loads, const void* probs, const int* offsets, int N, int E) override {
        f_->moe_route_stats(stats, loads, probs, offsets, N, E);
    }
    void moe_aux_loss(void* grad, void* aux_acc, void* stats, int E, double LN, double gscale) override {
        f_->moe_aux_loss(grad, aux_acc, stats, E, LN, gscale);
    }
    void moe_balance(void* figures, void* bias, void* bias64, void* loads, int L, int E, double divisor,
                     double rate) override {
        f_->moe_balance(figures, bias, bias64, loads, L, E, divisor, rate);
    }
    // Ring attention: the running output and the block gradients are of type stat (fp32).
    void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                 const AttnShape& s, bool first) override {
        run({{q, q_extent(s), false}, {k, kv_extent(s), false}, {v, kv_extent(s), false}},
            [&](float** x) { f_->attention_block_forward(out_acc, lse_acc, x[0], x[1], x[2], s, first); });
    }
    void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                  const void* v, const void* out, const void* lse, const AttnShape& s) override {
        const size_t qn = q_extent(s), kn = kv_extent(s), on = o_extent(s);
        run({{dout, on, false}, {q, qn, false}, {k, kn, false}, {v, kn, false}, {out, on, false}},
            [&](float** x) { f_->attention_block_backward(dq, dk, dv, x[0], x[1], x[2], x[3], x[4], lse, s); });
    }
    void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V, int Vp,
                              bool write_grad) override {
        run({{logits, (size_t)N * Vp, write_grad}},
            [&](float** x) { f_->softmax_crossentropy(x[0], losses, targets, dloss, N, V, Vp, write_grad); });
    }
    void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N, int Vl,
                            int v_begin, int V) override {
        run({{logits, (size_t)N * Vl, false}},
            [&](float** x) { f_->crossentropy_stats(x[0], targets, row_max, target_logit, N, Vl, v_begin, V); });
    }
    void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                             int V) override {
        run({{logits, (size_t)N * Vl, false}},
            [&](float** x) { f_->crossentropy_sumexp(x[0], row_max, sumexp, N, Vl, v_begin, V); });
    }
    void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max, const void* sumexp,
                             const void* target_logit, double dloss, int N, int Vl, int v_begin, int V,
                             bool write_grad) override {
        run({{logits, (size_t)N * Vl, write_grad}}, [&](float** x) {
            f_->crossentropy_finish(x[0], losses, targets, row_max, sumexp, target_logit, dloss, N, Vl, v_begin, V,
                                    write_grad);
        });
    }

    // ---- optimizer: the update on the fp32 master, the parameters its rounding ----------
    void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                      const AdamArgs& a) override {
        if (!master) throw std::logic_error("cpu bf16 adamw_update: the update needs the fp32 master weights");
        run({{grad, n, false}}, [&](float** x) { f_->adamw_update(master, nullptr, x[0], m, v, n, a); });
        f_->convert(param, DType::BF16, master, DType::F32, n);
    }
    void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) override {
        for (int i = 0; i < count; i++) {
            AdamArgs ai = a;
            if (!spans[i].decay) ai.weight_decay = 0;
            adamw_update(spans[i].param, spans[i].master, spans[i].grad, spans[i].m, spans[i].v, spans[i].n, ai);
        }
    }
    double sum_squares(const void* x, DType t, size_t n) override {
        if (t != DType::BF16) return f_->sum_squares(x, t, n);
        double ss = 0;
        run({{x, n, false}}, [&](float** y) { ss = f_->sum_squares(y[0], DType::F32, n); });
        return ss;
    }
    double sum_squares_multi(const SumSpan* spans, int count, DType t) override {
        double ss = 0;  // run by run, in order: the loop of single calls, bit for bit
        for (int i = 0; i < count; i++) ss += sum_squares(spans[i].x, t, spans[i].n);
        return ss;
    }
    // The step's figures: host memory, the fp32 backend's arithmetic.
    void sum_to_figure(void* acc, const void* x, DType t, size_t n, double divisor) override {
        f_->sum_to_figure(acc, x, t, n, divisor);
    }
    void sum_squares_to(void* dst, const SumSpan* spans, int count, DType t, const void* add) override {
        double ss = sum_squares_multi(spans, count, t);
        if (add) ss += *static_cast<const double*>(add);
        *static_cast<double*>(dst) = ss;
    }
    void step_verdict(void* figures, const StepVerdict& v) override { f_->step_verdict(figures, v); }

  private:
    // gemm_bf16 on the path chosen when the backend was built.
    void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B, int ldb,
              float beta, float* C, int ldc) {
        (dot_ ? gemm_bf16_dot : gemm_bf16_widened)(ta, tb, M, N, K, alpha, static_cast<const uint16_t*>(A), lda,
                                                   static_cast<const uint16_t*>(B), ldb, beta, C, ldc);
    }
    // The matmuls' fp32 scratch i (0: the product, 1: the bias), n floats.
    float* fp32(int i, size_t n) {
        if (mm_[i].size() < n) mm_[i].resize(n);
        return mm_[i].data();
    }
    // Widens the operands (nulls stay null), runs fn on fp32 pointers in
    // the operands' order, rounds the written spans back.
    template <typename Fn>
    void run(std::initializer_list<Operand> ops, Fn&& fn) {
        const std::vector<Operand> v(ops);
        // Spans: operands sorted by address, overlapping ones merged.
        std::vector<int> order;
        for (int i = 0; i < (int)v.size(); i++)
            if (v[i].p && v[i].n) order.push_back(i);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return addr(v[a].p) < addr(v[b].p); });
        struct Span {
            const uint16_t* begin;
            size_t n;
            bool out;
        };
        std::vector<Span> spans;
        std::vector<int> span_of(v.size(), -1);
        for (int i : order) {
            const uint16_t* b = static_cast<const uint16_t*>(v[i].p);
            if (spans.empty() || b >= spans.back().begin + spans.back().n) {
                spans.push_back({b, v[i].n, v[i].out});
            } else {
                Span& s = spans.back();
                s.n = std::max(s.n, (size_t)(b - s.begin) + v[i].n);
                s.out = s.out || v[i].out;
            }
            span_of[i] = (int)spans.size() - 1;
        }
        if (scratch_.size() < spans.size()) scratch_.resize(spans.size());
        for (size_t s = 0; s < spans.size(); s++) {
            if (scratch_[s].size() < spans[s].n) scratch_[s].resize(spans[s].n);
            f_->convert(scratch_[s].data(), DType::F32, spans[s].begin, DType::BF16, spans[s].n);
        }
        std::vector<float*> x(v.size(), nullptr);
        for (size_t i = 0; i < v.size(); i++)
            if (span_of[i] >= 0) {
                const Span& s = spans[span_of[i]];
                x[i] = scratch_[span_of[i]].data() + (static_cast<const uint16_t*>(v[i].p) - s.begin);
            }
        fn(x.data());
        for (size_t s = 0; s < spans.size(); s++)
            if (spans[s].out)
                f_->convert(const_cast<uint16_t*>(spans[s].begin), DType::BF16, scratch_[s].data(), DType::F32,
                            spans[s].n);
    }
    static uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
    // Rows of wpe an encoder call reaches: the largest position + 1.
    static size_t positions(const int* pos, int T) {
        int mx = 0;
        for (int t = 0; t < T; t++) mx = std::max(mx, pos[t]);
        return (size_t)mx + 1;
    }
    static size_t q_extent(const AttnShape& s) {
        return view_extent(s.B, s.qb(), s.Tq, s.q_stride, (size_t)s.NH * s.HS);
    }
    static size_t kv_extent(const AttnShape& s) {
        return view_extent(s.B, s.kb(), s.Tk, s.kv_stride, (size_t)s.kv_heads() * s.HS);
    }
    static size_t o_extent(const AttnShape& s) {
        return view_extent(s.B, s.ob(), s.Tq, s.o_stride, (size_t)s.NH * s.HS);
    }

    std::unique_ptr<Backend> f_;               // the fp32 CPU backend: memory and the fp32 ops
    std::vector<std::vector<float>> scratch_;  // one fp32 span per merged operand group, reused
    std::vector<float> mm_[2];                 // the matmuls' fp32 product and bias, reused
    const bool dot_;                           // the products by AVX-512 BF16 dot products
};

}  // namespace

Backend* make_cpu_bf16_backend() { return new CpuBf16Backend(); }
