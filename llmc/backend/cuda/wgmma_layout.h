// llmc/backend/cuda/wgmma_layout.h: the Hopper (sm_90a) data layouts the
// warpgroup attention kernels (attention_wg_kernels.h) rely on, as plain
// __host__ __device__ functions: the accumulator fragment of
// wgmma.mma_async m64nNk16 .f32, the 128-byte swizzle that the tensor
// memory accelerator (TMA) writes and wgmma reads, the shared-memory matrix
// descriptor, and the description of a TMA box that both the CUDA launcher
// (cuTensorMapEncodeTiled) and the CPU emulator read. The kernels build
// every index and descriptor through these; tests/unit/wgmma_emulator.h
// implements the instructions from the PTX ISA independently of this file,
// and tests/unit/test_wgmma_attention.cpp checks the two against each other
// and runs the kernels on the emulated GPU against fp64 attention.
//
// Source of truth: the PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate" (wgmma): register fragments and shared-memory matrix
// layouts, the matrix descriptor, and "Tensor copy" (cp.async.bulk.tensor)
// with CU_TENSOR_MAP_SWIZZLE_128B.
//
//  * A warpgroup is 4 consecutive warps (128 threads, the first warp index a
//    multiple of 4). wgmma m64nNk16 multiplies a 64x16 A by a 16xN B into
//    64xN fp32 accumulators; warp w of the group owns rows 16w..16w+15.
//  * Accumulator D (.f32), N/2 registers d[i] per thread: with lane's
//    g = lane/4, t = lane%4: row = 16w + g + 8·((i/2)%2), col = 8·(i/4) +
//    2t + (i%2). Per warp this is the mma.m16n8k16 C fragment (mma_layout.h
//    c_elem) repeated over the N/8 column chunks, so d viewed as [N/8][4] is
//    exactly an array of C tiles: the softmax and the c_to_a trick of the
//    mma.sync kernels apply unchanged.
//  * A from registers (.bf16, 4 registers of 2 values): per warp the
//    mma.m16n8k16 A fragment of its 16 rows (mma_layout.h a_elem).
//  * Shared operands through a 64-bit descriptor: bits 0-13 start address
//    >> 4, 16-29 leading-dimension byte offset (LBO) >> 4, 32-45
//    stride-dimension byte offset (SBO) >> 4, 49-51 base offset (0 here:
//    every swizzle atom is 1024-byte aligned), 62-63 swizzle (1 = 128 B).
//    With the 128-byte swizzle, in bytes:
//    - K-major (the k index contiguous; S = Q·K^T reads Q [m][d] and K
//      [n][d] this way): element (r, k) of an R x 16 bf16 operand is at
//      start + (r/8)·SBO + (r%8)·128 + 2k, then swizzled. One wgmma step
//      reads 32 bytes of each 128-byte row; the next k-step starts 32 bytes
//      further (LBO is not used).
//    - MN-major (the m/n index contiguous; O += P·V reads V [k][n] this way,
//      "transposed" B): element (k, n) of a 16 x N operand is at start +
//      (k/8)·SBO + (k%8)·128 + (n/64)·LBO + 2·(n%64), then swizzled.
//    - The swizzle: byte address bits 4-6 are XORed with bits 7-9 (the
//      16-byte chunk within a 128-byte row with the row's index in its
//      8-row, 1024-byte atom), on the shared-memory address itself: atoms
//      must sit at multiples of 1024 bytes.
//  * TMA with CU_TENSOR_MAP_SWIZZLE_128B writes a box whose inner extent is
//    128 bytes (64 bf16) as rows of 128 bytes, row r's 16-byte chunk c at
//    r·128 + ((c ^ (r%8))·16): the layout the descriptors above read.
//    Elements of the box outside the tensor are written as zeros, and the
//    transaction always counts the whole box.
#pragma once
#include <cstddef>
#include <cstdint>

#include "llmc/backend/cuda/mma_layout.h"

namespace wg_layout {

using mma_layout::RC;

constexpr int kSwizzleBytes = 128;   // one swizzled row: 64 bf16
constexpr int kAtomBytes = 1024;     // 8 rows of 128 bytes: the swizzle repeats
constexpr int kRowElems = 64;        // bf16 per swizzled row

// Accumulator register i of thread `tid` (0..127 within the warpgroup) of
// m64nNk16 .f32 (any N): its (row, col) in the 64 x N tile.
MMA_HD RC acc_elem(int tid, int i) {
    const int w = tid >> 5, lane = tid & 31;
    return {16 * w + (lane >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)};
}

// The 128-byte swizzle of a shared-memory byte address.
MMA_HD uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

// Byte offset (before the swizzle) of element (row, col) of a tile of
// `rows` x (64·halves) bf16 stored as `halves` column blocks of rows x 64,
// each block rows·128 bytes: how TMA boxes of 64 columns land side by side.
MMA_HD uint32_t tile_off(int row, int col, int rows) {
    return (uint32_t)((col / kRowElems) * rows * kSwizzleBytes + row * kSwizzleBytes + (col % kRowElems) * 2);
}

// The shared-memory matrix descriptor with the 128-byte swizzle.
MMA_HD uint64_t make_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    uint64_t d = 0;
    d |= (uint64_t)((smem_addr >> 4) & 0x3FFFu);
    d |= (uint64_t)((lbo_bytes >> 4) & 0x3FFFu) << 16;
    d |= (uint64_t)((sbo_bytes >> 4) & 0x3FFFu) << 32;
    d |= (uint64_t)1 << 62;  // swizzle mode 1: 128 B
    return d;
}

// A 4-dimensional bf16 TMA box: the tensor (dimension 0 contiguous), its
// byte strides of dimensions 1..3, and the box extents. The launcher hands
// it to cuTensorMapEncodeTiled with CU_TENSOR_MAP_SWIZZLE_128B and zero
// fill; the emulator copies from it.
struct TmaBox {
    const void* base;
    uint64_t dim[4];
    uint64_t stride[3];  // bytes, dimensions 1, 2, 3
    uint32_t box[4];
};

}  // namespace wg_layout
