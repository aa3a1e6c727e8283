// llmc/backend/cuda/fp8.cuh: the FP8 products on Hopper (docs/fp8.md;
// Backend::matmul_forward_fp8 / _backward_fp8): each operand's amax, its
// scale from it on the device (no host sync), the operand rounded to e4m3 or
// e5m2 bytes by the conversion instruction (satfinite: the saturating
// round-to-nearest-even of llmc/backend/fp8.h), in the layout cuBLASLt's FP8
// products take, and the product through cuBLASLt with the two descale
// pointers, accumulated in fp32.
//
// cuBLASLt multiplies FP8 only as "TN" (both operands contiguous along K).
// In row-major terms every product here is C[M, N] = A[M, K] · B[N, K]^T
// with A and B K-contiguous:
//   forward         out[N, OC]  = x[N, IC]      · W[OC, IC]^T      (as stored)
//   input gradient  dx[N, IC]   = dy[N, OC]     · (W^T)[IC, OC]^T  (W transposed)
//   weight gradient dW[OC, IC] += (dy^T)[OC, N] · (x^T)[IC, N]^T   (dy, x transposed)
// so the quantising kernel writes a transposed copy where one is needed
// (32 x 32 tiles through shared memory).
//
// Written without a GPU at hand: dev/cuda/fp8.cu checks it against the CPU's
// exact emulation (cpu_fp8.h); until a GPU has run it, docs/fp8.md says so.
#pragma once
#include <cuda_fp8.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/elementwise.cuh"
#include "llmc/backend/cuda/matmul.cuh"
#include "llmc/backend/cuda/scratch.cuh"
#include "llmc/backend/cuda/swiglu.cuh"
#include "llmc/backend/fp8.h"

namespace llmc_cuda {

// The max of |x| as float bits (common.cuh's abs_bits: NaN wins), exact
// and deterministic by atomicMax.
template <typename E>
__global__ void amax_bits_kernel(unsigned* out, const E* x, size_t n) {
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = max(m, abs_bits(to_float(x[i])));
    warp_amax_commit(out, m);
}
__global__ void amax_store_kernel(double* dst, const unsigned* bits) { *dst = (double)__uint_as_float(*bits); }

// bits: one unsigned of scratch.
template <typename E>
void amax_to(double* dst, const E* x, size_t n, unsigned* bits, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(unsigned), stream));
    if (n > 0) {
        const unsigned blocks = (unsigned)std::min<size_t>(ceil_div(n, (size_t)256), 1024);
        amax_bits_kernel<E><<<blocks, 256, 0, stream>>>(bits, x, n);
    }
    amax_store_kernel<<<1, 1, 0, stream>>>(dst, bits);
    CUDA_CHECK_LAUNCH();
}

// sc[i] = scale of operand i (0 input e4m3, 1 weight e4m3, 2 output
// gradient e5m2) from amax[i]; sc[3 + i] = 1 / sc[i], the product's descale.
__global__ void fp8_scales_kernel(float* sc, const double* amax) {
    const int i = threadIdx.x;
    if (i >= 3) return;
    const double s = fp8::scale_for(amax[i], i == 2 ? fp8::Format::e5m2 : fp8::Format::e4m3);
    sc[i] = (float)s;
    sc[3 + i] = (float)(1.0 / s);
}

// Delayed scaling's bookkeeping (Backend::fp8_delayed, fp8_history_push;
// the CPU's cpu_fp8.h, one thread here: a handful of numbers).
__device__ __forceinline__ double nan_max(double a, double b) {
    return (a != a || b != b) ? (a != a ? a : b) : fmax(a, b);
}
__global__ void fp8_delayed_kernel(double* amax, double* step_max, const double* hist, int len, bool record) {
    if (record) *step_max = nan_max(*step_max, *amax);
    double m = 0;
    for (int j = 0; j < len; j++) m = nan_max(m, hist[j]);
    if (m != 0) *amax = m;
}
__global__ void fp8_history_push_kernel(double* hist, double* step_max, int slots, int len, const double* figures,
                                        bool skip) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= slots) return;
    if (!skip && !(figures && figures[step_figure::skip] != 0.0)) {
        double* h = hist + (size_t)i * len;
        for (int j = len - 1; j > 0; j--) h[j] = h[j - 1];
        h[0] = step_max[i];
    }
    step_max[i] = 0;
}

__device__ __forceinline__ uint8_t fp8_of(float v, bool e5m2) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}
// q[r, c] = fp8(x[r, c] · scale) for a rows x cols matrix; with transpose,
// q is written [cols, ld] (q[c, r]), its columns rows..ld-1 zero (ld: rows
// rounded up to 16, the K a weight gradient's product needs; at most the
// tiles' 32), and `plain`, when given, gets the bytes as they are too: a
// backward's output gradient, needed both ways, is read once. Blocks of
// 32 x 8 threads, 32 x 32 tiles.
template <typename E>
__global__ void fp8_quantize_kernel(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2,
                                    bool transpose, int ld, uint8_t* plain) {
    __shared__ uint8_t tile[32][33];
    const float s = *scale;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            const uint8_t v = fp8_of(to_float(x[(size_t)r * cols + c]) * s, e5m2);
            if (transpose) tile[j][threadIdx.x] = v;
            else q[(size_t)r * cols + c] = v;
            if (transpose && plain) plain[(size_t)r * cols + c] = v;
        }
    }
    if (!transpose) return;  // (the same for the whole block)
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int c = c0 + j, r = r0 + threadIdx.x;
        if (c < cols && r < ld) q[(size_t)c * ld + r] = r < rows ? tile[threadIdx.x][j] : (uint8_t)0;
    }
}
// The K of a weight gradient's product over `rows` rows: a multiple of 16
// (cuBLASLt's FP8 rule), the padding zero bytes (+0 in both formats), which
// add nothing to the sums. A Mixtral expert's block takes any row count.
inline int fp8_padded_k(int rows) { return (rows + 15) / 16 * 16; }

// plain (with transpose only): the same bytes untransposed, in the same pass.
template <typename E>
void fp8_quantize(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2, bool transpose,
                  cudaStream_t stream, uint8_t* plain = nullptr) {
    if (rows <= 0 || cols <= 0) return;
    const dim3 grid((unsigned)ceil_div(cols, 32), (unsigned)ceil_div(rows, 32)), block(32, 8);
    fp8_quantize_kernel<E><<<grid, block, 0, stream>>>(q, x, rows, cols, scale, e5m2, transpose,
                                                       transpose ? fp8_padded_k(rows) : rows,
                                                       transpose ? plain : nullptr);
    CUDA_CHECK_LAUNCH();
}

// Row-major C[M, N] (+)= (A[M, K] · B[N, K]^T) · descale_a · descale_b (+ bias[N]),
// A and B FP8 bytes contiguous along K; C of type ct (bf16 or fp32). In
// cuBLASLt's column-major terms D[N, M] = op_T(B) · op_N(A): "TN", the FP8
// layout. Descriptors and the heuristic's algorithm are built once per
// shape and kept.
class Fp8Gemm {
  public:
    void init(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
        handle_ = handle, workspace_ = workspace, workspace_bytes_ = workspace_bytes, stream_ = stream;
    }
    void destroy() {
        for (auto& kv : cache_) kv.second.destroy();
        cache_.clear();
    }
    void run(void* C, cudaDataType_t ct, const uint8_t* A, bool a_e5m2, const uint8_t* B, bool b_e5m2, int M, int N,
             int K, const float* descale_a, const float* descale_b, bool accumulate, const void* bias) {
        if (K % 16 != 0 || N % 16 != 0 || M <= 0)
            throw std::invalid_argument("cuda fp8: cuBLASLt's FP8 products need K and N multiples of 16 (M=" +
                                        std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                        "); the model's widths are not");
        const Key key{M, N, K, (int)ct, (int)a_e5m2, (int)b_e5m2, accumulate, bias != nullptr};
        auto it = cache_.find(key);
        if (it == cache_.end()) it = cache_.emplace(key, build(key)).first;
        Entry& e = it->second;
        // cuBLASLt's A is our B and its B our A: their descales likewise.
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &descale_b,
                                                    sizeof(descale_b)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &descale_a,
                                                    sizeof(descale_a)));
        if (bias)
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
        CUBLAS_CHECK(cublasLtMatmul(handle_, e.desc, &alpha, B, e.la, A, e.lb, &beta, C, e.lc, C, e.lc, &e.algo,
                                    workspace_, workspace_bytes_, stream_));
    }

  private:
    // M, N, K, C's type, A e5m2, B e5m2, accumulate, bias
    using Key = std::tuple<int, int, int, int, int, int, bool, bool>;
    struct Entry {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        cublasLtMatmulAlgo_t algo{};
        void destroy() {
            if (desc) cublasLtMatmulDescDestroy(desc);
            if (la) cublasLtMatrixLayoutDestroy(la);
            if (lb) cublasLtMatrixLayoutDestroy(lb);
            if (lc) cublasLtMatrixLayoutDestroy(lc);
        }
    };
    Entry build(const Key& k) {
        const int M = std::get<0>(k), N = std::get<1>(k), K = std::get<2>(k);
        const cudaDataType_t ct = (cudaDataType_t)std::get<3>(k);
        const cudaDataType_t at = std::get<4>(k) ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
        const cudaDataType_t bt = std::get<5>(k) ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
        Entry e;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
        if (std::get<7>(k)) {
            const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof(ct)));
        }
        // Column-major: cuBLASLt's A = our B stored [N][K] (K x N, ld K, transposed
        // by op T), its B = our A stored [M][K] (K x M, ld K), D = C^T (N x M, ld N).
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.la, bt, K, N, K));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.lb, at, K, M, K));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.lc, ct, N, M, N));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes_, sizeof(workspace_bytes_)));
        cublasLtMatmulHeuristicResult_t r{};
        int found = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, e.desc, e.la, e.lb, e.lc, e.lc, pref, 1, &r, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        if (found == 0) {
            e.destroy();
            throw std::runtime_error("cuda fp8: cuBLASLt has no FP8 algorithm for M=" + std::to_string(M) + " N=" +
                                     std::to_string(N) + " K=" + std::to_string(K) +
                                     " (FP8 tensor cores: compute capability 8.9 or 9.0 and later)");
        }
        e.algo = r.algo;
        return e;
    }
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 0;
    cudaStream_t stream_ = nullptr;
    std::map<Key, Entry> cache_;
};

// The operands' scratch: six byte buffers of at most `elems` each (the
// input, weight and output gradient, and their transposes), the amax bits
// and the six scales, carved from one block of device memory.
struct Fp8Scratch {
    uint8_t *x, *w, *dy, *xt, *wt, *dyt;
    unsigned* bits;
    float* scales;  // [scale x, w, dy, descale x, w, dy]
    static size_t bytes(size_t elems) { return 6 * round_up(elems) + 256; }
    static size_t round_up(size_t n) { return (n + 255) / 256 * 256; }
    static Fp8Scratch carve(void* base, size_t elems) {
        uint8_t* p = static_cast<uint8_t*>(base);
        const size_t e = round_up(elems);
        Fp8Scratch s;
        s.x = p, s.w = p + e, s.dy = p + 2 * e, s.xt = p + 3 * e, s.wt = p + 4 * e, s.dyt = p + 5 * e;
        s.bits = reinterpret_cast<unsigned*>(p + 6 * e);
        s.scales = reinterpret_cast<float*>(p + 6 * e + 16);
        return s;
    }
};

// Backend::matmul_forward_fp8 on the device: amax [3] doubles (the model's).
template <typename E>
void matmul_forward_fp8(Fp8Gemm& g, const Fp8Scratch& s, E* out, const E* inp, const E* weight, const E* bias, int N,
                        int IC, int OC, const double* amax, cudaStream_t stream) {
    fp8_scales_kernel<<<1, 32, 0, stream>>>(s.scales, amax);
    CUDA_CHECK_LAUNCH();
    fp8_quantize<E>(s.x, inp, N, IC, s.scales + 0, false, false, stream);
    fp8_quantize<E>(s.w, weight, OC, IC, s.scales + 1, false, false, stream);
    g.run(out, cuda_dtype<E>(), s.x, false, s.w, false, N, OC, IC, s.scales + 3, s.scales + 4, false, bias);
}

// Backend::matmul_backward_fp8 on the device; the bias gradient is the
// caller's (from the unrounded gradient).
template <typename E>
void matmul_backward_fp8(Fp8Gemm& g, const Fp8Scratch& s, E* dinp, E* dweight, const E* dout, const E* inp,
                         const E* weight, int N, int IC, int OC, const double* amax, cudaStream_t stream) {
    fp8_scales_kernel<<<1, 32, 0, stream>>>(s.scales, amax);
    CUDA_CHECK_LAUNCH();
    // The output gradient both ways in one pass when both products run
    // (a split backward's B and W each quantise their own).
    if (dinp && dweight) fp8_quantize<E>(s.dyt, dout, N, OC, s.scales + 2, true, true, stream, s.dy);
    if (dinp) {  // dx[N, IC] = dy[N, OC] · (W^T)[IC, OC]^T
        if (!dweight) fp8_quantize<E>(s.dy, dout, N, OC, s.scales + 2, true, false, stream);
        fp8_quantize<E>(s.wt, weight, OC, IC, s.scales + 1, false, true, stream);
        g.run(dinp, cuda_dtype<E>(), s.dy, true, s.wt, false, N, IC, OC, s.scales + 5, s.scales + 4, false, nullptr);
    }
    if (!dweight) return;  // the input gradient alone (a split backward's B)
    // dW[OC, IC] += (dy^T)[OC, Np] · (x^T)[IC, Np]^T, N padded to Np with zeros
    if (!dinp) fp8_quantize<E>(s.dyt, dout, N, OC, s.scales + 2, true, true, stream);
    fp8_quantize<E>(s.xt, inp, N, IC, s.scales + 0, false, true, stream);
    g.run(dweight, cuda_dtype<E>(), s.dyt, true, s.xt, false, OC, IC, fp8_padded_k(N), s.scales + 5, s.scales + 3,
          true, nullptr);
}

template <typename E>
void activation_amax(bool swiglu, E* out, const E* a, const E* dout, int N, int H, unsigned* bits,
                     cudaStream_t stream) {
    if (swiglu && dout) swiglu_backward<E>(out, a, dout, N, H, stream, bits);
    else if (swiglu) swiglu_forward<E>(out, a, N, H, stream, bits);
    else if (dout) gelu_backward<E>(out, a, dout, (size_t)N * H, stream, bits);
    else gelu_forward<E>(out, a, (size_t)N * H, stream, bits);
}

// What the CUDA backend holds for the FP8 products: a cuBLASLt handle and
// workspace of their own, the products' descriptors, and the operands'
// scratch, all made by reserve() when the model stack is built (nothing is
// allocated between steps).
class Fp8Ops {
  public:
    ~Fp8Ops() {
        gemm_.destroy();
        if (handle_) cublasLtDestroy(handle_);
    }
    void reserve(size_t elems, cudaStream_t stream) {
        if (elems == 0) return;
        if (!handle_) {
            CUBLAS_CHECK(cublasLtCreate(&handle_));
            ws_.reserve(kWorkspace, stream);
            gemm_.init(handle_, ws_.get(kWorkspace, stream, "fp8 workspace"), kWorkspace, stream);
        }
        buf_.reserve(Fp8Scratch::bytes(elems), stream);
        elems_ = std::max(elems_, elems);
        stream_ = stream;
    }
    // The backend's ops, the element type from fp32 (bf16 otherwise).
    void amax(bool fp32, void* dst, const void* x, size_t n) {
        unsigned* b = scratch(0).bits;
        if (fp32) amax_to<float>(static_cast<double*>(dst), static_cast<const float*>(x), n, b, stream_);
        else amax_to<bf16>(static_cast<double*>(dst), static_cast<const bf16*>(x), n, b, stream_);
    }
    void forward(bool fp32, void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC,
                 const void* amax) {
        const Fp8Scratch s = scratch(std::max((size_t)N * IC, (size_t)OC * IC));
        const double* am = static_cast<const double*>(amax);
        if (fp32)
            matmul_forward_fp8<float>(gemm_, s, (float*)out, (const float*)inp, (const float*)w, (const float*)bias,
                                      N, IC, OC, am, stream_);
        else
            matmul_forward_fp8<bf16>(gemm_, s, (bf16*)out, (const bf16*)inp, (const bf16*)w, (const bf16*)bias, N,
                                     IC, OC, am, stream_);
    }
    // Backend::activation_amax: the GELU or SwiGLU kernel takes the max of
    // what it writes into the amax bits as it goes (no pass of its own).
    void activation(bool fp32, bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax) {
        unsigned* b = scratch(0).bits;
        CUDA_CHECK(cudaMemsetAsync(b, 0, sizeof(unsigned), stream_));
        if (fp32) activation_amax<float>(swiglu, (float*)out, (const float*)a, (const float*)dout, N, H, b, stream_);
        else activation_amax<bf16>(swiglu, (bf16*)out, (const bf16*)a, (const bf16*)dout, N, H, b, stream_);
        amax_store_kernel<<<1, 1, 0, stream_>>>(static_cast<double*>(amax), b);
        CUDA_CHECK_LAUNCH();
    }
    void delayed(void* amax, void* step_max, const void* hist, int len, bool record) {
        fp8_delayed_kernel<<<1, 1, 0, stream_>>>((double*)amax, (double*)step_max, (const double*)hist, len, record);
        CUDA_CHECK_LAUNCH();
    }
    void history_push(void* hist, void* step_max, int slots, int len, const void* figures, bool skip) {
        fp8_history_push_kernel<<<(unsigned)ceil_div(slots, 128), 128, 0, stream_>>>(
            (double*)hist, (double*)step_max, slots, len, (const double*)figures, skip);
        CUDA_CHECK_LAUNCH();
    }
    // The bias gradient (from the unrounded dout) with matmul.cuh's kernel
    // and its scratch (matmul_backward_scratch_floats).
    void backward(bool fp32, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                  int N, int IC, int OC, const void* amax, float* bias_scratch) {
        const size_t Np = (size_t)fp8_padded_k(N);  // the transposed copies' rows
        const Fp8Scratch s = scratch(std::max({Np * IC, (size_t)OC * IC, Np * OC}));
        const double* am = static_cast<const double*>(amax);
        if (fp32) {
            matmul_backward_fp8<float>(gemm_, s, (float*)dinp, (float*)dw, (const float*)dout, (const float*)inp,
                                       (const float*)w, N, IC, OC, am, stream_);
            if (dbias) bias_backward<float>((float*)dbias, (const float*)dout, N, OC, bias_scratch, stream_);
        } else {
            matmul_backward_fp8<bf16>(gemm_, s, (bf16*)dinp, (bf16*)dw, (const bf16*)dout, (const bf16*)inp,
                                      (const bf16*)w, N, IC, OC, am, stream_);
            if (dbias) bias_backward<bf16>((bf16*)dbias, (const bf16*)dout, N, OC, bias_scratch, stream_);
        }
    }

  private:
    static constexpr size_t kWorkspace = (size_t)32 << 20;
    Fp8Scratch scratch(size_t need) {
        if (need > elems_)
            throw std::runtime_error("cuda fp8: an operand of " + std::to_string(need) + " elements, more than the " +
                                     std::to_string(elems_) + " reserved (Workspace::fp8_elems)");
        return Fp8Scratch::carve(buf_.get(Fp8Scratch::bytes(elems_), stream_, "fp8 operands"), elems_);
    }
    cublasLtHandle_t handle_ = nullptr;
    GrowBuffer ws_, buf_;
    Fp8Gemm gemm_;
    size_t elems_ = 0;
    cudaStream_t stream_ = nullptr;
};

}  // namespace llmc_cuda
