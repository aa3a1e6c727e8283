// tests/distributed/test_ring_attention.cpp: ring attention (llmc/context_parallel) against
// full causal attention, run under mpirun -np N (N = 1, 2, 4...): every rank
// draws the same random q, k, v and output gradient for whole sequences,
// computes full attention forward and backward on them with the CPU
// backend's ops, then runs the ring on its zigzag chunks and compares its
// rows of the output, lse, dq, dk and dv. fp64; relative error <= 1e-10.
// Also checks the chunk rule (rank i holds chunks i and 2N-1-i) and the
// point-to-point bytes: 2(N-1) K,V block transfers forward; N-1 K,V and N
// dK,dV transfers backward. Last line (rank 0): "N passed, N failed",
// summed over ranks.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/model/context_parallel.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/base/rng.h"

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

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F64));
    std::string err;
    for (int c : {dist_world_size()}) {
        ProcessGrid grid;
        if (!make_process_grid(1, c, 1, "auto", *be, &grid, &err)) dist_abort(err);
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
            auto take = [&](const std::vector<double>& full, int width) {
                std::vector<double> loc((size_t)Nl * width);
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < Tl; t++)
                        for (int k = 0; k < width; k++)
                            loc[((size_t)b * Tl + t) * width + k] = full[((size_t)b * T + pos[t]) * width + k];
                return loc;
            };
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
    double p = g_pass, f = g_fail;
    ProcessGrid g;
    make_process_grid(1, 1, 1, "auto", *be, &g, &err);
    p = g.world->host_all_reduce(p, ReduceOp::Sum);
    f = g.world->host_all_reduce(f, ReduceOp::Sum);
    if (dist_world_rank() == 0) std::printf("%d passed, %d failed\n", (int)p, (int)f);
    dist_finalize();
    return f ? 1 : 0;
}
