// llmc/base/dtype.cpp: host conversion between element types.
#include "llmc/base/dtype.h"

#include <stdexcept>

// Read element i of a float-like buffer as double.
static inline double load_as_double(const void* src, DType t, size_t i) {
    switch (t) {
        case DType::F32: return static_cast<const float*>(src)[i];
        case DType::F64: return static_cast<const double*>(src)[i];
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
        default: throw std::logic_error("convert_host: not a float type");
    }
}

void convert_host(void* dst, DType dt, const void* src, DType st, size_t n) {
    if (dt == st) {
        if (dst != src) std::memcpy(dst, src, n * dtype_size(dt));
        return;
    }
    if (dt == DType::I32 || st == DType::I32) throw std::logic_error("convert_host: int32 converts only to int32");
    switch (dt) {
        case DType::F32: {
            float* d = static_cast<float*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = (float)load_as_double(src, st, i);
            return;
        }
        case DType::F64: {
            double* d = static_cast<double*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = load_as_double(src, st, i);
            return;
        }
        case DType::BF16: {
            uint16_t* d = static_cast<uint16_t*>(dst);
            // via fp32: a double rounds to fp32 first (as the GPU would store it)
            for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16((float)load_as_double(src, st, i));
            return;
        }
        default: break;
    }
}
