// llmc/base/dtype.h: the element types a flat buffer can hold, their sizes and
// names, and host-side conversion between them (bf16 <-> fp32 <-> fp64).
// Backends use these to describe what their parameter, gradient, optimizer
// and activation buffers hold; the model code only ever sizes buffers through
// dtype_size(), so one orchestration serves fp64, fp32 and bf16 backends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

enum class DType : int { F32 = 0, F64 = 1, BF16 = 2, I32 = 3 };

inline size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::F64: return 8;
        case DType::BF16: return 2;
        case DType::I32: return 4;
    }
    return 0;
}

inline const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "fp32";
        case DType::F64: return "fp64";
        case DType::BF16: return "bf16";
        case DType::I32: return "int32";
    }
    return "?";
}

// Byte address of element idx of a buffer of type t (buffers are untyped).
inline void* elem_ptr(void* base, DType t, size_t idx) {
    return static_cast<char*>(base) + idx * dtype_size(t);
}
inline const void* elem_ptr(const void* base, DType t, size_t idx) {
    return static_cast<const char*>(base) + idx * dtype_size(t);
}

// bf16 is the top half of an fp32; round to nearest even when narrowing.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Host conversion of n elements between any two floating types
// (I32 only to I32). dst and src must not overlap unless the types are equal.
void convert_host(void* dst, DType dt, const void* src, DType st, size_t n);
