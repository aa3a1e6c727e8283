// llmc/backend/backends.cpp: see backends.h.
#include "llmc/backend/backends.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_profile.h"
#include "llmc/backend/backend_recorder.h"
#include "llmc/backend/cuda/switches.h"
#include "llmc/base/test_hooks.h"
#ifdef LLMC_CUDA
#include "llmc/backend/backend_cuda.h"
#endif

std::string resolve_device(const std::string& device) {
    if (device != "auto") return device;
#ifdef LLMC_CUDA
    return cuda_device_count() > 0 ? "cuda" : "cpu";
#else
    return "cpu";
#endif
}

static Backend* make_device_backend(const std::string& device, const std::string& dtype, int local_rank,
                                   std::string* err) {
    const std::string dev = resolve_device(device);
    (void)local_rank;  // only CUDA picks a device by it
#ifndef LLMC_CUDA
    if (dev == "cuda") {
        *err = "flag --device: cuda, but this binary was built without CUDA (nvcc was not found at build time)";
        return nullptr;
    }
#endif
    if (dev == "cpu") {
        // LLMC_CPU_GRAPH=1: recorded regions by recording calls (backend_recorder.h).
        bool record = false;
        if (!llmc_switch::parse_on_off("LLMC_CPU_GRAPH", std::getenv("LLMC_CPU_GRAPH"), &record, err)) return nullptr;
        Backend* be = nullptr;
        if (dtype == "auto" || dtype == "fp32") be = make_cpu_backend(DType::F32);
        else if (dtype == "fp64") be = make_cpu_backend(DType::F64);
        else if (dtype == "bf16") be = make_cpu_bf16_backend();
        else {
            *err = "flag --dtype: " + dtype + " is not available on the cpu (fp32, fp64 or bf16)";
            return nullptr;
        }
        return record ? make_recording_backend(be) : be;
    }
#ifdef LLMC_CUDA
    if (cuda_device_count() <= 0) {
        *err = "flag --device: cuda, but no CUDA device is available";
        return nullptr;
    }
    const int gpu = local_rank % cuda_device_count();
    if (dtype == "auto" || dtype == "bf16") return make_cuda_backend(gpu, false);
    if (dtype == "fp32") return make_cuda_backend(gpu, true);
    *err = "flag --dtype: " + dtype + " is not available on cuda (bf16 or fp32)";
#endif
    return nullptr;
}

Backend* make_backend(const std::string& device, const std::string& dtype, int local_rank, std::string* err) {
    // LLMC_BREAKDOWN=1: the step's time by op class (backend_profile.h).
    bool profile = false;
    if (!llmc_switch::parse_on_off("LLMC_BREAKDOWN", std::getenv("LLMC_BREAKDOWN"), &profile, err)) return nullptr;
    Backend* be = make_device_backend(device, dtype, local_rank, err);
    if (be && profile) be = make_profiling_backend(be);
    if (be && test_hooks::matmul_tune()) be = make_standin_tuning_backend(be, local_rank);
    return be && test_hooks::host_reads() ? make_read_counting_backend(be) : be;
}

double backend_peak_flops(Backend& be) {
#ifdef LLMC_CUDA
    if (std::strcmp(be.name(), "cuda") == 0) return cuda_peak_bf16_flops();
#endif
    (void)be;
    return 0.0;
}

int Backend::mark() {
    marks_.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count());
    return (int)marks_.size() - 1;
}

double Backend::mark_ms(int a, int b) { return marks_.at(b) - marks_.at(a); }

void Backend::refuse(const char* op) const {
    throw std::logic_error(std::string(op) + ": not implemented by the " + name() + " backend");
}

// The FP8 ops of a backend without FP8 products (backend.h).
void Backend::amax_to(void*, const void*, DType, size_t) { refuse("amax_to"); }
void Backend::fp8_delayed(void*, void*, const void*, int, bool) { refuse("fp8_delayed"); }
void Backend::fp8_history_push(void*, void*, int, int, const void*, bool) { refuse("fp8_history_push"); }
void Backend::matmul_forward_fp8(void*, const void*, const void*, const void*, int, int, int, const void*,
                                 const Fp8Delayed*, const Fp8Weight*) {
    refuse("matmul_forward_fp8");
}
void Backend::matmul_backward_fp8(void*, void*, void*, const void*, const void*, const void*, int, int, int,
                                  const void*, const Fp8Kept*, const Fp8Delayed*, const Fp8Weight*) {
    refuse("matmul_backward_fp8");
}

void Backend::activation(bool swiglu, void* out, const void* a, const void* dout, int N, int H) {
    const size_t n = (size_t)N * H;
    if (swiglu && dout) swiglu_backward(out, a, dout, N, H);
    else if (swiglu) swiglu_forward(out, a, N, H);
    else if (dout) gelu_backward(out, a, dout, n);
    else gelu_forward(out, a, n);
}

// The activation, then its output's amax: two passes (a backend may fuse them).
void Backend::activation_amax(bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                              const Fp8Cast*) {
    activation(swiglu, out, a, dout, N, H);
    // (SwiGLU's backward writes [gate | up], 2H per row)
    if (amax) amax_to(amax, out, precision().act, (size_t)N * H * (swiglu && dout ? 2 : 1));
}

// The block's norms: the forward and backward ops by kind, then (amax
// given) the output's amax in a pass of its own (a backend may fuse it).
void Backend::norm(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                   const void* w, const void* bias, int N, int C, double eps, void* amax, const Fp8Cast* cast) {
    if (amax) return norm_amax(rms, residual, out, mean, rstd, a, b, w, bias, N, C, eps, amax, cast);
    if (rms && b) residual_rmsnorm_forward(residual, out, rstd, a, b, w, N, C, eps);
    else if (rms) rmsnorm_forward(out, rstd, a, w, N, C, eps);
    else if (b) residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C);
    else layernorm_forward(out, mean, rstd, a, w, bias, N, C);
}
void Backend::norm_amax(bool rms, void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                        const void* w, const void* bias, int N, int C, double eps, void* amax, const Fp8Cast*) {
    norm(rms, residual, out, mean, rstd, a, b, w, bias, N, C, eps);
    amax_to(amax, out, precision().act, (size_t)N * C);
}
void Backend::norm_backward(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                            const void* w, const void* mean, const void* rstd, int N, int C, void* amax) {
    if (amax) return norm_backward_amax(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C, amax);
    if (rms) rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    else layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
void Backend::norm_backward_amax(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                                 const void* w, const void* mean, const void* rstd, int N, int C, void* amax) {
    norm_backward(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    amax_to(amax, dinp, precision().act, (size_t)N * C);
}

// Llama's ops refuse on a backend without them (GPT-2 runs there).
void Backend::rmsnorm_forward(void*, void*, const void*, const void*, int, int, double) { refuse("rmsnorm_forward"); }
void Backend::residual_rmsnorm_forward(void*, void*, void*, const void*, const void*, const void*, int, int, double) {
    refuse("residual_rmsnorm_forward");
}
void Backend::rmsnorm_backward(void*, void*, const void*, const void*, const void*, const void*, int, int) {
    refuse("rmsnorm_backward");
}
