// llmc/base/state_round.h: rounding Adam's moments to bf16 when the optimizer
// keeps them in bf16 (--optimizer-dtype bf16), one definition for the CPU
// backends and the CUDA kernel, so both store the same bits.
//
// The update itself runs in the compute type (fp32, or fp64 on the fp64
// backend, narrowed to fp32 first); only what is stored is rounded:
//   - to nearest even (the default): error at most half a bf16 ulp, 2^-9
//     of the value;
//   - stochastically (--optimizer-rounding stochastic): up with probability
//     equal to the distance from the lower neighbour in ulps, so the stored
//     value is unbiased; error under one ulp, 2^-8 of the value. Small
//     increments that nearest rounding would drop every step (a second
//     moment with beta2 near 1) then survive on average.
// The random bits are a hash of the value's own bits, the step and the seed,
// not of the element's position: every layout (ZeRO shards, tensor-parallel
// slices, pipeline stages) holds the same values and so rounds every element
// the same way, and a run stays bit for bit equal to one process.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LLMC_SR_HD __host__ __device__ __forceinline__
#else
#define LLMC_SR_HD inline
#endif

namespace state_round {

LLMC_SR_HD uint32_t bits_of(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}
LLMC_SR_HD float float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

// A 32-bit integer hash (every output bit depends on every input bit).
LLMC_SR_HD uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// The key of one step's rounding: the seed and the step mixed (the host
// computes it once per step, or the update from the step's figures on the
// device; the moments then differ by kSecondMoment).
LLMC_SR_HD uint32_t step_key(uint64_t seed, long long step) {
    return mix((uint32_t)seed ^ mix((uint32_t)(seed >> 32) ^ mix((uint32_t)step + 0x9e3779b9u)));
}
constexpr uint32_t kSecondMoment = 0x5bd1e995u;

// x rounded to the nearest bf16 (ties to even), as an fp32 value. NaN stays
// NaN; a value past the largest bf16 becomes infinite, as a cast does.
LLMC_SR_HD float nearest(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN as they are
    u += 0x7fffu + ((u >> 16) & 1u);
    return float_of(u & 0xffff0000u);
}

// x rounded to one of its two bf16 neighbours: adding 16 random bits r to
// the 16 bits that bf16 drops carries into the kept bits with probability
// (dropped bits) / 2^16, then the dropped bits are cut. Exact values stay.
LLMC_SR_HD float stochastic(float x, uint32_t r16) {
    uint32_t u = bits_of(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += r16 & 0xffffu;
    return float_of(u & 0xffff0000u);
}

// The 16 random bits for value x under key.
LLMC_SR_HD uint32_t random16(float x, uint32_t key) { return mix(bits_of(x) ^ key) >> 16; }

// The stored value of a moment: nearest, or stochastic under key.
LLMC_SR_HD float round_moment(float x, bool stochastic_rounding, uint32_t key) {
    return stochastic_rounding ? stochastic(x, random16(x, key)) : nearest(x);
}

}  // namespace state_round
