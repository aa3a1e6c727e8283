// llmc/pipeline_parallel.h: pipeline parallelism over the pp group
// (shared/reference.md section 7; Narayanan et al. 2021, Megatron-LM). This
// file holds the schedules, every collective the pp group issues, and the
// split of the blocks into stages.
//
// Stages. The L blocks are cut into pp·V model chunks of L/(pp·V) blocks
// (V = --vpp virtual stages per rank); virtual stage v = k·pp + s is chunk k
// of stage s, so stage s holds chunks s, s + pp, s + 2pp, ... The first
// virtual stage starts with the embeddings, the last ends with the final
// LayerNorm and the LM head. wte is tied: the last stage keeps a copy of the
// whole embedding unit (wte and wpe, so both ends shard it alike under ZeRO)
// and the two copies' gradients are summed over the embedding group (first
// and last stage) before the optimizer, so they stay bitwise equal.
//
// Micro-batches: the m gradient-accumulation steps of one optimizer step.
// Schedules (the compute order of each stage):
//   1F1B (V = 1): min(pp - s - 1, m) warm-up forwards, then one forward /
//     one backward, then the remaining backwards. At most pp - s
//     micro-batches of activations in flight on stage s.
//   interleaved 1F1B (V > 1, m % pp == 0): forwards visit the chunks in
//     groups of pp micro-batches (chunk 0 for micro-batches 0..pp-1, chunk 1
//     for the same, ...), backwards the chunks in reverse; warm-up
//     (pp - s - 1)·2 + (V - 1)·pp chunk-forwards. The bubble shrinks from
//     (pp-1)/m to (pp-1)/(m·V) of the ideal time.
//
// Point-to-point. A forward sends the residual stream leaving its chunk
// ([B, T/cp, C], 1/tp of the tokens under sp) to the next virtual stage; a
// backward sends the gradient of its chunk's input back. When the transfers
// happen is planned once (make_pipe_schedule) by running the schedule in
// lock step: at each tick every stage does its next op if its input has
// arrived, then the messages made in that tick are exchanged, each stage's
// sends and receives of the tick issued as one group (Comm::start_p2p). Both
// ends of every message issue it in the group of the same tick and the
// groups go out in tick order on every rank, so neither NCCL (which runs a
// rank's groups in order) nor host-staged MPI can deadlock; with MPI and
// NCCL the groups run in the background, a rank waits for a receive only
// right before the op that needs it, and for a send only when its buffer is
// needed again (or at the end of the step), never for a send while it
// needs a receive (which could wait for the peer to finish computing).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "gpt.h"

class DataParallel;

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

class PipelineParallel {
  public:
    // pp_group: one rank per stage (ordered by stage); embed: the first and
    // the last stage (tied wte). L blocks, vpp chunks per stage, m
    // micro-batches per step. Throws std::invalid_argument naming the flag
    // when the layout does not fit.
    PipelineParallel(Comm& pp_group, Comm& embed, int L, int vpp, int m);
    ~PipelineParallel();
    int size() const { return pp_; }
    int stage() const { return stage_; }
    int vpp() const { return vpp_; }
    const PipeSchedule& schedule() const { return *sched_; }
    // The model chunks of this stage, for GPT's constructor.
    std::vector<ModelChunk> chunks() const;
    // Allocates the transfer buffers for this model (call once, after the model is built).
    void attach(GPT& model);
    size_t buffer_bytes() const { return bytes_; }

    // Host arrays of micro-batch mb: token ids and targets, [B, T_local].
    using Loader = std::function<void(int mb, const int** inputs, const int** targets)>;
    // One step's forwards and backwards over the m micro-batches (the schedule
    // above); gradients accumulate in the model (through dp's provider).
    // Returns the sum of the micro-batches' mean losses on the last stage, 0
    // elsewhere.
    double train_step(GPT& model, DataParallel& dp, const Loader& load, int B, int T, double dloss);
    // A forward-only pass of one micro-batch through all stages (validation,
    // samples); returns its mean loss on every rank (0 without targets).
    double forward_only(GPT& model, const int* inputs, const int* targets, int B, int T);
    // Logits row (b, pos) of the last forward_only, first V columns, as fp32
    // on every rank (the last stage computes it; broadcast over the pp group).
    void logits_row(GPT& model, int b, int pos, float* out);

    // Called by the data-parallel optimizer step: sums the embedding unit's
    // gradients (this rank's part, n elements) over the first and the last
    // stage; a no-op elsewhere and without pp.
    void tie_embedding_grads(void* grads, size_t n, DType t);
    // Whether the first and the last stage's copies of the embedding unit
    // are bitwise equal (checked through their sums of squares); true
    // without pp. Collective over the pp group.
    bool tied_embeddings_agree(GPT& model);
    // Sums a host value over the stages (gradient norms, losses).
    double sum_over_stages(double x) { return comm_.host_all_reduce(x, ReduceOp::Sum); }

    // The bubble of each stage measured from the trace (llmc/trace.h) of
    // the steps after the first: (window - busy) / busy, the window being the
    // whole pipeline's span of the step. Collective over the pp group;
    // returns one value per stage (empty when nothing was traced).
    std::vector<double> measured_bubble();
    // The formula: (pp - 1) / (m·V).
    double bubble_formula() const { return (double)(pp_ - 1) / ((double)m_ * vpp_); }

  private:
    struct Handle {
        CommHandle h = 0;
        bool waited = true;
    };
    void wait(int handle);
    void exchange(GPT& model, const PipeAction& a, const std::vector<int>& send_buf_of_msg);
    void transfer(const P2POp& op);
    void* alloc(size_t bytes);
    void* buf(int i);

    Comm& comm_;
    Comm& embed_;
    Backend* be_ = nullptr;
    int pp_, stage_, vpp_, m_, L_;
    std::shared_ptr<const PipeSchedule> sched_;
    size_t elems_ = 0;             // elements of one boundary activation
    DType act_ = DType::F32;
    std::vector<void*> recv_;      // receive buffers
    std::vector<int> recv_handle_; // the handle of the transfer filling each receive buffer
    std::vector<void*> send_;      // gradient send buffers (round robin)
    std::vector<int> send_handle_;
    std::vector<Handle> handles_;
    void* row_ = nullptr;          // [V] fp32: the sampled logits row
    std::vector<void*> owned_;
    size_t bytes_ = 0;
};
