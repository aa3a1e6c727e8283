// llmc/backend/backend.h: the operations the model is written in.
//
// The forward and backward passes (llmc/model/gpt.h), the optimizer and the
// trainer call only these. A backend owns its memory and its element types:
// the CPU backend runs fp32 or fp64 everywhere; the CUDA backend (and the
// CPU's bf16 backend) keeps bf16 parameters, gradients and activations with
// fp32 master weights and Adam state. Every pointer passed to an op is backend memory ("device" memory,
// even on the CPU); sizes are in elements, offsets are size_t.
//
// Conventions every backend honours (the model code relies on them):
//   - activations and their gradients have type precision().act; per-row
//     statistics (LayerNorm mean/rstd, attention lse, per-token losses) have
//     type precision().stat;
//   - ops marked (+=) accumulate into their output, all others overwrite;
//   - matrices are row-major; a Linear weight is (out, in) as in PyTorch;
//   - token and position arrays are int32 in backend memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "llmc/backend/attn_shape.h"
#include "llmc/backend/fp8_args.h"
#include "llmc/backend/matmul_tuning.h"
#include "llmc/backend/step_figures.h"
#include "llmc/base/dtype.h"

struct Precision {
    DType param;      // parameters used by forward/backward
    DType grad;       // gradients
    DType master;     // master weights for the update (== param when !has_master)
    bool has_master;  // separate master copy (mixed precision)
    DType opt;        // Adam m and v
    DType act;        // activations and activation gradients
    DType stat;       // per-row statistics and losses
};

// One AdamW step on a contiguous range (docs/design.md section 2). bias_corr1
// and bias_corr2 are 1-β1^t and 1-β2^t; grad_scale multiplies every gradient
// first (gradient clipping folds in here).
// Doubles, so that fp64 runs see exactly the hyperparameters the user gave
// (float(0.95) is off by 1e-8); a backend narrows them to its compute type.
// Adam's m and v are stored in precision().opt, or in bf16 when bf16_state
// is set (--optimizer-dtype bf16): read, updated in the compute type, the
// step taken with the unrounded values, and stored rounded to nearest or
// stochastically under round_key (llmc/base/state_round.h).
struct AdamArgs {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_scale;
    double bias_corr1, bias_corr2;
    bool bf16_state = false;
    bool stochastic = false;
    uint32_t round_key = 0;
    uint64_t round_seed = 0;  // round_key = state_round::step_key(round_seed, the step)
    // The step's figures in backend memory (StepFigures, below), or null:
    // when set, grad_scale, lr and the bias corrections are read from its
    // `scale`, `lr`, `bias_corr1` and `bias_corr2`, the rounding key is
    // made from round_seed and its `step`, and the update does nothing when
    // its `skip` is not 0 (a step with no host synchronisation; nothing of
    // the step's own then comes from the host, so a recorded region can
    // replay it: docs/design.md section 2.9).
    const void* figures = nullptr;
};

// One contiguous run for adamw_update_multi: pointers to its first element
// in each buffer (master null without a master copy; types as for
// adamw_update), its length, and whether weight decay applies to it.
struct AdamSpan {
    void* param;
    void* master;
    const void* grad;
    void* m;
    void* v;
    size_t n;
    bool decay;
};

// One contiguous run for sum_squares_multi: n elements from x.
struct SumSpan {
    const void* x;
    size_t n;
};

// The largest shapes a model stack passes to the ops that need temporary
// memory of their own (reserve_workspace): a backend that needs some (CUDA:
// the kernels' partial sums, the encoder's sort, the multi-tensor tables)
// allocates it all once, when the stack is built, so that nothing is
// allocated between steps, while collectives may be in flight.
struct Workspace {
    int rows = 0;          // most rows of a norm, matmul or encoder backward (B·T of a micro-batch)
    int seq = 0;           // most positions of an encoder backward (T)
    int channels = 0;      // widest LayerNorm or RMSNorm row (C)
    int bias_width = 0;    // widest bias a matmul backward sums (OC)
    int vocab_rows = 0;    // embedding rows an encoder backward holds (v_end - v_begin)
    size_t attn_rows = 0;  // most B·NH·Tq of an attention backward (whole or one ring block)
    int head_size = 0;     // head size of those attentions (C / NH)
    int runs = 0;          // most runs of one adamw_update_multi or sum_squares_multi
    size_t run_elems = 0;  // most elements of all the runs of one sum_squares_multi
    // --fp8: the most bytes each FP8 operand buffer takes (the input, weight and output gradient, then
    // their transposes: cuda/fp8_kernels.h Scratch::Sizes; 0: none)
    size_t fp8_elems[6] = {};
};

class Backend {
  public:
    virtual ~Backend() {}
    virtual const char* name() const = 0;  // "cpu" or "cuda"
    virtual Precision precision() const = 0;
    virtual bool deterministic() const = 0;  // same inputs, same bits
    // How the ops compute, when it is not plain from name() and precision()
    // (the settings table prints it; "" when nothing to add).
    virtual std::string compute_path() const { return ""; }

    // ---- memory --------------------------------------------------------
    virtual void* alloc(size_t bytes) = 0;  // zero-filled; throws std::bad_alloc
    virtual void release(void* p) = 0;
    // Host memory that downloads and uploads reach at the link's full speed
    // (pinned on CUDA; plain on the CPU), zero-filled, for large host
    // buffers that live for the run (the asynchronous checkpoint's snapshot);
    // throws std::bad_alloc.
    virtual void* alloc_host(size_t bytes) {
        void* p = std::calloc(bytes ? bytes : 1, 1);
        if (!p) throw std::bad_alloc();
        return p;
    }
    virtual void release_host(void* p) { std::free(p); }
    virtual void zero(void* p, size_t bytes) = 0;
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within the backend
    // Host <-> backend with element conversion (any float type to any float
    // type; I32 to I32 only).
    virtual void upload(void* dst, DType dt, const void* host_src, DType st, size_t n) = 0;
    virtual void download(void* host_dst, DType dt, const void* src, DType st, size_t n) = 0;
    // Conversion inside the backend (master weights -> parameters).
    virtual void convert(void* dst, DType dt, const void* src, DType st, size_t n) = 0;
    virtual void synchronize() = 0;
    // The backend's compute stream (a cudaStream_t on CUDA; null on the CPU),
    // for communicators that must order their work after the compute.
    virtual void* native_stream() { return nullptr; }
    // An optional cap on the bytes alloc() may hold (0: none): allocations
    // past it throw std::bad_alloc, as a device that is full would.
    void set_memory_budget(size_t bytes) { budget_ = bytes; }
    size_t memory_budget() const { return budget_; }
    // Bytes the backend holds right now and at most so far (memory report).
    virtual size_t bytes_in_use() const = 0;
    virtual size_t bytes_peak() const = 0;
    // Bytes an allocation of `bytes` takes in bytes_in_use() (the backend's
    // rounding), so that a count made without allocating matches it.
    virtual size_t alloc_size(size_t bytes) const { return bytes; }
    // Reserves the temporary memory of every op the stack will call with at
    // most these shapes (see Workspace); afterwards a call that would need
    // more fails with a message instead of allocating. Nothing on the CPU.
    virtual void reserve_workspace(const Workspace& w) { (void)w; }
    // Bytes this rank may still allocate, its share of the device when
    // `local_ranks` processes share the node (0: unknown).
    virtual size_t free_memory(int local_ranks) const {
        (void)local_ranks;
        return 0;
    }
    // ---- model ops -----------------------------------------------------
    // out[b,t,:] = wte[tokens[b,t] - v_begin, :] + wpe[pos[t], :]
    // wte holds rows for global ids [v_begin, v_end) (the whole vocabulary
    // unless tensor parallel); ids outside contribute zero. wpe may be null
    // (then positions are not added).
    virtual void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte,
                                 const void* wpe, int B, int T, int C, int v_begin, int v_end) = 0;
    // dwte (+=), dwpe (+=, may be null)
    virtual void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos,
                                  int B, int T, int C, int v_begin, int v_end) = 0;

    // out = LayerNorm(inp) * w + b over the last dim C, N rows; eps 1e-5.
    virtual void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w,
                                   const void* b, int N, int C) = 0;
    // residual = a + b; out = LayerNorm(residual) (fused on the GPU).
    virtual void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a,
                                            const void* b, const void* w, const void* bias, int N, int C) = 0;
    // dinp (+=), dw (+=), db (+=)
    virtual void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp,
                                    const void* w, const void* mean, const void* rstd, int N, int C) = 0;

    // out[N,OC] = inp[N,IC] · weight[OC,IC]^T + bias[OC] (bias may be null).
    virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                                int OC) = 0;
    // dinp = dout · weight (overwrite; may be null to skip),
    // dweight (+=, may be null) = dout^T · inp, dbias (+=, may be null) = column sums of dout.
    virtual void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                 const void* weight, int N, int IC, int OC) = 0;

    // The MLP's fc layer and its GELU: pre = inp·weight^T + bias (may be
    // null), out = gelu(pre), both [N, OC]. By default the two ops; a backend
    // may fuse them (CUDA: cuBLASLt's GELU epilogue writes both at once).
    virtual void matmul_gelu_forward(void* pre, void* out, const void* inp, const void* weight, const void* bias, int N,
                                     int IC, int OC) {
        matmul_forward(pre, inp, weight, bias, N, IC, OC);
        gelu_forward(out, pre, (size_t)N * OC);
    }
    // The backward of a Linear whose input was gelu(pre) (the fcproj layer):
    // dpre = gelu'(pre) * (dout · weight) (overwrite, [N, IC]), dweight and
    // dbias (+=) as matmul_backward. By default matmul_backward into dpre,
    // then gelu_backward in place; a backend may fuse the GELU' into the
    // product (CUDA: cuBLASLt's DGELU epilogue).
    virtual void matmul_backward_gelu(void* dpre, void* dweight, void* dbias, const void* dout, const void* inp,
                                      const void* weight, const void* pre, int N, int IC, int OC) {
        matmul_backward(dpre, dweight, dbias, dout, inp, weight, N, IC, OC);
        gelu_backward(dpre, pre, dpre, (size_t)N * IC);
    }
    // out[n, :] += bias (row-parallel layers add their bias once, after the
    // tensor-parallel reduction).
    virtual void add_bias(void* out, const void* bias, int N, int OC) = 0;

    // ---- FP8 products (--fp8 1, docs/fp8.md; fp8.h's grids) ---------------------
    // 0: this backend has none; else the multiple its products' rows, IC and OC must be (CPU: 1, emulated exactly).
    // The ops below refuse by default (backends.cpp), the activation's excepted.
    virtual int fp8() const { return 0; }
    // *dst (one double) = max |x_i| over n elements of type t (NaN if any is).
    virtual void amax_to(void* dst, const void* x, DType t, size_t n);
    // Delayed scaling (--fp8-history; doubles): with record step_max = max(step_max, *amax); then *amax = the
    // max of history [len] (the operand's last steps' amaxes) when it holds any. At a step's end, unless skip or
    // figures[skip], each of `slots` histories moves one back and takes its step_max; every step_max is zeroed.
    virtual void fp8_delayed(void* amax, void* step_max, const void* history, int len, bool record);
    virtual void fp8_history_push(void* history, void* step_max, int slots, int len, const void* figures, bool skip);
    // matmul_forward / matmul_backward on FP8 operands: amax [3] doubles in
    // backend memory, the largest magnitudes of the whole input, weight and
    // output gradient (the model's group max taken); the input and weight in
    // e4m3, the output gradient in e5m2, each at scale fmax / amax; the
    // products of the rounded values divided by both scales; the bias, and
    // its gradient from the unrounded output gradient, in the compute type.
    // delayed (or null: current scaling, or amaxes already the history's): Fp8Delayed; wq (or null): the
    // weight's copies made once per step and its amax (Fp8Weight; the CPU's rounding reads the amax alone).
    virtual void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                                    int OC, const void* amax, const Fp8Delayed* delayed = nullptr,
                                    const Fp8Weight* wq = nullptr);
    // kept (or null): the weight gradient's x^T from there (Fp8Kept).
    virtual void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                     const void* weight, int N, int IC, int OC, const void* amax,
                                     const Fp8Kept* kept = nullptr, const Fp8Delayed* delayed = nullptr,
                                     const Fp8Weight* wq = nullptr);
    // The MLP's activation, GELU or SwiGLU (gelu_/swiglu_ ops; H the hidden
    // width): forward (dout null) or backward, and at amax (one double) the
    // largest magnitude of what it wrote, the next FP8 product's operand,
    // measured in the pass that writes it (CUDA); by default the op, then amax_to (amax null: not measured, a
    // recompute's cast). cast (or null): the next
    // product's operand cast as well, which that product, matmul_*_fp8 on `out` next, then leaves; a backend
    // that does not fuse it (the CPU's) ignores it, with the same results.
    virtual void activation_amax(bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                                 const Fp8Cast* cast = nullptr);
    // The same op without the amax: the gelu_ or swiglu_ op, forward (dout null) or backward.
    void activation(bool swiglu, void* out, const void* a, const void* dout, int N, int H);
    // A block's norm: LayerNorm (rms false; mean, bias) or RMSNorm (eps), of a (b null) or of
    // residual = a + b (the four forward ops); with amax (one double), the largest magnitude of out as
    // written, the next FP8 product's input, measured in the same pass on CUDA (by default: amax_to after).
    // cast (or null; with amax): that input cast as well, plain for the product on `out` next and transposed
    // into cast->kept for its weight gradient (Fp8Cast, as activation_amax's forward keeping x^T); a
    // backend that does not fuse it (the CPU's) ignores it and always stores out.
    void norm(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
              const void* w, const void* bias, int N, int C, double eps, void* amax = nullptr,
              const Fp8Cast* cast = nullptr);
    virtual void norm_amax(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                           const void* w, const void* bias, int N, int C, double eps, void* amax,
                           const Fp8Cast* cast = nullptr);
    // Its backward (layernorm_ or rmsnorm_backward; db null for RMSNorm); with amax, the largest magnitude
    // of dinp as it ends (after its +=): the residual gradient, the row-parallel products' output gradient.
    void norm_backward(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                       const void* mean, const void* rstd, int N, int C, void* amax = nullptr);
    virtual void norm_backward_amax(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                                    const void* w, const void* mean, const void* rstd, int N, int C, void* amax);

    // GELU, tanh approximation. gelu_backward: dinp = gelu'(inp) * dout
    // (overwrite; dinp may alias dout).
    virtual void gelu_forward(void* out, const void* inp, size_t n) = 0;
    virtual void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) = 0;

    // out = a + b (out may alias a or b).
    virtual void residual_forward(void* out, const void* a, const void* b, size_t n) = 0;
    // dst += src, n elements of type precision().grad (gradient shards
    // accumulating reduce-scattered micro-steps).
    virtual void accumulate(void* dst, const void* src, size_t n) = 0;

    // Softmax attention, see AttnShape. out, lse overwritten.
    virtual void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                                   const AttnShape& s) = 0;
    // dq, dk, dv overwritten (same strides as q, k, v); out and lse from forward.
    virtual void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q,
                                    const void* k, const void* v, const void* out, const void* lse,
                                    const AttnShape& s) = 0;

    // ---- Llama (docs/design.md section 9) ------------------------------------
    // These have defaults that refuse, so a backend without them still builds
    // and GPT-2 runs on it; the model calls them only for Llama.
    // out = inp / sqrt(mean(inp²) + eps) * w over the last dim C, N rows;
    // rstd [N] (type stat) keeps 1/sqrt(mean + eps) for the backward.
    virtual void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps);
    // residual = a + b; out = RMSNorm(residual) (fused on the GPU).
    virtual void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b,
                                          const void* w, int N, int C, double eps);
    // dinp (+=), dw (+=) from dout, the forward's input and its rstd.
    virtual void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w,
                                  const void* rstd, int N, int C);
    // Rotary position embeddings, in place, on `heads` heads of HS channels
    // at the start of each of the B·T rows of x (row b·T + t at
    // x + (b·T + t)·row_stride), token t at position pos[t] (int32, backend
    // memory). Rotate-half convention of Hugging Face Llama: with half =
    // HS/2, f_i = theta^(-2i/HS) and a = pos·f_i for i < half,
    //   y_i = x_i cos a - x_{i+half} sin a;  y_{i+half} = x_{i+half} cos a + x_i sin a.
    // inverse rotates by -a (the backward: the gradient of the input).
    virtual void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
                      bool inverse) {
        (void)x, (void)row_stride, (void)heads, (void)HS, (void)pos, (void)B, (void)T, (void)theta, (void)inverse;
        refuse("rope");
    }
    // SwiGLU: gu holds N rows of [gate (H) | up (H)]; out[n, i] =
    // silu(gate[n, i]) * up[n, i] with silu(x) = x / (1 + exp(-x)).
    virtual void swiglu_forward(void* out, const void* gu, int N, int H) {
        (void)out, (void)gu, (void)N, (void)H;
        refuse("swiglu_forward");
    }
    // dgu [N, 2H] (overwrite) from dout [N, H] and the forward's gu.
    virtual void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) {
        (void)dgu, (void)gu, (void)dout, (void)N, (void)H;
        refuse("swiglu_backward");
    }
    // ---- Mixtral's mixture of experts (docs/moe.md) ------------------------------
    // Defaults that refuse, as Llama's ops. An assignment a = n·K + j is
    // token n's j-th expert; the grouped order lists the assignments by
    // expert, then token, then j (stable), so each expert's rows are one
    // contiguous group.
    // Routing of N tokens from their router logits [N, E] (type act):
    // probs [N, E] (type stat) = softmax over E; topi [N, K] (int32) the K
    // most probable experts, most probable first; topw [N, K] (type act) their
    // probabilities divided by the sum of the K; offsets [E + 1] (int32):
    // expert e's group is grouped rows [offsets[e], offsets[e+1]); perm
    // [N·K]: the assignment at each grouped row; inv [N·K]: the grouped row
    // of each assignment. All overwritten. bias [E] (type stat; null: none):
    // added to the probabilities for the choice of the K only (DeepSeek-V3's
    // balancing without a loss); the weights stay the chosen probabilities
    // renormalised.
    virtual void moe_route(void* probs, void* topw, int* topi, int* offsets, int* perm, int* inv, const void* logits,
                           int N, int E, int K, const void* bias) {
        (void)probs, (void)topw, (void)topi, (void)offsets, (void)perm, (void)inv, (void)logits, (void)N, (void)E,
            (void)K, (void)bias;
        refuse("moe_route");
    }
    // dlogits [N, E] (type act, overwrite) from dtopw [N, K] (type stat, the
    // gradient of topw) through the renormalisation and the softmax, plus
    // aux_grad [E] (type stat; null: none), added to the gradient of every
    // token's probability of expert e (the load-balancing loss's).
    virtual void moe_route_backward(void* dlogits, const void* probs, const int* topi, const void* dtopw,
                                    const void* aux_grad, int N, int E, int K) {
        (void)dlogits, (void)probs, (void)topi, (void)dtopw, (void)aux_grad, (void)N, (void)E, (void)K;
        refuse("moe_route_backward");
    }
    // To the grouped rows: xg[inv[a], :] = w[a] · x[a / K, :] for the N·K
    // assignments (w type act; null: 1), rows of C (type act, overwrite).
    // With dw (type stat, may be null), also dw[a] = x[a / K, :] · yg[inv[a], :]
    // (the combine's backward: x = its output gradient, yg its input).
    virtual void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N,
                              int K, int C) {
        (void)xg, (void)dw, (void)x, (void)yg, (void)w, (void)inv, (void)N, (void)K, (void)C;
        refuse("moe_dispatch");
    }
    // Back to the tokens: out[n, :] = sum over j of w[n·K + j] · yg[inv[n·K + j], :]
    // (w null: 1; the dispatch's backward), overwrite.
    virtual void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) {
        (void)out, (void)yg, (void)w, (void)inv, (void)N, (void)K, (void)C;
        refuse("moe_combine");
    }
    // The experts' products, group sizes in backend memory (offsets as moe_route's; rows = offsets[E],
    // a GPU's launch size), none on the host (--sync-free): per expert e, rows offsets[e]..offsets[e+1]
    // of inp [., IC] with W_e (OC x IC at weight + e·OC·IC): matmul_forward's out = inp·W_e^T; matmul_backward's
    // dinp = dout·W_e and dweight_e (+=, at dweight + e·OC·IC) = dout^T·inp, no bias (empty group: + 0).
    virtual void moe_expert_matmul_forward(void* out, const void* inp, const void* weight, const int* offsets, int rows,
                                           int E, int IC, int OC) {
        (void)out, (void)inp, (void)weight, (void)offsets, (void)rows, (void)E, (void)IC, (void)OC;
        refuse("moe_expert_matmul_forward");
    }
    virtual void moe_expert_matmul_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                            const void* weight, const int* offsets, int rows, int E, int IC, int OC) {
        (void)dinp, (void)dweight, (void)dout, (void)inp, (void)weight, (void)offsets, (void)rows, (void)E, (void)IC,
            (void)OC;
        refuse("moe_expert_matmul_backward");
    }
    // The routing figures on the device (moe_figures.h; doubles unless said): moe_route_stats adds to
    // stats [2E] a block's assignments per expert and each expert's sum of probs [N, E] (stat, token
    // order), to loads [E] (null: none) the assignments; moe_aux_loss makes grad [E] (stat) from stats
    // (cleared) and adds aux to *aux_acc (null: none); moe_balance divides loads [L, E] (cleared) by
    // divisor, sets figures[moe_maxvio], and with bias64 and no skip moves it by rate into bias (stat).
    virtual void moe_route_stats(void* stats, void* loads, const void* probs, const int* offsets, int N, int E) {
        (void)stats, (void)loads, (void)probs, (void)offsets, (void)N, (void)E;
        refuse("moe_route_stats");
    }
    virtual void moe_aux_loss(void* grad, void* aux_acc, void* stats, int E, double LN, double gscale) {
        (void)grad, (void)aux_acc, (void)stats, (void)E, (void)LN, (void)gscale;
        refuse("moe_aux_loss");
    }
    virtual void moe_balance(void* figures, void* bias, void* bias64, void* loads, int L, int E, double divisor,
                             double rate) {
        (void)figures, (void)bias, (void)bias64, (void)loads, (void)L, (void)E, (void)divisor, (void)rate;
        refuse("moe_balance");
    }
    // Ring attention (context parallel, docs/design.md section 5): one block of
    // queries against one block of keys and values.
    // Forward: merges the block's result into running (out_acc, lse_acc), both
    // of type stat (fp32 on CUDA), by log-sum-exp: lse' = lse + log(1 +
    // exp(lse_b - lse)); out' = out·exp(lse - lse') + out_b·exp(lse_b - lse').
    // With first, they are overwritten instead. out_acc uses o_stride/ob().
    virtual void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                         const AttnShape& s, bool first) = 0;
    // Backward of one block, given the final (global) out and lse of the
    // query rows: accumulates (+=) into dq (q's strides), dk and dv (k's
    // strides), all of type stat.
    virtual void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                          const void* v, const void* out, const void* lse, const AttnShape& s) = 0;
    // dst[r*dst_pitch + c] = src[r*src_pitch + c] for rows × cols elements of
    // type t (packing K and V out of QKV rows, and back).
    virtual void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                        DType t) = 0;

    // Per row n of logits[N,Vp]: losses[n] = -log softmax(logits[n, :V])[targets[n]].
    // Columns V..Vp-1 are padding and never enter the softmax. With
    // write_grad, logits is overwritten by dloss * (softmax - onehot) in the
    // first V columns and 0 in the padding (the fused classifier).
    virtual void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V,
                                      int Vp, bool write_grad) = 0;

    // Vocab-parallel cross-entropy (tensor parallel, docs/design.md section 3),
    // in three steps with the tensor-parallel all-reduces between them. Each
    // rank holds logits[N, Vl] for global vocabulary ids v_begin..v_begin+Vl-1;
    // ids >= V (padding) take no part. Outputs are [N] of type stat.
    //  1: row_max = max over the rank's valid columns (-inf if none);
    //     target_logit = logit of targets[n] if this rank holds it, else 0.
    virtual void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N,
                                    int Vl, int v_begin, int V) = 0;
    //  2: sumexp = sum over valid columns of exp(logit - row_max) (row_max global).
    virtual void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                                     int V) = 0;
    //  3: losses = log(sumexp) + row_max - target_logit (all global); with
    //     write_grad, logits becomes dloss * (softmax - onehot) on valid
    //     columns and 0 on padding.
    virtual void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max,
                                     const void* sumexp, const void* target_logit, double dloss, int N, int Vl,
                                     int v_begin, int V, bool write_grad) = 0;

    // ---- optimizer -----------------------------------------------------
    // AdamW on n elements. param has type precision().param; master (null
    // when !has_master) precision().master; grad precision().grad; m, v
    // precision().opt (bf16 with a.bf16_state). With a master copy the
    // update runs on master and param receives its rounded value.
    virtual void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                              const AdamArgs& a) = 0;
    // AdamW on many runs at once (one launch on a GPU): run i is updated
    // exactly as adamw_update would update it with weight_decay =
    // spans[i].decay ? a.weight_decay : 0. Runs must not overlap.
    virtual void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) = 0;
    // Sum of squares of n elements of type t, to the host (deterministic on
    // the CPU: a fixed order whatever the thread count).
    virtual double sum_squares(const void* x, DType t, size_t n) = 0;
    // The sum of squares of many runs of type t, to the host at once: the
    // runs' sums added in run order (sum = 0; sum += sum of run i, i = 0,
    // 1, ...). The CPU computes each run's sum exactly as sum_squares does,
    // so the result is bit for bit the loop of single calls; a GPU sums
    // every run in one launch and synchronises once.
    virtual double sum_squares_multi(const SumSpan* spans, int count, DType t) = 0;

    // ---- the step's figures on the device (step_figure, StepVerdict) --------
    // acc (one double in backend memory) += (the sum of x's n elements of type
    // t, added in order in double) / divisor: a micro-batch's mean loss,
    // kept on the device.
    virtual void sum_to_figure(void* acc, const void* x, DType t, size_t n, double divisor) = 0;
    // dst (one double) = sum_squares_multi(spans, count, t) + *add (add may
    // be null: + 0), left where the spans live: on the CPU bit for bit what
    // sum_squares_multi returns; a GPU adds the same partials in the same
    // order on the device.
    virtual void sum_squares_to(void* dst, const SumSpan* spans, int count, DType t, const void* add) = 0;
    // The step's decision on its figures (a block of step_figure::count
    // doubles), as StepVerdict says: apply_verdict (step_figures.h), the
    // function the host runs when the figures come to it.
    virtual void step_verdict(void* figures, const StepVerdict& v) = 0;
    // n doubles of backend memory, copied into slot (0 or 1) after the work
    // issued so far, without waiting for it; wait_late(slot, dst) waits for
    // that copy alone and writes the values to dst. Two slots, so a step's
    // figures can be read while the next step's are on their way (one step
    // late). By default (the CPU, whose ops are done when issued) a plain
    // download kept until asked for.
    virtual void download_late(int slot, const void* src, int n) {
        late_[slot & 1].resize((size_t)n);
        download(late_[slot & 1].data(), DType::F64, src, DType::F64, (size_t)n);
    }
    virtual void wait_late(int slot, double* dst) {
        const std::vector<double>& v = late_[slot & 1];
        for (size_t i = 0; i < v.size(); i++) dst[i] = v[i];
    }
    // ---- recorded regions (docs/design.md section 2.9) -------------------
    // A region is a stretch of ops that runs the same way every time: the
    // same ops with the same arguments and pointers, no transfer to or from
    // the host, no allocation or release, no synchronisation, no
    // communication. A backend that records regions (CUDA with
    // LLMC_CUDA_GRAPH=1: a CUDA graph; the CPU with LLMC_CPU_GRAPH=1: an
    // emulation that records the calls) keeps one recording per key:
    //   if (!be.region_replay(key)) {        // replays the recording, if any
    //       bool rec = be.region_begin(key); // records what follows (true)
    //       ...the ops...
    //       if (rec) be.region_end();        // ends the recording, runs it
    //   }
    // While recording, ops are recorded and not yet run (as in CUDA stream
    // capture): the host must not read what they compute before
    // region_end(). Backends that do not record return false and run ops
    // as they come. Regions nest by folding: inside a recording,
    // region_replay and region_begin return false and the inner region's
    // ops become part of the outer one (the whole step as one region holds
    // its passes' regions).
    virtual bool region_replay(uint64_t key) {
        (void)key;
        return false;
    }
    virtual bool region_begin(uint64_t key) {
        (void)key;
        return false;
    }
    virtual void region_end() {}
    // Whether this backend records regions, and what it has done so far.
    struct RegionStats {
        bool on = false;
        int recorded = 0;         // recordings kept
        long long replays = 0;    // regions run from a recording
    };
    virtual RegionStats region_stats() const { return {}; }

    // ---- matmul algorithms (--matmul-tune; matmul_tuning.h) ----------------
    // What this backend's timings hold for (its device and library); "" when
    // it has one algorithm per product and nothing to choose.
    virtual std::string matmul_scope() const { return ""; }
    // Times up to `candidates` algorithms of every product shape run so far
    // that has no choice yet, each on the operands of the shape's last call.
    // It writes those calls' outputs again and again: the caller must no
    // longer need them (between steps, where each is recomputed or zeroed
    // before it is read). Waits for the work.
    virtual std::vector<MatmulTrial> time_matmul_candidates(int candidates) {
        (void)candidates;
        return {};
    }
    // From now on each listed shape runs the named algorithm (a shape first
    // met later too); shapes not listed, or whose algorithm is not among
    // this backend's candidates, keep the untuned one. Drops recorded
    // regions, which hold the algorithms they were recorded with. Returns how
    // many of the shapes run so far changed their algorithm.
    virtual int choose_matmul_algorithms(const MatmulChoices& choices) {
        (void)choices;
        return 0;
    }
    // ---- timing marks (the step's time by op class: backend_profile.h) -----
    // mark(): a mark after the work issued so far, its index; mark_ms(a, b):
    // the milliseconds between marks a and b (waiting for b); clear_marks()
    // forgets every mark. By default the host's clock, which is the device's
    // for a backend that runs its ops as they come (the CPU); CUDA records
    // events on its stream.
    virtual int mark();
    virtual double mark_ms(int a, int b);
    virtual void clear_marks() { marks_.clear(); }

  protected:
    bool over_budget(size_t more) const { return budget_ && bytes_in_use() + more > budget_; }
    [[noreturn]] void refuse(const char* op) const;
    size_t budget_ = 0;
    std::vector<double> marks_;  // the default marks: host times in ms
    std::vector<double> late_[2];  // download_late's values (the default)
};
