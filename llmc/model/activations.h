// llmc/model/activations.h: the model's activation and scratch buffers and
// one block's slices of them. Private to the model's own sources: buffers.cpp
// allocates them, forward.cpp and backward.cpp compute in them.
#pragma once
#include <array>

#include "llmc/model/gpt.h"

// Activations. N = B·T tokens; Ns = tokens of the residual stream held here
// (N/tp under sequence parallelism, else N); Cl = C/tp attention channels,
// Hl = 4C/tp MLP channels and Vl vocabulary rows of this tensor-parallel rank.
// Kept per micro-batch slot: per-layer buffers hold one slice per
// layer-slot (a block of a chunk for one slot, layer_acts()), chunk inputs
// one per chunk-slot, the embedding and head buffers one per slot of the
// chunk that has them.
struct GPT::Acts {
    int* inputs = nullptr;  // [slots, N] token ids (embedding chunk)
    int* targets = nullptr;  // [slots, N] (head chunk)
    int* pos = nullptr;  // [T] positions 0..T-1
    int* docs = nullptr;  // [chunk-slots, B·T] document starts (document mask only)
    void* encoded = nullptr;  // [chunk-slots, Ns,C] the residual stream entering each chunk
    void* emb = nullptr;      // [N,C] partial embeddings (SP: before the reduce-scatter)
    // per layer-slot, [L·slots, ...], or one block's scratch when the
    // recompute mode does not keep them (keep_*)
    bool keep_block = true, keep_attn = true, keep_gelu = true;
    // Kept per ModelChunk::fb_bufs (from F to B) instead of per slot: the
    // norms' statistics and second residual, the MLP's pre-activation (qkv
    // and lse always; the w_ buffers per bw_bufs).
    bool fb_norms = false, fb_fch = false;
    void *ln1, *ln1_mean, *ln1_rstd;            // [Ns,C], [Ns], [Ns]
    void *qkv, *atty, *lse;                     // [N,3Cl], [N,Cl], [NHl,N]
    void *residual2, *ln2, *ln2_mean, *ln2_rstd;  // [Ns,C], ...
    void *fch, *fch_gelu;                       // [N,Hl]
    void* residual3;                            // [Ns,C]
    // Mixtral (fch and h then hold N·K grouped rows): per layer-slot
    void *moe_probs = nullptr, *moe_topw = nullptr;  // [N,E] stat, [N,K]
    int *moe_topi = nullptr, *moe_offsets = nullptr, *moe_perm = nullptr, *moe_inv = nullptr;  // [N,K], [E+1], [NK], [NK]
    void *moe_xg = nullptr, *moe_yg = nullptr;     // [NK,C] the experts' grouped inputs and outputs
    // Mixtral scratch
    void *moe_logits = nullptr, *moe_dlogits = nullptr;  // [N,E]
    void *moe_dg = nullptr, *moe_dtopw = nullptr, *moe_dx = nullptr;  // [NK,C], [NK] stat, [N,C]
    // Expert parallel: the grouped rows before they leave ([NK,C]) and the
    // experts' output rows (or, backward, their received gradients) before
    // they go back ([R,C]).
    void *moe_send = nullptr, *moe_ye = nullptr;
    void* moe_bias = nullptr;  // [L, E] stat: --moe-balance bias's routing bias
    void* moe_aux_grad = nullptr;  // [chunk-slots, E] stat: the load-balancing loss's gradient per probability
    // --fp8 1 (docs/fp8.md), per layer-slot: the amaxes of the four linear
    // layers' input, weight and output gradient ([4][3] doubles; a Mixtral's
    // experts' [2 products][E blocks][3] after them), the forward's two kept
    // for the backward (the backend keeps the operands' FP8 copies).
    void* fp8_amax = nullptr;
    // --fp8-history: per (layer, linear, operand) the last N steps' amaxes
    // ([L, 4, 3, N] doubles, newest first) and this step's ([L, 4, 3]).
    void *fp8_hist = nullptr, *fp8_step = nullptr;
    // --fp8-history, dense MLP: fcproj's input as the transposed FP8 copy
    // its weight gradient multiplies ([Hl, N padded to 16] bytes), which the
    // activation's cast writes (Backend::Fp8Kept) in h's own buffer (per
    // layer-slot, or the block's scratch when recomputed), where h is not
    // stored once the history holds an amax; and QKV's and fc's inputs in
    // ln1's and ln2's (the norms' casts; where the block keeps them, without
    // sequence parallel; fc's not for a Mixtral).
    bool fp8_kept_h = false, fp8_kept_ln1 = false, fp8_kept_ln2 = false;
    // --fp8, not ZeRO-3: the four linear layers' weights of this rank's
    // blocks as FP8 bytes, as they are and transposed, each 256-aligned
    // (GPT::fp8_woff_), and their amaxes [L, 4] doubles: made at a step's
    // first use (fp8.cpp's fp8_weight), read by its other micro-batches.
    void *fp8_wq = nullptr, *fp8_wamax = nullptr;
    // per slot of the head chunk
    void *lnf, *lnf_mean, *lnf_rstd;            // [Ns,C], [Ns], [Ns]
    void* logits;                               // [N,Vl]; with --head-chunk ROWS one [ROWS,Vl] for all slots
    void* dlnf = nullptr;                       // [N,C] --head-chunk: d(head input), from the forward
    void* losses;                               // [N]
    void *ce_max = nullptr, *ce_target = nullptr, *ce_sumexp = nullptr;  // [N], tp > 1
    void* logit_row = nullptr;                  // [V], tp > 1: one gathered row
    void* head_dw = nullptr;  // [Vl,C] --head-chunk: the head weight's gradient since the last backward
    // scratch, reused by every layer
    void* ln_full = nullptr;  // [N,C] SP: a LayerNorm output gathered over the tp group
    void* proj;               // [N,C] row-parallel output (partial under tp)
    void* proj_s = nullptr;   // [Ns,C] SP: its reduce-scattered rows
    void* dresidual;          // [Ns,C]
    void* dfull = nullptr;    // [N,C] SP: residual gradient gathered
    void* dln;                // [N,C] gradient of a column-parallel layer's input
    void* dln_s = nullptr;    // [Ns,C] SP: its reduce-scattered rows
    void* datt;               // [N,Cl]
    void* dh;                 // [N,Hl] gradient of the MLP's activation output
    void* dfch;               // [N,Fl] gradient of fch (GPT-2: the same buffer as dh)
    void* dqkv;               // [N,3Cl]
    // split_backward: per layer-slot, the output gradients of QKV, the
    // attention's projection, fc and its projection, from B for W
    void *g_qkv = nullptr, *g_attproj = nullptr, *g_fc = nullptr, *g_fcproj = nullptr;
    // ... and the inputs W cannot find where the forward left them: QKV's and
    // fc's (gathered under sp, or recomputed), the projections' (recomputed)
    void *g_ln1 = nullptr, *g_ln2 = nullptr, *g_atty = nullptr, *g_h = nullptr;
    void* g_router = nullptr;  // Mixtral: the router's output gradient [N,E] (g_fcproj, g_fc: the experts' rows)
    // ZeRO 2 and 3: the two norms' output gradients [Ns,C] for W's norm
    // weight gradients, and where B's own go ([2C], discarded); under full
    // recompute also the norms' inputs B recomputed: x2 [Ns,C] and the
    // statistics [4][Ns] (ln1 mean, rstd, ln2 mean, rstd)
    void *g_dln1 = nullptr, *g_dln2 = nullptr, *norm_discard = nullptr, *g_x2 = nullptr, *g_stats = nullptr;
    void* g_xg = nullptr;  // Mixtral under full recompute: the experts' input rows [R,C] (W's, recomputed by B)
};

// Block l's slices of the activations, for N tokens (Ns in the residual
// stream). Buffers the recompute mode does not keep are the block scratch.
struct GPT::LayerActs {
    void *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *x2, *ln2, *ln2_mean, *ln2_rstd, *fch, *h, *x3;
    const int* docs;  // the slot's document starts [B·T] (null: no document mask)
    void *probs, *topw, *xg, *yg;  // Mixtral (null otherwise)
    int *topi, *offsets, *perm, *inv;
    void *g_qkv, *g_attproj, *g_fc, *g_fcproj;  // split_backward: the kept output gradients (null otherwise)
    void *g_ln1, *g_ln2, *g_atty, *g_h;  // split_backward: the four layers' inputs for W (kept copies, or ln1 ...)
    void* g_router;                      // split_backward, Mixtral: the router's output gradient
    void* amax;                          // --fp8: the slot's amaxes (Acts::fp8_amax; else null)
    void* h_t;                           // --fp8-history: fcproj's input kept transposed in FP8 (in h's buffer)
    void *ln1_t, *ln2_t;                 // ... QKV's and fc's (in ln1's and ln2's; null: none; Acts::fp8_kept_*)
    void *g_dln1, *g_dln2;               // split_backward, ZeRO 2 and 3: the norms' output gradients from B
    void *g_x2, *g_stats;                // ... under full recompute: the norms' inputs B recomputed (else null)
    size_t index;  // the layer-slot (layer_slots_: the recompute scratch)
    size_t slot_index;  // the layer-slot, kept or not (a split backward's W under full recompute)
    void* g_xg;         // split_backward, Mixtral under full recompute: the experts' input rows B recomputed
    // The two norms' statistics in g_stats' order: ln1 mean, rstd, ln2 mean,
    // rstd (a mean is null for RMSNorm).
    std::array<const void*, 4> norm_stats() const { return {ln1_mean, ln1_rstd, ln2_mean, ln2_rstd}; }
};
