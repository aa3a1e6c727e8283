// dev/cuda/previous.h: the production kernels as they were before the
// 16-byte / deterministic rewrite (commit 9afbfae), kept verbatim in
// namespace llmc_prev so every kernel-lab program can run the old version
// next to the new one on the same inputs and print both bandwidths. Not
// used by the trainer. Only the namespace and the include paths differ from
// the old headers; the helpers they used (to_float, warp_sum, grid_for, ...)
// come from llmc/backend/cuda/common.cuh.
#pragma once
#include <algorithm>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_prev {

using namespace llmc_cuda;

// ==== from llmc/backend/cuda/gelu.cuh ====
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

// tanh through expf: under --use_fast_math nvcc turns tanhf into
// tanh.approx.f32 (about 2^-11 relative error), too coarse for the fp32
// build's checks, while expf stays within a few ulp. Saturates correctly:
// expf overflows to inf for large u (t = 1) and underflows to 0 (t = -1).
__device__ __forceinline__ float tanh_via_exp(float u) { return 1.f - 2.f / (expf(2.f * u) + 1.f); }

template <typename E>
__global__ void gelu_forward_kernel(E* out, const E* inp, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = to_float(inp[i]);
        const float u = kGeluScale * (x + kGeluCube * x * x * x);
        out[i] = from_float<E>(0.5f * x * (1.f + tanh_via_exp(u)));
    }
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'(x),
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <typename E>
__global__ void gelu_backward_kernel(E* dinp, const E* inp, const E* dout, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = to_float(inp[i]);
        const float u = kGeluScale * (x + kGeluCube * x * x * x);
        const float t = tanh_via_exp(u);
        const float sech2 = 1.f - t * t;
        const float grad = 0.5f * (1.f + t) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
        dinp[i] = from_float<E>(grad * to_float(dout[i]));
    }
}

template <typename E>
__global__ void residual_forward_kernel(E* out, const E* a, const E* b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_float<E>(to_float(a[i]) + to_float(b[i]));
}

template <typename E>
void gelu_forward(E* out, const E* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    gelu_forward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(out, inp, n);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    gelu_backward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(dinp, inp, dout, n);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_forward(E* out, const E* a, const E* b, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    residual_forward_kernel<E><<<grid_for(n, block), block, 0, stream>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

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

// ==== from llmc/backend/cuda/layernorm.cuh ====
constexpr float kLayerNormEps = 1e-5f;

// Normalise the row x (already in memory, possibly just written by this same
// lane) and write out, mean, rstd. Each lane touches channels lane, lane+32, ...
// in every pass, so a lane only ever reads back what it wrote itself.
template <typename E>
__device__ __forceinline__ void layernorm_row(E* o, float* mean, float* rstd, const E* x, const E* w, const E* b,
                                              int row, int C, int lane) {
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += to_float(x[c]);
    const float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        const float d = to_float(x[c]) - m;
        v += d * d;
    }
    const float r = 1.f / sqrtf(warp_sum(v) / C + kLayerNormEps);
    for (int c = lane; c < C; c += 32)
        o[c] = from_float<E>((to_float(x[c]) - m) * r * to_float(w[c]) + to_float(b[c]));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

template <typename E>
__global__ void layernorm_forward_kernel(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N,
                                         int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    layernorm_row(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, C, threadIdx.x % 32);
}

// residual = a + b (rounded to E), then LayerNorm of the rounded residual, so
// the statistics match what backward will read back from `residual`.
// residual may alias a or b: each element is read before it is written by
// the same lane.
template <typename E>
__global__ void residual_layernorm_forward_kernel(E* residual, E* out, float* mean, float* rstd, const E* a,
                                                  const E* bb, const E* w, const E* bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const size_t off = (size_t)row * C;
    for (int c = lane; c < C; c += 32) residual[off + c] = from_float<E>(to_float(a[off + c]) + to_float(bb[off + c]));
    layernorm_row(out + off, mean, rstd, residual + off, w, bias, row, C, lane);
}

template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* w, const E* b, int N, int C,
                       cudaStream_t stream) {
    if (N <= 0) return;
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(out, mean, rstd, inp, w,
                                                                                             b, N, C);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a, const E* b, const E* w,
                                const E* bias, int N, int C, cudaStream_t stream) {
    if (N <= 0) return;
    const int block = 256, rows_per_block = block / 32;
    residual_layernorm_forward_kernel<E><<<(unsigned)ceil_div(N, rows_per_block), block, 0, stream>>>(
        residual, out, mean, rstd, a, b, w, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---- backward ------------------------------------------------------------------
constexpr int kLnBwdBlock = 256;       // 8 warps, one row each at a time
constexpr int kLnBwdMaxBlocks = 512;   // fixed cap: same grid (and sums) on every GPU

inline int layernorm_backward_blocks(int N) {
    int g = (int)ceil_div(N, kLnBwdBlock / 32);
    return g < kLnBwdMaxBlocks ? (g > 0 ? g : 1) : kLnBwdMaxBlocks;
}
// fp32 scratch the backward needs: one (dw, db) slice per block.
inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)layernorm_backward_blocks(N) * 2 * C;
}

// dinp += (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd, with
// dnorm = w * dout and xhat = (x - mean) * rstd; block partials of dout * xhat
// and dout go to shared memory, then to partial[blockIdx.x] = [dw(C) | db(C)].
template <typename E>
__global__ void layernorm_backward_kernel(E* dinp, float* partial, const E* dout, const E* inp, const E* w,
                                          const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float sm[];  // [2C]: dw, db partial sums of this block
    float* dw_s = sm;
    float* db_s = sm + C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) sm[c] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
        const size_t off = (size_t)row * C;
        const E* x = inp + off;
        const E* dy = dout + off;
        const float m = mean[row], r = rstd[row];
        float sum_dn = 0.f, sum_dn_xhat = 0.f;
        for (int c = lane; c < C; c += 32) {
            const float xhat = (to_float(x[c]) - m) * r;
            const float dn = to_float(w[c]) * to_float(dy[c]);
            sum_dn += dn;
            sum_dn_xhat += dn * xhat;
        }
        const float mean_dn = warp_sum(sum_dn) / C;
        const float mean_dn_xhat = warp_sum(sum_dn_xhat) / C;
        E* dx = dinp + off;
        for (int c = lane; c < C; c += 32) {
            const float g = to_float(dy[c]);
            const float xhat = (to_float(x[c]) - m) * r;
            const float dn = to_float(w[c]) * g;
            dx[c] = from_float<E>(to_float(dx[c]) + (dn - mean_dn - xhat * mean_dn_xhat) * r);
            atomicAdd(&dw_s[c], g * xhat);  // shared-memory atomics: other warps of the block share c
            atomicAdd(&db_s[c], g);
        }
    }
    __syncthreads();
    float* p = partial + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) p[c] = sm[c];
}

// dw[c] += sum over blocks of partial dw, db likewise (fixed block order).
template <typename E>
__global__ void layernorm_backward_finish_kernel(E* dw, E* db, const float* partial, int nblocks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float gw = 0.f, gb = 0.f;
    for (int k = 0; k < nblocks; k++) {
        gw += partial[(size_t)k * 2 * C + c];
        gb += partial[(size_t)k * 2 * C + C + c];
    }
    dw[c] = from_float<E>(to_float(dw[c]) + gw);
    db[c] = from_float<E>(to_float(db[c]) + gb);
}

// scratch: at least layernorm_backward_scratch_floats(N, C) floats.
template <typename E>
void layernorm_backward(E* dinp, E* dw, E* db, const E* dout, const E* inp, const E* w, const float* mean,
                        const float* rstd, int N, int C, float* scratch, cudaStream_t stream) {
    const int nblocks = layernorm_backward_blocks(N);
    const size_t smem = (size_t)2 * C * sizeof(float);
    allow_smem(layernorm_backward_kernel<E>, smem);
    layernorm_backward_kernel<E><<<nblocks, kLnBwdBlock, smem, stream>>>(dinp, scratch, dout, inp, w, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    layernorm_backward_finish_kernel<E><<<(unsigned)ceil_div(C, 256), 256, 0, stream>>>(dw, db, scratch, nblocks, C);
    CUDA_CHECK_LAUNCH();
}

// ==== from llmc/backend/cuda/classifier.cuh ====
template <typename E>
__global__ void softmax_crossentropy_kernel(E* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                                            bool write_grad) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    E* x = logits + (size_t)row * Vp;
    const int t = targets[row];
    const bool t_ok = t >= 0 && t < V;
    // Read the target logit before any thread can overwrite it in pass 2 (the
    // reductions below contain barriers).
    const float xt = t_ok ? to_float(x[t]) : 0.f;

    float m = -INFINITY, s = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = to_float(x[i]);
        if (v > m) {
            s = s * expf(m - v) + 1.f;  // m = -inf the first time: expf(-inf) = 0
            m = v;
        } else if (v > -INFINITY) {
            s += expf(v - m);
        }
    }
    const float M = block_max(m, red);
    const float S = block_sum(m > -INFINITY ? s * expf(m - M) : 0.f, red);
    const float lse = logf(S) + M;
    if (threadIdx.x == 0) losses[row] = t_ok ? lse - xt : NAN;
    if (!write_grad) return;
    const float inv = 1.f / S;
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float g = 0.f;
        if (i < V) {
            const float p = expf(to_float(x[i]) - M) * inv;
            g = (p - (i == t ? 1.f : 0.f)) * dloss;
        }
        x[i] = from_float<E>(g);
    }
}

template <typename E>
void softmax_crossentropy(E* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                          bool write_grad, cudaStream_t stream) {
    if (N <= 0) return;
    // Enough threads to stream a 50k-wide row; fewer for the tiny test vocabularies.
    int block = 1024;
    while (block > 32 && block / 2 >= Vp) block /= 2;
    softmax_crossentropy_kernel<E><<<N, block, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_grad);
    CUDA_CHECK_LAUNCH();
}

// ---- vocab-parallel cross-entropy ----------------------------------------------------
// Valid (non-padding) local columns of a rank's slice.
inline int ce_valid_cols(int Vl, int v_begin, int V) {
    const long long nv = (long long)V - v_begin;
    return nv <= 0 ? 0 : (nv < Vl ? (int)nv : Vl);
}

// Threads per row: enough to stream a wide slice, fewer for tiny ones.
inline int ce_block_size(int cols) {
    int block = 1024;
    while (block > 32 && block / 2 >= cols) block /= 2;
    return block;
}

template <typename E>
__global__ void crossentropy_stats_kernel(const E* logits, const int* targets, float* row_max, float* target_logit,
                                          int Vl, int nv, int v_begin) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) m = fmaxf(m, to_float(x[j]));
    m = block_max(m, red);
    if (threadIdx.x == 0) {
        row_max[row] = m;
        const long long t = (long long)targets[row] - v_begin;
        target_logit[row] = (t >= 0 && t < nv) ? to_float(x[t]) : 0.f;
    }
}

template <typename E>
__global__ void crossentropy_sumexp_kernel(const E* logits, const float* row_max, float* sumexp, int Vl, int nv) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const E* x = logits + (size_t)row * Vl;
    const float M = row_max[row];
    float s = 0.f;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        const float v = to_float(x[j]);
        // exp(-inf - M) is 0 for any M but -inf, where it is NaN; a NaN logit
        // still propagates (v == -inf is false for NaN).
        s += v == -INFINITY ? 0.f : expf(v - M);
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) sumexp[row] = s;
}

template <typename E>
__global__ void crossentropy_finish_kernel(E* logits, float* losses, const int* targets, const float* row_max,
                                           const float* sumexp, const float* target_logit, float dloss, int Vl,
                                           int nv, int v_begin, bool write_grad) {
    const int row = blockIdx.x;
    const float M = row_max[row], S = sumexp[row];
    if (threadIdx.x == 0) losses[row] = logf(S) + M - target_logit[row];
    if (!write_grad) return;
    E* x = logits + (size_t)row * Vl;
    const long long t = (long long)targets[row] - v_begin;  // local column of the target (any value)
    const float inv = 1.f / S;
    // Each element is read and written by the same thread: in place is safe.
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float g = 0.f;
        if (j < nv) {
            const float v = to_float(x[j]);
            const float p = v == -INFINITY ? 0.f : expf(v - M) * inv;
            g = (p - (j == t ? 1.f : 0.f)) * dloss;
        }
        x[j] = from_float<E>(g);
    }
}

template <typename E>
void crossentropy_stats(const E* logits, const int* targets, float* row_max, float* target_logit, int N, int Vl,
                        int v_begin, int V, cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    crossentropy_stats_kernel<E><<<N, ce_block_size(nv), 0, stream>>>(logits, targets, row_max, target_logit, Vl, nv,
                                                                       v_begin);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_sumexp(const E* logits, const float* row_max, float* sumexp, int N, int Vl, int v_begin, int V,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    crossentropy_sumexp_kernel<E><<<N, ce_block_size(nv), 0, stream>>>(logits, row_max, sumexp, Vl, nv);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void crossentropy_finish(E* logits, float* losses, const int* targets, const float* row_max, const float* sumexp,
                         const float* target_logit, float dloss, int N, int Vl, int v_begin, int V, bool write_grad,
                         cudaStream_t stream) {
    if (N <= 0) return;
    const int nv = ce_valid_cols(Vl, v_begin, V);
    // Without write_grad only thread 0 works: one warp is plenty.
    const int block = write_grad ? ce_block_size(Vl) : 32;
    crossentropy_finish_kernel<E><<<N, block, 0, stream>>>(logits, losses, targets, row_max, sumexp, target_logit,
                                                           dloss, Vl, nv, v_begin, write_grad);
    CUDA_CHECK_LAUNCH();
}

// ==== from llmc/backend/cuda/adamw.cuh ====
struct AdamF {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
};

inline AdamF adam_narrow(const AdamArgs& a) {
    return {(float)a.lr,         (float)a.beta1,      (float)a.beta2,      (float)a.eps,
            (float)a.weight_decay, (float)a.grad_scale, (float)a.bias_corr1, (float)a.bias_corr2};
}

template <typename P, typename G>
__global__ void adamw_kernel(P* param, float* master, const G* grad, float* m, float* v, size_t n, AdamF a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = to_float(grad[i]) * a.grad_scale;
        const float mi = a.beta1 * m[i] + (1.f - a.beta1) * g;
        const float vi = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / a.bc1, vhat = vi / a.bc2;
        float p = master ? master[i] : to_float(param[i]);
        p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * p);
        if (master) master[i] = p;
        param[i] = from_float<P>(p);
    }
}

template <typename P, typename G>
void adamw_update(P* param, float* master, const G* grad, float* m, float* v, size_t n, const AdamArgs& args,
                  cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    adamw_kernel<P, G><<<grid_for(n, block), block, 0, stream>>>(param, master, grad, m, v, n, adam_narrow(args));
    CUDA_CHECK_LAUNCH();
}

// ==== from llmc/backend/cuda/matmul.cuh (bias add and bias gradient) ====
// out[n, o] += bias[o]: the fallback when cuBLASLt rejects the bias epilogue,
// and Backend::add_bias (row-parallel layers add their bias after the
// tensor-parallel reduction). fp32 add, one rounding to E.
template <typename E>
__global__ void add_bias_kernel(E* out, const E* bias, int N, int OC) {
    const size_t total = (size_t)N * OC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_float<E>(to_float(out[i]) + to_float(bias[i % OC]));
}

template <typename E>
void add_bias(E* out, const E* bias, int N, int OC, cudaStream_t stream) {
    if (N <= 0 || OC <= 0) return;
    const int block = 256;
    add_bias_kernel<E><<<grid_for((size_t)N * OC, block), block, 0, stream>>>(out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
}

// ---- bias gradient ------------------------------------------------------------
constexpr int kColSumRowsPerChunk = 64;
constexpr int kColSumMaxChunks = 128;

inline int column_sum_chunks(int N) {
    int c = (int)ceil_div(N, kColSumRowsPerChunk);
    return c < 1 ? 1 : (c > kColSumMaxChunks ? kColSumMaxChunks : c);
}
inline size_t matmul_backward_scratch_floats(int N, int OC) { return (size_t)column_sum_chunks(N) * OC; }

// Block (32, 8): 32 columns, 8 row lanes; block (x, y) sums the rows of chunk
// y for its 32 columns and writes partial[y, c].
template <typename E>
__global__ void column_sum_partial_kernel(float* partial, const E* dout, int N, int OC, int rows_per_chunk) {
    __shared__ float s[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(N, r0 + rows_per_chunk);
    float acc = 0.f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += to_float(dout[(size_t)r * OC + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) t += s[i][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + c] = t;
    }
}

template <typename E>
__global__ void column_sum_finish_kernel(E* dbias, const float* partial, int nchunks, int OC) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float t = 0.f;
    for (int k = 0; k < nchunks; k++) t += partial[(size_t)k * OC + c];
    dbias[c] = from_float<E>(to_float(dbias[c]) + t);
}

// dbias[o] += sum_n dout[n, o]. scratch: matmul_backward_scratch_floats(N, OC).
template <typename E>
void bias_backward(E* dbias, const E* dout, int N, int OC, float* scratch, cudaStream_t stream) {
    const int chunks = column_sum_chunks(N);
    const int rows_per_chunk = (int)ceil_div(N, chunks);
    dim3 grid((unsigned)ceil_div(OC, 32), (unsigned)chunks);
    column_sum_partial_kernel<E><<<grid, dim3(32, 8), 0, stream>>>(scratch, dout, N, OC, rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    column_sum_finish_kernel<E><<<(unsigned)ceil_div(OC, 256), 256, 0, stream>>>(dbias, scratch, chunks, OC);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_prev
