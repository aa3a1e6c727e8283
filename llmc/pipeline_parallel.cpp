// llmc/pipeline_parallel.cpp: see pipeline_parallel.h. Every collective of
// the pp group and of the embedding group is issued in this file.
#include "pipeline_parallel.h"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "data_parallel.h"
#include "trace.h"

// ---- the schedule ---------------------------------------------------------------------------

std::vector<PipeAction> pipe_compute_order(int pp, int V, int m, int s) {
    std::vector<PipeAction> out;
    auto op = [&](PipeAction::Kind kind, int mb, int chunk) {
        PipeAction a;
        a.kind = kind;
        a.mb = mb;
        a.chunk = chunk;
        out.push_back(a);
    };
    if (V == 1) {  // 1F1B (PipeDream-Flush)
        const int w = std::min(pp - s - 1, m);
        for (int i = 0; i < w; i++) op(PipeAction::Forward, i, 0);
        for (int i = 0; i < m - w; i++) {
            op(PipeAction::Forward, w + i, 0);
            op(PipeAction::Backward, i, 0);
        }
        for (int i = m - w; i < m; i++) op(PipeAction::Backward, i, 0);
        return out;
    }
    // Interleaved: the k-th chunk-forward of a stage is micro-batch
    // (k / (pp·V))·pp + k % pp of chunk (k / pp) % V; backwards take the
    // chunks in reverse. Warm-up lets every stage fill its V chunks and the
    // later stages catch up (two ticks per stage of distance to the last).
    const int total = m * V;
    const int w = std::min((pp - s - 1) * 2 + (V - 1) * pp, total);
    auto mb_of = [&](int k) { return (k / (pp * V)) * pp + k % pp; };
    auto fchunk = [&](int k) { return (k % (pp * V)) / pp; };
    for (int k = 0; k < w; k++) op(PipeAction::Forward, mb_of(k), fchunk(k));
    for (int k = 0; k < total - w; k++) {
        op(PipeAction::Forward, mb_of(w + k), fchunk(w + k));
        op(PipeAction::Backward, mb_of(k), V - 1 - fchunk(k));
    }
    for (int k = total - w; k < total; k++) op(PipeAction::Backward, mb_of(k), V - 1 - fchunk(k));
    return out;
}

static bool schedule_ok(int pp, int V, int m, std::string* err) {
    auto fail = [&](const std::string& s) {
        *err = s;
        return false;
    };
    if (pp < 1) return fail("flag --pp: " + std::to_string(pp) + " must be at least 1");
    if (V < 1) return fail("flag --vpp: " + std::to_string(V) + " must be at least 1");
    if (V > 1 && pp == 1) return fail("flag --vpp: interleaved stages need --pp > 1");
    if (m < pp)
        return fail("flag -d: " + std::to_string(m) + " micro-batch(es) per step for " + std::to_string(pp) +
                    " pipeline stages; the pipeline needs at least one per stage");
    if (V > 1 && m % pp != 0)
        return fail("flag -d: the interleaved schedule (--vpp " + std::to_string(V) + ") needs the " +
                    std::to_string(m) + " micro-batches per step to be a multiple of --pp " + std::to_string(pp));
    return true;
}

bool pipe_layout_ok(int L, int pp, int vpp, int m, std::string* err) {
    if (pp >= 1 && vpp >= 1 && L % (pp * vpp) != 0) {
        *err = std::string(vpp > 1 ? "flag --vpp" : "flag --pp") + ": the " + std::to_string(L) +
               " blocks do not split evenly into pp·vpp = " + std::to_string(pp * vpp) + " model chunks";
        return false;
    }
    return schedule_ok(pp, vpp, m, err);
}

// Schedules are pure functions of (pp, vpp, m) and the planner asks for the
// same ones many times (every rank of every layout it sizes): kept once made.
static PipeSchedule make_schedule_uncached(int pp, int V, int m);

std::shared_ptr<const PipeSchedule> shared_pipe_schedule(int pp, int V, int m) {
    static std::map<std::tuple<int, int, int>, std::shared_ptr<const PipeSchedule>> cache;
    std::string why;
    if (!schedule_ok(pp, V, m, &why)) throw std::invalid_argument(why);
    auto it = cache.find({pp, V, m});
    if (it != cache.end()) return it->second;
    if (cache.size() > 256) cache.clear();
    auto sched = std::make_shared<const PipeSchedule>(make_schedule_uncached(pp, V, m));
    cache[{pp, V, m}] = sched;
    return sched;
}

PipeSchedule make_pipe_schedule(int pp, int V, int m) { return *shared_pipe_schedule(pp, V, m); }

static PipeSchedule make_schedule_uncached(int pp, int V, int m) {
    PipeSchedule S;
    S.pp = pp;
    S.vpp = V;
    S.m = m;
    S.stages.assign(pp, {});
    S.slots.assign(pp, std::vector<int>(V, 0));
    S.recv_bufs.assign(pp, 0);
    const int nv = pp * V;
    auto stage_of = [&](int v) { return v % pp; };
    std::vector<std::vector<PipeAction>> order(pp);
    for (int s = 0; s < pp; s++) order[s] = pipe_compute_order(pp, V, m, s);
    // When each message was made (tick), and where its data sits.
    std::map<std::tuple<int, int, bool>, int> made;       // (mb, v, grad) -> tick
    std::map<std::tuple<int, int, bool>, int> recv_buf;   // -> receive buffer at its consumer
    std::map<std::pair<int, int>, int> fwd_slot;          // (mb, v) -> activation slot of its forward
    std::vector<std::vector<std::vector<int>>> free_slots(pp, std::vector<std::vector<int>>(V));
    std::vector<std::vector<int>> used_slots(pp, std::vector<int>(V, 0));
    std::vector<std::vector<int>> free_bufs(pp);
    std::vector<size_t> next(pp, 0);
    auto take = [](std::vector<int>& freelist, int& used) {
        if (!freelist.empty()) {
            int i = freelist.back();
            freelist.pop_back();
            return i;
        }
        return used++;
    };
    size_t left = 0;
    for (auto& o : order) left += o.size();
    for (int t = 0; left > 0; t++) {
        std::vector<PipeMsg> sent;
        for (int s = 0; s < pp; s++) {
            if (next[s] == order[s].size()) continue;
            PipeAction a = order[s][next[s]];
            const int v = a.chunk * pp + s;
            // Ready: its input message was made in an earlier tick.
            bool fwd = a.kind == PipeAction::Forward;
            std::tuple<int, int, bool> need = fwd ? std::make_tuple(a.mb, v - 1, false) : std::make_tuple(a.mb, v + 1, true);
            bool needs = fwd ? v > 0 : v < nv - 1;
            if (needs) {
                auto it = made.find(need);
                if (it == made.end() || it->second >= t) continue;
                a.in_buf = recv_buf.at(need);
                free_bufs[s].push_back(a.in_buf);  // free once the op has read it
            }
            a.tick = t;
            if (fwd) {
                a.slot = take(free_slots[s][a.chunk], used_slots[s][a.chunk]);
                fwd_slot[{a.mb, v}] = a.slot;
                if (v < nv - 1) sent.push_back({a.mb, v, false});
            } else {
                a.slot = fwd_slot.at({a.mb, v});
                free_slots[s][a.chunk].push_back(a.slot);
                if (v > 0) sent.push_back({a.mb, v, true});
            }
            S.stages[s].push_back(a);
            next[s]++;
            left--;
        }
        if (sent.empty() && left > 0) {
            // Nothing ran and nothing is in flight: the order cannot finish.
            bool any_ran = false;
            for (int s = 0; s < pp; s++)
                if (!S.stages[s].empty() && S.stages[s].back().tick == t && S.stages[s].back().kind != PipeAction::Exchange)
                    any_ran = true;
            if (!any_ran) throw std::logic_error("pipeline schedule deadlocks at tick " + std::to_string(t));
        }
        // The tick's exchange: one group per stage that sends or receives.
        std::vector<PipeAction> ex(pp);
        for (const PipeMsg& msg : sent) {
            const int from = stage_of(msg.v), to = stage_of(msg.grad ? msg.v - 1 : msg.v + 1);
            made[{msg.mb, msg.v, msg.grad}] = t;
            const int rb = take(free_bufs[to], S.recv_bufs[to]);
            recv_buf[{msg.mb, msg.v, msg.grad}] = rb;
            ex[from].xfers.push_back({true, to, msg, msg.grad ? -1 : fwd_slot.at({msg.mb, msg.v})});
            ex[to].xfers.push_back({false, from, msg, rb});
        }
        for (int s = 0; s < pp; s++) {
            if (ex[s].xfers.empty()) continue;
            ex[s].kind = PipeAction::Exchange;
            ex[s].tick = t;
            S.stages[s].push_back(ex[s]);
        }
        S.ticks = t + 1;
    }
    for (int s = 0; s < pp; s++) S.slots[s] = used_slots[s];
    return S;
}

double simulate_pipe_time(const PipeSchedule& S, double tf, double tb, std::vector<double>* busy) {
    const int pp = S.pp, nv = pp * S.vpp;
    std::map<std::tuple<int, int, bool>, double> ready;  // message -> time available
    std::vector<size_t> next(pp, 0);
    std::vector<double> free_at(pp, 0.0);
    busy->assign(pp, 0.0);
    size_t left = 0;
    std::vector<std::vector<const PipeAction*>> ops(pp);
    for (int s = 0; s < pp; s++)
        for (const PipeAction& a : S.stages[s])
            if (a.kind != PipeAction::Exchange) ops[s].push_back(&a), left++;
    double makespan = 0;
    while (left > 0) {
        bool progress = false;
        for (int s = 0; s < pp; s++) {
            while (next[s] < ops[s].size()) {
                const PipeAction& a = *ops[s][next[s]];
                const bool fwd = a.kind == PipeAction::Forward;
                const int v = a.chunk * pp + s;
                double start = free_at[s];
                if (fwd ? v > 0 : v < nv - 1) {
                    auto it = ready.find(fwd ? std::make_tuple(a.mb, v - 1, false) : std::make_tuple(a.mb, v + 1, true));
                    if (it == ready.end()) break;
                    start = std::max(start, it->second);
                }
                const double d = fwd ? tf : tb;
                free_at[s] = start + d;
                (*busy)[s] += d;
                makespan = std::max(makespan, free_at[s]);
                ready[std::make_tuple(a.mb, v, !fwd)] = free_at[s];
                next[s]++;
                left--;
                progress = true;
            }
        }
        if (!progress) throw std::logic_error("simulate_pipe_time: the schedule does not finish");
    }
    return makespan;
}

// ---- the stage ----------------------------------------------------------------------------

PipelineParallel::PipelineParallel(Comm& pp_group, Comm& embed, int L, int vpp, int m)
    : comm_(pp_group), embed_(embed), pp_(pp_group.size()), stage_(pp_group.rank()), vpp_(vpp), m_(m), L_(L) {
    std::string why;
    if (!pipe_layout_ok(L, pp_, vpp, m, &why)) throw std::invalid_argument(why);
    sched_ = shared_pipe_schedule(pp_, vpp, m);
}

PipelineParallel::~PipelineParallel() {
    for (Handle& h : handles_)
        if (!h.waited) comm_.wait(h.h);
    for (void* p : owned_) be_->release(p);
}

std::vector<ModelChunk> PipelineParallel::chunks() const {
    const int per = L_ / (pp_ * vpp_), last = pp_ * vpp_ - 1;
    std::vector<ModelChunk> out;
    for (int k = 0; k < vpp_; k++) {
        const int v = k * pp_ + stage_;
        ModelChunk c;
        c.first_layer = v * per;
        c.layers = per;
        c.embed = v == 0;
        c.head = v == last;
        c.slots = std::max(1, sched_->slots[stage_][k]);
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
    for (const PipeXfer& x : a.xfers) {
        P2POp op{x.send, nullptr, x.peer, elems_, msg_tag(x.msg, nv)};
        int who = -1;
        if (x.send && !x.msg.grad) {
            op.buf = const_cast<void*>(model.chunk_output(x.msg.v / pp_, x.buf));
        } else if (x.send) {
            const int sb = send_buf_of_msg[x.msg.mb * nv + x.msg.v];
            op.buf = send_[sb];
            who = -2 - sb;
        } else {
            wait(recv_handle_[x.buf]);  // (read already, in program order; a no-op)
            op.buf = recv_[x.buf];
            who = x.buf;
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

double PipelineParallel::train_step(GPT& model, DataParallel& dp, const Loader& load, int B, int T, double dloss) {
    const int nv = pp_ * vpp_;
    const std::vector<ModelChunk>& chunks = model.chunks();
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
        const int v = a.chunk * pp_ + stage_;
        const bool fwd = a.kind == PipeAction::Forward;
        const void* in = nullptr;
        if (a.in_buf >= 0) {
            wait(recv_handle_[a.in_buf]);
            in = recv_[a.in_buf];
        }
        trace::Scope span((fwd ? "F mb" : "B mb") + std::to_string(a.mb) + " v" + std::to_string(v),
                          fwd ? "forward" : "backward");
        if (fwd) {
            const int *inputs = nullptr, *targets = nullptr;
            load(a.mb, &inputs, &targets);
            loss += model.forward_chunk(a.chunk, a.slot, inputs, in, ch.head ? targets : nullptr, B, T, dloss);
        } else {
            // Stages 0 and 1 of ZeRO reduce a unit's gradients when its last
            // micro-batch's backward is done.
            dp.set_last_micro_step(a.mb == m_ - 1);
            model.backward_chunk(a.chunk, a.slot, in);
            if (!ch.embed) {  // the input's gradient goes back to the previous virtual stage
                const int sb = next_send;
                next_send = (next_send + 1) % (int)send_.size();
                wait(send_handle_[sb]);
                be_->copy(send_[sb], model.input_grad(), elems_ * dtype_size(act_));
                send_buf_of_msg[a.mb * nv + v] = sb;
            }
        }
    }
    for (size_t i = 0; i < handles_.size(); i++) wait((int)i);
    return loss;
}

double PipelineParallel::forward_only(GPT& model, const int* inputs, const int* targets, int B, int T) {
    if (pp_ == 1) return model.forward(inputs, targets, B, T);
    // One virtual stage after the other; each transfer alone in its group,
    // issued in the same order on both ends.
    const int nv = pp_ * vpp_;
    double loss = 0;
    for (int v = 0; v < nv; v++) {
        const int k = v / pp_;
        if (v % pp_ != stage_) continue;
        if (v > 0) transfer({false, recv_[0], (v - 1) % pp_, elems_, msg_tag({0, v - 1, false}, nv)});
        loss = model.forward_chunk(k, 0, inputs, recv_[0], v == nv - 1 ? targets : nullptr, B, T);
        if (v < nv - 1)
            transfer({true, const_cast<void*>(model.chunk_output(k, 0)), (v + 1) % pp_, elems_, msg_tag({0, v, false}, nv)});
    }
    return sum_over_stages(stage_ == pp_ - 1 ? loss : 0.0);
}

void PipelineParallel::logits_row(GPT& model, int b, int pos, float* out) {
    const int V = model.config().vocab_size;
    if (pp_ == 1) return model.logits_row(b, pos, out, DType::F32);
    if (stage_ == pp_ - 1) {
        model.logits_row(b, pos, out, DType::F32);
        be_->upload(row_, DType::F32, out, DType::F32, V);
    }
    comm_.broadcast(row_, V, DType::F32, pp_ - 1);
    be_->download(out, DType::F32, row_, DType::F32, V);
}

void PipelineParallel::tie_embedding_grads(void* grads, size_t n, DType t) {
    if (pp_ == 1 || embed_.size() == 1) return;
    embed_.all_reduce(grads, n, t, ReduceOp::Sum);
}

bool PipelineParallel::tied_embeddings_agree(GPT& model) {
    if (pp_ == 1 || !model.config().tied) return true;
    // The embedding group pairs ranks that hold the same slice of the unit.
    double c = embed_.size() > 1 ? model.unit_checksum(0) : 0.0;
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
