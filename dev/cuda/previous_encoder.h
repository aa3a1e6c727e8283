// dev/cuda/previous_encoder.h: the previous embedding kernels (from
// encoder.cuh): encoder forward, and the backward's host-side grouping of
// rows by target with its bucket kernel. Kept verbatim in namespace
// llmc_prev (see previous.h).
#pragma once
#include <algorithm>
#include <vector>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/encoder.cuh ====
template <typename E>
__global__ void encoder_forward_kernel(E* out, const int* tokens, const int* pos, const E* wte, const E* wpe, int B,
                                       int T, int C, int v_begin, int v_end) {
    const size_t total = (size_t)B * T * C;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t n = idx / C;
        const int c = (int)(idx - n * C);
        const int t = (int)(n % T);
        const int id = tokens[n];
        float x = 0.f;
        if (id >= v_begin && id < v_end) x = to_float(wte[(size_t)(id - v_begin) * C + c]);
        if (wpe) {
            const int p = pos ? pos[t] : t;
            x += to_float(wpe[(size_t)p * C + c]);
        }
        out[idx] = from_float<E>(x);
    }
}

template <typename E>
void encoder_forward(E* out, const int* tokens, const int* pos, const E* wte, const E* wpe, int B, int T, int C,
                     int v_begin, int v_end, cudaStream_t stream) {
    const int block = 256;
    encoder_forward_kernel<E><<<grid_for((size_t)B * T * C, block), block, 0, stream>>>(out, tokens, pos, wte, wpe,
                                                                                          B, T, C, v_begin, v_end);
    CUDA_CHECK_LAUNCH();
}

// dst[rows[k], c] += sum over i in [starts[k], starts[k+1]) of src[idx[i], c].
// One thread per (bucket, channel): each output element has exactly one
// writer and sums in a fixed order.
template <typename E>
__global__ void bucket_rows_add_kernel(E* dst, const E* src, const int* rows, const int* starts, const int* idx, int C) {
    const int k = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.f;
    const int end = starts[k + 1];
    for (int i = starts[k]; i < end; i++) acc += to_float(src[(size_t)idx[i] * C + c]);
    const size_t o = (size_t)rows[k] * C + c;
    dst[o] = from_float<E>(to_float(dst[o]) + acc);
}

// Host-side grouping plus the device buffer it is uploaded to. One per
// backend (or lab program); release() frees the device memory.
struct EncoderBackwardScratch {
    std::vector<int> tok, pos;              // downloaded ids / positions
    std::vector<int> order;                 // source rows sorted by target row
    std::vector<int> packed;                // rows | starts | idx, uploaded in one copy
    int* dev = nullptr;
    size_t dev_cap = 0;  // ints

    int* device(size_t ints, cudaStream_t stream) {
        if (ints > dev_cap) {
            if (dev) {
                CUDA_CHECK(cudaStreamSynchronize(stream));  // an earlier launch may still read it
                CUDA_CHECK(cudaFree(dev));
            }
            dev_cap = std::max(ints, (size_t)1024);
            CUDA_CHECK(cudaMalloc(&dev, dev_cap * sizeof(int)));
        }
        return dev;
    }
    void release() {
        if (dev) cudaFree(dev);
        dev = nullptr;
        dev_cap = 0;
    }
};

namespace detail {
// Group source rows 0..n-1 by target[i] (skipping target < 0), in ascending
// source order within a bucket, and launch the bucket kernel.
template <typename E>
void scatter_add_rows(E* dst, const E* src, const std::vector<int>& target, int C, EncoderBackwardScratch& sc,
                      cudaStream_t stream) {
    const int n = (int)target.size();
    sc.order.clear();
    for (int i = 0; i < n; i++)
        if (target[i] >= 0) sc.order.push_back(i);
    if (sc.order.empty()) return;
    std::stable_sort(sc.order.begin(), sc.order.end(), [&](int a, int b) { return target[a] < target[b]; });
    std::vector<int> rows, starts;
    for (size_t i = 0; i < sc.order.size(); i++) {
        if (i == 0 || target[sc.order[i]] != target[sc.order[i - 1]]) {
            rows.push_back(target[sc.order[i]]);
            starts.push_back((int)i);
        }
    }
    starts.push_back((int)sc.order.size());
    const int nb = (int)rows.size();
    sc.packed.clear();
    sc.packed.insert(sc.packed.end(), rows.begin(), rows.end());
    sc.packed.insert(sc.packed.end(), starts.begin(), starts.end());
    sc.packed.insert(sc.packed.end(), sc.order.begin(), sc.order.end());
    int* d = sc.device(sc.packed.size(), stream);
    CUDA_CHECK(cudaMemcpyAsync(d, sc.packed.data(), sc.packed.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
    const int block = 128;
    dim3 grid((unsigned)nb, (unsigned)ceil_div(C, block));
    bucket_rows_add_kernel<E><<<grid, block, 0, stream>>>(dst, src, d, d + nb, d + 2 * nb + 1, C);
    CUDA_CHECK_LAUNCH();
    // The host vector and the device buffer are reused by the next scatter
    // (and a copy from pageable memory may still be reading the host side):
    // let this one finish. Encoder backward is the last op of the backward
    // pass, so the wait costs little.
    CUDA_CHECK(cudaStreamSynchronize(stream));
}
}  // namespace detail

template <typename E>
void encoder_backward(E* dwte, E* dwpe, const E* dout, const int* tokens, const int* pos, int B, int T, int C,
                      int v_begin, int v_end, EncoderBackwardScratch& sc, cudaStream_t stream) {
    const int N = B * T;
    sc.tok.resize(N);
    CUDA_CHECK(cudaMemcpyAsync(sc.tok.data(), tokens, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost, stream));
    if (dwpe && pos) {
        sc.pos.resize(T);
        CUDA_CHECK(cudaMemcpyAsync(sc.pos.data(), pos, (size_t)T * sizeof(int), cudaMemcpyDeviceToHost, stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // wte: source row n feeds parameter row tokens[n] - v_begin, if owned here.
    std::vector<int> target(N);
    for (int n = 0; n < N; n++) {
        const int id = sc.tok[n];
        target[n] = (id >= v_begin && id < v_end) ? id - v_begin : -1;
    }
    detail::scatter_add_rows(dwte, dout, target, C, sc, stream);
    if (dwpe) {
        for (int n = 0; n < N; n++) target[n] = pos ? sc.pos[n % T] : n % T;
        detail::scatter_add_rows(dwpe, dout, target, C, sc, stream);
    }
}

}  // namespace llmc_prev
