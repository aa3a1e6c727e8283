// llmc/backend/cuda_device.cu: the CUDA device queries of backend_cuda.h
// that need no backend: how many devices there are, and a device's peak
// bf16 FLOP/s for MFU (its datasheet figure by name, device_peaks.h).
#include <cuda_runtime.h>

#include "llmc/backend/backend_cuda.h"
#include "llmc/backend/device_peaks.h"

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver / no device: not an error for the caller
        return 0;
    }
    return n;
}

double cuda_peak_bf16_flops(int device_index) {
    if (device_index < 0 || device_index >= cuda_device_count()) return 0.0;
    cudaDeviceProp prop;
    int khz = 0;
    if (cudaGetDeviceProperties(&prop, device_index) != cudaSuccess ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device_index) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    return device_bf16_peak(prop.name, prop.major, prop.minor, prop.multiProcessorCount, khz).flops;
}
