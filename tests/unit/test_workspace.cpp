// tests/unit/test_workspace.cpp: the CUDA backend's scratch is reserved once,
// when the model stack is built (Backend::reserve_workspace with
// GPT::workspace()), and never allocated between steps; a call that needs
// more than the reservation ends the run. This checks, without a GPU, that
// the reservation covers every call a training step makes: each layout's
// stack is built on a probe backend (the measuring backend with CUDA's
// precision: nothing runs, nothing is allocated) with groups that only have
// a shape, then a whole step runs (pipeline schedule, ZeRO's reductions,
// the optimizer step), a validation forward and a sampled row; the probe
// computes, for every call, what the CUDA backend would ask of each buffer
// (the formulas of llmc/backend/cuda/workspace.h and kernel_index.h, the ones
// backend_cuda.cu uses) and checks it against what the reservation holds;
// with --fp8 1, each FP8 product's and cast's operand buffers (fp8k's
// forward_sizes, backward_sizes, the casts' copies) against fp8_elems, for
// all four layers and for a set of them (--fp8-layers), a Mixtral's expert
// blocks too. --calibrate, whose ops run outside a stack, reserves what
// they need before the first (its FP8 products refuse to run without).
// Last line: "N passed, N failed".
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/backend/backend_measure.h"
#include "llmc/backend/cuda/fp8_kernels.h"
#include "llmc/backend/cuda/kernel_index.h"
#include "llmc/backend/cuda/workspace.h"
#include "llmc/comm/comm_local.h"
#include "llmc/model/config.h"
#include "llmc/parallel/model_stack.h"
#include "llmc/plan/calibrate.h"
#include "tests/lib/check.h"

using namespace llmc_idx;

namespace {


const Precision kCudaBf16{DType::BF16, DType::BF16, DType::F32, true, DType::F32, DType::BF16, DType::F32};

// The measuring backend, checking each scratch-using call against the
// reservation. `over` collects the calls that would not fit.
class Probe : public MeasureBackend {
  public:
    Probe() : MeasureBackend("cuda", kCudaBf16) {}
    bool reserved = false;
    Workspace w;
    int calls = 0;
    std::vector<std::string> over;

    void reserve_workspace(const Workspace& ws) override {
        reserved = true;
        w = ws;
    }
    void layernorm_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*, int N,
                            int C) override {
        scratch("layernorm_backward", norm_bwd_scratch_bytes(N, C));
    }
    void rmsnorm_backward(void*, void*, const void*, const void*, const void*, const void*, int N, int C) override {
        scratch("rmsnorm_backward", norm_bwd_scratch_bytes(N, C));
    }
    void matmul_backward(void*, void*, void* dbias, const void*, const void*, const void*, int N, int, int OC) override {
        if (dbias) scratch("matmul_backward", bias_scratch_bytes(N, OC));
    }
    void attention_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*,
                            const void*, const AttnShape& s) override {
        scratch("attention_backward", attn_bwd_scratch_bytes((size_t)s.B * s.NH * s.Tq));
    }
    void attention_block_backward(void*, void*, void*, const void*, const void*, const void*, const void*, const void*,
                                  const void*, const AttnShape& s) override {
        scratch("attention_block_backward", attn_bwd_scratch_bytes((size_t)s.B * s.NH * s.Tq));
    }
    void matmul_forward_fp8(void*, const void*, const void*, const void*, int N, int IC, int OC, const void*,
                            const Fp8Delayed*, const Fp8Weight*) override {
        fp8_check("matmul_forward_fp8", fp8k::forward_sizes(N, IC, OC));
    }
    void matmul_backward_fp8(void*, void*, void*, const void*, const void*, const void*, int N, int IC, int OC,
                             const void*, const Fp8Kept*, const Fp8Delayed*, const Fp8Weight*) override {
        fp8_check("matmul_backward_fp8", fp8k::backward_sizes(N, IC, OC));
    }
    // A cast's copies (cuda/fp8.cuh cast_op): N rows of the op's columns, transposed ld x cols.
    void activation_amax(bool swiglu, void*, const void*, const void* dout, int N, int H, void*,
                         const Fp8Cast* cast) override {
        const int halves = swiglu && dout ? 2 : 1;
        if (cast)
            fp8_cast("activation_amax", dout != nullptr, N, halves * H, halves,
                     dout ? cast->transposed : cast->kept != nullptr, dout || cast->plain);
    }
    void norm_amax(bool, void*, void*, void*, void*, const void*, const void*, const void*, const void*, int N, int C,
                   double, void*, const Fp8Cast* cast) override {
        if (cast) fp8_cast("norm_amax", false, N, C, 1, cast->kept != nullptr, cast->plain);
    }
    double sum_squares(const void*, DType, size_t n) override {
        scratch("sum_squares", sum_squares_scratch_bytes(n));
        return 0;
    }
    // The encoder's scratch (cuda/encoder.cuh): sort arrays of B·T items,
    // partial slots of max(B·T, T) items of C channels, CUB's storage for the
    // item count and the key bits of the rows held.
    void encoder_backward(void*, void*, const void*, const int*, const int*, int B, int T, int C, int v_begin,
                          int v_end) override {
        check("encoder_backward", B * T <= w.rows && T <= w.seq && C <= w.channels && v_end - v_begin <= w.vocab_rows &&
                                      enc_partial_floats(std::max(B * T, T), C) <=
                                          enc_partial_floats(std::max(w.rows, w.seq), w.channels));
    }
    void adamw_update_multi(const AdamSpan*, int count, const AdamArgs&) override {
        check("adamw_update_multi", count <= w.runs);
    }
    double sum_squares_multi(const SumSpan* spans, int count, DType) override {
        size_t blocks = 0;
        for (int i = 0; i < count; i++) blocks += sumsq_blocks(spans[i].n);
        check("sum_squares_multi", count <= w.runs && blocks <= sumsq_max_blocks(w.run_elems, w.runs));
        return 0;
    }

  private:
    void fp8_check(const char* what, const fp8k::Scratch::Sizes& need) {
        check(what, fp8k::Scratch::Sizes::of(w.fp8_elems).holds(need));
    }
    // cuda/fp8.cuh cast_op: forward the plain copy (or the copy) in x; backward dy, and dy^T when transposed.
    void fp8_cast(const char* what, bool backward, int N, int cols, int halves, bool transposed, bool plain) {
        const fp8k::QuantizeGrid g = fp8k::quantize_grid(N, cols / halves, transposed);
        fp8k::Scratch::Sizes need;
        if (!backward) need.x = transposed && !plain ? 0 : (size_t)N * cols;
        else need.dy = (size_t)N * cols, need.dyt = transposed ? (size_t)g.ld * cols : 0;
        fp8_check(what, need);
    }
    void scratch(const char* what, size_t bytes) {
        check(what, bytes <= scratch_bytes(w));
    }
    void check(const char* what, bool fits) {
        calls++;
        if (!reserved) over.push_back(std::string(what) + " before the reservation");
        else if (!fits) over.push_back(what);
    }
};

struct Case {
    const char* model;
    int world, pp, vpp, tp, cp, sp, zero, B, T;
    Recompute rc;
    int fp8_history = -1;                  // >= 0: --fp8 1 with this history
    unsigned fp8_layers = kLinearLayersAll;  // --fp8-layers
};

// Every rank of the layout, its groups as the grid would make them (llmc/parallel/process_grid.h).
void run_case(const Case& c) {
    GPTConfig mc;
    std::string err;
    if (!parse_model_spec(c.model, &mc, &err)) {
        CHECK(false, "model %s: %s", c.model, err.c_str());
        return;
    }
    Layout l;
    l.world = c.world, l.pp = c.pp, l.vpp = c.vpp, l.tp = c.tp, l.cp = c.cp, l.sp = c.sp, l.zero = c.zero;
    l.B = c.B, l.T = c.T, l.recompute = c.rc;
    l.fp8 = c.fp8_history >= 0, l.fp8_history = std::max(0, c.fp8_history), l.fp8_layers = c.fp8_layers;
    l.total_batch = (long long)c.B * c.T * l.dp() * c.pp * 2;  // 2·pp micro-batches
    if (!check_layout(&l, mc, &err)) {
        CHECK(false, "layout %s: %s", l.describe().c_str(), err.c_str());
        return;
    }
    const std::string name = std::string(c.model) + ", " + l.describe();
    for (int r = 0; r < c.world; r++) {
        ShapeGroups g;  // rank r's groups, shapes only (every call completes at once)
        make_shape_groups(l, r, false, &g);
        Probe be;
        ModelStack s;
        build_stack(be, mc, l, g.groups, &s);
        const int Tl = l.T_local();
        std::vector<int> in((size_t)c.B * Tl), tg((size_t)c.B * Tl);
        for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * 7 % 257), tg[i] = (int)(i * 5 % 257);
        OptimConfig o;
        for (int step = 0; step < 2; step++) {
            s.model->zero_grad();
            s.pipe->train_step(
                *s.model,
                [&](int, const int** a, const int** b, const int**) {
                    *a = in.data();
                    *b = tg.data();
                },
                c.B, Tl, 1.0 / (double)l.total_batch);
            s.step(o, step, step);
        }
        s.pipe->forward_only(*s.model, in.data(), tg.data(), c.B, Tl);
        std::vector<float> row(mc.vocab_size);
        s.pipe->logits_row(*s.model, 0, 0, row.data());
        std::string what;
        for (const std::string& x : be.over) what += (what.empty() ? "" : ", ") + x;
        CHECK(be.reserved && be.over.empty() && be.calls > 0, "%s, rank %d: %d calls; past the reservation: %s",
              name.c_str(), r, be.calls, what.empty() ? "none" : what.c_str());
    }
}

}  // namespace

int main() {
    const char* gpt = "L=4,C=64,NH=4,V=257,T=64";
    const char* llama = "arch=llama,L=4,C=64,NH=4,NKV=2,F=96,V=257,T=64";
    const char* mixtral = "arch=mixtral,L=2,C=64,NH=4,NKV=2,F=96,E=4,K=2,V=257,T=64";
    const Recompute none = Recompute::none;
    const Case cases[] = {
        {gpt, 1, 1, 1, 1, 1, 0, 0, 4, 64, none},
        {gpt, 1, 1, 1, 1, 1, 0, 0, 2, 32, Recompute::full},
        {gpt, 2, 1, 1, 1, 1, 0, 1, 4, 64, none},
        {gpt, 2, 1, 1, 1, 1, 0, 2, 4, 64, Recompute::gelu},
        {gpt, 2, 1, 1, 1, 1, 0, 3, 4, 64, none},
        {gpt, 2, 1, 1, 2, 1, 0, 0, 4, 64, none},
        {gpt, 4, 1, 1, 2, 1, 1, 1, 4, 64, Recompute::selective},
        {gpt, 2, 1, 1, 1, 2, 0, 0, 4, 64, none},
        {gpt, 4, 1, 1, 2, 2, 0, 2, 2, 64, none},
        {gpt, 2, 2, 1, 1, 1, 0, 0, 4, 64, none},
        {gpt, 4, 2, 2, 1, 1, 0, 1, 2, 64, none},
        {gpt, 8, 2, 1, 2, 1, 1, 1, 2, 64, none},
        {llama, 1, 1, 1, 1, 1, 0, 0, 4, 64, none},
        {llama, 4, 1, 1, 2, 1, 0, 1, 4, 64, none},
        {llama, 4, 1, 1, 1, 2, 0, 3, 2, 64, none},
        {llama, 4, 2, 1, 2, 1, 1, 0, 2, 64, Recompute::full},
        // --fp8 1: every FP8 operand within fp8_elems, the four layers or a
        // set (whose reservation is the set's widths alone).
        {gpt, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 0},
        {gpt, 1, 1, 1, 1, 1, 0, 0, 4, 64, Recompute::gelu, 2},
        {gpt, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 2, 0x3u},
        {gpt, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 2, 0x8u},
        {gpt, 2, 1, 1, 2, 1, 0, 0, 4, 64, none, 2, 0x4u},
        {llama, 2, 2, 1, 1, 1, 0, 0, 2, 64, none, 2},
        {llama, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 0, 0x9u},
        {mixtral, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 0},
        {mixtral, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 2, 0x3u},
        {mixtral, 1, 1, 1, 1, 1, 0, 0, 4, 64, none, 0, 0x8u},
    };
    for (const Case& c : cases) run_case(c);
    // The probe sees a reservation that is too small: one of half the rows.
    {
        struct Short : Probe {
            void reserve_workspace(const Workspace& ws) override {
                Probe::reserve_workspace(ws);
                w.rows /= 2;
                w.attn_rows /= 2;
            }
        };
        GPTConfig mc;
        std::string err;
        parse_model_spec(gpt, &mc, &err);
        Layout l;
        l.B = 4, l.T = 64;
        check_layout(&l, mc, &err);
        ShapeGroups one;
        make_shape_groups(l, 0, false, &one);
        Short be;
        ModelStack s;
        build_stack(be, mc, l, one.groups, &s);
        std::vector<int> in(256, 1);
        s.model->zero_grad();
        s.pipe->train_step(
            *s.model,
            [&](int, const int** a, const int** b, const int**) {
                *a = in.data();
                *b = in.data();
            },
            4, 64, 1.0 / 256);
        CHECK(!be.over.empty(), "a reservation of half the rows is found too small (%zu calls past it)", be.over.size());
    }
    // --calibrate's ops (llmc/plan/calibrate.cpp), FP8 products included, within the reservation it makes.
    {
        Probe be;
        GPTConfig mc;
        std::string err;
        parse_model_spec(gpt, &mc, &err);
        ProcessGrid grid;
        grid.world = std::make_unique<LocalComm>("world", be);
        Hardware hw;
        calibrate(be, grid, mc, 4, 64, "probe", &hw, &err);
        std::string what;
        for (const std::string& x : be.over) what += (what.empty() ? "" : ", ") + x;
        CHECK(be.reserved && be.over.empty() && be.calls > 0, "--calibrate: %d calls; past its reservation: %s",
              be.calls, what.empty() ? "none" : what.c_str());
    }
    // scratch_bytes covers each op at the workspace's shapes, and a larger
    // call of the op that sizes it does not fit.
    {
        Workspace w;
        w.rows = 64, w.seq = 64, w.channels = 768, w.bias_width = 3072, w.vocab_rows = 50304, w.attn_rows = 64 * 12;
        w.runs = 150, w.run_elems = 124000000;
        const size_t cap = scratch_bytes(w);
        CHECK(norm_bwd_scratch_bytes(64, 768) <= cap && bias_scratch_bytes(64, 3072) <= cap &&
                  attn_bwd_scratch_bytes(64 * 12) <= cap && sum_squares_scratch_bytes((size_t)1 << 40) <= cap,
              "scratch_bytes covers each op at the workspace's shapes");
        CHECK(norm_bwd_scratch_bytes(4096, 768) > cap, "a LayerNorm backward over more rows does not fit");
        // The one-kernel attention backward's fp32 dq accumulator (B·NH·T rows
        // of the head size) counts only when that kernel is switched on.
        w.attn_rows = (size_t)4 * 12 * 1024, w.head_size = 64;  // B=4, 12 heads, T=1024
        CHECK(attn_bwd_fused_scratch_bytes(w.attn_rows, 64) > scratch_bytes(w, false) &&
                  attn_bwd_fused_scratch_bytes(w.attn_rows, 64) <= scratch_bytes(w, true),
              "scratch_bytes counts the one-kernel attention backward's dq accumulator when it is on");
    }
    return check_summary();
}
