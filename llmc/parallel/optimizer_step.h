// llmc/parallel/optimizer_step.h: the optimizer step of every layout, once
// the step's gradients are reduced (DataParallel::finish_reductions). Every
// collective of the step is issued here, over plain communicators:
//
//   1. tied embeddings (pipeline parallel, GPT-2's tied wte): the first and
//      the last stage each hold the embedding unit; their gradients (this
//      rank's part) are summed over the embedding group, so both copies take
//      the same update and stay bitwise equal (docs/design.md section 7);
//   2. the global gradient norm: each rank sums the squares of what it owns
//      (all of it at ZeRO 0, its slices at 1-3, summed over the dp group;
//      tensors split by tp summed over the tp group, replicated ones counted
//      by tp rank 0; the stages' sums added over the pp group, the last
//      stage's copy of the embeddings left out; expert parallel's experts
//      summed over the ep group at ZeRO 0, whose ranks hold different ones);
//   3. clipping and AdamW on this rank's part of every unit, in one
//      multi-tensor backend call (llmc/model/optimizer.h);
//   4. ZeRO stages 1 and 2: every rank needs every updated parameter, so the
//      updated slices are all-gathered over the dp group, an expert
//      segment's over the expert-data group (stage 3 gathers them only when
//      a unit is next used; stage 0 updated everything).
#pragma once
#include "llmc/comm/comm.h"
#include "llmc/model/gpt.h"
#include "llmc/model/optimizer.h"

// The groups of a rank that the step reduces over; null (or a group of one)
// where the layout has no such axis.
struct StepGroups {
    Comm* dp = nullptr;     // the dp × cp group the ZeRO shards are split over
    Comm* tp = nullptr;     // tensor parallel
    Comm* pp = nullptr;     // one rank per pipeline stage
    Comm* embed = nullptr;  // the first and the last stage (tied embeddings)
    Comm* ep = nullptr;     // expert parallel: the ranks holding the other experts
    Comm* edp = nullptr;    // expert parallel: the dp × cp ranks holding the same experts
    Comm* world = nullptr;  // every rank: they agree on skipping a step whose norm is not finite
};

// One optimizer step of `model` (built with the ZeRO sharding of g.dp):
// the four parts above, for step `step` of the run (0-based) and its update
// number `update` (the steps before it less those skipped: the learning
// rate and Adam's t count updates, docs/design.md section 2.8). Returns the
// global gradient norm before clipping.
// The update (parts 3 and 4) is skipped, leaving parameters and Adam state
// as they were, when `skip` is set or the norm is not finite on any rank (a
// max over the world: the norm is reduced over the ranks that hold different
// gradients, but a gradient that went bad after its reduction, on one data-
// parallel replica, would otherwise be seen by that rank alone), so every
// rank skips alike. *skipped (may be null) says whether it was.
//
// figures (not null): the step's figures in backend memory (step_figure,
// backend.h) with the loss's verdict made (StepVerdict phase 0): the sums of
// squares and their reductions stay on the device (device all-reduces of one
// double, in the host's order), the verdict's phase 1 sets the norm, the clip
// scale and the decision there, phase 2 the learning rate and the bias
// corrections at the figures' own count of updates (`update` is then not
// used), and AdamW reads them; skip is then ignored, nothing is read back
// and the return value is 0 (the figures hold the norm).
double optimizer_step(GPT& model, const StepGroups& g, const OptimConfig& o, int step, int update,
                      bool skip = false, bool* skipped = nullptr, void* figures = nullptr);
