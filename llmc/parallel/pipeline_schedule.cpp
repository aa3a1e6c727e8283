// llmc/parallel/pipeline_schedule.cpp: the pipeline schedules
// (llmc/parallel/pipeline_schedule.h).
#include "llmc/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

const char* pipe_order_name(PipeOrder o, int vpp) {
    return o == PipeOrder::zb_h1 ? "zb-h1" : o == PipeOrder::zbv ? "zbv" : vpp > 1 ? "interleaved" : "1f1b";
}

bool pipe_order_of(const std::string& name, int vpp, PipeOrder* o, std::string* err) {
    *o = name == "zb-h1" ? PipeOrder::zb_h1 : name == "zbv" ? PipeOrder::zbv : PipeOrder::standard;
    if (name == "1f1b" && vpp > 1) *err = "flag --pp-schedule: 1f1b runs one model chunk per stage (drop --vpp)";
    else if (name == "interleaved" && vpp < 2) *err = "flag --pp-schedule: interleaved needs --vpp 2 or more";
    else if (name == "zbv" && vpp > 2)
        *err = "flag --vpp: zbv places two model chunks per stage (--vpp " + std::to_string(vpp) + "; give 2 or leave it out)";
    else if (!name.empty() && name != "1f1b" && name != "interleaved" && name != "zb-h1" && name != "zbv")
        *err = "flag --pp-schedule: '" + name + "': expected 1f1b, interleaved, zb-h1 or zbv";
    else return true;
    return false;
}

int pipe_chunks_per_stage(PipeOrder o, int vpp) { return o == PipeOrder::zbv ? 2 : vpp; }

int pipe_virtual_stage(PipeOrder o, int pp, int k, int s) {
    if (o == PipeOrder::zbv) return k == 0 ? s : 2 * pp - 1 - s;
    return k * pp + s;
}

int pipe_stage_of(PipeOrder o, int pp, int v) {
    if (o == PipeOrder::zbv) return v < pp ? v : 2 * pp - 1 - v;
    return v % pp;
}

int pipe_chunk_of(PipeOrder o, int pp, int v) { return o == PipeOrder::zbv ? (v < pp ? 0 : 1) : v / pp; }

// ZB-H1's order on each stage (pipeline_schedule.h): 1F1B's with every
// backward split into B and W, stage s putting each W off by s
// micro-batches: its warm-up forwards, then for each micro-batch j its B,
// the W of micro-batch j - s and the next forward; then the W's left.
static std::vector<std::vector<PipeAction>> zb_h1_orders(int pp, int m) {
    std::vector<std::vector<PipeAction>> out(pp);
    for (int s = 0; s < pp; s++) {
        auto op = [&](PipeAction::Kind kind, int mb) {
            PipeAction a;
            a.kind = kind, a.mb = mb, a.chunk = 0;
            out[s].push_back(a);
        };
        const int warm = std::min(pp - s, m);
        for (int f = 0; f < warm; f++) op(PipeAction::Forward, f);
        int w = 0;  // the next W
        for (int j = 0; j < m; j++) {
            op(PipeAction::Backward, j);
            if (j - s >= 0) op(PipeAction::Weight, w++);
            if (j + warm < m) op(PipeAction::Forward, j + warm);
        }
        while (w < m) op(PipeAction::Weight, w++);
    }
    return out;
}

// ZBV's order (pipeline_schedule.h) under one variant of its rules: the
// lock-step run, for every stage at once, of chunk-sized ticks. cap0: the
// activations chunk 0 may hold (chunk 1: 2pp - cap0; each chunk's slots are
// allocated for its most at once, so the stage holds at most 2pp); w_limit:
// the waiting W's that go before a forward; b_first: the chunk whose B goes
// first when both have one; lead: how far chunk 0's forwards may run ahead of
// chunk 1's on stage s (0: no limit). Empty when the rules stall.
static std::vector<std::vector<PipeAction>> zbv_run(int pp, int m, int cap0, int w_limit, int b_first, int lead,
                                                    int* ticks) {
    const int nv = 2 * pp;
    std::vector<std::vector<PipeAction>> out(pp);
    std::vector<std::vector<int>> f_at(nv, std::vector<int>(m, -1)), b_at(nv, std::vector<int>(m, -1));
    std::vector<std::vector<int>> nf(pp, std::vector<int>(2, 0)), nb(pp, std::vector<int>(2, 0));
    std::vector<std::vector<std::pair<int, int>>> waiting(pp);  // (mb, chunk) of B's whose W waits, in order
    std::vector<size_t> next_w(pp, 0);
    std::vector<std::vector<int>> held(pp, std::vector<int>(2, 0));  // activations from F to W, per chunk
    auto before = [](int at, int t) { return at >= 0 && at < t; };
    auto virt = [&](int k, int s) { return pipe_virtual_stage(PipeOrder::zbv, pp, k, s); };
    int t = 0;
    for (int left = 6 * m * pp; left > 0; t++) {
        std::vector<std::pair<PipeAction::Kind, int>> picks(pp, {PipeAction::Exchange, -1});  // (kind, chunk)
        for (int s = 0; s < pp; s++) {
            auto b_ready = [&](int k) {
                const int b = nb[s][k], v = virt(k, s);
                return b < nf[s][k] && before(v == nv - 1 ? f_at[v][b] : b_at[v + 1][b], t);
            };
            auto f_ready = [&](int k) {
                const int f = nf[s][k], v = virt(k, s);
                if (f >= m || held[s][k] >= (k == 0 ? cap0 : 2 * pp - cap0)) return false;
                // chunk 0's lead: the forwards that fit before chunk 1's first
                // input comes back down the V (2(pp-s)-1), or fewer
                const int lead_max = lead == 1 ? 2 * (pp - s) - 1 : lead == 2 ? pp - s : 2 * (pp - s) - 2;
                if (k == 0 && lead > 0 && nf[s][0] - nf[s][1] >= lead_max) return false;
                return v == 0 || before(f_at[v - 1][f], t);
            };
            const int wait_n = (int)(waiting[s].size() - next_w[s]);
            if (b_ready(b_first)) picks[s] = {PipeAction::Backward, b_first};
            else if (b_ready(1 - b_first)) picks[s] = {PipeAction::Backward, 1 - b_first};
            else if (wait_n >= w_limit) picks[s] = {PipeAction::Weight, -1};
            else if (f_ready(1)) picks[s] = {PipeAction::Forward, 1};
            else if (f_ready(0)) picks[s] = {PipeAction::Forward, 0};
            else if (wait_n > 0) picks[s] = {PipeAction::Weight, -1};
        }
        bool any = false;
        for (int s = 0; s < pp; s++) {
            const PipeAction::Kind kind = picks[s].first;
            if (kind == PipeAction::Exchange) continue;
            PipeAction a;
            a.kind = kind;
            if (kind == PipeAction::Weight) {
                a.mb = waiting[s][next_w[s]].first, a.chunk = waiting[s][next_w[s]].second;
                next_w[s]++;
                held[s][a.chunk]--;
            } else {
                const int k = picks[s].second, v = virt(k, s);
                a.chunk = k;
                if (kind == PipeAction::Forward) {
                    a.mb = nf[s][k]++;
                    f_at[v][a.mb] = t;
                    held[s][k]++;
                } else {
                    a.mb = nb[s][k]++;
                    b_at[v][a.mb] = t;
                    waiting[s].push_back({a.mb, k});
                }
            }
            out[s].push_back(a);
            left--;
            any = true;
        }
        if (!any) return {};  // nothing changed: nothing ever will
    }
    *ticks = t;
    return out;
}

// ZBV's order: the shortest of the variants' runs (the first of equals).
static std::vector<std::vector<PipeAction>> zbv_orders(int pp, int m) {
    std::vector<std::vector<PipeAction>> best;
    int best_ticks = 0;
    for (int cap0 = pp; cap0 <= std::min(pp + 3, 2 * pp - 1); cap0++)
        for (int w_limit : {pp, 2 * pp, 1 << 30})
            for (int b_first : {0, 1})
                for (int lead : {0, 1, 2, 3}) {
                    int ticks = 0;
                    std::vector<std::vector<PipeAction>> o = zbv_run(pp, m, cap0, w_limit, b_first, lead, &ticks);
                    if (!o.empty() && (best.empty() || ticks < best_ticks)) best = o, best_ticks = ticks;
                }
    if (best.empty()) throw std::logic_error("ZBV: no order of its rules finishes");
    return best;
}

std::vector<PipeAction> pipe_compute_order(int pp, int V, int m, int s, PipeOrder order) {
    if (order == PipeOrder::zb_h1) return zb_h1_orders(pp, m).at(s);
    if (order == PipeOrder::zbv) return zbv_orders(pp, m).at(s);
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

static bool schedule_ok(int pp, int V, int m, std::string* err, PipeOrder order) {
    auto fail = [&](const std::string& s) {
        *err = s;
        return false;
    };
    if (order == PipeOrder::zb_h1 && pp < 2) return fail("flag --pp-schedule: zb-h1 needs --pp > 1");
    if (order == PipeOrder::zb_h1 && V != 1)
        return fail("flag --pp-schedule: zb-h1 runs one model chunk per stage (drop --vpp " + std::to_string(V) + ")");
    if (order == PipeOrder::zbv && pp < 2) return fail("flag --pp-schedule: zbv needs --pp > 1");
    if (order == PipeOrder::zbv && V != 2)
        return fail("flag --vpp: zbv places two model chunks per stage (--vpp " + std::to_string(V) + ")");
    if (pp < 1) return fail("flag --pp: " + std::to_string(pp) + " must be at least 1");
    if (V < 1) return fail("flag --vpp: " + std::to_string(V) + " must be at least 1");
    if (V > 1 && pp == 1) return fail("flag --vpp: interleaved stages need --pp > 1");
    if (m < pp)
        return fail("flag -d: " + std::to_string(m) + " micro-batch(es) per step for " + std::to_string(pp) +
                    " pipeline stages; the pipeline needs at least one per stage");
    if (V > 1 && m % pp != 0 && order != PipeOrder::zbv)
        return fail("flag -d: the interleaved schedule (--vpp " + std::to_string(V) + ") needs the " +
                    std::to_string(m) + " micro-batches per step to be a multiple of --pp " + std::to_string(pp));
    return true;
}

bool pipe_layout_ok(int L, int pp, int vpp, int m, std::string* err, PipeOrder order) {
    if (pp >= 1 && vpp >= 1 && L % (pp * vpp) != 0) {
        *err = order == PipeOrder::zbv ? "flag --pp-schedule: zbv cuts the model into 2·pp = " +
                                             std::to_string(pp * vpp) + " model chunks; the " + std::to_string(L) +
                                             " blocks do not split evenly into them"
               : std::string(vpp > 1 ? "flag --vpp" : "flag --pp") + ": the " + std::to_string(L) +
                     " blocks do not split evenly into pp·vpp = " + std::to_string(pp * vpp) + " model chunks";
        return false;
    }
    return schedule_ok(pp, vpp, m, err, order);
}

// Schedules are pure functions of (pp, vpp, m) and the planner asks for the
// same ones many times (every rank of every layout it sizes): kept once made.
static PipeSchedule make_schedule_uncached(int pp, int V, int m, PipeOrder order);

std::shared_ptr<const PipeSchedule> shared_pipe_schedule(int pp, int V, int m, PipeOrder order) {
    static std::map<std::tuple<int, int, int, int>, std::shared_ptr<const PipeSchedule>> cache;
    std::string why;
    if (!schedule_ok(pp, V, m, &why, order)) throw std::invalid_argument(why);
    const std::tuple<int, int, int, int> key{pp, V, m, (int)order};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() > 256) cache.clear();
    auto sched = std::make_shared<const PipeSchedule>(make_schedule_uncached(pp, V, m, order));
    cache[key] = sched;
    return sched;
}

PipeSchedule make_pipe_schedule(int pp, int V, int m, PipeOrder order) {
    return *shared_pipe_schedule(pp, V, m, order);
}

double pipe_bubble_formula(int pp, int V, int m, PipeOrder order) {
    if (order == PipeOrder::zbv) return (double)(pp - 1) / (6.0 * m);
    return (double)(pp - 1) / ((double)m * V * (order == PipeOrder::zb_h1 ? 3 : 1));
}

static PipeSchedule make_schedule_uncached(int pp, int V, int m, PipeOrder kind) {
    PipeSchedule S;
    S.pp = pp;
    S.vpp = V;
    S.m = m;
    S.order = kind;
    S.stages.assign(pp, {});
    S.slots.assign(pp, std::vector<int>(V, 0));
    S.recv_bufs.assign(pp, 0);
    const int nv = pp * V;
    auto stage_of = [&](int v) { return S.stage_of(v); };
    std::vector<std::vector<PipeAction>> order(pp);  // each stage's compute order
    if (kind == PipeOrder::zb_h1) order = zb_h1_orders(pp, m);
    else if (kind == PipeOrder::zbv) order = zbv_orders(pp, m);
    else
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
            const int v = S.virtual_stage(a.chunk, s);
            if (a.kind == PipeAction::Weight) {  // after its B in program order; frees the slot
                a.tick = t;
                a.slot = fwd_slot.at({a.mb, v});
                free_slots[s][a.chunk].push_back(a.slot);
                S.stages[s].push_back(a);
                next[s]++;
                left--;
                continue;
            }
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
                if (!S.split()) free_slots[s][a.chunk].push_back(a.slot);  // (split: after the W)
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

double simulate_pipe_time(const PipeSchedule& S, double tf, double tb, std::vector<double>* busy, double tw) {
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
                const int v = S.virtual_stage(a.chunk, s);
                double start = free_at[s];
                if (a.kind == PipeAction::Weight) {  // waits for nothing but the stage
                    free_at[s] = start + tw;
                    (*busy)[s] += tw;
                    makespan = std::max(makespan, free_at[s]);
                    next[s]++;
                    left--;
                    progress = true;
                    continue;
                }
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
