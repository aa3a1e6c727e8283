// tests/unit/attention_bench.cpp: attention_bench, times the CPU attention
// (llmc/backend/cpu_attention.h, forward then backward, fp32) on rows of T
// tokens cut into documents of equal length, with the document mask (or
// plain causal attention with --docs 0), and prints one line with the
// median times and the score elements the tiles compute. A figure, not a
// test: scripts/benchmark_document_mask.py runs it and prints the ratios.
//   usage: attention_bench [--T 4096] [--docs 32] [--B 1] [--NH 4] [--HS 64] [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/cpu_ops.h"
#include "llmc/base/args.h"
#include "llmc/model/gpt.h"

int main(int argc, char** argv) {
    int T = 4096, docs = 32, B = 1, NH = 4, HS = 64, reps = 5;
    ArgParser p("attention_bench", "Times the CPU attention with the document mask.");
    p.add({0, "T", Option::Int, &T, "tokens per row", 1, 1 << 20});
    p.add({0, "docs", Option::Int, &docs, "documents per row, of T/docs tokens (0: causal, no mask)", 0, 1 << 20});
    p.add({0, "B", Option::Int, &B, "rows", 1, 1 << 16});
    p.add({0, "NH", Option::Int, &NH, "heads", 1, 1 << 10});
    p.add({0, "HS", Option::Int, &HS, "head size", 1, 1 << 10});
    p.add({0, "reps", Option::Int, &reps, "timed repetitions (the median is printed)", 1, 1000});
    bool help = false;
    std::string err;
    if (!p.parse(argc, argv, &help, &err)) {
        std::fprintf(stderr, "attention_bench: error: %s\n", err.c_str());
        return 1;
    }
    if (help) {
        std::printf("%s", p.usage().c_str());
        return 0;
    }
    const size_t C = (size_t)NH * HS, W = 3 * C, N = (size_t)B * T;
    std::vector<float> qkv(N * W), out(N * C), dout(N * C), lse((size_t)B * NH * T), dqkv(N * W);
    std::mt19937 g(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& x : qkv) x = nd(g);
    for (float& x : dout) x = nd(g);
    // Documents of T/docs tokens: each ends with an EOT (token 1), others 0.
    std::vector<int> tokens(N, 0), starts(N);
    if (docs > 0)
        for (size_t i = 0; i < N; i++)
            if ((i % T + 1) % std::max(1, T / docs) == 0) tokens[i] = 1;
    GPT::document_starts(tokens.data(), B, T, 1, starts.data());
    AttnShape s{B, NH, HS, T, T, W, W, C, true, 1.0 / std::sqrt((double)HS)};
    if (docs > 0) s.doc_start = starts.data();
    size_t work = 0;
    for (int b = 0; b < B; b++) work += cpu::attn_tile_work(s, b) * NH;
    std::vector<double> fwd, bwd;
    for (int r = 0; r <= reps; r++) {  // the first is a warm-up
        auto t0 = std::chrono::steady_clock::now();
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C, s);
        auto t1 = std::chrono::steady_clock::now();
        cpu::attention_backward(dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, dout.data(), qkv.data(),
                                qkv.data() + C, qkv.data() + 2 * C, out.data(), lse.data(), s);
        auto t2 = std::chrono::steady_clock::now();
        if (r == 0) continue;
        fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(fwd.begin(), fwd.end());
    std::sort(bwd.begin(), bwd.end());
    std::printf("attention T=%d docs=%d B=%d NH=%d HS=%d: forward %.3f ms backward %.3f ms score_elements %zu\n", T,
                docs, B, NH, HS, fwd[fwd.size() / 2], bwd[bwd.size() / 2], work);
    return 0;
}
