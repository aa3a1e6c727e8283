// llmc/backend/cuda/workspace.h: the bytes of the CUDA backend's shared
// kernel scratch for a Workspace (backend.h), in plain C++, so that the
// reservation (backend_cuda.cu) and its host test (tests/unit/test_workspace.cpp,
// which checks every op a model stack calls against it) compute it the same
// way. The encoder's sort and the multi-run tables are sized by their own
// headers (cuda/encoder.cuh, cuda/adamw.cuh, cuda/global_norm.cuh).
#pragma once
#include <algorithm>
#include <cstddef>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/kernel_index.h"

namespace llmc_idx {

// The float scratch of each op that takes some from the shared buffer, as
// the backend asks for it (backend_cuda.cu: scratch_floats / sum_squares).
inline size_t norm_bwd_scratch_bytes(int N, int C) {
    return std::max(ln_bwd_scratch_floats(N, C), rms_bwd_scratch_floats(N, C)) * sizeof(float);
}
inline size_t bias_scratch_bytes(int N, int OC) { return bias_scratch_floats(N, OC) * sizeof(float); }
inline size_t attn_bwd_scratch_bytes(size_t rows) { return rows * sizeof(float); }
// The one-kernel attention backward (LLMC_ATTN_BWD=5, cuda/attention_tc.cuh)
// sums dq into a dense fp32 accumulator of B·NH·Tq rows of the head size.
inline size_t attn_bwd_fused_scratch_bytes(size_t rows, int head_size) { return rows * head_size * sizeof(float); }
inline size_t sum_squares_scratch_bytes(size_t n) { return (size_t)sum_squares_blocks(n) * sizeof(double); }

// The largest of them over a Workspace: every op's count grows with its
// rows, so the largest shapes give the largest need (a single-buffer sum
// of squares needs at most kNormMaxBlocks doubles). attn_bwd_fused: the
// one-kernel attention backward is switched on, so its dq accumulator counts.
inline size_t scratch_bytes(const Workspace& w, bool attn_bwd_fused = false) {
    return std::max({norm_bwd_scratch_bytes(w.rows, w.channels), bias_scratch_bytes(w.rows, w.bias_width),
                     attn_bwd_scratch_bytes(w.attn_rows),
                     attn_bwd_fused ? attn_bwd_fused_scratch_bytes(w.attn_rows, w.head_size) : (size_t)0,
                     (size_t)kNormMaxBlocks * sizeof(double)});
}

}  // namespace llmc_idx
