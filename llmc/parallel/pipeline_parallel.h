// llmc/parallel/pipeline_parallel.h: pipeline parallelism over the pp group
// (docs/design.md section 7; Narayanan et al. 2021, Megatron-LM): the split
// of the blocks into stages, the runtime that runs a schedule
// (llmc/parallel/pipeline_schedule.h), and every collective the pp group
// issues. (The tied embeddings' gradients are summed over the embedding
// group by the optimizer step, llmc/parallel/optimizer_step.h.)
//
// Stages. The L blocks are cut into pp·V model chunks of L/(pp·V) blocks
// (V = --vpp virtual stages per rank); virtual stage v = k·pp + s is chunk k
// of stage s, so stage s holds chunks s, s + pp, s + 2pp, ... (ZBV places
// its two chunks in a V: s and 2pp-1-s; PipeSchedule::virtual_stage). The
// first virtual stage starts with the embeddings, the last ends with the
// final LayerNorm and the LM head. wte is tied: the last stage keeps a copy
// of the whole embedding unit (wte and wpe, so both ends shard it alike
// under ZeRO) and the two copies' gradients are summed over the embedding
// group (first and last stage) before the optimizer, so they stay bitwise
// equal. Under ZBV both ends are on stage 0, which holds the one copy (its
// embedding group is itself).
//
// Point-to-point. A forward sends the residual stream leaving its chunk
// ([B, T/cp, C], 1/tp of the tokens under sp) to the next virtual stage; a
// backward sends the gradient of its chunk's input back. Each exchange of
// the schedule goes out as one group (Comm::start_p2p), in tick order on
// every rank and with both ends of a message in the group of the same tick,
// so neither NCCL (which runs a rank's groups in order) nor host-staged MPI
// can deadlock; with MPI and NCCL the groups run in the background, a rank
// waits for a receive only right before the op that needs it, and for a
// send only when its buffer is needed again (or at the end of the step),
// never for a send while it needs a receive (which could wait for the peer
// to finish computing). A message from a stage to itself (ZBV's turn at the
// bottom of the V) is a copy into its receive buffer, no transfer.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/model/gpt.h"
#include "llmc/parallel/pipeline_schedule.h"

class PipelineParallel {
  public:
    // pp_group: one rank per stage (ordered by stage); embed: the first and
    // the last stage (tied wte). L blocks, vpp chunks per stage, m
    // micro-batches per step. Throws std::invalid_argument naming the flag
    // when the layout does not fit.
    PipelineParallel(Comm& pp_group, Comm& embed, int L, int vpp, int m, PipeOrder order = PipeOrder::standard);
    ~PipelineParallel();
    int size() const { return pp_; }
    int stage() const { return stage_; }
    int vpp() const { return vpp_; }
    int head_stage() const { return sched_->head_stage(); }  // the stage of the LM head (the loss)
    const PipeSchedule& schedule() const { return *sched_; }
    // The model chunks of this stage, for GPT's constructor.
    std::vector<ModelChunk> chunks() const;
    // Allocates the transfer buffers for this model (call once, after the model is built).
    void attach(GPT& model);
    size_t buffer_bytes() const { return bytes_; }

    // Host arrays of micro-batch mb: token ids, targets and (document mask;
    // else null) document starts, [B, T_local]. Every stage loads the
    // micro-batch's rows itself: later stages take no token ids, but the
    // document starts reach every stage's attention this way.
    using Loader = std::function<void(int mb, const int** inputs, const int** targets, const int** docs)>;
    // One step's forwards and backwards over the m micro-batches (the schedule
    // above); gradients accumulate in the model (through dp's provider).
    // Returns the sum of the micro-batches' mean losses on the head's stage,
    // 0 elsewhere.
    // The backward of a unit's last micro-batch says so to the model's unit
    // provider (ZeRO stages 0 and 1 reduce only then).
    double train_step(GPT& model, const Loader& load, int B, int T, double dloss);
    // Mixtral with its load-balancing loss over pp > 1 stages: each
    // micro-batch's routing statistics over all stages (a forward-only pass
    // of the step's micro-batches); empty otherwise.
    std::vector<std::vector<double>> moe_stats(GPT& model, const Loader& load, int B, int T);
    // A forward-only pass of one micro-batch through all stages (validation,
    // samples); returns its mean loss on every rank (0 without targets).
    double forward_only(GPT& model, const int* inputs, const int* targets, int B, int T, const int* docs = nullptr);
    // Logits row (b, pos) of the last forward_only, first V columns, as fp32
    // on every rank (the head's stage computes it; broadcast over the pp group).
    void logits_row(GPT& model, int b, int pos, float* out);

    // Whether the first and the last stage's copies of the embedding unit
    // are bitwise equal (checked through their sums of squares); true
    // without pp. Collective over the pp group.
    bool tied_embeddings_agree(GPT& model);
    // Sums a host value over the stages (gradient norms, losses).
    double sum_over_stages(double x) { return comm_.host_all_reduce(x, ReduceOp::Sum); }

    // The bubble of each stage measured from the trace (llmc/base/trace.h) of
    // the steps after the first: (window - busy) / busy, the window being the
    // whole pipeline's span of the step. Collective over the pp group;
    // returns one value per stage (empty when nothing was traced).
    std::vector<double> measured_bubble();
    // The schedule's formula: (pp - 1) / (m·V); ZB-H1 (pp - 1) / (3m); ZBV (pp - 1) / (6m).
    double bubble_formula() const { return pipe_bubble_formula(pp_, vpp_, m_, sched_->order); }

  private:
    // ModelChunk::fb_bufs (open Forward, close Backward) or bw_bufs (Backward, Weight) of chunk k.
    std::vector<int> colour_slots(int k, int slots, PipeAction::Kind open, PipeAction::Kind close) const;
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
