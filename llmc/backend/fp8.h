// llmc/backend/fp8.h: the two 8-bit floating-point formats of FP8 training
// (docs/fp8.md) and their per-tensor scaling, as plain __host__ __device__
// functions: one definition for the CPU's exact emulation and the GPU's
// kernels, so both put every value on the same grid.
//
//   e4m3 ("E4M3FN"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no
//        infinities, one NaN pattern per sign (S.1111.111); largest finite
//        448, smallest normal 2^-6, smallest subnormal 2^-9. Weights and
//        activations.
//   e5m2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like
//        (infinities, NaNs); largest finite 57344, smallest normal 2^-14,
//        smallest subnormal 2^-16. Output gradients (wider range).
//
// Rounding: to nearest, ties to even, after saturating: a magnitude above
// the largest finite value becomes that value (infinities too), as
// cuBLASLt's and the conversion instructions' "satfinite" mode does; NaN
// stays NaN (e4m3's 0x7f / 0xff, e5m2's 0x7e / 0xfe, the patterns NumPy's
// ml_dtypes writes). Zero keeps its sign.
//
// Per-tensor current scaling: scale = fmax / amax (amax the largest |x| of
// the tensor, 1 when it is 0 or not finite), q = round(x · scale) on the
// grid, and the product of two quantised operands is divided by both
// scales. All of it is exact in double: the grid rounding only scales by
// powers of two and rounds one integer.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8_HD __host__ __device__ __forceinline__
#else
#define FP8_HD inline
#endif

namespace fp8 {

enum class Format : int { e4m3 = 0, e5m2 = 1 };

struct Spec {
    int mantissa_bits;  // 3 or 2
    int min_exp;        // exponent of the smallest normal: -6 or -14
    int bias;           // 7 or 15
    double max;         // largest finite: 448 or 57344
};
FP8_HD Spec spec(Format f) { return f == Format::e4m3 ? Spec{3, -6, 7, 448.0} : Spec{2, -14, 15, 57344.0}; }

// 2^e, and floor(log2(a)) for a > 0 finite: exact (ldexp, frexp) on host and device.
FP8_HD double pow2(int e) { return ldexp(1.0, e); }
FP8_HD int exponent_of(double a) {
    int e;
    frexp(a, &e);  // a = f · 2^e with f in [0.5, 1)
    return e - 1;
}
// Round half to even of a non-negative value below 2^52.
FP8_HD double round_half_even(double r) {
    const double lo = (double)(int64_t)r;  // floor (r >= 0)
    const double d = r - lo;
    if (d > 0.5) return lo + 1.0;
    if (d < 0.5) return lo;
    return ((int64_t)lo % 2 == 0) ? lo : lo + 1.0;
}

// x rounded to format f's grid (saturating; NaN stays NaN), as a double.
FP8_HD double round_to(double x, Format f) {
    if (x != x) return x;
    const Spec s = spec(f);
    const bool neg = x < 0 || (x == 0 && 1.0 / x < 0);
    double a = neg ? -x : x;
    if (a > s.max) a = s.max;  // saturate (infinities too)
    if (a == 0) return neg ? -0.0 : 0.0;
    int e = exponent_of(a);
    if (e < s.min_exp) e = s.min_exp;  // subnormal: the smallest normal's quantum
    const double q = pow2(e - s.mantissa_bits);
    double r = round_half_even(a / q) * q;  // a / q < 2^(mantissa_bits + 1): exact
    if (r > s.max) r = s.max;               // (cannot happen after the saturation; kept for clarity)
    return neg ? -r : r;
}

// The byte of a value already on f's grid (round_to's result).
FP8_HD uint8_t encode_grid(double v, Format f) {
    const Spec s = spec(f);
    if (v != v) return f == Format::e4m3 ? 0x7f : 0x7e;
    const bool neg = v < 0 || (v == 0 && 1.0 / v < 0);
    const double a = neg ? -v : v;
    uint8_t bits = 0;
    if (a != 0) {
        int e = exponent_of(a);
        if (e < s.min_exp) {  // subnormal: exponent field 0, mantissa = a / 2^(min_exp - m)
            bits = (uint8_t)(a / pow2(s.min_exp - s.mantissa_bits));
        } else {
            const int m = (int)((a / pow2(e) - 1.0) * (double)(1 << s.mantissa_bits));
            bits = (uint8_t)(((e + s.bias) << s.mantissa_bits) | m);
        }
    }
    return (uint8_t)(bits | (neg ? 0x80 : 0));
}
FP8_HD uint8_t encode(double x, Format f) { return encode_grid(round_to(x, f), f); }

// The value of a byte (NaN patterns give NaN; e5m2's infinities give them).
FP8_HD double decode(uint8_t b, Format f) {
    const Spec s = spec(f);
    const bool neg = (b & 0x80) != 0;
    const int ebits = 7 - s.mantissa_bits;
    const int ef = (b >> s.mantissa_bits) & ((1 << ebits) - 1), mf = b & ((1 << s.mantissa_bits) - 1);
    double v;
    if ((f == Format::e4m3 && ef == 15 && mf == 7) || (f == Format::e5m2 && ef == 31)) {
        const uint64_t u = (f == Format::e5m2 && mf == 0) ? 0x7ff0000000000000ull : 0x7ff8000000000000ull;
        std::memcpy(&v, &u, sizeof v);  // NaN, or e5m2's infinity
    } else if (ef == 0) {
        v = mf * pow2(s.min_exp - s.mantissa_bits);
    } else {
        v = (1.0 + mf / (double)(1 << s.mantissa_bits)) * pow2(ef - s.bias);
    }
    return neg ? -v : v;
}

// Current scaling's factor for a tensor whose largest magnitude is amax.
FP8_HD double scale_for(double amax, Format f) {
    if (!(amax > 0) || amax - amax != 0) return 1.0;  // zero, NaN or infinity: leave the values as they are
    return spec(f).max / amax;
}

// |x| as the bits of a non-negative float, NaN (one canonical pattern)
// above +inf above every finite value: the max of the bits is the max of
// the magnitudes with NaN winning, so a max (atomicMax on the GPU) over
// them is exact and independent of the order.
FP8_HD unsigned abs_bits(float x) {
    const float a = fabsf(x);
    if (a != a) return 0x7fc00000u;
#if defined(__CUDA_ARCH__)
    return __float_as_uint(a);
#else
    unsigned u;
    std::memcpy(&u, &a, sizeof u);
    return u;
#endif
}
FP8_HD float float_of_bits(unsigned u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// Delayed scaling's bookkeeping (Backend::fp8_delayed, fp8_history_push),
// one definition for the CPU and the GPU. NaN wins a max.
FP8_HD double nan_max(double a, double b) { return (a != a || b != b) ? (a != a ? a : b) : (a > b ? a : b); }
// The largest amax of an operand's history [len]; 0 while it holds none.
// Delayed scaling scales by it when it is not 0, known before the operand
// is written: the op that writes it may cast it (fp8_kernels.h's cast_body).
FP8_HD double history_amax(const double* hist, int len) {
    double m = 0;
    for (int j = 0; j < len; j++) m = nan_max(m, hist[j]);
    return m;
}
// With record, step_max = max(step_max, amax); returns the amax the operand
// scales by: the largest of its history [len] when that holds any, else
// its own. (Idempotent for an amax the history replaced: a product's
// backward applies it again to the forward's amaxes.)
FP8_HD double delayed_amax(double amax, double* step_max, const double* hist, int len, bool record) {
    if (record) *step_max = nan_max(*step_max, amax);
    const double m = history_amax(hist, len);
    return m != 0 ? m : amax;
}
// The same in place: *amax becomes the amax the operand scales by.
FP8_HD void delayed(double* amax, double* step_max, const double* hist, int len, bool record) {
    *amax = delayed_amax(*amax, step_max, hist, len, record);
}
// Whether a step's end pushes its maxes: not for a step whose update was
// skipped, told by the host (skip) or, in a sync-free step, by the step's
// figures on the device (figures[skip_at] != 0; figures null: none).
FP8_HD bool history_pushes(const double* figures, int skip_at, bool skip) {
    return !skip && !(figures && figures[skip_at] != 0.0);
}
// One operand at a step's end: with push, its step max becomes the newest
// of its history [len] (the oldest drops out); the step max restarts at 0.
FP8_HD void history_push_one(double* hist, double* step_max, int len, bool push) {
    if (push) {
        for (int j = len - 1; j > 0; j--) hist[j] = hist[j - 1];
        hist[0] = *step_max;
    }
    *step_max = 0;
}

}  // namespace fp8
