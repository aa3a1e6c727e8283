// tests/distributed/test_ring_attention.cpp: ring attention (llmc/context_parallel) against
// full causal attention, run under mpirun -np N (N = 1, 2, 4...): every rank
// draws the same random q, k, v and output gradient for whole sequences,
// computes full attention forward and backward on them with the CPU
// backend's ops, then runs the ring on its zigzag chunks and compares its
// rows of the output, lse, dq, dk and dv. fp64; relative error <= 1e-10.
// Also checks the chunk rule (rank i holds chunks i and 2N-1-i) and the
// point-to-point bytes: 2(N-1) K,V block transfers forward; N-1 K,V and N
// dK,dV transfers backward. Hybrid (N = 4, 6, 8...: all-to-all in groups
// of 2, the ring over N/2 groups): output and dq, dk, dv in the token
// layout, and lse in the head layout (heads 2a, 2a+1 of group member a, at
// the tokens of ring rank g's zigzag shard of the sequence cut into N),
// against the same full attention. Last line (rank 0): "N passed, N
// failed", summed over ranks.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/base/rng.h"
#include "tests/lib/comm_checks.h"

static int g_pass = 0, g_fail = 0;
static void check(bool ok, const std::string& what) {
    (ok ? g_pass : g_fail)++;
    if (!ok) std::printf("FAIL (rank %d) %s\n", dist_world_rank(), what.c_str());
}

static double rel(const std::vector<double>& a, const std::vector<double>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); i++) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
    return std::sqrt(d / n);
}

// A rank's rows of B whole sequences of T [B·T, width]: row b's local token
// t is global token pos[t].
static std::vector<double> rows(const std::vector<double>& full, int width, int B, int T, const std::vector<int>& pos) {
    const size_t Tl = pos.size();
    std::vector<double> loc((size_t)B * Tl * width);
    for (int b = 0; b < B; b++)
        for (size_t t = 0; t < Tl; t++)
            for (int k = 0; k < width; k++)
                loc[((size_t)b * Tl + t) * width + k] = full[((size_t)b * T + pos[t]) * width + k];
    return loc;
}

// Hybrid context parallel over c ranks, all-to-all groups of n: every rank
// draws the same whole sequences (4 heads, 2 key/value heads), runs full
// attention on them, and compares its rows.
static void test_hybrid(Backend& be, int c, int n) {
    std::string err;
    ProcessGrid grid;
    if (!make_process_grid(grid_layout(1, c, 1, n), "auto", be, &grid, &err)) dist_abort(err);
    const int r = grid.cp_rank, g = r / n, a = r % n, rings = c / n;
    check(grid.cp_a2a_group && grid.cp_ring_group && grid.cp_a2a_group->size() == n &&
              grid.cp_a2a_group->rank() == a && grid.cp_ring_group->size() == rings && grid.cp_ring_group->rank() == g,
          "hybrid groups: a2a of consecutive cp ranks, ring across them");
    const int T = 8 * c, B = 2, NH = 4, NKV = 2, HS = 3, C = NH * HS, Ckv = NKV * HS, W = C + 2 * Ckv, Tl = T / c;
    Rng rng(5);
    std::vector<double> qkv((size_t)B * T * W), dout((size_t)B * T * C);
    for (double& x : qkv) x = rng.normal();
    for (double& x : dout) x = rng.normal();
    AttnShape s{B, NH, HS, T, T, (size_t)W, (size_t)W, (size_t)C, true, 1.0 / std::sqrt((double)HS)};
    s.NKV = NKV;
    std::vector<double> out((size_t)B * T * C), lse((size_t)B * NH * T), dqkv(qkv.size());
    be.attention_forward(out.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + C + Ckv, s);
    be.attention_backward(dqkv.data(), dqkv.data() + C, dqkv.data() + C + Ckv, dout.data(), qkv.data(),
                          qkv.data() + C, qkv.data() + C + Ckv, out.data(), lse.data(), s);
    const std::vector<int> pos = ContextParallel::positions(T, c, r), ring_pos = ContextParallel::positions(T, rings, g);
    auto take = [&](const std::vector<double>& full, int width) { return rows(full, width, B, T, pos); };
    std::vector<double> lqkv = take(qkv, W), ldout = take(dout, C), want_out = take(out, C), want_dqkv = take(dqkv, W);
    // lse in the head layout: [B, NH/n, n·Tl], the group's tokens in global order.
    const int h = NH / n, Tg = n * Tl;
    std::vector<double> want_lse((size_t)B * h * Tg);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < h; k++)
            for (int t = 0; t < Tg; t++)
                want_lse[((size_t)b * h + k) * Tg + t] = lse[((size_t)b * NH + a * h + k) * T + ring_pos[t]];
    ContextParallel cp(*grid.cp_group, be, B, Tl, NH, HS, NKV, grid.cp_a2a_group.get(), grid.cp_ring_group.get());
    std::vector<double> got_out(want_out.size()), got_lse(want_lse.size()), got_dqkv(want_dqkv.size());
    cp.attention_forward(got_out.data(), got_lse.data(), lqkv.data(), B, s.scale);
    cp.attention_backward(got_dqkv.data(), ldout.data(), lqkv.data(), got_out.data(), got_lse.data(), B, s.scale);
    char what[160];
    std::snprintf(what, sizeof what, "hybrid cp=%d (a2a %d x ring %d) T=%d: out %.2e lse %.2e dqkv %.2e", c, n, rings,
                  T, rel(got_out, want_out), rel(got_lse, want_lse), rel(got_dqkv, want_dqkv));
    check(rel(got_out, want_out) <= 1e-10 && rel(got_lse, want_lse) <= 1e-10 && rel(got_dqkv, want_dqkv) <= 1e-10,
          what);
    if (r == 0) std::printf("%s\n", what);
}

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F64));
    std::string err;
    for (int c : {dist_world_size()}) {
        ProcessGrid grid;
        if (!make_process_grid(grid_layout(1, c, 1), "auto", *be, &grid, &err)) dist_abort(err);
        const int r = grid.cp_rank;
        // Chunk rule.
        std::vector<int> pos = ContextParallel::positions(16 * c, c, r);
        bool rule = (int)pos.size() == 16 && pos[0] == r * 8 && pos[8] == (2 * c - 1 - r) * 8;
        check(rule, "zigzag chunks");
        for (int T : {8 * c, 24 * c}) {
            const int B = 2, NH = 3, HS = 5, C = NH * HS, Tl = T / c, N = B * T, Nl = B * Tl;
            Rng rng(11 + T);
            std::vector<double> qkv((size_t)N * 3 * C), dout((size_t)N * C);
            for (double& x : qkv) x = rng.normal();
            for (double& x : dout) x = rng.normal();
            // Full attention on whole sequences.
            AttnShape s{B, NH, HS, T, T, (size_t)3 * C, (size_t)3 * C, (size_t)C, true, 1.0 / std::sqrt((double)HS)};
            std::vector<double> out((size_t)N * C), lse((size_t)B * NH * T), dqkv((size_t)N * 3 * C);
            be->attention_forward(out.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C, s);
            be->attention_backward(dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, dout.data(), qkv.data(),
                                   qkv.data() + C, qkv.data() + 2 * C, out.data(), lse.data(), s);
            // This rank's rows: row b's local token t is global token pos[t].
            pos = ContextParallel::positions(T, c, r);
            auto take = [&](const std::vector<double>& full, int width) { return rows(full, width, B, T, pos); };
            std::vector<double> lqkv = take(qkv, 3 * C), ldout = take(dout, C), want_out = take(out, C),
                                want_dqkv = take(dqkv, 3 * C);
            std::vector<double> want_lse((size_t)B * NH * Tl);
            for (int b = 0; b < B; b++)
                for (int h = 0; h < NH; h++)
                    for (int t = 0; t < Tl; t++)
                        want_lse[((size_t)b * NH + h) * Tl + t] = lse[((size_t)b * NH + h) * T + pos[t]];
            ContextParallel cp(*grid.cp_group, *be, B, Tl, NH, HS);
            std::vector<double> got_out((size_t)Nl * C), got_lse(want_lse.size()), got_dqkv((size_t)Nl * 3 * C);
            if (c > 1) {
                grid.cp_group->counts().reset();
                cp.attention_forward(got_out.data(), got_lse.data(), lqkv.data(), B, s.scale);
                CommCounts fwd = grid.cp_group->counts();
                grid.cp_group->counts().reset();
                cp.attention_backward(got_dqkv.data(), ldout.data(), lqkv.data(), got_out.data(), got_lse.data(), B,
                                      s.scale);
                CommCounts bwd = grid.cp_group->counts();
                const uint64_t block = (uint64_t)Nl * C * 8;  // one K (or V) block, fp64
                int k = (int)CommKind::SendRecv;
                check(fwd.bytes[k] == 2 * (c - 1) * block && fwd.calls[k] == (uint64_t)(c - 1),
                      "forward p2p bytes " + std::to_string(fwd.bytes[k]) + " vs " + std::to_string(2 * (c - 1) * block));
                check(bwd.bytes[k] == 2 * (c - 1) * block + 2 * c * block,
                      "backward p2p bytes " + std::to_string(bwd.bytes[k]));
                char what[160];
                std::snprintf(what, sizeof what, "cp=%d T=%d: out %.2e lse %.2e dqkv %.2e", c, T, rel(got_out, want_out),
                              rel(got_lse, want_lse), rel(got_dqkv, want_dqkv));
                check(rel(got_out, want_out) <= 1e-10 && rel(got_lse, want_lse) <= 1e-10 &&
                          rel(got_dqkv, want_dqkv) <= 1e-10,
                      what);
                if (r == 0) std::printf("%s\n", what);
            }
        }
    }
    if (dist_world_size() >= 4 && dist_world_size() % 2 == 0) test_hybrid(*be, dist_world_size(), 2);
    double p = g_pass, f = g_fail;
    ProcessGrid g;
    make_process_grid(grid_layout(1, 1, 1), "auto", *be, &g, &err);
    p = g.world->host_all_reduce(p, ReduceOp::Sum);
    f = g.world->host_all_reduce(f, ReduceOp::Sum);
    if (dist_world_rank() == 0) std::printf("%d passed, %d failed\n", (int)p, (int)f);
    dist_finalize();
    return f ? 1 : 0;
}
