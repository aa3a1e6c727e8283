// llmc/backend/cpu_math.h: exp and tanh for the CPU ops' inner loops.
// libm's expf/tanhf are calls the compiler cannot vectorise (without
// -ffast-math, which the project does not use: it would let the compiler
// reorder the sums the layouts must reproduce), and GELU, softmax and
// cross-entropy spend most of their time in them. For float these are
// branch-free inline versions the vectoriser turns into SIMD code; for
// double they are libm's, so fp64 runs stay exactly what the reference
// computes.
//
// vexp(float): range reduction x = n·ln2 + r with |r| <= ln2/2 (ln2 split in
// a high part exact in float and a low correction), a degree-6 polynomial
// for e^r (the classic minimax coefficients for this interval, relative
// error about 1 ulp), and 2^n put straight into the exponent bits.
// Inputs below -87.3 give 0 (softmax's masked or far-below-max scores),
// above 88.3 give e^88.3 (no caller gets there: scores are shifted by
// their row maximum first), NaN stays NaN.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace cpu {

inline float vexp(float x) {
    const float hi = 88.3f, lo = -87.3f;  // 2^n stays a normal float
    float xc = x > hi ? hi : (x < lo ? lo : x);
    // n = round(x / ln2): adding 1.5·2^23 leaves n in the low mantissa bits.
    const float shifter = 12582912.0f;
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter;
    int32_t tb;
    std::memcpy(&tb, &t, sizeof tb);
    int32_t ni = tb - 0x4B400000;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t yb;
    std::memcpy(&yb, &y, sizeof yb);
    yb += ni * (1 << 23);
    std::memcpy(&y, &yb, sizeof y);
    y = x < lo ? 0.0f : y;
    return x != x ? x : y;
}
inline double vexp(double x) { return std::exp(x); }

// tanh(u) = sign(u)·(1 - 2/(e^{2|u|} + 1)): absolute error about 1e-7 near 0
// (where GELU adds it to 1), relative error about 1 ulp elsewhere.
inline float vtanh(float u) {
    float a = u < 0 ? -u : u;
    float t = 1.0f - 2.0f / (vexp(2.0f * a) + 1.0f);
    return u < 0 ? -t : t;
}
inline double vtanh(double u) { return std::tanh(u); }

}  // namespace cpu
