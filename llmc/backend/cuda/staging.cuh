// llmc/backend/cuda/staging.cuh: element conversion on the device, which the
// CUDA backend's host transfers between types go through (backend_cuda.cu:
// a fixed staging buffer, allocated with the backend, converts a transfer
// chunk by chunk), and the pinned host memory of Backend::alloc_host. The
// kernels' scratch buffers are in cuda/scratch.cuh.
#pragma once
#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "llmc/base/dtype.h"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

// ---- element conversion on the device ---------------------------------------------
// Every float conversion goes through fp32, as convert_host does (a double
// destined for bf16 rounds to fp32 first), except double -> double (a copy).
template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = llmc_cuda::from_float<D>(llmc_cuda::to_float(src[i]));
}

template <typename D, typename S>
void launch_convert(void* dst, const void* src, size_t n, cudaStream_t stream) {
    const int block = 256;
    convert_kernel<D, S><<<llmc_cuda::grid_for(n, block), block, 0, stream>>>(static_cast<D*>(dst),
                                                                                static_cast<const S*>(src), n);
    CUDA_CHECK_LAUNCH();
}

template <typename D>
void convert_to(void* dst, const void* src, DType st, size_t n, cudaStream_t stream) {
    switch (st) {
        case DType::F32: launch_convert<D, float>(dst, src, n, stream); return;
        case DType::F64: launch_convert<D, double>(dst, src, n, stream); return;
        case DType::BF16: launch_convert<D, bf16>(dst, src, n, stream); return;
        default: throw std::logic_error("cuda convert: int32 converts only to int32");
    }
}

// Transfers convert between float types; int32 only to int32.
inline void check_float_pair(DType dt, DType st) {
    if (dt == DType::I32 || st == DType::I32)
        throw std::logic_error(std::string("cuda transfer: cannot convert ") + dtype_name(st) + " to " + dtype_name(dt));
}

inline void device_convert(void* dst, DType dt, const void* src, DType st, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (dt == st) {
        if (dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(dt), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    switch (dt) {
        case DType::F32: convert_to<float>(dst, src, st, n, stream); return;
        case DType::F64: convert_to<double>(dst, src, st, n, stream); return;
        case DType::BF16: convert_to<bf16>(dst, src, st, n, stream); return;
        default: throw std::logic_error("cuda convert: int32 converts only to int32");
    }
}

// ---- pinned host memory (Backend::alloc_host) -------------------------------------
// Page-locked, so copies to and from it run at the link's speed and need no
// driver-side staging; zero-filled like every allocation of a backend.
inline void* pinned_alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) throw std::bad_alloc();
    return std::memset(p, 0, bytes);
}
inline void pinned_free(void* p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

}  // namespace llmc_cuda
