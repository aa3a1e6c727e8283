// tests/unit/test_grouped_gemm.cpp: the experts' products whose row groups
// stay on the device (llmc/backend/cuda/grouped_gemm.h, the body of the CUDA
// kernels of Backend::moe_expert_matmul_*), run block by block on the CPU
// (each block's threads in turn between its barriers, as the kernel's
// phases) against naive products in double: the forward, the input
// gradient and the weight gradient (+=) over random groupings with empty
// experts, one-row groups, groups of exactly a tile and more, and sizes
// that are not multiples of the tile, in fp32 and in bf16 (rounded on the
// store as the kernel's store does). Also the block-to-tile map: every row
// of every group in exactly one block, spare blocks idle. Last line: "N
// passed, N failed".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "llmc/backend/cuda/grouped_gemm.h"
#include "llmc/backend/cuda/mma_layout.h"
#include "tests/lib/check.h"

namespace gg = grouped_gemm;

namespace {

struct Bf16 {
    uint16_t b;
};
struct LdF {
    float operator()(const float* p) const { return *p; }
    float operator()(const Bf16* p) const { return mma_layout::bf16_bits_to_float(p->b); }
};
struct StF {
    void operator()(float* p, float v) const { *p = v; }
    void operator()(Bf16* p, float v) const { p->b = mma_layout::bf16_bits_rn(v); }
};
float val(float x) { return x; }
float val(Bf16 x) { return mma_layout::bf16_bits_to_float(x.b); }
template <typename T>
T make(float x) {
    T t;
    StF()(&t, x);
    return t;
}

// The kernel's block, on the host: the job, then per k-step every thread's
// loads, (barrier), every thread's multiply-adds, (barrier); the stores.
template <typename T>
void run_block(const gg::BlockJob<T>& j) {
    std::vector<float> sm(gg::kSmemFloats);
    std::vector<float> acc((size_t)gg::kThreads * 16, 0.f);
    for (int k0 = 0; k0 < j.K; k0 += gg::kDepth) {
        for (int t = 0; t < gg::kThreads; t++)
            gg::load_tiles(t, sm.data(), sm.data() + gg::kDepth * gg::kPitch, j.A, j.B, j.m0, j.n0, k0, LdF());
        for (int t = 0; t < gg::kThreads; t++)
            gg::multiply_add(t, sm.data(), sm.data() + gg::kDepth * gg::kPitch,
                             *reinterpret_cast<float(*)[4][4]>(&acc[(size_t)t * 16]));
    }
    for (int t = 0; t < gg::kThreads; t++)
        gg::store_patch(t, *reinterpret_cast<float(*)[4][4]>(&acc[(size_t)t * 16]), j.C, j.ldc, j.m0, j.n0, j.M, j.N,
                        j.accumulate, LdF(), StF());
}

std::vector<int> grouping(std::mt19937& rng, int E, int rows) {
    // Random sizes with some experts empty, summing to rows.
    std::vector<int> w(E);
    for (int e = 0; e < E; e++) w[e] = (rng() % 4 == 0) ? 0 : 1 + (int)(rng() % 100);
    int sum = 0;
    for (int x : w) sum += x;
    std::vector<int> off(E + 1, 0);
    if (sum == 0) w[E - 1] = 1, sum = 1;
    int acc = 0;
    for (int e = 0; e < E; e++) {
        acc += w[e];
        off[e + 1] = (int)((long long)rows * acc / sum);
    }
    return off;
}

template <typename T>
void check_products(const char* type, const std::vector<int>& off, int E, int IC, int OC, double tol, std::mt19937& rng) {
    const int R = off[E];
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto fill = [&](size_t n) {
        std::vector<T> v(n);
        for (T& x : v) x = make<T>(u(rng));
        return v;
    };
    std::vector<T> inp = fill((size_t)R * IC), w = fill((size_t)E * OC * IC), dout = fill((size_t)R * OC);
    std::vector<T> dw0 = fill((size_t)E * OC * IC);
    // The launches the CUDA wrappers make (moe.cuh).
    std::vector<T> out((size_t)R * OC, make<T>(NAN)), dinp((size_t)R * IC, make<T>(NAN)), dw = dw0;
    const int ty = gg::row_tiles_bound(R, E);
    for (int by = 0; by < ty; by++)
        for (int bx = 0; bx < (OC + gg::kTile - 1) / gg::kTile; bx++) {
            gg::BlockJob<T> j;
            if (gg::forward_job(&j, out.data(), inp.data(), w.data(), off.data(), E, IC, OC, bx, by)) run_block(j);
        }
    for (int by = 0; by < ty; by++)
        for (int bx = 0; bx < (IC + gg::kTile - 1) / gg::kTile; bx++) {
            gg::BlockJob<T> j;
            if (gg::input_job(&j, dinp.data(), dout.data(), w.data(), off.data(), E, IC, OC, bx, by)) run_block(j);
        }
    for (int e = 0; e < E; e++)
        for (int by = 0; by < (OC + gg::kTile - 1) / gg::kTile; by++)
            for (int bx = 0; bx < (IC + gg::kTile - 1) / gg::kTile; bx++) {
                gg::BlockJob<T> j;
                if (gg::weight_job(&j, dw.data(), dout.data(), inp.data(), off.data(), IC, OC, bx, by, e)) run_block(j);
            }
    // Naive products in double; errors relative to the sum of |terms| (the
    // scale of the fp32 accumulation's error) plus the store's rounding.
    double ef = 0, ei = 0, ew = 0;
    int untouched = 0;
    // A NaN (an output never written) counts as an infinite error.
    auto worst = [](double m, double x) { return std::isnan(x) ? INFINITY : std::max(m, x); };
    for (int e = 0; e < E; e++) {
        for (int r = off[e]; r < off[e + 1]; r++) {
            for (int o = 0; o < OC; o++) {
                double s = 0, a = 0;
                for (int i = 0; i < IC; i++) {
                    const double t = (double)val(inp[(size_t)r * IC + i]) * val(w[((size_t)e * OC + o) * IC + i]);
                    s += t, a += std::fabs(t);
                }
                ef = worst(ef, std::fabs(val(out[(size_t)r * OC + o]) - s) / (a + 1e-30));
            }
            for (int i = 0; i < IC; i++) {
                double s = 0, a = 0;
                for (int o = 0; o < OC; o++) {
                    const double t = (double)val(dout[(size_t)r * OC + o]) * val(w[((size_t)e * OC + o) * IC + i]);
                    s += t, a += std::fabs(t);
                }
                ei = worst(ei, std::fabs(val(dinp[(size_t)r * IC + i]) - s) / (a + 1e-30));
            }
        }
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++) {
                const size_t k = ((size_t)e * OC + o) * IC + i;
                double s = val(dw0[k]), a = std::fabs(s);
                for (int r = off[e]; r < off[e + 1]; r++) {
                    const double t = (double)val(dout[(size_t)r * OC + o]) * val(inp[(size_t)r * IC + i]);
                    s += t, a += std::fabs(t);
                }
                if (off[e + 1] == off[e]) untouched += val(dw[k]) == val(dw0[k]) ? 0 : 1;
                ew = worst(ew, std::fabs(val(dw[k]) - s) / (a + 1e-30));
            }
    }
    CHECK(ef <= tol && ei <= tol && ew <= tol, "%s E=%d IC=%d OC=%d rows=%d: relative errors forward %.2e input %.2e "
          "weight %.2e (tolerance %.1e)", type, E, IC, OC, R, ef, ei, ew, tol);
    CHECK(untouched == 0, "%s: an empty expert's weight gradient changed (%d elements)", type, untouched);
    std::printf("  %s E=%d IC=%d OC=%d rows=%d: forward %.1e, input %.1e, weight %.1e\n", type, E, IC, OC, R, ef, ei,
                ew);
}

void check_tiles(std::mt19937& rng) {
    for (int trial = 0; trial < 200; trial++) {
        const int E = 1 + (int)(rng() % 16), R = (int)(rng() % 700);
        const std::vector<int> off = grouping(rng, E, R);
        std::vector<int> seen(R, 0);
        int idle = 0, tail_ok = 1;
        const int bound = gg::row_tiles_bound(R, E);
        for (int by = 0; by < bound; by++) {
            int e, r0, n;
            if (!gg::row_tile(off.data(), E, by, &e, &r0, &n)) {
                idle++;
                continue;
            }
            tail_ok &= (r0 >= off[e] && r0 + n <= off[e + 1] && n > 0 && n <= gg::kTile);
            for (int r = r0; r < r0 + n; r++) seen[r]++;
        }
        bool once = true;
        for (int x : seen) once = once && x == 1;
        CHECK(once && tail_ok && idle >= 0, "row tiles: E=%d rows=%d: a row in %s block", E, R, once ? "a wrong" : "not one");
    }
    // The bound is reached: E groups of kTile + 1 rows take 2E tiles.
    std::vector<int> off(5);
    for (int e = 0; e <= 4; e++) off[e] = e * (gg::kTile + 1);
    int used = 0;
    for (int by = 0; by < gg::row_tiles_bound(off[4], 4); by++) {
        int e, r0, n;
        used += gg::row_tile(off.data(), 4, by, &e, &r0, &n) ? 1 : 0;
    }
    CHECK(used == 8, "row tiles: 4 groups of kTile + 1 rows use %d tiles, want 8", used);
}

}  // namespace

int main() {
    std::mt19937 rng(7);
    check_tiles(rng);
    struct Shape {
        int E, IC, OC, rows;
    };
    const Shape shapes[] = {{4, 48, 80, 64}, {8, 64, 64, 300}, {3, 17, 33, 129}, {1, 64, 128, 64}, {6, 40, 96, 250}};
    for (const Shape& s : shapes) {
        const std::vector<int> off = grouping(rng, s.E, s.rows);
        check_products<float>("fp32", off, s.E, s.IC, s.OC, 1e-5, rng);
        check_products<Bf16>("bf16", off, s.E, s.IC, s.OC, 8e-3, rng);
    }
    // Groups of one row and of exactly one tile.
    std::vector<int> off = {0, 1, 1 + gg::kTile, 2 + gg::kTile, 2 + 2 * gg::kTile};
    check_products<float>("fp32", off, 4, 24, 72, 1e-5, rng);
    return check_summary();
}
