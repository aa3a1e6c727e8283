// dev/cuda/previous_encoder_sorted.h: the encoder backward as it was before
// buckets were split across blocks (from llmc/backend/cuda/encoder.cuh):
// keys sorted on the device, then one block per bucket summing the whole
// bucket, so a token that is ~3% of the text is one block's serial work.
// Kept verbatim in namespace llmc_prev_sorted so
// dev/cuda/encoder_backward.cu can time it next to the production kernel on
// the same inputs. Not used by the trainer.
#pragma once
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev_sorted {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/encoder.cuh ====
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

}  // namespace llmc_prev_sorted
