// llmc/backend/cuda/kernel_index.h: the index arithmetic of the CUDA kernels, in plain C++.
//
// Which thread touches which element, and in which order partial sums are
// added, is decided here and nowhere else: the kernels in llmc/backend/cuda/*.cuh
// call these functions, and tests/unit/test_kernel_index.cpp (built by g++, run
// on a machine without a GPU) runs the very same functions over every
// thread of a grid to check that each element is visited exactly once and
// that the reductions, replayed in the kernels' order, agree with the CPU
// backend's ops. Nothing here includes a CUDA header.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define LLMC_HD __host__ __device__ __forceinline__
// The visitors below are instantiated with device lambdas by the kernels
// and with host lambdas by the test; tell nvcc not to check the other side.
#define LLMC_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define LLMC_HD inline
#define LLMC_HD_TEMPLATE
#endif

namespace llmc_idx {

// 16-byte accesses: 8 bf16 or 4 fp32 elements per load or store.
constexpr int kVecBytes = 16;

// ---- elementwise loops over n elements -------------------------------------------
// W elements per access (16 / sizeof(E) when every pointer of the op is
// 16-byte aligned, else 1). Packs p = 0 .. n/W - 1 cover elements
// [p*W, p*W + W); thread tid of nthreads takes packs tid, tid + nthreads, ...
// (a grid-stride loop). The tail [n/W*W, n), fewer than W elements, goes one
// element each to threads 0, 1, ... (strided too, should a grid have fewer
// threads than the tail). f(first, count): count == W for a pack, 1 for a
// tail element (so with W == 1 every call is a "pack").
LLMC_HD_TEMPLATE
template <typename F>
LLMC_HD void for_each_pack(size_t n, int W, size_t tid, size_t nthreads, F&& f) {
    const size_t packs = n / (size_t)W;
    for (size_t p = tid; p < packs; p += nthreads) f(p * (size_t)W, W);
    for (size_t e = packs * (size_t)W + tid; e < n; e += nthreads) f(e, 1);
}

// ---- one warp per row (LayerNorm forward and backward) ----------------------------
// A row of C channels, C % W == 0, is split into packs of W channels; lane l
// holds packs k = 0 .. ln_packs_per_lane - 1 at channel (k*32 + l)*W, so one
// warp-wide access reads 32*W consecutive channels (512 bytes). Packs at or
// past C are idle (only in the last k).
LLMC_HD int ln_packs_per_lane(int C, int W) { return (C + 32 * W - 1) / (32 * W); }
LLMC_HD int ln_pack_channel(int k, int lane, int W) { return (k * 32 + lane) * W; }

// ---- LayerNorm backward: rows to warps, and the dw/db reduction order ------------
// Grid of ln_bwd_blocks(N) blocks of kLnBwdWarps warps; warp w of block b
// takes rows b*warps + w, then + grid*warps, ... Each warp sums dw, db of its
// rows in registers (row order); the block adds its warps' sums in warp order
// 0, 1, ..., into partial[b] = [dw(C) | db(C)] (fp32). The grid depends only on
// N (a fixed cap, not the GPU's SM count), so the sums are the same on every
// GPU and every run.
constexpr int kLnBwdWarps = 8;
constexpr int kLnBwdMaxBlocks = 256;
LLMC_HD int ln_bwd_blocks(int N) {
    int g = (N + kLnBwdWarps - 1) / kLnBwdWarps;
    return g < 1 ? 1 : (g > kLnBwdMaxBlocks ? kLnBwdMaxBlocks : g);
}
LLMC_HD int ln_bwd_first_row(int block, int warp) { return block * kLnBwdWarps + warp; }
LLMC_HD int ln_bwd_row_stride(int grid) { return grid * kLnBwdWarps; }

// ---- fixed-order column sums of fp32 partials -------------------------------------
// out[c] = sum over k < K of partial[k][c], computed by a block of 32 columns
// x kColSumLanes lanes: lane y adds rows k = y, y + lanes, ... in ascending
// order, then lane 0 adds the lanes' results in lane order 0, 1, ... The
// order depends only on K, never on timing.
constexpr int kColSumLanes = 8;
LLMC_HD int colsum_first(int lane) { return lane; }
LLMC_HD int colsum_stride() { return kColSumLanes; }

// ---- bias gradient (column sums of dout[N, OC]) -----------------------------------
// Rows are cut into chunks of bias_rows_per_chunk rows (at most
// kBiasMaxChunks chunks; the number depends only on N). A block owns 32
// column packs (32*W columns) of one chunk; warp w adds rows r0 + w,
// r0 + w + warps, ... of the chunk in order, the block adds its warps in warp
// order into partial[chunk][c], and the fixed-order column sum above adds the
// chunks.
constexpr int kBiasWarps = 8;
constexpr int kBiasRowsPerChunk = 256;
constexpr int kBiasMaxChunks = 64;
LLMC_HD int bias_chunks(int N) {
    int c = (N + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk;
    return c < 1 ? 1 : (c > kBiasMaxChunks ? kBiasMaxChunks : c);
}
LLMC_HD int bias_rows_per_chunk(int N) {
    const int c = bias_chunks(N);
    return (N + c - 1) / c;
}

// ---- encoder backward: sorted buckets ---------------------------------------------
// Keys are the parameter row an item feeds (token id - v_begin; position),
// or `sentinel` (the number of rows) when the item feeds no row of this
// rank. After a stable sort by key, a bucket is a maximal run of equal keys;
// its first position is where the run starts. Sentinels sort last.
LLMC_HD int encoder_key(int id, int v_begin, int v_end) {
    return (id >= v_begin && id < v_end) ? id - v_begin : v_end - v_begin;
}
template <typename K>
LLMC_HD bool bucket_start(const K* keys, int i) {
    return i == 0 || keys[i] != keys[i - 1];
}
// Bits a radix sort needs for keys 0 .. max_key.
LLMC_HD int key_bits(int max_key) {
    int b = 1;
    while (b < 31 && (1 << b) <= max_key) b++;
    return b;
}
// The sorted items are cut into chunks of kEncChunk, so a bucket of many
// items (a frequent token: ~3% of real text) is summed by several blocks.
// A segment is a maximal run of one key inside one chunk; it starts where a
// bucket starts or a chunk starts inside a bucket. Pass 1: a block per
// segment start (a grid-stride loop over sorted positions, as many blocks
// at work as before the split for small buckets) sums the segment in item
// order (fp32); a segment that is a whole bucket is added straight into its
// parameter row; a segment of a bucket that crosses a chunk boundary goes
// to a partial slot instead: the chunk's first segment, if its bucket began
// in an earlier chunk, to slot "head" of the chunk; else its last segment,
// if its bucket goes on into the next chunk, to slot "tail". Pass 2: the
// chunk where such a bucket begins (its "owner": tail slot written) finds
// the bucket's end (a binary search of the sorted keys), adds the bucket's
// partials in chunk order (its tail, then the next chunks' heads) and adds
// the sum into the parameter row once. Every row has one writer and every
// order depends only on the sorted keys: deterministic.
constexpr int kEncChunk = 64;
enum EncDest { kEncDirect = 0, kEncHead = 1, kEncTail = 2 };
LLMC_HD int enc_chunks(int nitems) { return (nitems + kEncChunk - 1) / kEncChunk; }
// Chunk k's first item continues the bucket of chunk k-1's last.
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD bool enc_joins_prev(const K* keys, int nitems, int k) {
    const int i = k * kEncChunk;
    return k > 0 && i < nitems && keys[i] == keys[i - 1];
}
// Chunk k's last item's bucket goes on into chunk k+1.
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD bool enc_joins_next(const K* keys, int nitems, int k) {
    const int i = (k + 1) * kEncChunk;
    return i < nitems && keys[i] == keys[i - 1];
}
// Sorted position i starts a segment.
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD bool enc_segment_start(const K* keys, int i) {
    return i % kEncChunk == 0 || bucket_start(keys, i);
}
// The end of the bucket holding sorted position i: the first position past
// it with a larger key (binary search; keys ascending).
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD int enc_bucket_end(const K* keys, int nitems, int i) {
    const K key = keys[i];
    int lo = i + 1, hi = nitems;  // the answer lies in [lo, hi]
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (keys[mid] == key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
// Where pass 1 puts the sum of segment [a, b) of chunk k.
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD int enc_segment_dest(const K* keys, int nitems, int k, int a, int b) {
    const int c0 = k * kEncChunk, c1 = c0 + kEncChunk < nitems ? c0 + kEncChunk : nitems;
    if (a == c0 && enc_joins_prev(keys, nitems, k)) return kEncHead;
    if (b == c1 && enc_joins_next(keys, nitems, k)) return kEncTail;
    return kEncDirect;
}
// Chunk k wrote a tail slot: a bucket begins in it and goes on.
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD bool enc_owner(const K* keys, int nitems, int k) {
    if (!enc_joins_next(keys, nitems, k)) return false;
    const int c0 = k * kEncChunk;  // a chunk joining the next is whole
    return !(enc_joins_prev(keys, nitems, k) && keys[c0] == keys[c0 + kEncChunk - 1]);
}
// After adding chunk j's head slot, an owner goes on to chunk j+1 when the
// bucket fills chunk j and goes on (the same chunks as up to the chunk of
// enc_bucket_end - 1; tests/unit/test_encoder_buckets.cpp checks both agree).
LLMC_HD_TEMPLATE
template <typename K>
LLMC_HD bool enc_continues(const K* keys, int nitems, int j) {
    const int c0 = j * kEncChunk;
    return enc_joins_next(keys, nitems, j) && keys[c0] == keys[c0 + kEncChunk - 1];
}
// fp32 partial slots of one pass (head and tail per chunk, C each).
LLMC_HD size_t enc_partial_floats(int nitems, int C) { return 2 * (size_t)enc_chunks(nitems) * (size_t)C; }

// ---- sum of squares of one buffer: a fixed grid (at most kNormMaxBlocks) -----------
constexpr int kNormBlock = 512;
constexpr int kNormMaxBlocks = 1024;
LLMC_HD int sum_squares_blocks(size_t n) {
    const size_t g = (n + (size_t)kNormBlock * 8 - 1) / ((size_t)kNormBlock * 8);
    return (int)(g < 1 ? 1 : (g > (size_t)kNormMaxBlocks ? (size_t)kNormMaxBlocks : g));
}

// ---- sum of squares of many runs (the global norm in one launch) ------------------
// Run i (n_i elements) is cut into sumsq_blocks(n_i) blocks of at most
// kSumSqChunk consecutive elements; blocks are numbered run after run
// (first_block, as for AdamW below; find_piece maps a block to its run).
// Thread t of a block adds elements t, t + blockDim, ... of its chunk in
// double; the block adds its threads by a fixed tree into one partial. The
// host adds a run's partials in block order, then the runs in run order.
constexpr size_t kSumSqChunk = 16384;
LLMC_HD size_t sumsq_blocks(size_t n) { return (n + kSumSqChunk - 1) / kSumSqChunk; }
// Most blocks of runs of `elems` elements in all, `runs` runs.
LLMC_HD size_t sumsq_max_blocks(size_t elems, int runs) { return elems / kSumSqChunk + (size_t)runs; }

// ---- scratch the kernels need, in elements ------------------------------------------
// LayerNorm backward: one [dw | db] slice per warp (the vector path uses
// the first ln_bwd_blocks(N) slices); RMSNorm: one dw slice per warp; bias
// gradient: one row of partials per chunk; attention backward: D, one
// float per query row and head.
LLMC_HD size_t ln_bwd_scratch_floats(int N, int C) { return (size_t)ln_bwd_blocks(N) * kLnBwdWarps * 2 * (size_t)C; }
LLMC_HD size_t rms_bwd_scratch_floats(int N, int C) { return (size_t)ln_bwd_blocks(N) * kLnBwdWarps * (size_t)C; }
LLMC_HD size_t bias_scratch_floats(int N, int OC) { return (size_t)bias_chunks(N) * (size_t)OC; }

// ---- RoPE: threads to (row, head group, pack), and the angle -----------------------
// rope (backend.h) rotates channel pairs (i, i + half), half = HS/2, of
// `heads` heads in each of `rows` rows. A thread owns one pack p: channels
// [p·W, p·W + W) of the first half and the same of the second half, of the
// heads h0 .. h0 + kRopeHeadsPerThread - 1 of one row (fewer in the last
// group): it computes the pack's W angles once and applies them to every
// head it owns, so the trigonometry is amortised over heads. W is the
// 16-byte pack when half % W == 0 (and the rows are aligned), else 1.
// Thread tid -> pack = tid % packs, then head group, then row: consecutive
// threads take consecutive packs of one head (contiguous 16-byte accesses).
constexpr int kRopeHeadsPerThread = 8;
LLMC_HD int rope_packs(int HS, int W) { return (HS / 2) / W; }
LLMC_HD int rope_head_groups(int heads) { return (heads + kRopeHeadsPerThread - 1) / kRopeHeadsPerThread; }
LLMC_HD size_t rope_items(size_t rows, int heads, int HS, int W) {
    return rows * (size_t)rope_head_groups(heads) * (size_t)rope_packs(HS, W);
}
struct RopeItem {
    size_t row;
    int h0, h1;  // heads [h0, h1)
    int i0;      // first channel of the pack in the first half
};
LLMC_HD RopeItem rope_item(size_t tid, int heads, int HS, int W) {
    const int packs = rope_packs(HS, W), groups = rope_head_groups(heads);
    const size_t rest = tid / (size_t)packs;
    RopeItem it;
    it.i0 = (int)(tid % (size_t)packs) * W;
    const int g = (int)(rest % (size_t)groups);
    it.row = rest / (size_t)groups;
    it.h0 = g * kRopeHeadsPerThread;
    it.h1 = it.h0 + kRopeHeadsPerThread < heads ? it.h0 + kRopeHeadsPerThread : heads;
    return it;
}
// The angle a = pos · f_i (f_i = theta^(-2i/HS), computed on the host in
// double exactly as the CPU op does, and a in double as there) reduced to
// [-pi, pi] in double: r = a - k·2pi, k = rint(a / 2pi), with 2pi split in
// two doubles so k·2pi is exact to ~1e-25 relative. fp32 sin/cos of the
// reduced angle then lose only the final rounding (|a| reaches 1e5 and more
// at long contexts; fp32 a itself would be off by up to 4e-3 there).
LLMC_HD double rope_reduce(double a) {
    constexpr double kInv2Pi = 0.15915494309189535, k2PiHi = 6.283185307179586, k2PiLo = 2.4492935982947064e-16;
    const double k = rint(a * kInv2Pi);
    return fma(-k, k2PiLo, fma(-k, k2PiHi, a));
}

// ---- multi-tensor AdamW: pieces, blocks and items ---------------------------------
// A piece is a contiguous run of n elements updated with one weight decay.
// It is processed in items of kAdamItem elements, one item per thread,
// kAdamItemsPerBlock items per block. When a head h < kAdamItem exists such
// that every pointer of the piece advanced by h elements is 16-byte aligned
// (and n >= h + kAdamItem), the piece is "vector": items cover
// [h + it*8, h + it*8 + 8) for it < (n - h) / 8 with 16-byte accesses, and
// the at most 14 leftover elements (the head [0, h) and the tail after the
// last whole item) go one each to threads of the piece's block 0. Otherwise
// the piece is "scalar": item it covers [it*8, min(n, it*8 + 8)) element by
// element.
constexpr int kAdamItem = 8;
constexpr int kAdamItemsPerBlock = 256;  // = the block size

// Smallest h in [0, kAdamItem) with (addr[i] + h*esize[i]) % 16 == 0 for all
// i < count, or -1 if there is none.
inline int adam_head(const uintptr_t* addr, const int* esize, int count) {
    for (int h = 0; h < kAdamItem; h++) {
        bool ok = true;
        for (int i = 0; i < count; i++) ok = ok && ((addr[i] + (uintptr_t)h * (uintptr_t)esize[i]) % kVecBytes) == 0;
        if (ok) return h;
    }
    return -1;
}
LLMC_HD size_t adam_vec_items(size_t n, int head) { return (n - (size_t)head) / kAdamItem; }
LLMC_HD size_t adam_piece_blocks(size_t n, bool vec, int head) {
    const size_t items = vec ? adam_vec_items(n, head) : (n + kAdamItem - 1) / kAdamItem;
    const size_t b = (items + kAdamItemsPerBlock - 1) / kAdamItemsPerBlock;
    return b < 1 ? 1 : b;
}
// The work of thread tid in block j of a piece: f(first, count, vector).
LLMC_HD_TEMPLATE
template <typename F>
LLMC_HD void adam_visit(size_t n, bool vec, int head, size_t j, int tid, F&& f) {
    const size_t it = j * kAdamItemsPerBlock + (size_t)tid;
    if (vec) {
        const size_t items = adam_vec_items(n, head);
        if (it < items) f((size_t)head + it * kAdamItem, kAdamItem, true);
        const size_t tail0 = (size_t)head + items * kAdamItem;
        const size_t extras = (size_t)head + (n - tail0);
        if (j == 0 && (size_t)tid < extras) {
            const size_t e = (size_t)tid < (size_t)head ? (size_t)tid : tail0 + ((size_t)tid - (size_t)head);
            f(e, 1, false);
        }
    } else {
        const size_t first = it * kAdamItem;
        if (first < n) f(first, (int)(n - first < (size_t)kAdamItem ? n - first : (size_t)kAdamItem), false);
    }
}
// The piece of block b: the last i with first_block[i] <= b (first_block
// ascending, first_block[0] == 0).
LLMC_HD int find_piece(const size_t* first_block, int count, size_t b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first_block[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// ---- a matmul's bias: in cuBLASLt's epilogue, or by a separate kernel ------------
// cuBLASLt's bias epilogue reads the bias in 16-byte pieces: a bias pointer
// that is not 16-byte aligned (a bias at an odd element offset of the flat
// buffers, a tensor-parallel slice) risks a misaligned-address fault, which
// leaves the CUDA context unusable. Such a bias is added by the separate
// bias kernel after the product instead (matmul_forward).
LLMC_HD bool bias_in_epilogue(uintptr_t bias_address) { return bias_address != 0 && bias_address % kVecBytes == 0; }

}  // namespace llmc_idx
