// llmc/backend/cuda/encoder.cuh: token + position embedding, forward and backward.
//
// Forward: out[b,t,:] = wte[tokens[b,t] - v_begin, :] + wpe[pos[t], :], ids
// outside [v_begin, v_end) contribute zero, wpe may be null (pos is then
// unused). pos holds T entries (one per position in the sequence, as the CPU
// reference reads pos[n % T]); a null pos means pos[t] = t. 16-byte packs of
// a row when C is a multiple of the pack and the pointers are aligned.
//
// Backward: dwte (+=) and dwpe (+=). Many tokens share a row of wte, so a
// naive kernel would need atomics (and bf16 atomics lose precision with every
// add). Instead the rows of dout are grouped by the parameter row they feed
// ("buckets") entirely on the device, with no host round trip:
//   1. a kernel writes key = parameter row (token id - v_begin, or the
//      sentinel v_end - v_begin for ids this rank does not hold) and
//      value = source row, for every token;
//   2. CUB's radix sort sorts the pairs by key. Radix sort is stable, so its
//      output is the one ordering by (key, source row): the same on every
//      run whatever the GPU's scheduling;
//   3. the sorted items are cut into chunks of 64 (llmc_idx::kEncChunk,
//      kernel_index.h), so a frequent token's bucket (~3% of real text) is summed
//      by many blocks rather than one: a block per run of one key inside a
//      chunk (a grid-stride loop over sorted positions) sums it in sorted
//      order in fp32, 16 bytes at a time; a bucket inside one chunk goes
//      straight into its parameter row, a piece of a longer bucket into a
//      partial slot; a second pass adds each long bucket's partials in
//      chunk order and adds the sum into the row once (each output row has
//      exactly one writer).
// Positions go the same way over the T entries of pos (a bucket of position
// entries, each standing for the B rows b*T + t, summed t-major then b).
// The result is deterministic and exact up to fp32 summation and one final
// rounding. Everything is queued on the stream: no synchronisation, no
// device -> host copy (the previous version downloaded the ids and sorted
// them on the host, one stream synchronisation per backward).
#pragma once
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/scratch.cuh"

namespace llmc_cuda {

// d[0..W) += acc[0..W), in fp32, rounded once on the store (a row of dst
// has one writer, so the add is deterministic).
template <typename E, int W>
__device__ __forceinline__ void add_floats(E* d, const float* acc) {
    float o[W];
    load_floats<E, W>(o, d);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] += acc[j];
    store_floats<E, W>(d, o);
}

template <typename E, int W>
__global__ void encoder_forward_kernel(E* out, const int* tokens, const int* pos, const E* wte, const E* wpe, int B,
                                       int T, int C, int v_begin, int v_end) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (size_t)gridDim.x * blockDim.x;
    // On the vector path C % W == 0, so a pack lies inside one row.
    llmc_idx::for_each_pack((size_t)B * T * C, W, tid, nth, [&](size_t i, int count) {
        const size_t n = i / (size_t)C;
        const int c = (int)(i - n * (size_t)C);
        const int t = (int)(n % (size_t)T);
        const int id = tokens[n];
        const bool own = id >= v_begin && id < v_end;
        const int p = wpe ? (pos ? pos[t] : t) : 0;
        if (count == W) {
            float x[W], y[W];
            if (own)
                load_floats<E, W>(x, wte + (size_t)(id - v_begin) * C + c);
            else
#pragma unroll
                for (int j = 0; j < W; j++) x[j] = 0.f;
            if (wpe) {
                load_floats<E, W>(y, wpe + (size_t)p * C + c);
#pragma unroll
                for (int j = 0; j < W; j++) x[j] += y[j];
            }
            store_floats<E, W>(out + i, x);
        } else {
            float x = own ? to_float(wte[(size_t)(id - v_begin) * C + c]) : 0.f;
            if (wpe) x += to_float(wpe[(size_t)p * C + c]);
            out[i] = from_float<E>(x);
        }
    });
}

template <typename E>
void encoder_forward(E* out, const int* tokens, const int* pos, const E* wte, const E* wpe, int B, int T, int C,
                     int v_begin, int v_end, cudaStream_t stream) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) return;
    constexpr int V = kVec<E>;
    const int block = 256;
    if (C % V == 0 && aligned16(out) && aligned16(wte) && (!wpe || aligned16(wpe)))
        encoder_forward_kernel<E, V><<<grid_for(ceil_div(n, V), block, 132 * 32), block, 0, stream>>>(
            out, tokens, pos, wte, wpe, B, T, C, v_begin, v_end);
    else
        encoder_forward_kernel<E, 1><<<grid_for(n, block, 132 * 32), block, 0, stream>>>(out, tokens, pos, wte, wpe,
                                                                                         B, T, C, v_begin, v_end);
    CUDA_CHECK_LAUNCH();
}

// ---- backward --------------------------------------------------------------------
// Device scratch of the backward: keys and values before and after the sort,
// the partial slots of the split buckets, then CUB's temporary storage
// (cuda/scratch.cuh: grows in the lab, reserved once in the trainer).
struct EncoderBackwardScratch {
    GrowBuffer buf;
    void* get(size_t bytes, cudaStream_t stream) { return buf.get(bytes, stream, "encoder_backward"); }
    void release() { buf.release(); }
};

// keys[n] = parameter row of token n (sentinel when not held), vals[n] = n.
static __global__ void encoder_token_keys_kernel(unsigned* keys, int* vals, const int* tokens, int N, int v_begin,
                                          int v_end) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    keys[n] = (unsigned)llmc_idx::encoder_key(tokens[n], v_begin, v_end);
    vals[n] = n;
}
// keys[t] = pos[t] (t when pos is null), vals[t] = t.
static __global__ void encoder_position_keys_kernel(unsigned* keys, int* vals, const int* pos, int T) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    keys[t] = (unsigned)(pos ? pos[t] : t);
    vals[t] = t;
}

// Pass 1, a block per segment start (kernel_index.h: a run of one key inside one
// chunk of kEncChunk sorted items; a grid-stride loop over sorted
// positions): the segment summed in item order, then r order, in fp32; item
// k stands for source rows vals[k] + r*rep_stride, r < rep (rep 1 for
// tokens; B rows of stride T for positions). A whole bucket is added into
// dst[key] here; a piece of a longer bucket goes to its partial slot.
template <typename E, int W>
__global__ void encoder_segment_sum_kernel(E* dst, float* partial, const E* src, const unsigned* keys, const int* vals,
                                           int nitems, unsigned sentinel, int C, int rep, int rep_stride) {
    for (int a = blockIdx.x; a < nitems; a += gridDim.x) {
        const unsigned key = keys[a];
        if (key == sentinel) break;  // sentinels sort last: nothing after this is owned
        if (!llmc_idx::enc_segment_start(keys, a)) continue;
        const int k = a / llmc_idx::kEncChunk, c1 = min(nitems, (k + 1) * llmc_idx::kEncChunk);
        int b = a + 1;
        while (b < c1 && keys[b] == key) b++;
        const int dest = llmc_idx::enc_segment_dest(keys, nitems, k, a, b);
        for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
            float acc[W];
#pragma unroll
            for (int j = 0; j < W; j++) acc[j] = 0.f;
            for (int i = a; i < b; i++) {
                const size_t v = (size_t)vals[i];
                for (int r = 0; r < rep; r++) {
                    float f[W];
                    load_floats<E, W>(f, src + (v + (size_t)r * rep_stride) * C + c);
#pragma unroll
                    for (int j = 0; j < W; j++) acc[j] += f[j];
                }
            }
            if (dest == llmc_idx::kEncDirect) {
                add_floats<E, W>(dst + (size_t)key * C + c, acc);
            } else {
                float* p = partial + (2 * (size_t)k + (dest == llmc_idx::kEncHead ? 0 : 1)) * C + c;
#pragma unroll
                for (int j = 0; j < W; j++) p[j] = acc[j];
            }
        }
    }
}

// Pass 2, a block per chunk that owns a split bucket: its tail slot, then
// the head slots of the chunks up to the bucket's end, in chunk order, and
// the sum once into dst[key].
template <typename E, int W>
__global__ void encoder_bucket_finish_kernel(E* dst, const float* partial, const unsigned* keys, int nitems,
                                             unsigned sentinel, int C) {
    const int nch = llmc_idx::enc_chunks(nitems);
    for (int k = blockIdx.x; k < nch; k += gridDim.x) {
        if (!llmc_idx::enc_owner(keys, nitems, k)) continue;
        const int last = (k + 1) * llmc_idx::kEncChunk - 1;
        const unsigned key = keys[last];
        if (key == sentinel) continue;
        const int end_chunk = (llmc_idx::enc_bucket_end(keys, nitems, last) - 1) / llmc_idx::kEncChunk;
        for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
            float acc[W];
            const float* p = partial + (2 * (size_t)k + 1) * C + c;
#pragma unroll
            for (int j = 0; j < W; j++) acc[j] = p[j];
            for (int jc = k + 1; jc <= end_chunk; jc++) {
                const float* h = partial + 2 * (size_t)jc * C + c;
#pragma unroll
                for (int j = 0; j < W; j++) acc[j] += h[j];
            }
            add_floats<E, W>(dst + (size_t)key * C + c, acc);
        }
    }
}

namespace detail {
constexpr int kEncGrid = 2048;  // most blocks of a pass (grid-stride loops over positions, chunks)

template <typename E>
void encoder_bucket_sum(E* dst, float* partial, const E* src, const unsigned* keys, const int* vals, int nitems,
                        unsigned sentinel, int C, int rep, int rep_stride, cudaStream_t stream) {
    constexpr int V = kVec<E>;
    const bool vec = C % V == 0 && aligned16(dst) && aligned16(src);
    const int W = vec ? V : 1;
    int block = (int)ceil_div(ceil_div(C, W), 32) * 32;
    if (block > 256) block = 256;
    const unsigned grid1 = (unsigned)std::min(nitems, kEncGrid);
    const unsigned grid2 = (unsigned)std::min(llmc_idx::enc_chunks(nitems), kEncGrid);
    if (vec) {
        encoder_segment_sum_kernel<E, V><<<grid1, block, 0, stream>>>(dst, partial, src, keys, vals, nitems, sentinel,
                                                                       C, rep, rep_stride);
        CUDA_CHECK_LAUNCH();
        encoder_bucket_finish_kernel<E, V><<<grid2, block, 0, stream>>>(dst, partial, keys, nitems, sentinel, C);
    } else {
        encoder_segment_sum_kernel<E, 1><<<grid1, block, 0, stream>>>(dst, partial, src, keys, vals, nitems, sentinel,
                                                                       C, rep, rep_stride);
        CUDA_CHECK_LAUNCH();
        encoder_bucket_finish_kernel<E, 1><<<grid2, block, 0, stream>>>(dst, partial, keys, nitems, sentinel, C);
    }
    CUDA_CHECK_LAUNCH();
}

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The scratch layout of one call: keys_in | keys_out | vals_in | vals_out (N
// each) | partial slots | CUB temp.
struct EncoderLayout {
    size_t arr, partial, temp;
    size_t bytes() const { return 4 * arr + partial + temp; }
};
inline EncoderLayout encoder_layout(int N, int T, int C, int key_rows, bool positions, cudaStream_t stream) {
    size_t temp_tok = 0, temp_pos = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_tok, (const unsigned*)nullptr, (unsigned*)nullptr,
                                               (const int*)nullptr, (int*)nullptr, N, 0,
                                               llmc_idx::key_bits(key_rows), stream));
    if (positions)
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_pos, (const unsigned*)nullptr, (unsigned*)nullptr,
                                                   (const int*)nullptr, (int*)nullptr, T, 0, 32, stream));
    EncoderLayout l;
    l.arr = align256((size_t)N * sizeof(int));
    l.partial = align256(llmc_idx::enc_partial_floats(std::max(N, T), C) * sizeof(float));
    l.temp = std::max(temp_tok, temp_pos);
    return l;
}
}  // namespace detail

// Reserves the scratch of the largest call the model makes: N = B·T rows
// of C channels, T positions, key_rows embedding rows held (CUB's
// temporary storage grows with the item count, so the largest call needs
// the most).
inline void encoder_backward_reserve(EncoderBackwardScratch& sc, int N, int T, int C, int key_rows,
                                     cudaStream_t stream) {
    if (N <= 0 || T <= 0 || C <= 0) return;
    sc.buf.reserve(detail::encoder_layout(N, T, C, key_rows, true, stream).bytes(), stream);
}

template <typename E>
void encoder_backward(E* dwte, E* dwpe, const E* dout, const int* tokens, const int* pos, int B, int T, int C,
                      int v_begin, int v_end, EncoderBackwardScratch& sc, cudaStream_t stream) {
    const int N = B * T;
    if (N <= 0 || C <= 0) return;
    const unsigned tok_sentinel = (unsigned)(v_end - v_begin);
    const int tok_bits = llmc_idx::key_bits((int)tok_sentinel);
    const detail::EncoderLayout l = detail::encoder_layout(N, T, C, (int)tok_sentinel, dwpe != nullptr, stream);
    char* base = static_cast<char*>(sc.get(l.bytes(), stream));
    unsigned* keys_in = reinterpret_cast<unsigned*>(base);
    unsigned* keys_out = reinterpret_cast<unsigned*>(base + l.arr);
    int* vals_in = reinterpret_cast<int*>(base + 2 * l.arr);
    int* vals_out = reinterpret_cast<int*>(base + 3 * l.arr);
    float* partial = reinterpret_cast<float*>(base + 4 * l.arr);
    void* cub_temp = base + 4 * l.arr + l.partial;

    // wte: every token row feeds parameter row id - v_begin (if held here).
    if (dwte && v_end > v_begin) {
        encoder_token_keys_kernel<<<(unsigned)ceil_div(N, 256), 256, 0, stream>>>(keys_in, vals_in, tokens, N, v_begin,
                                                                                 v_end);
        CUDA_CHECK_LAUNCH();
        size_t t = l.temp;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, t, keys_in, keys_out, vals_in, vals_out, N, 0, tok_bits,
                                                   stream));
        detail::encoder_bucket_sum<E>(dwte, partial, dout, keys_out, vals_out, N, tok_sentinel, C, 1, 0, stream);
    }
    // wpe: position entry t feeds row pos[t] for the B rows b*T + t. The
    // arrays are reused: the stream runs the wte bucket sum first.
    if (dwpe) {
        encoder_position_keys_kernel<<<(unsigned)ceil_div(T, 256), 256, 0, stream>>>(keys_in, vals_in, pos, T);
        CUDA_CHECK_LAUNCH();
        size_t t = l.temp;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, t, keys_in, keys_out, vals_in, vals_out, T, 0, 32, stream));
        detail::encoder_bucket_sum<E>(dwpe, partial, dout, keys_out, vals_out, T, 0xffffffffu, C, B, T, stream);
    }
}

}  // namespace llmc_cuda
