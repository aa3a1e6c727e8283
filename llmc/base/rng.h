// llmc/base/rng.h: a small deterministic random number generator (xorshift64*
// seeded through splitmix64). Its whole state is one uint64, so it goes into
// checkpoints as is. Same seed, same numbers on every machine.
#pragma once
#include <cmath>
#include <cstdint>

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed = 1337) { reseed(seed); }
    void reseed(uint64_t seed) {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull;  // splitmix64 scrambles small seeds
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        state = (z ^ (z >> 31)) | 1ull;  // never zero
    }
    uint64_t next_u64() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 0x2545F4914F6CDD1Dull;
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
    // Standard normal (Box-Muller, one value per call).
    double normal() {
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    }
};
