// llmc/backend/cuda/rope.cuh: rotary position embeddings (Llama, rotate-half
// convention; backend.h rope), in place, forward or inverse.
//
// For each of the B·T rows (row b·T + t at x + (b·T + t)·row_stride, token
// t at position pos[t]), each of `heads` heads of HS channels and each
// i < half = HS/2, with a = pos[t]·theta^(-2i/HS):
//   y_i = x_i cos a - x_{i+half} sin a,  y_{i+half} = x_{i+half} cos a + x_i sin a,
// and the inverse (the backward, applied to dq and dk) rotates by -a.
//
// Memory-bound. A thread owns one pack of W channels in the first half of a
// head and the matching pack in the second half, for up to
// llmc_idx::kRopeHeadsPerThread heads of one row (llmc_idx::rope_item):
// it computes the W angles once and applies them to all its heads, so the
// trigonometry costs 1/8 of a naive per-element version. W is 8 (bf16) or 4
// (fp32) with 16-byte accesses when half % W == 0, x is 16-byte aligned and
// row_stride % W == 0 (head offsets h·HS are then multiples of W too);
// otherwise 1. Every element is read and written by exactly one thread, so
// in place is safe.
//
// Accuracy: the frequencies f_i = theta^(-2i/HS) are computed on the host in
// double exactly as the CPU op computes them and passed to the kernel; the
// angle pos·f_i is formed in double and reduced to [-pi, pi] in double
// (llmc_idx::rope_reduce), and only then rounded to fp32 for sincosf. In
// fp32 the angle itself would be off by up to |a|·2^-24 (4e-3 rad at
// position 65536), which the reduction avoids; what remains is fp32 sin/cos
// of a small argument (a couple of ulp).
#pragma once
#include <cmath>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

constexpr int kRopeMaxHalf = 256;  // head sizes up to 512

// Inverse frequencies, passed by value (2 KiB of kernel parameters).
struct RopeFreqs {
    double f[kRopeMaxHalf];
};

template <typename E, int W>
__global__ void __launch_bounds__(256) rope_kernel(E* x, size_t row_stride, int heads, int HS, const int* pos, int T,
                                                   size_t items, RopeFreqs fr, bool inverse) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= items) return;
    const llmc_idx::RopeItem it = llmc_idx::rope_item(tid, heads, HS, W);
    const int half = HS / 2;
    const int t = (int)(it.row % (size_t)T);
    const double p = (double)pos[t];
    float cs[W], sn[W];
#pragma unroll
    for (int j = 0; j < W; j++) {
        const float r = (float)llmc_idx::rope_reduce(p * fr.f[it.i0 + j]);
        float s, c;
        sincosf(r, &s, &c);
        cs[j] = c;
        sn[j] = inverse ? -s : s;
    }
    E* row = x + it.row * row_stride;
    for (int h = it.h0; h < it.h1; h++) {
        E* lo = row + (size_t)h * HS + it.i0;
        E* hi = lo + half;
        float a[W], b[W], ya[W], yb[W];
        load_floats<E, W>(a, lo);
        load_floats<E, W>(b, hi);
#pragma unroll
        for (int j = 0; j < W; j++) {
            ya[j] = a[j] * cs[j] - b[j] * sn[j];
            yb[j] = b[j] * cs[j] + a[j] * sn[j];
        }
        store_floats<E, W>(lo, ya);
        store_floats<E, W>(hi, yb);
    }
}

// Whether the 16-byte path applies (see the top of this file).
template <typename E>
inline bool rope_vec_ok(const void* x, size_t row_stride, int HS) {
    constexpr int V = kVec<E>;
    return aligned16(x) && row_stride % V == 0 && (HS / 2) % V == 0;
}

template <typename E>
void rope(E* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta, bool inverse,
          cudaStream_t stream) {
    const int half = HS / 2;
    if (B <= 0 || T <= 0 || heads <= 0 || half <= 0) return;
    if (half > kRopeMaxHalf) {
        std::fprintf(stderr, "rope: head size %d not supported (at most %d)\n", HS, 2 * kRopeMaxHalf);
        std::exit(1);
    }
    RopeFreqs fr;
    for (int i = 0; i < half; i++) fr.f[i] = std::pow(theta, -2.0 * i / HS);  // as cpu::rope
    const size_t rows = (size_t)B * T;
    const int block = 256;
    if (rope_vec_ok<E>(x, row_stride, HS)) {
        constexpr int V = kVec<E>;
        const size_t items = llmc_idx::rope_items(rows, heads, HS, V);
        rope_kernel<E, V><<<(unsigned)ceil_div(items, block), block, 0, stream>>>(x, row_stride, heads, HS, pos, T,
                                                                                  items, fr, inverse);
    } else {
        const size_t items = llmc_idx::rope_items(rows, heads, HS, 1);
        rope_kernel<E, 1><<<(unsigned)ceil_div(items, block), block, 0, stream>>>(x, row_stride, heads, HS, pos, T,
                                                                                  items, fr, inverse);
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
