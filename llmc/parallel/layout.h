// llmc/parallel/layout.h: a layout, the one value that says how a run is
// split over its ranks (pipeline stages and chunks, data, context, tensor and
// expert parallel degrees, sequence parallel, ZeRO stage, micro-batch,
// recompute, LM-head chunk), and its checks: against the world size (before
// the model is known) and against the model. The run makes it once from its
// flags and checks it here, with every message naming its flag; the process
// grid (process_grid.h), the tensor table's split and the model's options
// (model_stack.h) are derived from it.
#pragma once
#include <string>

#include "llmc/model/config.h"
#include "llmc/model/gpt.h"
#include "llmc/parallel/pipeline_schedule.h"
struct Layout {
    int world = 1;
    int pp = 1, vpp = 1, tp = 1, cp = 1, sp = 0, zero = 0;
    PipeOrder pp_order = PipeOrder::standard;  // --pp-schedule (standard: 1F1B, or interleaved when vpp > 1)
    // Expert parallel (Mixtral, docs/moe.md): the experts split over groups
    // of ep data-parallel ranks (ep divides dp and the expert count).
    int ep = 1;
    int B = 1, T = 1;            // micro-batch rows and sequence length
    long long total_batch = -1;  // tokens per optimizer step (-1: B·T·dp)
    Recompute recompute = Recompute::none;
    int head_chunk = 0;          // rows per LM-head chunk (0: the whole micro-batch at once)
    bool bf16_optimizer = false;  // Adam's m and v held in bf16 (--optimizer-dtype bf16)
    bool fp8 = false;             // the blocks' four linear layers on FP8 operands (--fp8 1, docs/fp8.md)
    int fp8_history = 0;          // with fp8: delayed scaling over N steps (--fp8-history)
    bool fp8_weight_copies = true;  // with fp8: the weights' FP8 copies once per step (--fp8-weight-copies)
    unsigned fp8_layers = kLinearLayersAll;  // with fp8: the linear layers on FP8 operands (--fp8-layers)
    // Context parallel's implementation: ranks per all-to-all group (1: the
    // ring alone; cp: all-to-all alone, --cp-impl a2a; between: --cp-impl
    // hybrid, all-to-all in groups of cp_a2a and a ring over cp/cp_a2a).
    int cp_a2a = 1;
    bool cp_hybrid() const { return cp_a2a > 1 && cp_a2a < cp; }

    int dp() const { return world / (pp * tp * cp); }
    int T_local() const { return T / cp; }
    // Micro-batches per step on each data-parallel rank (after check_layout).
    int micro_batches() const { return (int)(total_batch / ((long long)B * dp() * T)); }
    // "pp 2 x dp 2 x cp 1 x tp 2 (sp), ZeRO 1, B=4, recompute none"
    std::string describe() const;
};

// Layout::cp_a2a of --cp-impl impl (ring, a2a, hybrid) and --cp-a2a n (0: not
// given) under --cp cp: 1, cp or n; false with *err naming the flag when
// they do not go together (n without hybrid; hybrid without 1 < n < cp
// dividing cp).
bool cp_a2a_of(const std::string& impl, int cp, int n, int* cp_a2a, std::string* err);

// The degrees against the world size alone (before the model is known):
// each at least 1, their product dividing the world, cp_a2a dividing cp, ep
// dividing dp; false with *err naming the flag. The process grid is made
// only of a layout that passes.
bool check_world(const Layout& l, std::string* err);
// Everything against the world and the model, in the order the trainer
// reports them: check_world, then the sequence, the heads, the batch and the
// pipeline. Sets total_batch when it was -1.
bool check_layout(Layout* l, const GPTConfig& c, std::string* err);
