// tests/unit/test_pipeline_schedule.cpp: the pipeline schedules of
// llmc/parallel/pipeline_parallel.h, checked without running a model, for pp in
// 1..8, vpp in 1..4 and several micro-batch counts, ZB-H1 (vpp 1) and ZBV
// (two chunks per stage in a V, so stage 0 holds the first and the last):
//   - every (micro-batch, virtual stage) is run forward once and backward
//     once (ZB-H1: and its W once, after its B, on the micro-batch's slot),
//     on the stage that owns it, forward first, in the 1F1B (or interleaved
//     or zero-bubble) order the compute order promises, backwards of a
//     chunk in micro-batch order (gradients accumulate as in one process);
//   - every input a forward or backward needs arrives in an exchange before
//     it, and every send meets its receive in the other stage's exchange of
//     the same tick (what makes the groups deadlock-free), with sends in
//     tick order;
//   - activation slots are never shared by two micro-batches in flight,
//     receive buffers never overwritten before their op has read them;
//   - micro-batches in flight: min(pp - s, m) on stage s under 1F1B
//     (docs/design.md section 7), at most pp - s + pp - 1 under ZB-H1 (its
//     waiting W's); under ZBV the two chunks' slots together at most 2pp
//     (1F1B's pp micro-batches of a whole stage);
//   - on a cost model (forward 1, backward 2, per chunk divided by vpp, free
//     transfers) the bubble of every stage is (pp - 1) / (m·vpp) of its busy
//     time, exactly; ZB-H1 with F, B and W of 1 each: (pp - 1) / (3m), the
//     bubble a third of 1F1B's; ZBV with a chunk's F, B and W of 1 each:
//     (pp - 1) / (6m), exactly when m is a multiple of pp, and at most pp
//     ticks more otherwise (printed);
//   - the flags that do not fit give errors naming them.
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "llmc/parallel/pipeline_parallel.h"

static int g_pass = 0, g_fail = 0;
static bool check(bool ok, const std::string& what) {
    (ok ? g_pass : g_fail)++;
    if (!ok) std::printf("FAIL %s\n", what.c_str());
    return ok;
}

static int s_printed_zbv = 0;

static void test_schedule(int pp, int V, int m, PipeOrder po = PipeOrder::standard) {
    const std::string tag = std::string(pipe_order_name(po, V)) + " pp=" + std::to_string(pp) + " vpp=" +
                            std::to_string(V) + " m=" + std::to_string(m) + ": ";
    const bool split = po != PipeOrder::standard, zbv = po == PipeOrder::zbv;
    PipeSchedule S;
    try {
        S = make_pipe_schedule(pp, V, m, po);
    } catch (const std::exception& e) {
        check(false, tag + e.what());
        return;
    }
    const int nv = pp * V;
    bool once = true, order_ok = true, inputs_ok = true, pairs_ok = true, slots_ok = true, bufs_ok = true;
    // Per tick, the transfers each stage issues: (send?, from, to, mb, v, grad).
    std::map<int, std::multiset<std::tuple<int, int, int, int, bool>>> sends, recvs;
    std::map<std::tuple<int, int>, int> fwd_count, bwd_count, w_count, last_bwd;
    bool bwd_in_order = true;
    for (int s = 0; s < pp; s++) {
        // The compute order, as the actions list it.
        std::vector<PipeAction> order = pipe_compute_order(pp, V, m, s, po), got;
        std::map<int, int> buf_holder;                     // receive buffer -> message it holds (-1 free)
        std::set<std::tuple<int, int, bool>> arrived;      // messages received so far
        std::map<std::pair<int, int>, int> slot_owner;     // (chunk, slot) -> micro-batch
        std::map<std::pair<int, int>, bool> done_fwd;
        int last_tick = -1;
        for (const PipeAction& a : S.stages[s]) {
            if (a.tick < last_tick) order_ok = false;
            last_tick = a.tick;
            if (a.kind == PipeAction::Exchange) {
                for (const PipeXfer& x : a.xfers) {
                    auto key = std::make_tuple(x.send ? s : x.peer, x.send ? x.peer : s, x.msg.mb, x.msg.v, x.msg.grad);
                    (x.send ? sends : recvs)[a.tick].insert(key);
                    if (!x.send) {
                        auto it = buf_holder.find(x.buf);
                        if (it != buf_holder.end() && it->second >= 0) bufs_ok = false;  // still unread
                        buf_holder[x.buf] = 1;
                        arrived.insert({x.msg.mb, x.msg.v, x.msg.grad});
                    }
                }
                continue;
            }
            got.push_back(a);
            const int v = S.virtual_stage(a.chunk, s);
            if (S.stage_of(v) != s || S.chunk_of(v) != a.chunk) order_ok = false;
            if (a.kind == PipeAction::Weight) {  // after its B, on its slot, which it frees; no input
                w_count[{a.mb, v}]++;
                if (!split || bwd_count[{a.mb, v}] != 1 || a.in_buf >= 0) inputs_ok = false;
                if (slot_owner[{a.chunk, a.slot}] != a.mb) slots_ok = false;
                slot_owner[{a.chunk, a.slot}] = -1;
                continue;
            }
            const bool fwd = a.kind == PipeAction::Forward;
            if (!fwd) {  // a chunk's backwards in micro-batch order
                if (last_bwd.count({s, a.chunk}) && last_bwd[{s, a.chunk}] + 1 != a.mb) bwd_in_order = false;
                last_bwd[{s, a.chunk}] = a.mb;
            }
            if (fwd) fwd_count[{a.mb, v}]++;
            else bwd_count[{a.mb, v}]++;
            // Its input must have arrived, in the buffer the action names.
            const bool needs = fwd ? v > 0 : v < nv - 1;
            if (needs) {
                if (!arrived.count({a.mb, fwd ? v - 1 : v + 1, !fwd}) || a.in_buf < 0 || buf_holder[a.in_buf] < 0)
                    inputs_ok = false;
                buf_holder[a.in_buf] = -1;
            } else if (a.in_buf >= 0) {
                inputs_ok = false;
            }
            if (fwd) {
                if (slot_owner.count({a.chunk, a.slot}) && slot_owner[{a.chunk, a.slot}] >= 0) slots_ok = false;
                slot_owner[{a.chunk, a.slot}] = a.mb;
                done_fwd[{a.mb, v}] = true;
            } else {
                if (!done_fwd[{a.mb, v}] || slot_owner[{a.chunk, a.slot}] != a.mb) slots_ok = false;
                if (!split) slot_owner[{a.chunk, a.slot}] = -1;  // (split: the W frees it)
            }
            if (a.slot < 0 || a.slot >= S.slots[s][a.chunk]) slots_ok = false;
        }
        if (got.size() != order.size()) order_ok = false;
        for (size_t i = 0; i < got.size() && i < order.size(); i++)
            if (got[i].kind != order[i].kind || got[i].mb != order[i].mb || got[i].chunk != order[i].chunk)
                order_ok = false;
        if (V == 1 && !split)
            check(S.slots[s][0] == std::min(pp - s, m), tag + "stage " + std::to_string(s) + " keeps " +
                                                            std::to_string(S.slots[s][0]) + " micro-batches, want " +
                                                            std::to_string(std::min(pp - s, m)));
        if (zbv)
            check(S.slots[s][0] + S.slots[s][1] <= 2 * pp, tag + "stage " + std::to_string(s) + " keeps " +
                                                               std::to_string(S.slots[s][0] + S.slots[s][1]) +
                                                               " chunk activations, at most 2pp");
        else if (split)  // ZB-H1: at most 1F1B's most (stage 0's), pp - s between F and B, s waiting for W
            check(S.slots[s][0] == std::min(pp, m), tag + "stage " + std::to_string(s) + " keeps " +
                                                        std::to_string(S.slots[s][0]) + " micro-batches, want " +
                                                        std::to_string(std::min(pp, m)));
    }
    for (int mb = 0; mb < m; mb++)
        for (int v = 0; v < nv; v++)
            if (fwd_count[{mb, v}] != 1 || bwd_count[{mb, v}] != 1 || w_count[{mb, v}] != (split ? 1 : 0))
                once = false;
    // Every send meets its receive in the same tick, and nothing else is received.
    for (auto& kv : sends)
        if (recvs[kv.first] != kv.second) pairs_ok = false;
    for (auto& kv : recvs)
        if (sends[kv.first] != kv.second) pairs_ok = false;
    check(once, tag + "each micro-batch and virtual stage forward and backward once");
    check(bwd_in_order, tag + "backwards in micro-batch order");
    check(order_ok, tag + "actions in tick order and in the compute order");
    check(inputs_ok, tag + "inputs arrive before their op, in the buffer it reads");
    check(pairs_ok, tag + "sends and receives paired in the same tick");
    check(slots_ok, tag + "activation slots not shared while in flight");
    check(bufs_ok, tag + "receive buffers not overwritten before read");
    // The bubble on the cost model.
    std::vector<double> busy;
    const double makespan = split ? simulate_pipe_time(S, 1, 1, &busy, 1) : simulate_pipe_time(S, 1.0 / V, 2.0 / V, &busy);
    const double want = zbv ? (pp - 1.0) / (6.0 * m) : (pp - 1.0) / ((double)m * V * (split ? 3 : 1));
    check(want == pipe_bubble_formula(pp, V, m, po), tag + "pipe_bubble_formula");
    bool bubble_ok = true;
    for (int s = 0; s < pp; s++) {
        const double got = (makespan - busy[s]) / busy[s];
        if (zbv && m % pp != 0) {  // the formula, or at most pp ticks (of 6m) more
            if (got < want - 1e-9 || got > want + pp / (6.0 * m) + 1e-9) bubble_ok = false;
        } else if (std::fabs(got - want) > 1e-9) {
            bubble_ok = false;
        }
    }
    if (zbv && m % pp != 0 && s_printed_zbv++ < 6)
        std::printf("zbv pp %d, m %d (not a multiple of pp): %g ticks of bubble, the formula's %d\n", pp, m,
                    makespan - busy[0], pp - 1);
    check(bubble_ok, tag + "bubble " + std::to_string(want) + " on every stage, got " +
                         std::to_string((makespan - busy[0]) / busy[0]));
}

static void test_errors() {
    struct Bad {
        int pp, V, m;
        const char* flag;
    } bad[] = {{2, 1, 1, "-d"}, {4, 1, 3, "-d"}, {2, 2, 3, "-d"}, {4, 2, 6, "-d"}, {1, 2, 4, "--vpp"},
               {0, 1, 4, "--pp"}, {2, 0, 4, "--vpp"}};
    for (const Bad& b : bad) {
        std::string got = "no error";
        try {
            make_pipe_schedule(b.pp, b.V, b.m);
        } catch (const std::invalid_argument& e) {
            got = e.what();
        }
        check(got.find(std::string("flag ") + b.flag) != std::string::npos,
              "pp=" + std::to_string(b.pp) + " vpp=" + std::to_string(b.V) + " m=" + std::to_string(b.m) +
                  " is refused naming " + b.flag + " (got: " + got + ")");
    }
    // ZB-H1: two stages or more, one chunk each; the flag's names.
    std::string err;
    check(!pipe_layout_ok(4, 1, 1, 4, &err, PipeOrder::zb_h1) && err.find("--pp-schedule") != std::string::npos,
          "zb-h1 on one stage is refused naming --pp-schedule: " + err);
    check(!pipe_layout_ok(8, 2, 2, 4, &err, PipeOrder::zb_h1) && err.find("--pp-schedule") != std::string::npos,
          "zb-h1 with --vpp 2 is refused naming --pp-schedule: " + err);
    // ZBV: two stages or more, two chunks each (--vpp 2 or not given).
    check(!pipe_layout_ok(4, 1, 2, 4, &err, PipeOrder::zbv) && err.find("--pp-schedule") != std::string::npos,
          "zbv on one stage is refused naming --pp-schedule: " + err);
    check(!pipe_layout_ok(12, 2, 3, 4, &err, PipeOrder::zbv) && err.find("--vpp") != std::string::npos,
          "zbv with three chunks per stage is refused naming --vpp: " + err);
    check(!pipe_layout_ok(6, 2, 2, 4, &err, PipeOrder::zbv) && err.find("--pp-schedule") != std::string::npos,
          "zbv with 6 blocks over 2 stages (4 chunks) is refused: " + err);
    PipeOrder o;
    check(pipe_order_of("zb-h1", 1, &o, &err) && o == PipeOrder::zb_h1, "--pp-schedule zb-h1");
    check(pipe_order_of("zbv", 1, &o, &err) && o == PipeOrder::zbv && pipe_chunks_per_stage(o, 1) == 2,
          "--pp-schedule zbv: two chunks per stage");
    check(pipe_order_of("zbv", 2, &o, &err) && o == PipeOrder::zbv, "--pp-schedule zbv --vpp 2");
    check(!pipe_order_of("zbv", 3, &o, &err) && err.find("--vpp") != std::string::npos, "zbv with --vpp 3: " + err);
    check(pipe_order_of("", 2, &o, &err) && o == PipeOrder::standard, "no --pp-schedule: from --vpp");
    check(!pipe_order_of("1f1b", 2, &o, &err) && err.find("--pp-schedule") != std::string::npos, "1f1b with --vpp 2");
    check(!pipe_order_of("interleaved", 1, &o, &err), "interleaved without --vpp");
    check(!pipe_order_of("zbx", 1, &o, &err) && err.find("zbx") != std::string::npos, "an unknown schedule: " + err);
}

int main() {
    for (int pp = 1; pp <= 8; pp++)
        for (int V = 1; V <= 4; V++) {
            if (pp == 1 && V > 1) continue;
            for (int m : {pp, pp + 1, 2 * pp, 3 * pp + 1, 4 * pp, 8 * pp}) {
                if (V > 1 && m % pp != 0) continue;
                test_schedule(pp, V, m);
                if (V == 1 && pp > 1) test_schedule(pp, V, m, PipeOrder::zb_h1);
            }
        }
    for (int pp = 2; pp <= 8; pp++)
        for (int m : std::set<int>{pp, pp + 1, 2 * pp, 2 * pp + 3, 3 * pp + 1, 4 * pp, 8 * pp}) test_schedule(pp, 2, m, PipeOrder::zbv);
    // ZBV's placement: stage s holds virtual stages s and 2pp-1-s.
    {
        const PipeSchedule S = make_pipe_schedule(4, 2, 8, PipeOrder::zbv);
        check(S.virtual_stage(0, 0) == 0 && S.virtual_stage(1, 0) == 7 && S.virtual_stage(0, 3) == 3 &&
                  S.virtual_stage(1, 3) == 4 && S.head_stage() == 0 && S.stage_of(5) == 2 && S.chunk_of(5) == 1,
              "zbv: the V's placement (stage 0 holds the first and the last chunk)");
    }
    for (int pp : {2, 4, 8}) {  // the makespans side by side (F = 1; 1F1B's backward 2, ZB-H1's B and W 1 each)
        std::vector<double> busy;
        const int m = 2 * pp;
        std::printf("pp %d, m %d: makespan 1f1b %g, zb-h1 %g, zbv %g, ideal %d\n", pp, m,
                    simulate_pipe_time(make_pipe_schedule(pp, 1, m), 1, 2, &busy),
                    simulate_pipe_time(make_pipe_schedule(pp, 1, m, PipeOrder::zb_h1), 1, 1, &busy, 1),
                    simulate_pipe_time(make_pipe_schedule(pp, 2, m, PipeOrder::zbv), 0.5, 0.5, &busy, 0.5), 3 * m);
    }
    test_errors();
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
