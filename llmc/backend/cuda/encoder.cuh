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
//   3. one block per bucket start (a grid-stride loop over sorted positions;
//      llmc_idx::bucket_start) sums its bucket's rows in sorted order in fp32,
//      16 bytes at a time, and adds once into the parameter row (each output
//      row has exactly one writer).
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

namespace llmc_cuda {

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
// then CUB's temporary storage. Grows only; one per backend (or lab
// program); release() frees it.
struct EncoderBackwardScratch {
    void* dev = nullptr;
    size_t cap = 0;  // bytes

    void* get(size_t bytes, cudaStream_t stream) {
        if (bytes > cap) {
            if (dev) {
                CUDA_CHECK(cudaStreamSynchronize(stream));  // an earlier launch may still use it
                CUDA_CHECK(cudaFree(dev));
            }
            cap = bytes + bytes / 2;
            CUDA_CHECK(cudaMalloc(&dev, cap));
        }
        return dev;
    }
    void release() {
        if (dev) cudaFree(dev);
        dev = nullptr;
        cap = 0;
    }
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

// dst[key, :] += sum over the bucket of key, for every bucket but the
// sentinel's: item k of a bucket stands for source rows vals[k] + r*rep_stride,
// r < rep (rep 1 for tokens; B rows of stride T for positions). Summed in
// sorted item order, then r order, in fp32.
template <typename E, int W>
__global__ void encoder_bucket_sum_kernel(E* dst, const E* src, const unsigned* keys, const int* vals, int nitems,
                                          unsigned sentinel, int C, int rep, int rep_stride) {
    for (int i = blockIdx.x; i < nitems; i += gridDim.x) {
        const unsigned key = keys[i];
        if (key == sentinel) break;  // sentinels sort last: nothing after this is owned
        if (!llmc_idx::bucket_start(keys, i)) continue;
        for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
            float acc[W];
#pragma unroll
            for (int j = 0; j < W; j++) acc[j] = 0.f;
            for (int k = i; k < nitems && keys[k] == key; k++) {
                const size_t v = (size_t)vals[k];
                for (int r = 0; r < rep; r++) {
                    float f[W];
                    load_floats<E, W>(f, src + (v + (size_t)r * rep_stride) * C + c);
#pragma unroll
                    for (int j = 0; j < W; j++) acc[j] += f[j];
                }
            }
            E* d = dst + (size_t)key * C + c;
            float o[W];
            load_floats<E, W>(o, d);
#pragma unroll
            for (int j = 0; j < W; j++) o[j] += acc[j];
            store_floats<E, W>(d, o);
        }
    }
}

namespace detail {
constexpr int kEncBucketGrid = 2048;  // blocks of the bucket sum (a grid-stride loop over sorted items)

template <typename E>
void encoder_bucket_sum(E* dst, const E* src, const unsigned* keys, const int* vals, int nitems, unsigned sentinel,
                        int C, int rep, int rep_stride, cudaStream_t stream) {
    constexpr int V = kVec<E>;
    const bool vec = C % V == 0 && aligned16(dst) && aligned16(src);
    const int W = vec ? V : 1;
    int block = (int)ceil_div(ceil_div(C, W), 32) * 32;
    if (block > 256) block = 256;
    const unsigned grid = (unsigned)std::min(nitems, kEncBucketGrid);
    if (vec)
        encoder_bucket_sum_kernel<E, V><<<grid, block, 0, stream>>>(dst, src, keys, vals, nitems, sentinel, C, rep,
                                                                    rep_stride);
    else
        encoder_bucket_sum_kernel<E, 1><<<grid, block, 0, stream>>>(dst, src, keys, vals, nitems, sentinel, C, rep,
                                                                    rep_stride);
    CUDA_CHECK_LAUNCH();
}

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }
}  // namespace detail

template <typename E>
void encoder_backward(E* dwte, E* dwpe, const E* dout, const int* tokens, const int* pos, int B, int T, int C,
                      int v_begin, int v_end, EncoderBackwardScratch& sc, cudaStream_t stream) {
    const int N = B * T;
    if (N <= 0 || C <= 0) return;
    // Scratch: keys_in | keys_out | vals_in | vals_out (N each) | CUB temp.
    const unsigned tok_sentinel = (unsigned)(v_end - v_begin);
    const int tok_bits = llmc_idx::key_bits((int)tok_sentinel);
    size_t temp_tok = 0, temp_pos = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_tok, (const unsigned*)nullptr, (unsigned*)nullptr,
                                               (const int*)nullptr, (int*)nullptr, N, 0, tok_bits, stream));
    if (dwpe)
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_pos, (const unsigned*)nullptr, (unsigned*)nullptr,
                                                   (const int*)nullptr, (int*)nullptr, T, 0, 32, stream));
    const size_t arr = detail::align256((size_t)N * sizeof(int));
    const size_t temp = std::max(temp_tok, temp_pos);
    char* base = static_cast<char*>(sc.get(4 * arr + temp, stream));
    unsigned* keys_in = reinterpret_cast<unsigned*>(base);
    unsigned* keys_out = reinterpret_cast<unsigned*>(base + arr);
    int* vals_in = reinterpret_cast<int*>(base + 2 * arr);
    int* vals_out = reinterpret_cast<int*>(base + 3 * arr);
    void* cub_temp = base + 4 * arr;

    // wte: every token row feeds parameter row id - v_begin (if held here).
    if (dwte && v_end > v_begin) {
        encoder_token_keys_kernel<<<(unsigned)ceil_div(N, 256), 256, 0, stream>>>(keys_in, vals_in, tokens, N, v_begin,
                                                                                 v_end);
        CUDA_CHECK_LAUNCH();
        size_t t = temp;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, t, keys_in, keys_out, vals_in, vals_out, N, 0, tok_bits,
                                                   stream));
        detail::encoder_bucket_sum<E>(dwte, dout, keys_out, vals_out, N, tok_sentinel, C, 1, 0, stream);
    }
    // wpe: position entry t feeds row pos[t] for the B rows b*T + t. The
    // arrays are reused: the stream runs the wte bucket sum first.
    if (dwpe) {
        encoder_position_keys_kernel<<<(unsigned)ceil_div(T, 256), 256, 0, stream>>>(keys_in, vals_in, pos, T);
        CUDA_CHECK_LAUNCH();
        size_t t = temp;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, t, keys_in, keys_out, vals_in, vals_out, T, 0, 32, stream));
        detail::encoder_bucket_sum<E>(dwpe, dout, keys_out, vals_out, T, 0xffffffffu, C, B, T, stream);
    }
}

}  // namespace llmc_cuda
