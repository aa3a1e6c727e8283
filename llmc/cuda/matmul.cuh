// llmc/cuda/matmul.cuh: the Linear layer on cuBLASLt, forward and backward,
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
// dbias (+=) = column sums of dout: fp32 partials over row chunks, then a
// per-column sum in chunk order (no atomics).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>

#include "common.cuh"

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

template <typename E>
void matmul_forward(MatmulContext& ctx, E* out, const E* inp, const E* weight, const E* bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, bias)) return;
    ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, nullptr);
    add_bias<E>(out, bias, N, OC, ctx.stream());
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
