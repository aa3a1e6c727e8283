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
    enum Kind { Forward, Backward, Exchange } kind;
    int tick = 0;              // lock-step time of the action
    int mb = -1, chunk = -1;   // compute: micro-batch and the stage's chunk index (v = chunk·pp + stage)
    int slot = -1;             // compute: the chunk's activation slot for this micro-batch
    int in_buf = -1;           // compute: receive buffer holding its input (activation or gradient); -1: none
    std::vector<PipeXfer> xfers;  // exchange
};

struct PipeSchedule {
    int pp = 1, vpp = 1, m = 1;
    std::vector<std::vector<PipeAction>> stages;  // [stage] actions in program order
    std::vector<std::vector<int>> slots;          // [stage][chunk] activation slots (micro-batches in flight)
    std::vector<int> recv_bufs;                   // [stage] receive buffers needed at once
    int ticks = 0;                                // length of the lock-step run
};

// Whether L blocks, pp stages, vpp chunks per stage and m micro-batches
// make a pipeline; false with *err naming the flag (--pp, --vpp or -d).
bool pipe_layout_ok(int L, int pp, int vpp, int m, std::string* err);

// The schedule of pp stages, vpp chunks per stage and m micro-batches.
// Throws std::invalid_argument naming the flag when they do not fit
// (m < pp names -d; V > 1 needs m % pp == 0 and pp > 1).
PipeSchedule make_pipe_schedule(int pp, int vpp, int m);
// The same, made once per (pp, vpp, m) and shared (the planner sizes many
// ranks of many layouts).
std::shared_ptr<const PipeSchedule> shared_pipe_schedule(int pp, int vpp, int m);
// The compute order alone: stage s's forwards and backwards as (kind, mb, chunk).
std::vector<PipeAction> pipe_compute_order(int pp, int vpp, int m, int s);

// Time of the schedule when a chunk's forward takes tf and its backward tb
// and transfers are free: each stage runs its compute order, an op starting
// when the stage is free and its input is there. Returns the makespan, and
// per stage the busy time; used by tests to check the bubble formulas.
double simulate_pipe_time(const PipeSchedule& s, double tf, double tb, std::vector<double>* busy);

