// tests/lib/comm_checks.h: what the communication tests share: a pass/fail
// counter that prints each failure with its rank, typed access to untyped
// buffers, the known value rank r holds at index i (small multiples of 1/2,
// so every sum is exact in every type, bf16 included), backend buffers
// released on scope exit, an exact comparison of a range, and the layout of
// a grid's degrees over this job's ranks.
#pragma once
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/comm/dist.h"
#include "llmc/parallel/layout.h"

namespace comm_checks {

struct Checker {
    int rank = 0;
    long passed = 0, failed = 0;
    bool operator()(bool ok, const std::string& what) {
        if (ok) {
            passed++;
        } else {
            failed++;
            std::printf("rank %d: FAIL: %s\n", rank, what.c_str());
            std::fflush(stdout);
        }
        return ok;
    }
};

// ---- typed access to untyped buffers ----------------------------------
inline double get(const void* p, DType t, size_t i) {
    switch (t) {
        case DType::F32:
            return static_cast<const float*>(p)[i];
        case DType::F64:
            return static_cast<const double*>(p)[i];
        case DType::BF16:
            return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
        case DType::I32:
            return static_cast<const int32_t*>(p)[i];
    }
    return 0;
}
inline void set(void* p, DType t, size_t i, double v) {
    switch (t) {
        case DType::F32:
            static_cast<float*>(p)[i] = (float)v;
            break;
        case DType::F64:
            static_cast<double*>(p)[i] = v;
            break;
        case DType::BF16:
            static_cast<uint16_t*>(p)[i] = f32_to_bf16((float)v);
            break;
        case DType::I32:
            static_cast<int32_t*>(p)[i] = (int32_t)v;
            break;
    }
}

// What rank r holds at index i: within [-8, 8.5] in steps of 1/2 (int32:
// integers, with the rank in the thousands so a wrong source shows).
inline double val(DType t, int r, size_t i) {
    const double base = (double)((i * 7 + (size_t)r * 3) % 17) - 8;
    if (t == DType::I32) return base + 1000.0 * r;
    return base + 0.5 * (double)((i + (size_t)r) % 2);
}
inline double sum_over(DType t, int g, size_t i) {
    double s = 0;
    for (int r = 0; r < g; r++) s += val(t, r, i);
    return s;
}
inline double max_over(DType t, int g, size_t i) {
    double m = val(t, 0, i);
    for (int r = 1; r < g; r++) m = std::max(m, val(t, r, i));
    return m;
}

// Backend memory (host memory on the CPU backend), released on scope exit.
struct Buf {
    Backend& be;
    DType t;
    size_t n;
    void* p;
    Buf(Backend& b, DType type, size_t count) : be(b), t(type), n(count), p(b.alloc(count * dtype_size(type))) {}
    ~Buf() { be.release(p); }
    void* at(size_t i) { return elem_ptr(p, t, i); }
    void fill(const std::function<double(size_t)>& f) {
        for (size_t i = 0; i < n; i++) set(p, t, i, f(i));
    }
};

// Elements [off, off+n) of p against f(i) for i in [0, n): exact equality.
inline bool expect(Checker& ck, const std::string& what, const void* p, DType t, size_t off, size_t n,
            const std::function<double(size_t)>& f) {
    for (size_t i = 0; i < n; i++) {
        const double got = get(p, t, off + i), want = f(i);
        if (got != want)
            return ck(false, what + ": element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
                                 std::to_string(want));
    }
    return ck(true, what);
}

}  // namespace comm_checks

// The degrees of a process grid over this job's ranks (the rest of the
// layout left at its defaults): what make_process_grid takes.
inline Layout grid_layout(int tp, int cp, int pp, int cp_a2a = 1, int ep = 1) {
    Layout l;
    l.world = dist_world_size();
    l.tp = tp, l.cp = cp, l.pp = pp, l.cp_a2a = cp_a2a, l.ep = ep;
    return l;
}
