// llmc/backend/backends.cpp: see backends.h.
#include "llmc/backend/backends.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_recorder.h"
#include "llmc/backend/cuda/switches.h"
#ifdef LLMC_CUDA
#include "llmc/backend/backend_cuda.h"
#endif

Backend* make_backend(const std::string& device, const std::string& dtype, int local_rank, std::string* err) {
    std::string dev = device;
    (void)local_rank;  // only CUDA picks a device by it
#ifdef LLMC_CUDA
    if (dev == "auto") dev = cuda_device_count() > 0 ? "cuda" : "cpu";
#else
    if (dev == "auto") dev = "cpu";
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

double backend_peak_flops(Backend& be) {
#ifdef LLMC_CUDA
    if (std::strcmp(be.name(), "cuda") == 0) return cuda_peak_bf16_flops();
#endif
    (void)be;
    return 0.0;
}

void Backend::refuse(const char* op) const {
    throw std::logic_error(std::string(op) + ": not implemented by the " + name() + " backend");
}
