// llmc/plan/cost_model.h: the planner's time model (docs/design.md section
// 10, docs/planner.md): one layout's step time per rank, from the model's
// shapes and a hardware profile (llmc/plan/hardware.h).
//
// Every matrix product is timed by its shape, not by its FLOPs alone: on a
// profile that names its multiprocessors and GEMM tile (the built-in GPU
// profiles), the output is cut into tiles, the tiles run in waves over the
// multiprocessors, each wave costs a full tile's time at the large-GEMM
// rate, and every product pays a launch; so a product whose tiles do not
// fill the last wave, or whose edge is narrower than a tile (an attention
// head's 64-160 columns against a 128-wide tile), runs below the rate a
// large product reaches. A profile without them (the CPU's, a calibrated
// one, which measured its rate at the model's own shapes) times FLOPs over
// its rate.
//
// The rest per block and micro-batch: the memory-bound kernels by the bytes
// they move (with --plan-attention standard, the kernels Megatron-LM's block
// launched in 2021: the T x T scores through memory, dropout masks on the
// scores and on both residual branches, the attention output's transpose,
// QKV's bias, the fp32 loss, the gradients accumulated by their own kernel),
// a launch per kernel; tp's collectives blocking, as the runtime issues
// them; the ring of cp beside its attention; the experts' all-to-all,
// blocking; the pipeline's bubble and its fill and drain; dp's reductions
// overlapped with the backward; AdamW.
#pragma once
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/model/config.h"
#include "llmc/parallel/layout.h"
#include "llmc/plan/hardware.h"

// Seconds per step of one rank, by part; and the slowest stage's compute by
// op class, as the trainer measures them (llmc/backend/backend_profile.h;
// scripts/benchmark.py --breakdown): each linear layer's products
// (forward, both backward products, the recompute's forward), the
// attention core forward (again when recomputed) and backward, the
// memory-bound kernels of the blocks (norms, activation, residual adds,
// rotary embeddings, routing), the embeddings, the LM head with its
// cross-entropy, AdamW.
struct Cost {
    double compute = 0, tp = 0, cp = 0, pp = 0, dp = 0, bubble = 0, optimizer = 0, ep = 0, step = 0;
    struct Classes {
        double qkv = 0, attproj = 0, fc = 0, fcproj = 0, attention_fwd = 0, attention_bwd = 0, memory_bound = 0,
               embed = 0, head = 0, optimizer = 0;
    } classes;
};

class CostModel {
  public:
    // standard_attention: Megatron-LM 2021's block (see above) instead of
    // this trainer's (flash-style attention, no dropout).
    CostModel(const GPTConfig& c, const Layout& l, const Hardware& hw, const Precision& prec, int gpus_per_node,
              bool standard_attention);

    // stage_params[s]: parameters a rank of stage s holds; unit0: its
    // embedding unit (for the tied all-reduce); stage_experts[s]: of its
    // parameters, the experts' under expert parallelism (reduced over the
    // expert-data group; empty: none).
    Cost predict(const std::vector<size_t>& stage_params, size_t unit0,
                 const std::vector<size_t>& stage_experts = {}) const;

    // Seconds of `batch` products of an M x K by a K x N matrix (the wave
    // model above), launch included; at `rate` FLOP/s for a large product
    // (0: the profile's matmul_flops).
    double gemm(double M, double N, double K, double batch = 1, double rate = 0) const;

    // With --fp8 1 (docs/fp8.md), what one linear layer's operands cost
    // beside its FP8 product, forward or backward, N rows, IC -> OC: the
    // amax passes (each operand read; separate ops) and the quantisation
    // (read, and the copy written: FP8 bytes on a GPU, with the transposed
    // copies cuBLASLt's products need; the compute type's on the CPU's
    // emulation, which rounds in place of the GPU's byte copies); a, pb:
    // bytes of an activation and of a weight element.
    struct Fp8Passes {
        double amax_bytes = 0, quant_bytes = 0;
        double amax_ops = 0, quant_ops = 0;  // (a share of a launch: the weight's, once per step)
    };
    // fused: the operand the pass measures (forward the input, backward the
    // output gradient) was measured by the op that wrote it; cast: that op
    // wrote its FP8 copies too (delayed scaling, a GPU's: the MLP's
    // activation). part (backward): 0 the whole, 1 a split backward's B (the
    // input gradient), 2 its W. kept: the forward's cast also wrote the
    // input's transposed copy, which the weight gradient multiplies
    // (fcproj's: the forward writes it, the backward reads no input).
    // wshare: the share of the micro-batches that measure the weight and
    // make its FP8 copies (1 / micro-batches: once per step, GPT::fp8_weight).
    static Fp8Passes fp8_passes(bool cpu, double a, double pb, double N, double IC, double OC, bool backward,
                                bool fused = false, int part = 0, bool cast = false, bool kept = false,
                                double wshare = 1);
    // The forward's cast keeps fcproj's input transposed in FP8 (a GPU's
    // delayed scaling on a dense MLP, where h is kept or a whole backward
    // recomputes it): h is then not stored in the compute type.
    bool kept_h() const;
    bool kept_ln(int i) const;  // the norm casts linear layer i's input (0 QKV, 2 fc), its transposed copy kept
    // Linear layer i (0 QKV, 1 attention output, 2 MLP up, 3 MLP down) on FP8 operands (--fp8, --fp8-layers).
    bool fp8_on(int i) const { return rate8_ > 0 && linear_layer_in(l_.fp8_layers, i); }

  private:
    // A zero-bubble schedule: each backward is B, then W apart.
    bool split() const { return l_.pp > 1 && l_.pp_order != PipeOrder::standard; }
    struct Link {
        double bw, lat;
    };
    Link link(int span) const;
    static double all_reduce(double n, int g, Link k);
    static double gather_scatter(double n, int g, Link k);
    double p2p(double n, Link k) const;
    double expose(double comm, double compute) const;
    // One block's linear products, forward or backward, one micro-batch;
    // with `layer` (0 qkv, 1 attproj, 2 fc, 3 fcproj) that layer's alone (a
    // Mixtral's experts as fc and fcproj, its router as neither); with
    // weights_only the backward's weight-gradient products alone (a
    // zero-bubble schedule's W).
    double block_gemms(bool backward, int layer = -1, bool weights_only = false) const;

    const GPTConfig& c_;
    const Layout& l_;
    const Hardware& hw_;
    int G_;
    bool standard_;
    double a_, st_, pb_, gb_, ov_;
    bool master_;
    double rate8_;  // FP8 products' rate (--fp8 1; 0: off)
};
