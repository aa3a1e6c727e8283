// llmc/backend/backend_cuda.h: the CUDA backend (llmc/backend/backend_cuda.cu): bf16
// parameters, gradients and activations with fp32 master weights, Adam state
// and statistics, or fp32 everywhere for tight kernel checks. Plain C++: no
// CUDA headers, so the trainer's host code compiles with g++.
#pragma once
#include "llmc/backend/backend.h"

// Number of usable CUDA devices; 0 (silently) when there is no driver or GPU.
int cuda_device_count();

// Peak dense bf16 tensor-core FLOP/s of a device (for MFU): its datasheet
// figure by name, else an estimate (llmc/backend/device_peaks.h); 0 when
// unknown or there is no GPU.
double cuda_peak_bf16_flops(int device_index = 0);

// A backend on device `device_index`. fp32 = true: every buffer is fp32 and
// there is no master copy. Exits with a message if the device cannot be used.
Backend* make_cuda_backend(int device_index, bool fp32);
