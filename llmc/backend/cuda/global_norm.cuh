// llmc/backend/cuda/global_norm.cuh: sum of squares of a buffer, or of many runs at
// once (the global gradient norm for clipping), returned to the host as a
// double, or left on the device (sum_squares_to: the step's figures).
//
// One buffer: a fixed grid of blocks (independent of the GPU) each sums a
// grid-stride slice in double and writes one double partial; the host adds
// the partials in block order. Many runs (sum_squares_multi): one launch
// over every run's fixed chunks (llmc_idx::kSumSqChunk, kernel_index.h), one
// partial per chunk, one copy to the host and one synchronisation; the host
// adds each run's partials in order, then the runs in order. Double
// accumulation keeps 124M-element sums accurate, and the operation is
// memory-bound, so fp64 arithmetic costs nothing visible on data-centre GPUs.
#pragma once
#include <stdexcept>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/scratch.cuh"

namespace llmc_cuda {

using llmc_idx::kNormBlock;
using llmc_idx::kNormMaxBlocks;
using llmc_idx::sum_squares_blocks;
// Scratch the reduction needs, in doubles.
inline size_t sum_squares_scratch_doubles(size_t n) { return (size_t)sum_squares_blocks(n); }

__device__ __forceinline__ double warp_sum_double(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Widen to double (bf16 via float: exact).
__device__ __forceinline__ double to_double(float x) { return (double)x; }
__device__ __forceinline__ double to_double(double x) { return x; }
__device__ __forceinline__ double to_double(bf16 x) { return (double)__bfloat162float(x); }

// The block's threads' sums by a fixed tree; thread 0 writes *out.
__device__ __forceinline__ void block_sum_double_to(double acc, double* out) {
    __shared__ double red[32];
    acc = warp_sum_double(acc);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x / 32) ? red[lane] : 0.0;
        acc = warp_sum_double(acc);
        if (lane == 0) *out = acc;
    }
}

template <typename E>
__global__ void sum_squares_kernel(double* partial, const E* x, size_t n) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const double v = to_double(x[i]);
        acc += v * v;
    }
    block_sum_double_to(acc, &partial[blockIdx.x]);
}

// ---- many runs -----------------------------------------------------------------------
struct SumSqPiece {
    const void* x;
    size_t n;
};

// Block b: chunk b - first[i] of run i (llmc_idx::find_piece).
template <typename E>
__global__ void sum_squares_multi_kernel(double* partial, const SumSqPiece* pieces, const size_t* first, int count) {
    const size_t b = blockIdx.x;
    const int i = llmc_idx::find_piece(first, count, b);
    const SumSqPiece p = pieces[i];
    const size_t lo = (b - first[i]) * llmc_idx::kSumSqChunk;
    const size_t hi = lo + llmc_idx::kSumSqChunk < p.n ? lo + llmc_idx::kSumSqChunk : p.n;
    const E* x = static_cast<const E*>(p.x);
    double acc = 0.0;
    for (size_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        const double v = to_double(x[k]);
        acc += v * v;
    }
    block_sum_double_to(acc, &partial[b]);
}

// One thread adds the partials as SumSqMulti::run does on the host: each
// run's in block order, then the runs in order; then *add (not null).
__global__ void sum_partials_kernel(double* dst, const double* partial, const size_t* first, int runs, size_t blocks,
                                    const double* add) {
    double total = 0.0;
    for (int i = 0; i < runs; i++) {
        const size_t end = i + 1 < runs ? first[i + 1] : blocks;
        double run_sum = 0.0;
        for (size_t b = first[i]; b < end; b++) run_sum += partial[b];
        total += run_sum;
    }
    if (add) total += *add;
    *dst = total;
}

inline size_t sumsq_table_bytes(int runs) { return (size_t)runs * (sizeof(SumSqPiece) + sizeof(size_t)); }

// The runs' table on the device (uploaded when the runs change: the
// trainer passes the same ones every step) and the partials, in reserved
// memory (cuda/scratch.cuh).
class SumSqMulti {
  public:
    void reserve(int runs, size_t elems, cudaStream_t stream) {
        table_.reserve(sumsq_table_bytes(runs), stream);
        partial_.reserve(llmc_idx::sumsq_max_blocks(elems, runs) * sizeof(double), stream);
    }
    void release() {
        table_.release();
        partial_.release();
        host_.clear();
    }
    template <typename E>
    double run(const SumSpan* spans, int count, cudaStream_t stream) {
        const Launched l = launch<E>(spans, count, stream);
        if (l.runs == 0) return 0.0;
        std::vector<double> host(l.blocks);
        CUDA_CHECK(cudaMemcpyAsync(host.data(), l.partial, l.blocks * sizeof(double), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));  // the one synchronisation (the table's copies end with it)
        double total = 0.0;
        for (int i = 0; i < l.runs; i++) {
            const size_t end = i + 1 < l.runs ? first_[i + 1] : l.blocks;
            double run_sum = 0.0;
            for (size_t b = first_[i]; b < end; b++) run_sum += host[b];
            total += run_sum;
        }
        return total;
    }
    // The same sum left on the device: *dst = the total (+ *add, when not
    // null), the partials added by one thread in run()'s order. No
    // synchronisation (the table is uploaded only when the runs change).
    void run_to(void* dst, const SumSpan* spans, int count, DType t, const void* add, cudaStream_t stream) {
        Launched l{};
        switch (t) {
            case DType::F32: l = launch<float>(spans, count, stream); break;
            case DType::BF16: l = launch<bf16>(spans, count, stream); break;
            case DType::F64: l = launch<double>(spans, count, stream); break;
            default: throw std::invalid_argument("cuda sum_squares_to: unsupported type");
        }
        sum_partials_kernel<<<1, 1, 0, stream>>>(static_cast<double*>(dst), l.partial, l.first, l.runs, l.blocks,
                                                  static_cast<const double*>(add));
        CUDA_CHECK_LAUNCH();
    }

  private:
    struct Launched {
        double* partial;
        const size_t* first;  // on the device: each run's first block
        int runs;
        size_t blocks;
    };
    // The partials of every run (one launch); first_ holds the runs' first blocks.
    template <typename E>
    Launched launch(const SumSpan* spans, int count, cudaStream_t stream) {
        std::vector<SumSqPiece> pieces;
        first_.clear();
        size_t blocks = 0;
        for (int i = 0; i < count; i++) {
            if (spans[i].n == 0) continue;
            pieces.push_back({spans[i].x, spans[i].n});
            first_.push_back(blocks);
            blocks += llmc_idx::sumsq_blocks(spans[i].n);
        }
        if (pieces.empty()) return {nullptr, nullptr, 0, 0};
        const int np = (int)pieces.size();
        const size_t pb = (size_t)np * sizeof(SumSqPiece);
        char* table = static_cast<char*>(table_.get(sumsq_table_bytes(np), stream, "sum_squares_multi (its table of runs)"));
        double* partial = static_cast<double*>(partial_.get(blocks * sizeof(double), stream, "sum_squares_multi"));
        if (!same(pieces)) {
            refuse_table_in_capture(stream, "sum_squares_multi/sum_squares_to");
            host_ = pieces;
            CUDA_CHECK(cudaMemcpyAsync(table, pieces.data(), pb, cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaMemcpyAsync(table + pb, first_.data(), (size_t)np * sizeof(size_t), cudaMemcpyHostToDevice,
                                       stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));  // first_ may change before the copy runs
        }
        sum_squares_multi_kernel<E><<<(unsigned)blocks, kNormBlock, 0, stream>>>(
            partial, reinterpret_cast<const SumSqPiece*>(table), reinterpret_cast<const size_t*>(table + pb), np);
        CUDA_CHECK_LAUNCH();
        return {partial, reinterpret_cast<const size_t*>(table + pb), np, blocks};
    }
    bool same(const std::vector<SumSqPiece>& p) const {
        if (p.size() != host_.size()) return false;
        for (size_t i = 0; i < p.size(); i++)
            if (p[i].x != host_[i].x || p[i].n != host_[i].n) return false;
        return true;
    }
    GrowBuffer table_, partial_;
    std::vector<SumSqPiece> host_;  // the runs now in the device table
    std::vector<size_t> first_;     // the last launch's runs' first blocks (host)
};

// scratch: at least sum_squares_scratch_doubles(n) doubles of device memory.
// Synchronises the stream (the result goes to the host).
template <typename E>
double sum_squares(const E* x, size_t n, double* scratch, cudaStream_t stream) {
    if (n == 0) return 0.0;
    const int nblocks = sum_squares_blocks(n);
    sum_squares_kernel<E><<<nblocks, kNormBlock, 0, stream>>>(scratch, x, n);
    CUDA_CHECK_LAUNCH();
    std::vector<double> host(nblocks);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), scratch, nblocks * sizeof(double), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double total = 0.0;
    for (double p : host) total += p;
    return total;
}

}  // namespace llmc_cuda
