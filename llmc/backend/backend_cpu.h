// llmc/backend/backend_cpu.h: the CPU backend: OpenMP threads and OpenBLAS, the
// same element type everywhere (fp32 by default, fp64 for verification).
#pragma once
#include "llmc/backend/backend.h"

// dtype: DType::F32 or DType::F64. Throws std::invalid_argument otherwise.
Backend* make_cpu_backend(DType dtype);
