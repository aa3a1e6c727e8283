// tests/unit/test_fp8.cpp: the FP8 formats and their rounding
// (llmc/backend/fp8.h) against the formats' definitions, worked out here
// independently: each of the 256 bytes of e4m3 and e5m2 decoded by the
// textbook formula (sign · 2^(E - bias) · (1 + M / 2^m), subnormals
// 2^(1 - bias) · M / 2^m, e4m3's S.1111.111 NaN, e5m2's infinities and
// NaNs), then every rounding checked against a brute-force search of that
// grid: the nearest finite value, ties to the even byte, magnitudes past the
// largest finite value saturated, NaN kept, zero's sign kept. Inputs:
// every grid value, every midpoint between neighbours and its two
// neighbours in double, random magnitudes across the whole range and
// beyond, and the specials. Also current scaling's factor, and delayed
// scaling's bookkeeping (the step's max, the history's max, the push).
//
// With --encode FORMAT IN OUT it writes the bytes of IN's doubles (raw
// little-endian) to OUT, for tests/reference/test_fp8_grid.py, which
// compares them with NumPy's ml_dtypes. Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/cpu_fp8.h"
#include "llmc/backend/fp8.h"
#include "tests/lib/check.h"

namespace {

struct Def {
    const char* name;
    fp8::Format f;
    int ebits, mbits, bias;
};
const Def kDefs[] = {{"e4m3", fp8::Format::e4m3, 4, 3, 7}, {"e5m2", fp8::Format::e5m2, 5, 2, 15}};

// The textbook value of byte b.
double textbook(const Def& d, int b) {
    const int s = b >> 7, E = (b >> d.mbits) & ((1 << d.ebits) - 1), M = b & ((1 << d.mbits) - 1);
    const int Emax = (1 << d.ebits) - 1;
    double v;
    if (d.f == fp8::Format::e4m3 && E == Emax && M == (1 << d.mbits) - 1) v = std::numeric_limits<double>::quiet_NaN();
    else if (d.f == fp8::Format::e5m2 && E == Emax) v = M ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
    else if (E == 0) v = std::ldexp((double)M, 1 - d.bias - d.mbits);
    else v = std::ldexp(1.0 + (double)M / (1 << d.mbits), E - d.bias);
    return s ? -v : v;
}

// Brute force: the byte nearest x among the finite ones (ties to the even
// byte), after saturation; NaN's byte for NaN.
int nearest(const Def& d, double x) {
    if (std::isnan(x)) return d.f == fp8::Format::e4m3 ? 0x7f : 0x7e;
    double maxf = 0;
    for (int b = 0; b < 128; b++)
        if (std::isfinite(textbook(d, b))) maxf = std::max(maxf, textbook(d, b));
    const bool neg = std::signbit(x);
    double a = std::min(std::fabs(x), maxf);
    int best = -1;
    double bd = 0;
    for (int b = 0; b < 128; b++) {
        const double g = textbook(d, b);
        if (!std::isfinite(g)) continue;
        const double dist = std::fabs(a - g);
        if (best < 0 || dist < bd || (dist == bd && (b & 1) == 0)) best = b, bd = dist;
    }
    return best | (neg ? 0x80 : 0);
}

int encode_mode(int argc, char** argv) {
    if (argc != 5) return std::fprintf(stderr, "usage: test_fp8 --encode e4m3|e5m2 IN OUT\n"), 2;
    const fp8::Format f = std::string(argv[2]) == "e5m2" ? fp8::Format::e5m2 : fp8::Format::e4m3;
    FILE* in = std::fopen(argv[3], "rb");
    if (!in) return std::fprintf(stderr, "test_fp8: cannot read %s\n", argv[3]), 2;
    std::vector<double> x;
    double v;
    while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
    std::fclose(in);
    std::vector<uint8_t> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = fp8::encode(x[i], f);
    FILE* o = std::fopen(argv[4], "wb");
    if (!o || std::fwrite(out.data(), 1, out.size(), o) != out.size()) return 2;
    std::fclose(o);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--encode") return encode_mode(argc, argv);
    std::mt19937_64 rng(11);
    for (const Def& d : kDefs) {
        // Every byte decodes to its textbook value (NaN to NaN).
        int bad = 0;
        for (int b = 0; b < 256; b++) {
            const double t = textbook(d, b), g = fp8::decode((uint8_t)b, d.f);
            bad += std::isnan(t) ? !std::isnan(g) : (t != g || std::signbit(t) != std::signbit(g));
        }
        CHECK(bad == 0, "%s: %d bytes decode to another value", d.name, bad);
        // The inputs: grid values, midpoints and their neighbours, random magnitudes, specials.
        std::vector<double> xs;
        std::vector<double> grid;
        for (int b = 0; b < 128; b++)
            if (std::isfinite(textbook(d, b))) grid.push_back(textbook(d, b));
        for (size_t i = 0; i < grid.size(); i++) {
            xs.push_back(grid[i]);
            if (i + 1 < grid.size()) {
                const double mid = 0.5 * (grid[i] + grid[i + 1]);
                xs.push_back(mid);
                xs.push_back(std::nextafter(mid, 0.0));
                xs.push_back(std::nextafter(mid, INFINITY));
            }
        }
        std::uniform_real_distribution<double> ex(-22, 20);
        for (int i = 0; i < 20000; i++) xs.push_back(std::exp2(ex(rng)) * (1 + (double)(rng() % 1000) / 1000));
        const double specials[] = {0.0, 448.0, 464.0, 480.0, 1e6, 57344.0, 61440.0, 65536.0, INFINITY,
                                   std::numeric_limits<double>::quiet_NaN(), 1e-30, std::ldexp(1.0, -10),
                                   std::ldexp(1.0, -17), std::ldexp(1.5, -17)};
        for (double s : specials) xs.push_back(s);
        const size_t n = xs.size();
        for (size_t i = 0; i < n; i++) xs.push_back(-xs[i]);
        int wrong = 0, wrong_value = 0;
        for (double x : xs) {
            const int want = nearest(d, x);
            const int got = fp8::encode(x, d.f);
            if (got != want) {
                if (wrong++ < 5) std::printf("  %s: %.17g -> 0x%02x, want 0x%02x\n", d.name, x, got, want);
            }
            const double r = fp8::round_to(x, d.f), t = textbook(d, want);
            wrong_value += std::isnan(t) ? !std::isnan(r) : (r != t || std::signbit(r) != std::signbit(t));
        }
        CHECK(wrong == 0, "%s: %d of %zu inputs encode to another byte than the nearest (ties to even, saturated)",
              d.name, wrong, xs.size());
        CHECK(wrong_value == 0, "%s: %d roundings differ from the byte's value", d.name, wrong_value);
        std::printf("  %s: 256 bytes decoded, %zu roundings checked against the nearest grid value\n", d.name,
                    xs.size());
    }
    // Current scaling: the largest magnitude lands on the largest finite value.
    CHECK(fp8::scale_for(2.0, fp8::Format::e4m3) == 224.0 && fp8::scale_for(0.0, fp8::Format::e4m3) == 1.0 &&
              fp8::scale_for(INFINITY, fp8::Format::e5m2) == 1.0 &&
              fp8::scale_for(std::numeric_limits<double>::quiet_NaN(), fp8::Format::e5m2) == 1.0,
          "scale_for: fmax / amax, 1 for 0 and non-finite amax");
    CHECK(fp8::round_to(3.0 * fp8::scale_for(3.0, fp8::Format::e4m3), fp8::Format::e4m3) == 448.0,
          "scale_for: amax · scale is the largest finite value");
    // Delayed scaling's bookkeeping (cpu_fp8.h): the step's max recorded, the
    // history's max used once it holds any, a push shifting it (not on a
    // skipped step), NaN winning a max.
    {
        double hist[3] = {0, 0, 0}, step = 0, am = 2.0;
        cpu::fp8_delayed(&am, &step, hist, 3, true);
        CHECK(am == 2.0 && step == 2.0, "delayed: an empty history keeps the current amax (%g), records it (%g)", am, step);
        am = 5.0;
        cpu::fp8_delayed(&am, &step, hist, 3, false);
        CHECK(step == 2.0, "delayed: a pass that does not record leaves the step's max");
        cpu::fp8_history_push(hist, &step, 1, 3, nullptr, false);
        CHECK(hist[0] == 2.0 && hist[1] == 0 && step == 0, "push: the step's max first, the step's zeroed");
        am = 7.0;
        cpu::fp8_delayed(&am, &step, hist, 3, true);
        CHECK(am == 2.0 && step == 7.0, "delayed: scaled by the history's max (%g), the current recorded (%g)", am, step);
        cpu::fp8_history_push(hist, &step, 1, 3, nullptr, true);
        CHECK(hist[0] == 2.0 && hist[1] == 0 && step == 0, "push on a skipped step: the history unchanged");
        double fig[step_figure::count] = {};
        fig[step_figure::skip] = 1;
        step = 9;
        cpu::fp8_history_push(hist, &step, 1, 3, fig, false);
        CHECK(hist[0] == 2.0 && step == 0, "push: the figures' skip is a skip too");
        step = 4, fig[step_figure::skip] = 0;
        cpu::fp8_history_push(hist, &step, 1, 3, fig, false);
        CHECK(hist[0] == 4.0 && hist[1] == 2.0 && hist[2] == 0, "push: the history moves back");
        CHECK(std::isnan(fp8::nan_max(1.0, NAN)) && std::isnan(fp8::nan_max(NAN, 1.0)) && fp8::nan_max(1, 3) == 3,
              "nan_max: NaN wins");
    }
    return check_summary();
}
