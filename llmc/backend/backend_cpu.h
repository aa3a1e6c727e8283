// llmc/backend/backend_cpu.h: the CPU backends: OpenMP threads and OpenBLAS,
// the same element type everywhere (fp32 by default, fp64 for
// verification), or the CUDA backend's mixed precision (bf16 with fp32
// master weights, Adam state and statistics; backend_cpu_bf16.cpp).
#pragma once
#include "llmc/backend/backend.h"

// dtype: DType::F32 or DType::F64. Throws std::invalid_argument otherwise.
Backend* make_cpu_backend(DType dtype);

// bf16 parameters, gradients and activations, fp32 master weights, Adam
// state and statistics, fp32 compute: the CUDA bf16 build's buffers on the CPU.
Backend* make_cpu_bf16_backend();
