// llmc/base/fnv.h: FNV-1a 64, the one hash of the project's byte strings
// (checkpoint checksums, llmc/io/checksum.h; matmul algorithm ids,
// llmc/backend/cuda/matmul.cuh; the keys of recorded regions,
// llmc/model/buffers.cpp and llmc/run/step_graph.cpp; the stand-in
// algorithms' times of a test hook, llmc/backend/backend_recorder.cpp).
// Usable in host and CUDA code.
#pragma once
#include <cstddef>
#include <cstdint>

// The offset basis, and n bytes folded into h.
constexpr uint64_t kFnvStart = 14695981039346656037ull;
inline uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
