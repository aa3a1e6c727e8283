// llmc/parallel/pipeline_schedule.h: the schedules of pipeline parallelism
// (docs/design.md section 7; Narayanan et al. 2021, Megatron-LM), as pure
// functions of the stages pp, the model chunks per stage V (--vpp) and the
// micro-batches m of one optimizer step (its gradient-accumulation steps).
// Nothing here computes or communicates: llmc/parallel/pipeline_parallel.h
// runs a schedule, and the planner and the tests read it.
//
// The compute order of each stage:
//   1F1B (V = 1): min(pp - s - 1, m) warm-up forwards, then one forward /
//     one backward, then the remaining backwards. At most pp - s
//     micro-batches of activations in flight on stage s.
//   interleaved 1F1B (V > 1, m % pp == 0): forwards visit the chunks in
//     groups of pp micro-batches (chunk 0 for micro-batches 0..pp-1, chunk 1
//     for the same, ...), backwards the chunks in reverse; warm-up
//     (pp - s - 1)·2 + (V - 1)·pp chunk-forwards. The bubble shrinks from
//     (pp-1)/m to (pp-1)/(m·V) of the ideal time.
//   ZB-H1 (V = 1, --pp-schedule zb-h1; Qi et al. 2024, zero-bubble
//     pipelines): each backward split into B, the input's gradient (on the
//     critical path: the previous stage waits for it), and W, the weights'
//     (which can wait, GPT::BackwardPart). Stage s runs 1F1B's order
//     with each W put off by s micro-batches: its pp - s warm-up forwards,
//     then for each micro-batch j its B, the W of j - s and the next
//     forward; then the W's left. The later stages' waiting W's fill the
//     cool-down, so the bubble falls from 1F1B's (pp-1)·(F+B+W) to
//     (pp-1)·(F+B-W) ticks, (pp-1)/(3m) of the step when the three take
//     the same time, and every stage holds at most pp micro-batches'
//     activations (pp - s between their F and B, s waiting for their W;
//     the slot is free after W): 1F1B's most, stage 0's.
//   ZBV (V = 2, --pp-schedule zbv; the V schedule of the same paper): two
//     chunks per stage placed in a V, virtual stage v on stage v for v < pp
//     and on stage 2pp-1-v after, so stage 0 holds the first and the last
//     chunk (the embeddings and the LM head) and the turn at the bottom of
//     the V (stage pp-1's chunk 0 to its chunk 1) is no transfer. The order
//     is again a lock-step run of rules, over chunk-sized ticks: B if one
//     has its gradient, W if a limit of them wait, F if its input has
//     arrived and its chunk holds fewer than its share of 2pp activations
//     (1F1B's memory: pp micro-batches of a whole stage; chunk 1's first),
//     a waiting W. A few variants of the rules (the two chunks' shares, the
//     W limit, which chunk's B goes first, how far chunk 0's forwards may
//     run ahead of chunk 1's) are run and the shortest kept. With F, B and
//     W of a chunk taking one tick each the stage is busy 6m ticks and the
//     bubble is pp - 1 ticks, (pp-1)/(6m) of the step: half of ZB-H1's at
//     the same memory, with twice the pipeline transfers. That is exact
//     when m is a multiple of pp; otherwise the rules lose a few ticks more.
//
// When the transfers happen is planned once (make_pipe_schedule) by running
// the compute orders in lock step: at each tick every stage does its next op
// if its input has arrived, then the messages made in that tick are
// exchanged, each stage's sends and receives of the tick as one group. Both
// ends of every message issue it in the group of the same tick and the
// groups go out in tick order on every rank, which is what keeps the
// runtime free of deadlocks (llmc/parallel/pipeline_parallel.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

// A message between virtual stages: the activation leaving virtual stage v
// (grad = false, to v + 1) or the gradient of v's input (grad = true, to v - 1).
// The order of the compute ops: 1F1B or interleaved (by V), or zero-bubble.
enum class PipeOrder { standard, zb_h1, zbv };
// "1f1b", "interleaved" (by vpp), "zb-h1" or "zbv".
const char* pipe_order_name(PipeOrder o, int vpp);
// --pp-schedule NAME with --vpp vpp ("": 1F1B or interleaved by vpp); false
// with *err naming the flag when they disagree (1f1b with vpp > 1,
// interleaved without it, zbv with vpp other than 1 or 2).
bool pipe_order_of(const std::string& name, int vpp, PipeOrder* o, std::string* err);
// The chunks per stage an order runs: zbv 2, the others vpp.
int pipe_chunks_per_stage(PipeOrder o, int vpp);
// Which virtual stage is chunk k of stage s: k·pp + s (1F1B, interleaved,
// ZB-H1), or the V of ZBV (s, then 2pp-1-s).
int pipe_virtual_stage(PipeOrder o, int pp, int k, int s);
// The stage of virtual stage v, and its chunk index there.
int pipe_stage_of(PipeOrder o, int pp, int v);
int pipe_chunk_of(PipeOrder o, int pp, int v);

struct PipeMsg {
    int mb, v;
    bool grad;
};

// One send or receive of an exchange. buf: for a receive, the receive buffer
// it lands in; for a send of an activation, the activation slot it leaves
// from; unused for gradient sends (they leave from a send buffer).
struct PipeXfer {
    bool send;
    int peer;  // stage
    PipeMsg msg;
    int buf;
};

// A stage's actions in program order.
struct PipeAction {
    enum Kind { Forward, Backward, Exchange, Weight } kind;  // Backward: B alone when the schedule splits (W: Weight)
    int tick = 0;              // lock-step time of the action
    int mb = -1, chunk = -1;   // compute: micro-batch and the stage's chunk index (v = chunk·pp + stage)
    int slot = -1;             // compute: the chunk's activation slot for this micro-batch
    int in_buf = -1;           // compute: receive buffer holding its input (activation or gradient); -1: none
    std::vector<PipeXfer> xfers;  // exchange
};

struct PipeSchedule {
    int pp = 1, vpp = 1, m = 1;
    PipeOrder order = PipeOrder::standard;
    bool split() const { return order != PipeOrder::standard; }  // backwards as B then W
    int virtual_stage(int k, int s) const { return pipe_virtual_stage(order, pp, k, s); }
    int stage_of(int v) const { return pipe_stage_of(order, pp, v); }
    int chunk_of(int v) const { return pipe_chunk_of(order, pp, v); }
    int head_stage() const { return stage_of(pp * vpp - 1); }  // the stage of the LM head
    std::vector<std::vector<PipeAction>> stages;  // [stage] actions in program order
    std::vector<std::vector<int>> slots;          // [stage][chunk] activation slots (micro-batches in flight)
    std::vector<int> recv_bufs;                   // [stage] receive buffers needed at once
    int ticks = 0;                                // length of the lock-step run
};

// Whether L blocks, pp stages, vpp chunks per stage and m micro-batches
// make a pipeline of that order; false with *err naming the flag (--pp,
// --vpp, -d or --pp-schedule).
bool pipe_layout_ok(int L, int pp, int vpp, int m, std::string* err, PipeOrder order = PipeOrder::standard);

// The schedule of pp stages, vpp chunks per stage and m micro-batches.
// Throws std::invalid_argument naming the flag when they do not fit
// (m < pp names -d; V > 1 needs m % pp == 0 and pp > 1; ZB-H1 V = 1, ZBV V = 2).
PipeSchedule make_pipe_schedule(int pp, int vpp, int m, PipeOrder order = PipeOrder::standard);
// The same, made once per (pp, vpp, m, order) and shared (the planner sizes
// many ranks of many layouts).
std::shared_ptr<const PipeSchedule> shared_pipe_schedule(int pp, int vpp, int m,
                                                         PipeOrder order = PipeOrder::standard);
// The compute order alone: stage s's forwards, backwards (and W's) as (kind, mb, chunk).
std::vector<PipeAction> pipe_compute_order(int pp, int vpp, int m, int s, PipeOrder order = PipeOrder::standard);

// Time of the schedule when a chunk's forward takes tf, its backward tb
// (a split schedule's B) and a split schedule's W tw, transfers free: each
// stage runs its compute order, an op starting when the stage is free and
// its input is there. Returns the makespan, and per stage the busy time;
// used by tests to check the bubble formulas.
double simulate_pipe_time(const PipeSchedule& s, double tf, double tb, std::vector<double>* busy, double tw = 0);
// The bubble over the busy time when F, B and W take the same time (an
// unsplit backward twice a forward): (pp-1)/(m·V), ZB-H1 (pp-1)/(3m),
// ZBV (pp-1)/(6m).
double pipe_bubble_formula(int pp, int vpp, int m, PipeOrder order);

