// llmc/backend/cuda/fp8.cuh: the FP8 products on Hopper (docs/fp8.md;
// Backend::matmul_forward_fp8 / _backward_fp8): each operand's amax, its
// scale from it on the device (no host sync), the operand rounded to e4m3 or
// e5m2 bytes by the conversion instruction (satfinite: the saturating
// round-to-nearest-even of llmc/backend/fp8.h), in the layout cuBLASLt's FP8
// products take, and the product through cuBLASLt with the two descale
// pointers, accumulated in fp32.
//
// The kernels' bodies and the order of a product's launches are in
// fp8_kernels.h, which the CPU's test runs on an emulated GPU; here they
// become CUDA kernels (a context of built-ins) and the products cuBLASLt's.
//
// Written without a GPU at hand: dev/cuda/fp8.cu checks it against the CPU's
// exact emulation (cpu_fp8.h); until a GPU has run it, docs/fp8.md says so.
#pragma once
#include <cuda_fp8.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "llmc/backend/backend.h"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/elementwise.cuh"
#include "llmc/backend/cuda/fp8_kernels.h"
#include "llmc/backend/cuda/matmul.cuh"
#include "llmc/backend/cuda/scratch.cuh"
#include "llmc/backend/cuda/swiglu.cuh"
#include "llmc/backend/fp8.h"

namespace llmc_cuda {

// fp8_kernels.h's context on the device: CUDA's built-ins.
struct Fp8Ctx {
    using Tile = uint8_t[fp8k::kTile + 1];
    Tile* tile_ = nullptr;
    __device__ int tx() const { return threadIdx.x; }
    __device__ int ty() const { return threadIdx.y; }
    __device__ int bx() const { return blockIdx.x; }
    __device__ int by() const { return blockIdx.y; }
    __device__ int bdx() const { return blockDim.x; }
    __device__ int gdx() const { return gridDim.x; }
    __device__ void sync() const { __syncthreads(); }
    __device__ Tile* tile() const { return tile_; }
    template <typename E>
    __device__ float to_f(E e) const { return to_float(e); }
    __device__ uint8_t fp8(float v, bool e5m2) const {
        return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
    }
    __device__ void warp_max_commit(unsigned* bits, unsigned m) const { warp_amax_commit(bits, m); }
};

template <typename E>
__global__ void amax_bits_kernel(unsigned* out, const E* x, size_t n) {
    Fp8Ctx c;
    fp8k::amax_body(c, out, x, n);
}
__global__ void amax_store_kernel(double* dst, const unsigned* bits) { *dst = (double)fp8::float_of_bits(*bits); }

// bits: one unsigned of scratch.
template <typename E>
void amax_to(double* dst, const E* x, size_t n, unsigned* bits, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(unsigned), stream));
    if (n > 0) amax_bits_kernel<E><<<fp8k::amax_blocks(n), fp8k::kAmaxThreads, 0, stream>>>(bits, x, n);
    amax_store_kernel<<<1, 1, 0, stream>>>(dst, bits);
    CUDA_CHECK_LAUNCH();
}

__global__ void fp8_scales_kernel(float* sc, const double* amax, Fp8Delayed d, const double* wamax) {
    fp8k::scales_one(sc, amax, threadIdx.x, d, wamax);
}

// Delayed scaling's bookkeeping (fp8.h's, as the CPU's): a handful of numbers.
__global__ void fp8_delayed_kernel(double* amax, double* step_max, const double* hist, int len, bool record) {
    fp8::delayed(amax, step_max, hist, len, record);
}
__global__ void fp8_history_push_kernel(double* hist, double* step_max, int slots, int len, const double* figures,
                                        bool skip) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= slots) return;
    const bool push = fp8::history_pushes(figures, step_figure::skip, skip);
    fp8::history_push_one(hist + (size_t)i * len, step_max + i, len, push);
}

template <typename E>
__global__ void fp8_quantize_kernel(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2,
                                    bool transpose, int ld, uint8_t* plain, const double* skip_hist, int skip_len) {
    __shared__ uint8_t tile[fp8k::kTile][fp8k::kTile + 1];
    Fp8Ctx c{tile};
    fp8k::quantize_body(c, q, x, rows, cols, scale, e5m2, transpose, ld, plain, skip_hist, skip_len);
}

// The quantising copy (fp8k::quantize_body); plain (with transpose only):
// the same bytes untransposed, in the same pass; pre (or null): nothing to
// do on the device when the op that wrote x cast it (fp8k::cast_body).
template <typename E>
void fp8_quantize(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2, bool transpose,
                  cudaStream_t stream, uint8_t* plain = nullptr, const fp8k::Precast* pre = nullptr) {
    if (rows <= 0 || cols <= 0) return;
    const fp8k::QuantizeGrid g = fp8k::quantize_grid(rows, cols, transpose);
    fp8_quantize_kernel<E><<<dim3(g.gx, g.gy), dim3(fp8k::kTile, fp8k::kTileRows), 0, stream>>>(
        q, x, rows, cols, scale, e5m2, transpose, g.ld, transpose ? plain : nullptr, pre ? pre->hist : nullptr,
        pre ? pre->len : 0);
    CUDA_CHECK_LAUNCH();
}

// The MLP's activation as fp8k::cast_body's op: element (r, c) of its output
// (GELU's or SwiGLU's, forward or backward), computed as gelu_* and
// swiglu_* compute it, rounded to E, stored (st), and returned as rounded;
// SwiGLU's backward gives both its gradients, dgate at c and dup at H + c,
// from one read.
template <typename E>
struct ActivationCast {
    E* out;
    const E* a;     // GELU's input [N, H]; SwiGLU's [N, 2H] (gate | up)
    const E* dout;  // the backward's [N, H] (null: the forward)
    int H;
    bool swiglu;
    __device__ int halves() const { return swiglu && dout ? 2 : 1; }
    __device__ static float store(E* p, float v, bool st) {  // the value as rounded
        const E e = from_float<E>(v);
        if (st) *p = e;
        return to_float(e);
    }
    __device__ void operator()(int r, int c, float* f, bool st) const {
        const size_t i = (size_t)r * H + c;  // (GELU's backward may write over dout: read first)
        if (!swiglu) {
            const float v = dout ? gelu_grad(to_float(a[i])) * to_float(dout[i]) : gelu_value(to_float(a[i]));
            f[0] = store(out + i, v, st);
            return;
        }
        const size_t gi = (size_t)r * 2 * H + c;
        const float g = to_float(a[gi]), u = to_float(a[gi + H]);
        if (!dout) {
            f[0] = store(out + i, g * sigmoidf_(g) * u, st);
            return;
        }
        const float dy = to_float(dout[i]), sg = sigmoidf_(g);
        f[0] = store(out + gi, dy * u * sg * (1.f + g * (1.f - sg)), st);
        f[1] = store(out + gi + H, dy * g * sg, st);
    }
};

// fp8k::NormCast's conversions on the device.
template <typename E>
struct DeviceCvt {
    __device__ static float f(E e) { return to_float(e); }
    __device__ static E e(float v) { return from_float<E>(v); }
};

// The cast of an op's output (ActivationCast, fp8k::NormCast) by fp8k::cast_body.
template <class Op>
__global__ void fp8_cast_kernel(const Op op, int rows, int cols, const double* hist, int len, bool e5m2,
                                uint8_t* q, bool transpose, int ld, uint8_t* plain, bool keep, unsigned* bits) {
    __shared__ uint8_t tile[fp8k::kTile][fp8k::kTile + 1];
    Fp8Ctx c{tile};
    fp8k::cast_body(c, op, rows, cols, hist, len, e5m2, q, transpose, ld, plain, keep, bits);
}

__global__ void fp8_kept_copy_kernel(uint8_t* dst, const uint8_t* src, size_t n, const double* hist, int len) {
    Fp8Ctx c;
    fp8k::kept_copy_body(c, dst, src, n, hist, len);
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

// fp8k::forward / backward's executor on the device: the kernels above on
// `stream`, the products through g.
template <typename E>
struct Fp8Exec {
    Fp8Gemm& g;
    cudaStream_t stream;
    void scales(float* sc, const double* amax, const Fp8Delayed* d, const double* wamax) {
        fp8_scales_kernel<<<1, 32, 0, stream>>>(sc, amax, d ? *d : Fp8Delayed{}, wamax);
        CUDA_CHECK_LAUNCH();
    }
    void quantize(uint8_t* q, const E* x, int rows, int cols, const float* scale, bool e5m2, bool transpose,
                  uint8_t* plain, const fp8k::Precast* pre) {
        fp8_quantize<E>(q, x, rows, cols, scale, e5m2, transpose, stream, plain, pre);
    }
    void kept_copy(uint8_t* dst, const uint8_t* src, size_t n, const fp8k::Precast* pre) {
        fp8_kept_copy_kernel<<<fp8k::amax_blocks(n), fp8k::kAmaxThreads, 0, stream>>>(dst, src, n, pre->hist, pre->len);
        CUDA_CHECK_LAUNCH();
    }
    void gemm(E* C, const uint8_t* A, bool a_e5m2, const uint8_t* B, bool b_e5m2, int M, int N, int K,
              const float* descale_a, const float* descale_b, bool accumulate, const E* bias) {
        g.run(C, cuda_dtype<E>(), A, a_e5m2, B, b_e5m2, M, N, K, descale_a, descale_b, accumulate, bias);
    }
};

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
    // e: Workspace::fp8_elems, each operand buffer's bytes in Scratch::Sizes' order (x, w, dy, xt, wt, dyt).
    void reserve(const size_t* e, cudaStream_t stream) { reserve(fp8k::Scratch::Sizes::of(e), stream); }
    void reserve(const fp8k::Scratch::Sizes& z, cudaStream_t stream) {
        if (!z.any()) return;
        if (!handle_) {
            CUBLAS_CHECK(cublasLtCreate(&handle_));
            ws_.reserve(kWorkspace, stream);
            gemm_.init(handle_, ws_.get(kWorkspace, stream, "fp8 workspace"), kWorkspace, stream);
        }
        sizes_.cover(z);
        buf_.reserve(fp8k::Scratch::bytes(sizes_), stream);
        stream_ = stream;
    }
    // The backend's ops, the element type from fp32 (bf16 otherwise).
    void amax(bool fp32, void* dst, const void* x, size_t n) {
        unsigned* b = scratch({}).bits;
        if (fp32) amax_to<float>(static_cast<double*>(dst), static_cast<const float*>(x), n, b, stream_);
        else amax_to<bf16>(static_cast<double*>(dst), static_cast<const bf16*>(x), n, b, stream_);
    }
    void forward(bool fp32, void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC,
                 const void* amax, const Fp8Delayed* delayed = nullptr, const Fp8Weight* wq = nullptr) {
        const fp8k::Scratch s = scratch(fp8k::forward_sizes(N, IC, OC));
        const double* am = static_cast<const double*>(amax);
        const fp8k::Precast* pre = take_precast(inp, false, (size_t)N * IC);
        if (fp32) {
            Fp8Exec<float> ex{gemm_, stream_};
            fp8k::forward(ex, s, (float*)out, (const float*)inp, (const float*)w, (const float*)bias, N, IC, OC, am,
                          pre, delayed, wq);
        } else {
            Fp8Exec<bf16> ex{gemm_, stream_};
            fp8k::forward(ex, s, (bf16*)out, (const bf16*)inp, (const bf16*)w, (const bf16*)bias, N, IC, OC, am, pre,
                          delayed, wq);
        }
    }
    // An op whose kernels take the max of what they write into the amax
    // bits as they go, op(bits) (no pass of its own: Backend::activation_amax,
    // norm_amax, norm_backward_amax), then the amax stored as a double
    // (amax null: not wanted, a recompute's cast; the bits are scratch).
    template <typename Op>
    void measured(void* amax, Op op) {
        unsigned* b = scratch({}).bits;
        if (amax) CUDA_CHECK(cudaMemsetAsync(b, 0, sizeof(unsigned), stream_));
        op(b);
        if (!amax) return;
        amax_store_kernel<<<1, 1, 0, stream_>>>(static_cast<double*>(amax), b);
        CUDA_CHECK_LAUNCH();
    }
    void activation(bool fp32, bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                    const Fp8Cast* cast = nullptr) {
        if (cast) return activation_cast(fp32, swiglu, out, a, dout, N, H, amax, *cast);
        measured(amax, [&](unsigned* b) {
            if (fp32) activation_amax<float>(swiglu, (float*)out, (const float*)a, (const float*)dout, N, H, b, stream_);
            else activation_amax<bf16>(swiglu, (bf16*)out, (const bf16*)a, (const bf16*)dout, N, H, b, stream_);
        });
    }
    // Delayed scaling's fused cast (fp8k::cast_body): the activation writes
    // the next product's operand in FP8 too, into the scratch where that
    // product's quantiser would (forward: fcproj's input in s.x; backward:
    // fc's output gradient in s.dy, and s.dyt when transposed), and the next
    // product on `out` skips those quantisers on the device; without
    // cast.keep, `out` itself is then not written. A forward's cast.kept
    // takes the transposed copy for the layer's weight gradient, beside the
    // plain one in s.x (none without cast.plain: a recompute's).
    void activation_cast(bool fp32, bool swiglu, void* out, const void* a, const void* dout, int N, int H, void* amax,
                         const Fp8Cast& cast) {
        const bool bwd = dout != nullptr;
        const int halves = swiglu && bwd ? 2 : 1;  // (SwiGLU's backward: H wide, 2 values each)
        cast_op(fp32, out, bwd, N, halves * H, halves, amax, cast, [&](auto tag) {
            using E = decltype(tag);
            return ActivationCast<E>{(E*)out, (const E*)a, (const E*)dout, H, swiglu};
        });
    }
    // The same for a block's norm, forward (QKV's and fc's input): `stats`
    // launches the norm's kernel for the residual and the row statistics
    // alone (out null), then the cast computes the output from them
    // (fp8k::NormCast), its amax, and the plain and kept copies.
    template <class Stats>
    void norm_cast(bool fp32, bool rms, void* out, const void* x, const void* mean, const void* rstd, const void* w,
                   const void* bias, int N, int C, void* amax, const Fp8Cast& cast, Stats stats) {
        if (!cast.kept || !cast.plain || !rstd || (!rms && (!mean || !bias)))
            throw std::logic_error("cuda fp8: a norm's cast writes the plain and the kept copies from the statistics");
        if (rms) mean = nullptr;  // (NormCast: RMSNorm's formula without one)
        stats();
        cast_op(fp32, out, false, N, C, 1, amax, cast, [&](auto tag) {
            using E = decltype(tag);
            return fp8k::NormCast<E, DeviceCvt<E>>{(E*)out, (const E*)x, (const float*)mean, (const float*)rstd,
                                                   (const E*)w, (const E*)bias, C};
        });
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
    // kept (or null): the weight gradient's x^T from the forward's cast (Fp8Kept).
    void backward(bool fp32, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                  int N, int IC, int OC, const void* amax, float* bias_scratch, const Fp8Kept* kept = nullptr,
                  const Fp8Delayed* delayed = nullptr, const Fp8Weight* wq = nullptr) {
        const fp8k::Scratch s = scratch(fp8k::backward_sizes(N, IC, OC));
        const double* am = static_cast<const double*>(amax);
        const fp8k::Precast* pre = take_precast(dout, true, (size_t)N * OC);
        if (fp32) {
            Fp8Exec<float> ex{gemm_, stream_};
            fp8k::backward(ex, s, (float*)dinp, (float*)dw, (const float*)dout, (const float*)inp, (const float*)w, N,
                           IC, OC, am, pre, kept, delayed, wq);
            if (dbias) bias_backward<float>((float*)dbias, (const float*)dout, N, OC, bias_scratch, stream_);
        } else {
            Fp8Exec<bf16> ex{gemm_, stream_};
            fp8k::backward(ex, s, (bf16*)dinp, (bf16*)dw, (const bf16*)dout, (const bf16*)inp, (const bf16*)w, N, IC,
                           OC, am, pre, kept, delayed, wq);
            if (dbias) bias_backward<bf16>((bf16*)dbias, (const bf16*)dout, N, OC, bias_scratch, stream_);
        }
    }

  private:
    static constexpr size_t kWorkspace = (size_t)32 << 20;
    // The operand the last cast wrote (cast_op: an activation's, a norm's), for the very
    // next product only: any product call takes it, and only one whose
    // operand is that tensor, the same way round and size, uses it.
    struct Pending {
        const void* ptr = nullptr;
        bool backward = false;
        size_t elems = 0;
        fp8k::Precast pre{};
    };
    Pending pending_, taken_;
    const fp8k::Precast* take_precast(const void* operand, bool backward, size_t elems) {
        taken_ = pending_;
        pending_ = Pending{};
        const bool match = taken_.ptr && taken_.ptr == operand && taken_.backward == backward && taken_.elems == elems;
        return match ? &taken_.pre : nullptr;
    }
    // An op's output cast (cast_body) over N rows of `cols` (halves blocks
    // side by side), the op from make(element tag): forward, the plain copy
    // into s.x for the next product and with cast.kept the transposed one
    // there; backward, s.dy, and s.dyt when transposed.
    template <class Make>
    void cast_op(bool fp32, void* out, bool bwd, int N, int cols, int halves, void* amax, const Fp8Cast& cast,
                 Make make) {
        const bool tr = bwd ? cast.transposed : cast.kept != nullptr;
        const bool plain = bwd || cast.plain;  // a copy in the scratch for the next product
        const fp8k::QuantizeGrid g = fp8k::quantize_grid(N, cols / halves, tr);
        fp8k::Scratch::Sizes need;  // (forward: the plain copy, or the copy; backward: dy, and dy^T)
        if (!bwd) need.x = tr && !plain ? 0 : (size_t)N * cols;
        else need.dy = (size_t)N * cols, need.dyt = tr ? (size_t)g.ld * cols : 0;
        const fp8k::Scratch s = scratch(need);
        const double* hist = static_cast<const double*>(cast.history);
        uint8_t* q = !bwd ? (tr ? static_cast<uint8_t*>(cast.kept) : s.x) : tr ? s.dyt : s.dy;
        uint8_t* both = !tr || !plain ? nullptr : bwd ? s.dy : s.x;  // the plain copy beside the transposed one
        auto launch = [&](auto tag, unsigned* b) {
            fp8_cast_kernel<<<dim3(g.gx, g.gy), dim3(fp8k::kTile, fp8k::kTileRows), 0, stream_>>>(
                make(tag), N, cols, hist, cast.len, bwd, q, tr, g.ld, both, cast.keep, b);
            CUDA_CHECK_LAUNCH();
        };
        measured(amax, [&](unsigned* b) { fp32 ? launch(float{}, b) : launch(bf16{}, b); });
        pending_ = plain ? Pending{out, bwd, (size_t)N * cols, {hist, cast.len, bwd && tr}} : Pending{};
    }
    fp8k::Scratch scratch(const fp8k::Scratch::Sizes& need) {
        auto str = [](const fp8k::Scratch::Sizes& z) {
            return std::to_string(z.x) + "/" + std::to_string(z.w) + "/" + std::to_string(z.dy) + "/" +
                   std::to_string(z.xt) + "/" + std::to_string(z.wt) + "/" + std::to_string(z.dyt);
        };
        if (!sizes_.holds(need))
            throw std::runtime_error("cuda fp8: operands of " + str(need) + " bytes (x/w/dy/xt/wt/dyt), more than the " +
                                     str(sizes_) + " reserved (Workspace::fp8_elems)");
        return fp8k::Scratch::carve(buf_.get(fp8k::Scratch::bytes(sizes_), stream_, "fp8 operands"), sizes_);
    }
    cublasLtHandle_t handle_ = nullptr;
    GrowBuffer ws_, buf_;
    Fp8Gemm gemm_;
    fp8k::Scratch::Sizes sizes_;
    cudaStream_t stream_ = nullptr;
};

}  // namespace llmc_cuda
