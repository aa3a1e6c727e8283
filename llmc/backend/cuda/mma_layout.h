// llmc/backend/cuda/mma_layout.h: the lane -> matrix-element mappings of the bf16
// tensor-core instructions the attention kernels use (mma.sync m16n8k16 and
// ldmatrix m8n8 x4), as plain __host__ __device__ functions. The kernels in
// attention_tc.cuh compute every fragment index through these helpers, and
// tests/unit/test_mma_layout.cpp (g++, no CUDA) emulates a warp with them against
// naive matrix products and attention: kernels written without a GPU at hand
// are only as trustworthy as this index logic, so it is checked on the CPU.
//
// Source of truth: the PTX ISA (NVIDIA, "Parallel Thread Execution ISA",
// section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
// type", and the ldmatrix section "Warp-level matrix load instruction:
// ldmatrix"). With groupID g = lane >> 2 and threadID_in_group t = lane % 4:
//   A (16x16, row-major, 4 registers of 2 bf16, elements a0..a7):
//     row = g for a0, a1, a4, a5, g + 8 for the others;
//     col = 2t + (i & 1), plus 8 for i >= 4.
//   B (16x8, "col" operand, 2 registers, b0..b3):
//     row (k) = 2t + (i & 1), plus 8 for i >= 2; col (n) = g.
//   C/D (16x8 fp32, c0..c3): row = g for c0, c1, g + 8 for c2, c3;
//     col = 2t + (i & 1).
// The element with the lower index sits in the low 16 bits of its register.
//   ldmatrix .m8n8 .x4 .b16: lanes 8m..8m+7 give the addresses of rows 0..7
//     of matrix m (16 bytes each); destination register m of lane L holds
//     row L/4, columns 2(L%4) and 2(L%4)+1 of matrix m; with .trans it holds
//     rows 2(L%4) and 2(L%4)+1 of column L/4 (the matrix transposed).
//
// What follows from these, and is used by the kernels (and tested):
//  * ldsm_a_rc: one ldmatrix x4 of a 16x16 tile stored row-major [m][k]
//    gives the A fragment registers 0..3 in order (matrices: rows 0-7/cols
//    0-7, rows 8-15/cols 0-7, rows 0-7/cols 8-15, rows 8-15/cols 8-15).
//  * ldsm_b_nk_rc: one ldmatrix x4 (no .trans) of a 16(n) x 16(k) tile stored
//    [n][k] (k contiguous: K rows for S = Q K^T) gives the B fragments of
//    two n-tiles: registers {0, 1} for n 0..7 and {2, 3} for n 8..15.
//  * ldsm_b_kn_rc: one ldmatrix x4 .trans of a 16(k) x 16(n) tile stored
//    [k][n] (n contiguous: V rows for O = P V) gives the same two pairs.
//  * ldsm_a_km_rc: one ldmatrix x4 .trans of a 16(k) x 16(m) tile stored
//    [k][m] gives the A fragment of the 16x16 [m][k] tile (same addresses
//    as ldsm_b_nk_rc).
//  * c_to_a: the fp32 accumulators of two adjacent 16x8 C tiles (columns
//    0-7 and 8-15) are, element for element, the A fragment of the 16x16
//    tile they form: a score tile becomes the A operand of the next product
//    without leaving registers (FlashAttention-2's trick).
//  * Shared-memory tiles have a row pitch of width + kSmemPad bf16 (16 extra
//    bytes): the 8 row addresses of one ldmatrix matrix then fall in 8
//    distinct 16-byte bank groups, so the loads are free of bank conflicts.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MMA_HD __host__ __device__ __forceinline__
#else
#define MMA_HD inline
#endif

namespace mma_layout {

struct RC {
    int row, col;
};

constexpr int kSmemPad = 8;  // bf16 elements of padding per shared-memory row

MMA_HD int group_id(int lane) { return lane >> 2; }
MMA_HD int thread_in_group(int lane) { return lane & 3; }

// ---- mma.m16n8k16 fragments (PTX ISA 9.7.14.5.8) --------------------------------
MMA_HD RC a_elem(int lane, int i) {  // i = 0..7
    return {group_id(lane) + 8 * ((i >> 1) & 1), 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2)};
}
MMA_HD RC b_elem(int lane, int i) {  // i = 0..3; row = k, col = n
    return {2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 1), group_id(lane)};
}
MMA_HD RC c_elem(int lane, int i) {  // i = 0..3
    return {group_id(lane) + 8 * (i >> 1), 2 * thread_in_group(lane) + (i & 1)};
}

// ---- ldmatrix x4 addressing: (row, col) offsets within a 16x16 tile that
// lane `lane` passes as its row address ---------------------------------------------
MMA_HD RC ldsm_a_rc(int lane) { return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)}; }
MMA_HD RC ldsm_b_nk_rc(int lane) { return {(lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)}; }  // (n, k)
MMA_HD RC ldsm_b_kn_rc(int lane) { return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)}; }  // (k, n)
// A from a [k][m] tile (m contiguous) with .trans: the nk pattern, read as
// (k, m) (the one-kernel backward's dQ = dS K with dS stored transposed).
MMA_HD RC ldsm_a_km_rc(int lane) { return ldsm_b_nk_rc(lane); }  // (k, m)

// Element offset of (row, col) in a shared-memory tile of row pitch ld.
MMA_HD int smem_off(int row, int col, int ld) { return row * ld + col; }

// ---- bf16 packing -----------------------------------------------------------------
// Round-to-nearest-even fp32 -> bf16 bits (NaN kept quiet), the rounding
// __floats2bfloat162_rn does on the device.
MMA_HD uint16_t bf16_bits_rn(float x) {
    uint32_t u;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(x);
#else
    std::memcpy(&u, &x, 4);
#endif
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
MMA_HD float bf16_bits_to_float(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, 4);
    return x;
#endif
}
// Two values into one register, lo in the low half (the lower element index).
// On the device one cvt instruction (its first source goes to the high half).
MMA_HD uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (uint32_t)bf16_bits_rn(lo) | ((uint32_t)bf16_bits_rn(hi) << 16);
#endif
}

// The A fragment of the 16x16 tile formed by two 16x8 accumulator tiles
// (c0: columns 0-7, c1: columns 8-15), rounded to bf16.
MMA_HD void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);  // a0, a1: row g,     cols 2t, 2t+1
    a[1] = pack_bf16x2(c0[2], c0[3]);  // a2, a3: row g + 8, cols 2t, 2t+1
    a[2] = pack_bf16x2(c1[0], c1[1]);  // a4, a5: row g,     cols 8 + 2t, 8 + 2t+1
    a[3] = pack_bf16x2(c1[2], c1[3]);  // a6, a7: row g + 8, cols 8 + 2t, 8 + 2t+1
}

}  // namespace mma_layout
