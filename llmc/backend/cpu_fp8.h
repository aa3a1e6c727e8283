// llmc/backend/cpu_fp8.h: the CPU's exact emulation of FP8 operands
// (docs/fp8.md): a tensor's largest magnitude, and its copy rounded to an
// FP8 grid at current scaling (llmc/backend/fp8.h), for F = float or double.
#pragma once
#include <cmath>
#include <cstddef>

#include "llmc/backend/backend.h"
#include "llmc/backend/fp8.h"

namespace cpu {

// max |x_i| (NaN when any x_i is NaN), in a fixed order.
template <typename F>
double amax(const F* x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = std::fabs((double)x[i]);
        if (a != a) return a;
        if (a > m) m = a;
    }
    return m;
}

// dst_i = round_to(x_i · s) / s with s = scale_for(amax): in double, stored
// in F (the grid's values at scale s are not all exact in F; the rounding
// to F is the last step, as a GPU's dequantised operand would be).
template <typename F>
void fp8_round(F* dst, const F* x, size_t n, double amax, int format) {
    const fp8::Format f = format == 1 ? fp8::Format::e5m2 : fp8::Format::e4m3;
    const double s = fp8::scale_for(amax, f);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) dst[i] = (F)(fp8::round_to((double)x[i] * s, f) / s);
}

// Backend::fp8_delayed and fp8_history_push on host memory (fp8.h's bookkeeping).
inline void fp8_delayed(double* amax, double* step_max, const double* hist, int len, bool record) {
    fp8::delayed(amax, step_max, hist, len, record);
}
inline void fp8_history_push(double* hist, double* step_max, int slots, int len, const double* figures, bool skip) {
    const bool push = fp8::history_pushes(figures, step_figure::skip, skip);
    for (int i = 0; i < slots; i++) fp8::history_push_one(hist + (size_t)i * len, step_max + i, len, push);
}

}  // namespace cpu
