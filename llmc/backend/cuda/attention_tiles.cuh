// llmc/backend/cuda/attention_tiles.cuh: the building blocks of the CUDA-core
// attention kernels (attention.cuh, whose opening comment explains the work
// split): the block shape, the padded tile geometry, the host-resolved
// strides, and the per-warp tile operations on fp32 shared memory (load a
// tile, warp rows x lane row dot products, weighted sums of tile rows, row
// stores).
#pragma once
#include <climits>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {
namespace attn {

constexpr int kWarps = 4;
constexpr int kRows = 8;    // rows per warp
constexpr int kTile = 32;   // = kWarps * kRows = lanes per warp
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kWarps * kRows == kTile, "a block's rows must be one tile");

// Channels per lane when accumulating rows (DPL * 32 >= head size).
inline int dpl_for(int HS) { return HS <= 32 ? 1 : HS <= 64 ? 2 : HS <= 128 ? 4 : 8; }
constexpr int kMaxHeadSize = 256;

// Padded head size HSP (multiple of 4 and of DPL, zero-filled beyond HS) and
// shared-memory row stride LD: LD/4 odd makes the float4 reads of 8 lanes at
// stride LD hit 32 distinct banks.
struct Geometry {
    int HSP, LD;
};
inline Geometry geometry(int HS) {
    const int dpl = dpl_for(HS);
    const int mult = dpl > 4 ? dpl : 4;
    const int hsp = (HS + mult - 1) / mult * mult;
    int q = hsp / 4;
    if (q % 2 == 0) q += 1;
    return {hsp, 4 * q};
}

// The shape's batch and lse strides, resolved on the host (AttnShape's
// accessors are host functions; 0 there means dense), and the grouped-query
// group size: query head h reads key/value head h / group (group = NH / NKV;
// 1 without GQA, where kv head = h as before).
struct Strides {
    size_t qb, kb, ob, lb, lh;
    int group;
    size_t db;  // document starts' batch stride (document mask)
};
inline Strides strides(const AttnShape& s) {
    return {s.qb(), s.kb(), s.ob(), s.lb(), s.lh(), s.NH / s.kv_heads(), s.db()};
}

// Document mask (AttnShape::doc_start, key_pos): the global position of key
// j (INT_MAX past the keys, so that nothing sees it), and the first key at
// or after position d among keys 0..n-1 (positions increase along the keys).
__device__ __forceinline__ int key_position(const AttnShape& s, int j) {
    return j >= s.Tk ? INT_MAX : s.key_pos ? s.key_pos[j] : j;
}
__device__ __forceinline__ int first_key_at(const AttnShape& s, int d, int n) {
    if (!s.key_pos) return min(max(d, 0), n);
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s.key_pos[mid] < d) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
// The first key a query tile (rows q0..q0+kTile-1, those < Tq) may see,
// from the earliest document start of its rows (0 without the mask).
__device__ __forceinline__ int tile_first_key(const AttnShape& s, const int* docs, int q0, int kend) {
    if (!docs) return 0;
    int d = INT_MAX;
    for (int r = 0; r < kTile && q0 + r < s.Tq; r++) d = min(d, docs[q0 + r]);
    return first_key_at(s, d, kend);
}

// Load rows row0..row0+31 (those < nrows) of a [rows, stride] slab into dst
// [32][LD] as fp32 times mul; channels HS..HSP-1 and missing rows become 0.
template <typename E>
__device__ __forceinline__ void load_tile(float* dst, int LD, int HSP, const E* base, size_t stride, int row0,
                                          int nrows, int HS, float mul) {
    for (int idx = threadIdx.x; idx < kTile * HSP; idx += blockDim.x) {
        const int r = idx / HSP, d = idx - r * HSP;
        const int row = row0 + r;
        float x = 0.f;
        if (row < nrows && d < HS) x = to_float(base[(size_t)row * stride + d]) * mul;
        dst[r * LD + d] = x;
    }
}

// s[r] = A[r, :] · B[lane, :] for the warp's kRows rows of A (read by all
// lanes: broadcast) and row `lane` of the 32-row tile B.
__device__ __forceinline__ void dot_rows_lane(float (&s)[kRows], const float* A, const float* B, int LD, int HSP,
                                              int lane) {
#pragma unroll
    for (int r = 0; r < kRows; r++) s[r] = 0.f;
    const float* b = B + lane * LD;
    for (int d = 0; d < HSP; d += 4) {
        const float4 bv = *reinterpret_cast<const float4*>(b + d);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float4 av = *reinterpret_cast<const float4*>(A + r * LD + d);
            s[r] = fmaf(av.x, bv.x, s[r]);
            s[r] = fmaf(av.y, bv.y, s[r]);
            s[r] = fmaf(av.z, bv.z, s[r]);
            s[r] = fmaf(av.w, bv.w, s[r]);
        }
    }
}

__device__ __forceinline__ float f4_get(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int DPL>
__device__ __forceinline__ void load_channels(float (&out)[DPL], const float* p) {
    if constexpr (DPL == 1) {
        out[0] = p[0];
    } else if constexpr (DPL == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        out[0] = v.x;
        out[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(p + i);
            out[i] = v.x;
            out[i + 1] = v.y;
            out[i + 2] = v.z;
            out[i + 3] = v.w;
        }
    }
}

// acc[r][dd] += sum_j P[r][j] * B[j][lane*DPL + dd], j over the 32 tile rows.
// P is the warp's [kRows][32] weights in shared memory (broadcast reads); the
// lanes split the channels. Lanes past the padded head size have nothing to do.
template <int DPL>
__device__ __forceinline__ void accum_rows(float (&acc)[kRows][DPL], const float* P, const float* B, int LD, int HSP,
                                           int lane) {
    const int d0 = lane * DPL;
    if (d0 >= HSP) return;
    for (int j = 0; j < kTile; j += 4) {
        float4 p[kRows];
#pragma unroll
        for (int r = 0; r < kRows; r++) p[r] = *reinterpret_cast<const float4*>(P + r * kTile + j);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            float bv[DPL];
            load_channels<DPL>(bv, B + (j + jj) * LD + d0);
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                const float pr = f4_get(p[r], jj);
#pragma unroll
                for (int dd = 0; dd < DPL; dd++) acc[r][dd] = fmaf(pr, bv[dd], acc[r][dd]);
            }
        }
    }
}

// Write acc * mul (kAcc: add it) for rows of this warp to dst (row stride
// `stride`), rows below nrows, channels below HS. Each element belongs to
// one lane, so the read-modify-write of kAcc is race-free.
template <bool kAcc, typename O, int DPL>
__device__ __forceinline__ void store_rows(O* base, size_t stride, int row0, int nrows, int HS,
                                           const float (&acc)[kRows][DPL], float mul, int lane) {
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int row = row0 + r;
        if (row >= nrows) continue;
        O* o = base + (size_t)row * stride;
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) {
            const int d = lane * DPL + dd;
            if (d < HS) {
                if constexpr (kAcc)
                    o[d] = from_float<O>(to_float(o[d]) + acc[r][dd] * mul);
                else
                    o[d] = from_float<O>(acc[r][dd] * mul);
            }
        }
    }
}

}  // namespace attn
}  // namespace llmc_cuda
