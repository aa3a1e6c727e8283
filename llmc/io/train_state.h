// llmc/io/train_state.h: what a checkpoint keeps besides the weights and
// Adam state: where the run stands (TrainState) and the flags and layout of
// the run that wrote it (RunInfo).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

constexpr int kShardMagic = 20241124;  // a shard of a sharded checkpoint

struct TrainState {
    int step = 0;                // completed optimizer steps
    uint64_t rng_state = 0;      // sampling RNG
    uint64_t rows_consumed = 0;  // rows of the training stream used so far
    // Bad steps (--skip-spikes, --max-skips): updates skipped so far, and the
    // running mean of the accepted steps' losses (the plain mean of the
    // first 20, then an exponential mean with weight 1/20).
    int skips = 0;
    double loss_mean = 0;
    int loss_count = 0;
    // --moe-balance bias: the routing bias [L, E] (empty otherwise).
    std::vector<double> moe_bias;
    std::vector<double> fp8_history;  // --fp8-history: [L, 4, 3, N] amaxes, newest first (docs/fp8.md)
};

// The flags and layout of the run that wrote a checkpoint (a resume compares
// them with its own and says what changed).
struct RunInfo {
    int max_steps = 0;
    long long total_batch = 0;
    int B = 0, T = 0;
    int world = 1, pp = 1, vpp = 1, dp = 1, cp = 1, tp = 1, sp = 0, zero = 0;
    std::string recompute = "none";
    std::string data;  // the training data's fingerprint (DataLoader::fingerprint; "" if not recorded)
    // "world 8 = pp 2 x dp 2 x cp 1 x tp 2, ZeRO 1, B=4, recompute none"
    std::string layout() const {
        return "world " + std::to_string(world) + " = pp " + std::to_string(pp) +
               (vpp > 1 ? "(x" + std::to_string(vpp) + ")" : "") + " x dp " + std::to_string(dp) + " x cp " +
               std::to_string(cp) + " x tp " + std::to_string(tp) + (sp ? " (sp)" : "") + ", ZeRO " +
               std::to_string(zero) + ", B=" + std::to_string(B) + ", recompute " + recompute;
    }
};

// Two int32 slots of a 256-int32 header holding one uint64 (low word first).
inline void put_u64(int* h, int at, uint64_t x) {
    h[at] = (int)(uint32_t)(x & 0xffffffffu);
    h[at + 1] = (int)(uint32_t)(x >> 32);
}
inline uint64_t get_u64(const int* h, int at) {
    return (uint64_t)(uint32_t)h[at] | ((uint64_t)(uint32_t)h[at + 1] << 32);
}
