// llmc/backend/backends.h: picks and builds a backend from --device and --dtype.
// The CUDA backend exists only when the binary was built with nvcc
// (LLMC_CUDA defined); --device auto takes CUDA when a GPU is present.
#pragma once
#include <string>

#include "llmc/backend/backend.h"

// device: auto|cpu|cuda; dtype: auto|fp32|fp64|bf16. local_rank picks the
// GPU (local_rank modulo the GPUs on the node). Returns null with a one-line
// *err (naming the flag and value) when the pair cannot run here.
Backend* make_backend(const std::string& device, const std::string& dtype, int local_rank, std::string* err);

// The device --device auto runs on here: cuda when this binary has the CUDA
// backend and sees a GPU, else cpu (any other value as it is).
std::string resolve_device(const std::string& device);

// Peak dense bf16 FLOP/s of the device a backend runs on, for MFU; 0 when
// unknown (always 0 on the CPU).
double backend_peak_flops(Backend& be);
