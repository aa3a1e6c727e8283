// llmc/backend/cuda/matmul.cuh: the Linear layer on cuBLASLt, forward and backward,
// plus the bias add (Backend::add_bias) and the column-sum kernel for the
// bias gradient.
//
// Row-major shapes (PyTorch): out[N,OC] = inp[N,IC] · W[OC,IC]^T + b[OC].
// cuBLAS is column-major; a row-major X[R,C] in memory is the column-major
// X^T[C,R] with leading dimension C. So every product is computed transposed:
//   forward  out^T[OC,N]  = W'^T · inp'     A = W   (IC x OC, lda IC), op T
//                                           B = inp (IC x N,  ldb IC), op N
//            bias[OC] is per row of the column-major D: CUBLASLT_EPILOGUE_BIAS
//   dinp     dinp^T[IC,N] = W' · dout'      A = W    (IC x OC, lda IC), op N
//                                           B = dout (OC x N,  ldb OC), op N
//   dweight  dW^T[IC,OC] += inp' · dout'^T  A = inp  (IC x N, lda IC), op N
//                                           B = dout (OC x N, ldb OC), op T
// (X' = the column-major view of row-major X.) Compute type fp32; for bf16
// that is tensor cores with fp32 accumulation, for fp32 plain SGEMM (no TF32:
// the fp32 build is for tight checks).
//
// Parameters live at arbitrary element offsets of flat buffers, so pointers
// are not always 256-byte aligned (cuBLASLt's default assumption): the real
// alignment of every pointer goes into the heuristic query, and the chosen
// algorithm is cached per (shape, types, alignments). If no algorithm accepts
// the bias epilogue, the bias is added by a separate kernel.
//
// dbias (+=) = column sums of dout: fp32 partials over row chunks with
// 16-byte loads, then a fixed-order column sum (no atomics; see
// bias_backward for why not cuBLASLt's BGRADB epilogue).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>

#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {

template <typename E>
inline cudaDataType_t cuda_dtype();
template <>
inline cudaDataType_t cuda_dtype<float>() { return CUDA_R_32F; }
template <>
inline cudaDataType_t cuda_dtype<bf16>() { return CUDA_R_16BF; }

// Largest power of two (<= 256) dividing the address.
inline uint32_t ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

class MatmulContext {
  public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;

    void init(cudaStream_t stream) {
        stream_ = stream;
        CUBLAS_CHECK(cublasLtCreate(&handle_));
        CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    }
    void destroy() {
        if (workspace_) cudaFree(workspace_);
        if (handle_) cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }
    cudaStream_t stream() const { return stream_; }

    // Column-major D[m,n] = alpha·op(A)·op(B) + beta·D (+ bias[m] per row).
    // A is (transA ? k x m : m x k) with leading dimension lda; B likewise
    // (transB ? n x k : k x n), ldb; D has ld m. Returns false, doing nothing,
    // when bias is given but no algorithm supports the bias epilogue here.
    template <typename E>
    bool gemm(E* D, const E* A, bool transA, int lda, const E* B, bool transB, int ldb, int m, int n, int k,
              float beta, const E* bias) {
        const cudaDataType_t dt = cuda_dtype<E>();
        cublasLtMatmulDesc_t desc;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
        if (bias) {
            const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
            // The bias pointer is set before the heuristic query: its alignment matters there.
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        }
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, dt, transA ? k : m, transA ? m : k, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, dt, transB ? n : k, transB ? k : n, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, m));

        const Key key{m, n, k, (int)transA, (int)transB, (int)dt, beta != 0.f, bias != nullptr,
                      ptr_alignment(A), ptr_alignment(B), ptr_alignment(D), bias ? ptr_alignment(bias) : 0u};
        auto it = cache_.find(key);
        if (it == cache_.end()) {
            cublasLtMatmulPreference_t pref;
            CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
            const uint64_t ws = kWorkspaceBytes;
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                              sizeof(ws)));
            const uint32_t alA = std::get<8>(key), alB = std::get<9>(key), alD = std::get<10>(key);
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA,
                                                              sizeof(alA)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB,
                                                              sizeof(alB)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alD,
                                                              sizeof(alD)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alD,
                                                              sizeof(alD)));
            Entry e;
            int found = 0;
            const cublasStatus_t st =
                cublasLtMatmulAlgoGetHeuristic(handle_, desc, la, lb, ld, ld, pref, 1, &e.result, &found);
            e.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
            cublasLtMatmulPreferenceDestroy(pref);
            it = cache_.emplace(key, e).first;
        }
        bool done = false;
        if (it->second.ok) {
            const float alpha = 1.f;
            CUBLAS_CHECK(cublasLtMatmul(handle_, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &it->second.result.algo,
                                        workspace_, kWorkspaceBytes, stream_));
            done = true;
        }
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        if (!done && !bias) {
            std::fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d transA=%d transB=%d\n", m, n, k,
                         (int)transA, (int)transB);
            std::exit(1);
        }
        return done;
    }

  private:
    // m, n, k, transA, transB, dtype, beta!=0, has bias, align A, B, D, bias
    using Key = std::tuple<int, int, int, int, int, int, bool, bool, uint32_t, uint32_t, uint32_t, uint32_t>;
    struct Entry {
        cublasLtMatmulHeuristicResult_t result{};
        bool ok = false;
    };
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    cudaStream_t stream_ = 0;
    std::map<Key, Entry> cache_;
};

// out[n, o] += bias[o]: the fallback when cuBLASLt rejects the bias epilogue,
// and Backend::add_bias (row-parallel layers add their bias after the
// tensor-parallel reduction). fp32 add, one rounding to E. 16-byte packs
// when OC is a multiple of the pack and both pointers are aligned (a pack
// then never straddles two rows, and bias + (i % OC) is aligned too).
template <typename E, int W>
__global__ void add_bias_kernel(E* out, const E* bias, int N, int OC) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (size_t)gridDim.x * blockDim.x;
    llmc_idx::for_each_pack((size_t)N * OC, W, tid, nth, [&](size_t i, int count) {
        const int c = (int)(i % (size_t)OC);
        if (count == W) {
            float x[W], b[W];
            load_floats<E, W>(x, out + i);
            load_floats<E, W>(b, bias + c);
#pragma unroll
            for (int j = 0; j < W; j++) x[j] += b[j];
            store_floats<E, W>(out + i, x);
        } else {
            out[i] = from_float<E>(to_float(out[i]) + to_float(bias[c]));
        }
    });
}

template <typename E>
void add_bias(E* out, const E* bias, int N, int OC, cudaStream_t stream) {
    if (N <= 0 || OC <= 0) return;
    constexpr int V = kVec<E>;
    const size_t n = (size_t)N * OC;
    if (OC % V == 0 && aligned16(out) && aligned16(bias))
        add_bias_kernel<E, V><<<grid_for(ceil_div(n, V), 256, 132 * 32), 256, 0, stream>>>(out, bias, N, OC);
    else
        add_bias_kernel<E, 1><<<grid_for(n, 256, 132 * 32), 256, 0, stream>>>(out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
}

template <typename E>
void matmul_forward(MatmulContext& ctx, E* out, const E* inp, const E* weight, const E* bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    // The bias goes into cuBLASLt's epilogue only when it is 16-byte aligned
    // (llmc_idx::bias_in_epilogue) and an algorithm accepts it; else the
    // separate kernel adds it after the product.
    if (bias && llmc_idx::bias_in_epilogue((uintptr_t)bias) &&
        ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, bias))
        return;
    ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, nullptr);
    if (bias) add_bias<E>(out, bias, N, OC, ctx.stream());
}

// ---- bias gradient ------------------------------------------------------------
// dbias[o] += sum_n dout[n, o]: one pass over dout with 16-byte loads into
// fp32 partial sums per row chunk, then the fixed-order column sum of
// common.cuh (which also does the +=). Chosen over cuBLASLt's
// CUBLASLT_EPILOGUE_BGRADB on the dweight product because (1) the epilogue
// overwrites the bias gradient while the contract is +=, across micro-steps,
// so it would need a second buffer and an add kernel anyway; (2) its
// reduction order is the library's choice per algorithm (split-K variants
// included), while this one is fixed and depends only on N; (3) the
// heuristic may refuse the epilogue for the unaligned parameter slices of
// the flat buffers (as it may refuse the forward bias), which would need
// this kernel as a fallback regardless. The pass reads dout once (N*OC
// elements) and writes chunks*OC floats, and the dweight product reads dout
// again: about what the epilogue would save, at most one extra read of dout.
inline size_t matmul_backward_scratch_floats(int N, int OC) { return llmc_idx::bias_scratch_floats(N, OC); }

// Block (32, kBiasWarps): blockIdx.x owns 32 column packs (32*W columns),
// blockIdx.y one chunk of rows; see llmc_idx's bias-gradient order.
template <typename E, int W>
__global__ void bias_partial_kernel(float* partial, const E* dout, int N, int OC, int rows_per_chunk) {
    __shared__ float s[llmc_idx::kBiasWarps][32 * W + 1];
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int c0 = (blockIdx.x * 32 + lane) * W;  // first column of this lane's pack
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(N, r0 + rows_per_chunk);
    float acc[W];
#pragma unroll
    for (int j = 0; j < W; j++) acc[j] = 0.f;
    if (c0 < OC) {  // OC % W == 0 on the vector path, so a pack is all in or all out
        for (int r = r0 + warp; r < r1; r += llmc_idx::kBiasWarps) {
            float f[W];
            load_floats<E, W>(f, dout + (size_t)r * OC + c0);
#pragma unroll
            for (int j = 0; j < W; j++) acc[j] += f[j];
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++) s[warp][lane * W + j] = acc[j];
    __syncthreads();
    // Thread t of the block finishes column t of the block's 32*W columns,
    // adding the warps in warp order.
    for (int t = threadIdx.y * 32 + threadIdx.x; t < 32 * W; t += 32 * llmc_idx::kBiasWarps) {
        const int c = blockIdx.x * 32 * W + t;
        if (c < OC) {
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < llmc_idx::kBiasWarps; w++) sum += s[w][t];
            partial[(size_t)blockIdx.y * OC + c] = sum;
        }
    }
}

// dbias[o] += sum_n dout[n, o]. scratch: matmul_backward_scratch_floats(N, OC).
template <typename E>
void bias_backward(E* dbias, const E* dout, int N, int OC, float* scratch, cudaStream_t stream) {
    if (N <= 0 || OC <= 0) return;
    const int chunks = llmc_idx::bias_chunks(N);
    const int rows = llmc_idx::bias_rows_per_chunk(N);
    constexpr int V = kVec<E>;
    const dim3 block(32, llmc_idx::kBiasWarps);
    if (OC % V == 0 && aligned16(dout)) {
        bias_partial_kernel<E, V><<<dim3((unsigned)ceil_div(OC, 32 * V), chunks), block, 0, stream>>>(scratch, dout,
                                                                                                      N, OC, rows);
    } else {
        bias_partial_kernel<E, 1><<<dim3((unsigned)ceil_div(OC, 32), chunks), block, 0, stream>>>(scratch, dout, N,
                                                                                                 OC, rows);
    }
    CUDA_CHECK_LAUNCH();
    column_sum_finish<E>(dbias, nullptr, scratch, chunks, OC, OC, stream);
}

// dinp = dout · W (skipped when null), dweight += dout^T · inp, dbias += colsum(dout).
template <typename E>
void matmul_backward(MatmulContext& ctx, E* dinp, E* dweight, E* dbias, const E* dout, const E* inp, const E* weight,
                     int N, int IC, int OC, float* scratch) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;  // nothing to add, and cuBLASLt rejects empty shapes
    if (dinp) ctx.gemm<E>(dinp, weight, false, IC, dout, false, OC, IC, N, OC, 0.f, nullptr);
    ctx.gemm<E>(dweight, inp, false, IC, dout, true, OC, IC, OC, N, 1.f, nullptr);
    if (dbias) bias_backward(dbias, dout, N, OC, scratch, ctx.stream());
}

}  // namespace llmc_cuda
