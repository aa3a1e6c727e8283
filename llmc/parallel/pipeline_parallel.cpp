// llmc/parallel/pipeline_parallel.cpp: see pipeline_parallel.h. Every
// collective of the pp group is issued in this file.
#include "llmc/parallel/pipeline_parallel.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "llmc/base/trace.h"

PipelineParallel::PipelineParallel(Comm& pp_group, Comm& embed, int L, int vpp, int m, PipeOrder order)
    : comm_(pp_group), embed_(embed), pp_(pp_group.size()), stage_(pp_group.rank()), vpp_(vpp), m_(m), L_(L) {
    std::string why;
    // One stage runs no pipeline: its order is the plain one.
    if (pp_ == 1) order = PipeOrder::standard;
    if (!pipe_layout_ok(L, pp_, vpp, m, &why, order)) throw std::invalid_argument(why);
    sched_ = shared_pipe_schedule(pp_, vpp, m, order);
}

PipelineParallel::~PipelineParallel() {
    for (Handle& h : handles_)
        if (!h.waited) comm_.wait(h.h);
    for (void* p : owned_) be_->release(p);
}

// The slots of chunk k coloured so that two slots never both between
// their `open` and `close` actions share a colour (a buffer): in the order
// of the stage's actions, each slot takes the smallest colour no slot it
// meets there has. Under ZB-H1 the last stage's B follows its F and stage
// 0's W its B, so one buffer does for what they hold between the two.
std::vector<int> PipelineParallel::colour_slots(int k, int slots, PipeAction::Kind open, PipeAction::Kind close) const {
    std::vector<int> colour(slots, -1);
    std::vector<std::set<int>> meets(slots);  // the slots between open and close at once with each
    std::set<int> between;
    for (const PipeAction& a : sched_->stages[stage_]) {
        if (a.chunk != k || a.slot < 0) continue;
        if (a.kind == open) {
            for (int o : between) meets[a.slot].insert(o), meets[o].insert(a.slot);
            between.insert(a.slot);
        } else if (a.kind == close) {
            between.erase(a.slot);
        }
    }
    for (int s = 0; s < slots; s++) {
        std::set<int> taken;
        for (int o : meets[s])
            if (colour[o] >= 0) taken.insert(colour[o]);
        int c = 0;
        while (taken.count(c)) c++;
        colour[s] = c;
    }
    return colour;
}

std::vector<ModelChunk> PipelineParallel::chunks() const {
    const int per = L_ / (pp_ * vpp_), last = pp_ * vpp_ - 1;
    std::vector<ModelChunk> out;
    for (int k = 0; k < vpp_; k++) {
        const int v = sched_->virtual_stage(k, stage_);
        ModelChunk c;
        c.first_layer = v * per;
        c.layers = per;
        c.embed = v == 0;
        c.head = v == last;
        c.slots = std::max(1, sched_->slots[stage_][k]);
        if (sched_->split()) {  // a slot is held until W: what lives less shares buffers (ModelChunk)
            c.fb_bufs = colour_slots(k, c.slots, PipeAction::Forward, PipeAction::Backward);
            c.bw_bufs = colour_slots(k, c.slots, PipeAction::Backward, PipeAction::Weight);
        }
        out.push_back(c);
    }
    return out;
}

void* PipelineParallel::alloc(size_t bytes) {
    void* p = be_->alloc(bytes);
    owned_.push_back(p);
    bytes_ += bytes;
    return p;
}

void PipelineParallel::attach(GPT& model) {
    be_ = &model.backend();
    act_ = model.precision().act;
    elems_ = model.boundary_elems();
    if (pp_ == 1) return;  // no transfers
    row_ = alloc(model.config().vocab_size * sizeof(float));
    // Receive buffers as the schedule needs them at once, at least one for
    // the forward-only passes; two gradient send buffers used in turn.
    for (int i = 0; i < std::max(1, sched_->recv_bufs[stage_]); i++) recv_.push_back(alloc(elems_ * dtype_size(act_)));
    recv_handle_.assign(recv_.size(), -1);
    for (int i = 0; i < 2; i++) send_.push_back(alloc(elems_ * dtype_size(act_)));
    send_handle_.assign(send_.size(), -1);
}

void PipelineParallel::wait(int i) {
    if (i < 0 || handles_[i].waited) return;
    comm_.wait(handles_[i].h);
    handles_[i].waited = true;
}

// Message tags (MPI): unique among the messages of a step between two ranks.
static int msg_tag(const PipeMsg& m, int nv) { return ((m.mb * nv + m.v) * 2 + (m.grad ? 1 : 0)) % 30000; }

// Issues one exchange of the schedule. Each transfer gets its own handle, so
// that a receive is waited for alone (right before its op), and a send only
// when its buffer is needed again or at the end of the step.
void PipelineParallel::exchange(GPT& model, const PipeAction& a, const std::vector<int>& send_buf_of_msg) {
    const int nv = pp_ * vpp_;
    std::vector<P2POp> ops;
    std::vector<int> owner;  // per op: receive buffer (>= 0), gradient send buffer (-2 - sb), or -1
    const void* to_self = nullptr;  // the data of a message to this stage (ZBV's turn of the V)
    for (const PipeXfer& x : a.xfers) {
        P2POp op{x.send, nullptr, x.peer, elems_, msg_tag(x.msg, nv)};
        int who = -1;
        if (x.send && !x.msg.grad) {
            op.buf = const_cast<void*>(model.chunk_output(sched_->chunk_of(x.msg.v), x.buf));
        } else if (x.send) {
            const int sb = send_buf_of_msg[x.msg.mb * nv + x.msg.v];
            op.buf = send_[sb];
            who = -2 - sb;
        } else {
            wait(recv_handle_[x.buf]);  // (read already, in program order; a no-op)
            op.buf = recv_[x.buf];
            who = x.buf;
        }
        if (x.peer == stage_) {  // a send to itself is followed by its receive: a copy
            if (x.send) to_self = op.buf;
            else be_->copy(op.buf, to_self, elems_ * dtype_size(act_));
            continue;
        }
        ops.push_back(op);
        owner.push_back(who);
    }
    std::vector<CommHandle> hs;
    comm_.start_p2p(ops, act_, &hs);
    for (size_t i = 0; i < hs.size(); i++) {
        handles_.push_back({hs[i], false});
        const int h = (int)handles_.size() - 1;
        if (owner[i] >= 0) recv_handle_[owner[i]] = h;
        else if (owner[i] <= -2) send_handle_[-2 - owner[i]] = h;
    }
}

// One transfer alone, waited for (the forward-only passes).
void PipelineParallel::transfer(const P2POp& op) {
    std::vector<CommHandle> hs;
    comm_.start_p2p({op}, act_, &hs);
    comm_.wait(hs[0]);
}

// Mixtral's load-balancing loss pools the routing of every layer of a
// micro-batch, and its gradient is needed by the first backward of it
// (docs/moe.md): a forward-only pass of the step's micro-batches first
// gathers each one's routing statistics, summed over the stages.
std::vector<std::vector<double>> PipelineParallel::moe_stats(GPT& model, const Loader& load, int B, int T) {
    std::vector<std::vector<double>> out;
    const GPTConfig& c = model.config();
    if (!c.moe() || c.aux_coef == 0 || pp_ == 1) return out;
    model.moe().take_stats();
    const bool counting = model.moe().counting_loads();
    model.moe().count_loads(false);  // the schedule's forwards count the step's loads, once
    for (int mb = 0; mb < m_; mb++) {
        const int *inputs = nullptr, *targets = nullptr, *docs = nullptr;
        load(mb, &inputs, &targets, &docs);
        forward_only(model, inputs, targets, B, T, docs);
        std::vector<double> st = model.moe().take_stats();
        for (double& x : st) x = comm_.host_all_reduce(x, ReduceOp::Sum);
        out.push_back(st);
    }
    model.moe().count_loads(counting);
    return out;
}

double PipelineParallel::train_step(GPT& model, const Loader& load, int B, int T, double dloss) {
    const int nv = pp_ * vpp_;
    const std::vector<ModelChunk>& chunks = model.chunks();
    const std::vector<std::vector<double>> moe = moe_stats(model, load, B, T);
    std::vector<int> send_buf_of_msg((size_t)m_ * nv, -1);
    int next_send = 0;
    double loss = 0;
    handles_.clear();
    std::fill(recv_handle_.begin(), recv_handle_.end(), -1);
    std::fill(send_handle_.begin(), send_handle_.end(), -1);
    for (const PipeAction& a : sched_->stages[stage_]) {
        if (a.kind == PipeAction::Exchange) {
            exchange(model, a, send_buf_of_msg);
            continue;
        }
        const ModelChunk& ch = chunks[a.chunk];
        const int v = sched_->virtual_stage(a.chunk, stage_);
        if (a.kind == PipeAction::Weight) {  // a split backward's W: the weights' gradients, this stage's own
            trace::Scope span("W mb" + std::to_string(a.mb) + " v" + std::to_string(v), "backward");
            model.backward_chunk(a.chunk, a.slot, nullptr, a.mb == m_ - 1, GPT::BackwardPart::weights);
            continue;
        }
        const bool fwd = a.kind == PipeAction::Forward;
        const void* in = nullptr;
        if (a.in_buf >= 0) {
            wait(recv_handle_[a.in_buf]);
            in = recv_[a.in_buf];
        }
        {  // the op's span: its compute, not the waits for transfers before and after it
            trace::Scope span((fwd ? "F mb" : "B mb") + std::to_string(a.mb) + " v" + std::to_string(v),
                              fwd ? "forward" : "backward");
            if (fwd) {
                const int *inputs = nullptr, *targets = nullptr, *docs = nullptr;
                load(a.mb, &inputs, &targets, &docs);
                loss += model.forward_chunk(a.chunk, a.slot, inputs, in, ch.head ? targets : nullptr, B, T, dloss, docs);
            } else {
                // Stages 0 and 1 of ZeRO reduce a unit's gradients when its last
                // micro-batch's backward is done.
                if (!moe.empty()) model.set_moe_aux(a.chunk, a.slot, moe[a.mb], B * T, dloss);
                model.backward_chunk(a.chunk, a.slot, in, a.mb == m_ - 1,
                                     sched_->split() ? GPT::BackwardPart::input : GPT::BackwardPart::all);
            }
        }
        if (!fwd && !ch.embed) {  // the input's gradient goes back to the previous virtual stage
            const int sb = next_send;
            next_send = (next_send + 1) % (int)send_.size();
            wait(send_handle_[sb]);  // (a send buffer still in flight: waiting, not busy)
            be_->copy(send_[sb], model.input_grad(), elems_ * dtype_size(act_));
            send_buf_of_msg[a.mb * nv + v] = sb;
        }
    }
    for (size_t i = 0; i < handles_.size(); i++) wait((int)i);
    if (!moe.empty()) model.moe().take_stats();  // the schedule's forwards gathered them again
    return loss;
}

double PipelineParallel::forward_only(GPT& model, const int* inputs, const int* targets, int B, int T,
                                      const int* docs) {
    if (pp_ == 1) return model.forward(inputs, targets, B, T, 0.0, docs);
    // One virtual stage after the other; each transfer alone in its group,
    // issued in the same order on both ends (ZBV's turn of the V, from a
    // stage to itself, reads the previous chunk's output where it is).
    const PipeSchedule& S = *sched_;
    const int nv = pp_ * vpp_;
    double loss = 0;
    for (int v = 0; v < nv; v++) {
        if (S.stage_of(v) != stage_) continue;
        const int k = S.chunk_of(v);
        const void* in = recv_[0];
        if (v > 0 && S.stage_of(v - 1) == stage_) in = model.chunk_output(S.chunk_of(v - 1), 0);
        else if (v > 0) transfer({false, recv_[0], S.stage_of(v - 1), elems_, msg_tag({0, v - 1, false}, nv)});
        loss = model.forward_chunk(k, 0, inputs, in, v == nv - 1 ? targets : nullptr, B, T, 0.0, docs);
        if (v < nv - 1 && S.stage_of(v + 1) != stage_)
            transfer({true, const_cast<void*>(model.chunk_output(k, 0)), S.stage_of(v + 1), elems_, msg_tag({0, v, false}, nv)});
    }
    return sum_over_stages(stage_ == S.head_stage() ? loss : 0.0);
}

void PipelineParallel::logits_row(GPT& model, int b, int pos, float* out) {
    const int V = model.config().vocab_size;
    if (pp_ == 1) return model.logits_row(b, pos, out, DType::F32);
    if (stage_ == sched_->head_stage()) {
        model.logits_row(b, pos, out, DType::F32);
        be_->upload(row_, DType::F32, out, DType::F32, V);
    }
    comm_.broadcast(row_, V, DType::F32, sched_->head_stage());
    be_->download(out, DType::F32, row_, DType::F32, V);
}

bool PipelineParallel::tied_embeddings_agree(GPT& model) {
    if (pp_ == 1 || !model.config().tied) return true;
    // The embedding group pairs ranks that hold the same slice of the unit.
    // The sum of squares of this rank's part of the embedding unit (whole or its shard).
    const TensorTable& t = model.table();
    const bool sharded = model.sharding().params;
    const size_t at = sharded ? t.shard_begin[0] : t.unit_begin[0], n = sharded ? t.shard_size(0) : t.unit_size(0);
    const DType pt = model.precision().param;
    double c = embed_.size() > 1 && n > 0 ? model.backend().sum_squares(elem_ptr(model.params(), pt, at), pt, n) : 0.0;
    double hi = embed_.host_all_reduce(c, ReduceOp::Max), lo = -embed_.host_all_reduce(-c, ReduceOp::Max);
    return comm_.host_all_reduce(hi == lo ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
}

std::vector<double> PipelineParallel::measured_bubble() {
    // Per step: this rank's busy time and its first start and last end.
    std::map<int, double> busy, lo, hi;
    for (const trace::Event& e : trace::events()) {
        if (e.step < 1 || (e.cat != "forward" && e.cat != "backward")) continue;
        busy[e.step] += e.t1 - e.t0;
        lo[e.step] = lo.count(e.step) ? std::min(lo[e.step], e.t0) : e.t0;
        hi[e.step] = hi.count(e.step) ? std::max(hi[e.step], e.t1) : e.t1;
    }
    // Every stage traced the same steps; the window is the whole pipeline's.
    const double steps = comm_.host_all_reduce((double)busy.size(), ReduceOp::Max);
    if (steps == 0) return {};
    double total_busy = 0, total_window = 0;
    for (auto& kv : busy) {
        const double start = -comm_.host_all_reduce(-lo[kv.first], ReduceOp::Max);
        const double end = comm_.host_all_reduce(hi[kv.first], ReduceOp::Max);
        total_busy += kv.second;
        total_window += end - start;
    }
    const double mine = total_busy > 0 ? (total_window - total_busy) / total_busy : 0;
    std::vector<double> all(pp_);
    for (int s = 0; s < pp_; s++) all[s] = comm_.host_all_reduce(s == stage_ ? mine : 0.0, ReduceOp::Sum);
    return all;
}
