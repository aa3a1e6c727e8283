// dev/cuda/common.h: helpers shared by the kernel-lab programs: random
// inputs, host <-> device copies with conversion, validation against the CPU
// reference (relative L2 error ‖got-ref‖/‖ref‖ and max abs error, PASS/FAIL
// against a tolerance, counted), timing with CUDA events, and the device's
// HBM bandwidth (looked up by name) for the fraction of it a kernel reaches.
// Each timing is also printed as "figure NAME VALUE UNIT" for
// scripts/gpu/check.sh, and LAB_CHECK_ONLY=1 in the environment skips the
// timings (validation only; the attention programs also take --small, the
// small cases compute-sanitizer runs).
//
// Every lab program: makes random inputs, runs the CPU backend's op
// (llmc/backend/cpu_ops.h) as the reference, runs version 1 (a naive kernel written
// in the lab file) and the production kernel (llmc/backend/cuda/*.cuh) in fp32 and
// validates each, validates the production kernel in bf16 with a looser
// tolerance, then times the versions at GPT-2 d12 sizes. Inputs are rounded
// to bf16-representable values once, so the fp32 and bf16 runs and the
// reference all see the same numbers. The last line printed is always
// "N passed, M failed"; the exit status is 1 when something failed.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/device_peaks.h"
#include "tests/lib/tolerances.h"

namespace lab {

using llmc_cuda::bf16;

inline int g_passed = 0, g_failed = 0;

inline int finish() {
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}

// ---- the device's memory bandwidth ---------------------------------------------------
// Datasheet HBM bandwidth of the device found by name (GB/s, 1e9 bytes/s),
// so memory-bound kernels can print the fraction of it they reach. Names not
// in the table fall back to 2 x memory clock x bus width from the driver
// (which gives the same 3.35 TB/s on an H100 SXM). Checked in table order:
// the more specific names first.
struct HbmEntry {
    const char* name_part;
    const char* also_part;  // "" when the first part suffices
    double gbps;
};
inline const HbmEntry* hbm_table_match(const char* name) {
    static const HbmEntry table[] = {
        {"H100", "PCIe", 2000},     {"H100", "NVL", 3900},   {"H100", "", 3350},  // H100 SXM5 80 GB HBM3
        {"GH200", "", 4000},        {"H200", "", 4800},      {"H800", "", 3350},  // "GH200" contains "H200"
        {"A100", "PCIE-40GB", 1555}, {"A100", "SXM4-40GB", 1555}, {"A100", "PCIe", 1935}, {"A100", "", 2039},
        {"B200", "", 8000},         {"L40S", "", 864},       {"A10G", "", 600},
    };
    for (const HbmEntry& e : table)
        if (std::strstr(name, e.name_part) && (!e.also_part[0] || std::strstr(name, e.also_part))) return &e;
    return nullptr;
}
inline double hbm_from_attributes() {
    int khz = 0, bits = 0, dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    return 2.0 * khz * 1e3 * (bits / 8.0) / 1e9;  // double data rate
}
inline const char* device_name() {
    static cudaDeviceProp prop;
    static bool have = false;
    if (!have) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        have = true;
    }
    return prop.name;
}
inline double hbm_peak_gbps() {
    const HbmEntry* e = hbm_table_match(device_name());
    return e ? e->gbps : hbm_from_attributes();
}
inline const char* hbm_peak_source() {
    return hbm_table_match(device_name()) ? "datasheet, by device name" : "memory clock x bus width";
}

// False (with a message) when no GPU can run the lab, e.g. on a build machine.
inline bool have_gpu() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        std::printf("SKIP: no CUDA device available\n");
        return false;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    std::printf("HBM peak: %.0f GB/s (%s)\n", hbm_peak_gbps(), hbm_peak_source());
    return true;
}

// ---- random inputs (bf16-representable) --------------------------------------
inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

inline std::vector<float> rand_uniform(size_t n, float lo, float hi, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = round_bf16(dist(rng));
    return v;
}
inline std::vector<float> rand_normal(size_t n, float std, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, std);
    std::vector<float> v(n);
    for (float& x : v) x = round_bf16(dist(rng));
    return v;
}
inline std::vector<int> rand_ints(size_t n, int lo, int hi_exclusive, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> dist(lo, hi_exclusive - 1);
    std::vector<int> v(n);
    for (int& x : v) x = dist(rng);
    return v;
}

// ---- device buffers --------------------------------------------------------------
template <typename E>
inline E to_elem(float x);
template <>
inline float to_elem<float>(float x) { return x; }
template <>
inline bf16 to_elem<bf16>(float x) { return __float2bfloat16(x); }
inline float from_elem(float x) { return x; }
inline float from_elem(bf16 x) { return __bfloat162float(x); }

template <typename T>
inline T* dev_alloc(size_t n) {
    T* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, 0, (n ? n : 1) * sizeof(T)));
    return p;
}
template <typename E>
inline E* to_device(const std::vector<float>& h) {
    std::vector<E> tmp(h.size());
    for (size_t i = 0; i < h.size(); i++) tmp[i] = to_elem<E>(h[i]);
    E* d = dev_alloc<E>(h.size());
    CUDA_CHECK(cudaMemcpy(d, tmp.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
    return d;
}
template <typename E>
inline void copy_to_device(E* d, const std::vector<float>& h) {
    std::vector<E> tmp(h.size());
    for (size_t i = 0; i < h.size(); i++) tmp[i] = to_elem<E>(h[i]);
    CUDA_CHECK(cudaMemcpy(d, tmp.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
}
inline int* ints_to_device(const std::vector<int>& h) {
    int* d = dev_alloc<int>(h.size());
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
template <typename E>
inline std::vector<float> from_device(const E* d, size_t n) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<E> tmp(n);
    CUDA_CHECK(cudaMemcpy(tmp.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = from_elem(tmp[i]);
    return h;
}
// Device copy of h starting `shift` elements into its allocation (misaligned
// when shift > 0, as tensors at odd offsets of the flat buffers are); *base
// is the allocation, for dev_free.
template <typename E>
inline E* to_device_shifted(const std::vector<float>& h, int shift, E** base) {
    std::vector<float> padded(shift, 0.f);
    padded.insert(padded.end(), h.begin(), h.end());
    *base = to_device<E>(padded);
    return *base + shift;
}

template <typename T>
inline void dev_free(T* p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

// ---- validation -------------------------------------------------------------------
// Relative L2 error (absolute when the reference is all zeros) against tol;
// NaN or Inf in `got` always fails.
inline bool validate(const char* what, const std::vector<float>& got, const std::vector<float>& ref, double tol) {
    double diff2 = 0, ref2 = 0, maxabs = 0;
    bool finite = got.size() == ref.size();
    for (size_t i = 0; i < got.size() && i < ref.size(); i++) {
        if (!std::isfinite(got[i]) && std::isfinite(ref[i])) finite = false;
        if (std::isinf(ref[i]) && got[i] == ref[i]) continue;  // equal infinities (lse of a row that sees no key)
        const double d = (double)got[i] - (double)ref[i];
        diff2 += d * d;
        ref2 += (double)ref[i] * ref[i];
        if (std::fabs(d) > maxabs) maxabs = std::fabs(d);
    }
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    const bool ok = finite && rel <= tol;
    std::printf("  %-44s rel err %.3e  max abs err %.3e  (tol %.0e)  %s\n", what, rel, maxabs, tol,
                ok ? "PASS" : "FAIL");
    (ok ? g_passed : g_failed)++;
    return ok;
}

// ---- timing -------------------------------------------------------------------------
// True when LAB_CHECK_ONLY is set (and not "0"): validate, skip the timings.
inline bool check_only() {
    const char* e = std::getenv("LAB_CHECK_ONLY");
    return e && *e && std::strcmp(e, "0") != 0;
}

// The attention programs' flags: --no-timing, validation only; --quick,
// validation without the T=1024 cases; --small, validation on the small
// cases only (attention_cases.h: T <= 200, one or two batch rows, no naive
// v1 kernel), what compute-sanitizer runs (scripts/gpu/check.sh sanitize).
// An unknown flag is an error (exit status 2), so a typo never runs the
// full lists under a sanitizer.
struct RunFlags {
    bool timing = true, quick = false, small = false;
};
inline RunFlags parse_flags(int argc, char** argv) {
    RunFlags f;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--no-timing") == 0) f.timing = false;
        else if (std::strcmp(argv[i], "--quick") == 0) f.timing = false, f.quick = true;
        else if (std::strcmp(argv[i], "--small") == 0) f.timing = false, f.quick = true, f.small = true;
        else {
            std::fprintf(stderr, "%s: unknown flag '%s' (--no-timing, --quick, --small)\n", argv[0], argv[i]);
            std::exit(2);
        }
    }
    if (f.small) std::printf("small cases only (--small): validation, no timing\n");
    return f;
}

// "v2 production bf16" -> "v2_production_bf16": a figure name.
inline std::string slug(const char* what) {
    std::string s;
    for (const char* c = what; *c; c++) {
        const bool alnum = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9');
        if (alnum || *c == '.') s += *c;
        else if (!s.empty() && s.back() != '_') s += '_';
    }
    while (!s.empty() && s.back() == '_') s.pop_back();
    return s;
}

// Average milliseconds per call of fn() over reps calls, after two warm-ups.
template <typename Fn>
inline float time_ms(Fn&& fn, int reps = 20) {
    fn();
    fn();
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) fn();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return ms / reps;
}
// Achieved bandwidth: the bytes a kernel must move at least (each input read
// once, each output written once), over the time; and its fraction of the
// device's HBM peak.
inline void report_bw(const char* what, float ms, double bytes) {
    const double gbps = bytes / (ms * 1e-3) / 1e9, peak = hbm_peak_gbps();
    std::printf("  %-44s %9.4f ms  %8.1f GB/s  %5.1f%% of HBM peak\n", what, ms, gbps,
                peak > 0 ? 100.0 * gbps / peak : 0.0);
    std::printf("figure %s_ms %.6g ms\nfigure %s_GBps %.6g GB/s\n", slug(what).c_str(), ms, slug(what).c_str(), gbps);
}
inline void report_flops(const char* what, float ms, double flops) {
    const double tf = flops / (ms * 1e-3) / 1e12;
    std::printf("  %-44s %9.4f ms  %8.2f TFLOP/s\n", what, ms, tf);
    std::printf("figure %s_ms %.6g ms\nfigure %s_TFLOPs %.6g TFLOP/s\n", slug(what).c_str(), ms, slug(what).c_str(), tf);
}

// Dense bf16 tensor-core peak of the current device in TFLOP/s: the
// datasheet figure by its name, else an estimate (the trainer's MFU uses the
// same table, llmc/backend/device_peaks.h); 0 when unknown.
inline double peak_tflops() {
    static double peak = -1;
    if (peak < 0) {
        cudaDeviceProp prop;
        int dev = 0, khz = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
        peak = device_bf16_peak(prop.name, prop.major, prop.minor, prop.multiProcessorCount, khz).flops / 1e12;
    }
    return peak;
}
// report_flops plus the fraction of the device's dense bf16 peak.
inline void report_tflops(const char* what, float ms, double flops) {
    const double tf = flops / (ms * 1e-3) / 1e12, peak = peak_tflops();
    if (peak > 0)
        std::printf("  %-44s %9.4f ms  %8.2f TFLOP/s  %5.1f%% of %.0f\n", what, ms, tf, 100.0 * tf / peak, peak);
    else
        std::printf("  %-44s %9.4f ms  %8.2f TFLOP/s  (device peak unknown)\n", what, ms, tf);
    std::printf("figure %s_ms %.6g ms\nfigure %s_TFLOPs %.6g TFLOP/s\n", slug(what).c_str(), ms, slug(what).c_str(), tf);
}

// Tolerances (tests/lib/tolerances.h holds every figure): fp32 kernels differ
// from the CPU only in summation order and libm; bf16 outputs carry one
// rounding (2^-9 relative) plus bf16 intermediates.
constexpr double kTolF32 = tol::kFp32;
constexpr double kTolBF16 = tol::kBf16Kernel;

}  // namespace lab
