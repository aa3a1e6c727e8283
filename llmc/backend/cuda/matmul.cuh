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
// The MLP's GELU may run in cuBLASLt's epilogues instead of its own kernels
// (matmul_gelu_forward, matmul_backward_gelu; the switch LLMC_GELU_FUSION in
// cuda/switches.h), the bias gradient in the BGRADB epilogue
// (LLMC_BIAS_GRAD_EPILOGUE), and the workspace size is LLMC_GEMM_WORKSPACE_MB.
//
// Parameters live at arbitrary element offsets of flat buffers, so pointers
// are not always 256-byte aligned (cuBLASLt's default assumption): the real
// alignment of every pointer goes into the heuristic query, and the chosen
// algorithm, with the descriptors, is cached per (shape, types, epilogue,
// alignments). If no algorithm accepts
// the bias epilogue, the bias is added by a separate kernel.
//
// The algorithm is the heuristic's first unless --matmul-tune chose another
// (llmc/backend/matmul_tuning.h): time_candidates times the heuristic's top
// candidates of each cached shape on its last call's operands, choose takes
// the ranks' agreed choices (by the candidates' ids, the same on every rank).
//
// dbias (+=) = column sums of dout: fp32 partials over row chunks with
// 16-byte loads, then a fixed-order column sum (no atomics; see
// bias_backward for why not cuBLASLt's BGRADB epilogue).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/elementwise.cuh"
#include "llmc/backend/cuda/switches.h"
#include "llmc/backend/matmul_tuning.h"
#include "llmc/base/fnv.h"

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

// What runs after the product, in cuBLASLt's epilogue. aux is the GELU input
// matrix: written by gelu_aux(_bias) (the forward keeps it for the
// backward), read by dgelu; it has D's shape and leading dimension.
struct Epilogue {
    enum Kind : int { none = 0, bias = 1, gelu_aux = 2, gelu_aux_bias = 3, dgelu = 4, bgradb = 5 };
    Kind kind = none;
    const void* bias_ptr = nullptr;
    const void* aux_ptr = nullptr;
};

inline cublasLtEpilogue_t cublaslt_epilogue(Epilogue::Kind k) {
    switch (k) {
        case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
        case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
        case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
        case Epilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADB;
        default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

class MatmulContext {
  public:
    // workspace_bytes: llmc_switch::parse_gemm_workspace (LLMC_GEMM_WORKSPACE_MB).
    void init(cudaStream_t stream, size_t workspace_bytes = (size_t)32 << 20) {
        stream_ = stream;
        workspace_bytes_ = workspace_bytes;
        CUBLAS_CHECK(cublasLtCreate(&handle_));
        CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
    }
    void destroy() {
        for (auto& kv : cache_) kv.second.destroy();
        cache_.clear();
        if (workspace_) cudaFree(workspace_);
        if (handle_) cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }
    cudaStream_t stream() const { return stream_; }
    size_t workspace_bytes() const { return workspace_bytes_; }
    // LLMC_BIAS_GRAD_EPILOGUE (cuda/switches.h): matmul_backward's bias
    // gradient from the BGRADB epilogue.
    bool bias_grad_epilogue = false;

    // Column-major D[m,n] = alpha·op(A)·op(B) + beta·D, then the epilogue
    // (bias[m] per row; GELU with its input kept in aux; or D times
    // GELU'(aux)). A is (transA ? k x m : m x k) with leading dimension lda;
    // B likewise (transB ? n x k : k x n), ldb; D and aux have ld m.
    // Returns false, doing nothing, when an epilogue is asked for but no
    // algorithm supports it here (the caller then runs the separate kernels).
    //
    // The descriptors, the layouts and the heuristic's algorithm are built
    // once per (shape, types, epilogue, alignments) and kept: a step calls
    // the same dozen shapes every layer, and building them is host work on
    // the launch path. Only the bias and aux pointers are set per call (the
    // key holds their alignment, which is what the algorithm depends on).
    template <typename E>
    bool gemm(E* D, const E* A, bool transA, int lda, const E* B, bool transB, int ldb, int m, int n, int k,
              float beta, const Epilogue& epi = Epilogue{}) {
        const cudaDataType_t dt = cuda_dtype<E>();
        const Key key{m, n, k, (int)transA, (int)transB, (int)dt, beta != 0.f, (int)epi.kind, lda, ldb,
                      ptr_alignment(A), ptr_alignment(B), ptr_alignment(D),
                      epi.bias_ptr ? ptr_alignment(epi.bias_ptr) : 0u, epi.aux_ptr ? ptr_alignment(epi.aux_ptr) : 0u};
        auto it = cache_.find(key);
        if (it == cache_.end()) {
            it = cache_.emplace(key, build<E>(key, epi)).first;
            if (!chosen_.empty()) take_choice(key, it->second);
        }
        Entry& e = it->second;
        if (!e.ok) {
            if (epi.kind != Epilogue::none) return false;
            std::fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d transA=%d transB=%d\n", m, n, k,
                         (int)transA, (int)transB);
            std::exit(1);
        }
        set_pointers(e.desc, epi);
        e.A = A, e.B = B, e.D = D, e.beta = beta, e.epi = epi, e.called = true;  // for time_candidates
        const float alpha = 1.f;
        CUBLAS_CHECK(cublasLtMatmul(handle_, e.desc, &alpha, A, e.la, B, e.lb, &beta, D, e.ld, D, e.ld,
                                    &e.result.algo, workspace_, workspace_bytes_, stream_));
        return true;
    }

    // What the timings hold for: the device and cuBLASLt's version.
    std::string scope(int device) const {
        cudaDeviceProp p;
        CUDA_CHECK(cudaGetDeviceProperties(&p, device));
        return std::string(p.name) + " (sm_" + std::to_string(p.major * 10 + p.minor) + "), cuBLASLt " +
               std::to_string(cublasLtGetVersion());
    }
    // Times up to `count` of the heuristic's candidates for every shape
    // called so far and not yet timed or chosen, each on the shape's last
    // call's operands (writing its outputs: Backend::time_matmul_candidates).
    std::vector<MatmulTrial> time_candidates(int count) {
        count_ = count;
        std::vector<MatmulTrial> out;
        cudaEvent_t t0, t1;
        CUDA_CHECK(cudaEventCreate(&t0));
        CUDA_CHECK(cudaEventCreate(&t1));
        for (auto& kv : cache_) {
            Entry& e = kv.second;
            if (!e.ok || !e.called || e.settled) continue;
            e.settled = true;
            e.candidates = heuristics(kv.first, e, count_);
            MatmulTrial t;
            t.shape = shape_text(kv.first);
            for (const cublasLtMatmulHeuristicResult_t& r : e.candidates) {
                t.ids.push_back(algo_id(r.algo));
                t.ms.push_back(time_one(e, r.algo, t0, t1));
            }
            if (!t.ids.empty()) out.push_back(std::move(t));
        }
        CUDA_CHECK(cudaEventDestroy(t0));
        CUDA_CHECK(cudaEventDestroy(t1));
        return out;
    }
    // Each listed shape runs its chosen algorithm from now on (shapes cached
    // later too, as they are built); returns how many cached ones changed.
    int choose(const MatmulChoices& choices) {
        for (const auto& kv : choices) chosen_[kv.first] = kv.second;
        int changed = 0;
        for (auto& kv : cache_) changed += take_choice(kv.first, kv.second);
        return changed;
    }

  private:
    // m, n, k, transA, transB, dtype, beta!=0, epilogue, lda, ldb, align A, B, D, bias, aux
    using Key = std::tuple<int, int, int, int, int, int, bool, int, int, int, uint32_t, uint32_t, uint32_t, uint32_t,
                           uint32_t>;
    struct Entry {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
        cublasLtMatmulHeuristicResult_t result{};
        bool ok = false;
        // The last call's operands (time_candidates runs the shape on them).
        const void *A = nullptr, *B = nullptr;
        void* D = nullptr;
        float beta = 0;
        Epilogue epi;
        bool called = false;
        bool settled = false;  // timed, or its algorithm chosen: not timed again
        std::vector<cublasLtMatmulHeuristicResult_t> candidates;  // the heuristic's, ranked, once asked for
        void destroy() {
            if (la) cublasLtMatrixLayoutDestroy(la);
            if (lb) cublasLtMatrixLayoutDestroy(lb);
            if (ld) cublasLtMatrixLayoutDestroy(ld);
            if (desc) cublasLtMatmulDescDestroy(desc);
        }
    };

    static void set_pointers(cublasLtMatmulDesc_t desc, const Epilogue& epi) {
        if (epi.bias_ptr)
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias_ptr,
                                                        sizeof(epi.bias_ptr)));
        if (epi.aux_ptr)
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi.aux_ptr,
                                                        sizeof(epi.aux_ptr)));
    }

    template <typename E>
    Entry build(const Key& key, const Epilogue& epi) {
        const int m = std::get<0>(key), n = std::get<1>(key), k = std::get<2>(key);
        const bool transA = std::get<3>(key), transB = std::get<4>(key);
        const int lda = std::get<8>(key), ldb = std::get<9>(key);
        const cudaDataType_t dt = cuda_dtype<E>();
        Entry e;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
        if (epi.kind != Epilogue::none) {
            const cublasLtEpilogue_t ep = cublaslt_epilogue(epi.kind);
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
        }
        if (epi.aux_ptr) {
            const int64_t aux_ld = m;  // the aux matrix is laid out as D
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        }
        // The pointers are set before the heuristic query: their alignment matters there.
        set_pointers(e.desc, epi);
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.la, dt, transA ? k : m, transA ? m : k, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.lb, dt, transB ? n : k, transB ? k : n, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.ld, dt, m, n, m));
        std::vector<cublasLtMatmulHeuristicResult_t> first = heuristics(key, e, 1);
        e.ok = !first.empty();
        if (e.ok) e.result = first[0];
        return e;
    }

    // The heuristic's best `count` algorithms for the entry's descriptors,
    // best first (fewer when it has fewer; none when it has none).
    std::vector<cublasLtMatmulHeuristicResult_t> heuristics(const Key& key, Entry& e, int count) {
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = workspace_bytes_;
        CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        const uint32_t alA = std::get<10>(key), alB = std::get<11>(key), alD = std::get<12>(key);
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA,
                                                          sizeof(alA)));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB,
                                                          sizeof(alB)));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alD,
                                                          sizeof(alD)));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alD,
                                                          sizeof(alD)));
        int found = 0;
        std::vector<cublasLtMatmulHeuristicResult_t> r((size_t)std::max(count, 1));
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, e.desc, e.la, e.lb, e.ld, e.ld, pref,
                                                                 (int)r.size(), r.data(), &found);
        cublasLtMatmulPreferenceDestroy(pref);
        r.resize(st == CUBLAS_STATUS_SUCCESS ? (size_t)std::max(found, 0) : 0);
        return r;
    }

    // The shape's text (MatmulTrial::shape): the same on every rank for the
    // same product.
    static std::string shape_text(const Key& k) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s m=%d n=%d k=%d op=%c%c beta=%d epi=%d ld=%d,%d align=%u,%u,%u,%u,%u",
                      std::get<5>(k) == (int)CUDA_R_16BF ? "bf16" : "fp32", std::get<0>(k), std::get<1>(k),
                      std::get<2>(k), std::get<3>(k) ? 'T' : 'N', std::get<4>(k) ? 'T' : 'N', (int)std::get<6>(k),
                      std::get<7>(k), std::get<8>(k), std::get<9>(k), std::get<10>(k), std::get<11>(k),
                      std::get<12>(k), std::get<13>(k), std::get<14>(k));
        return buf;
    }
    // An algorithm's id: cuBLASLt's algorithm number, then a hash of the
    // whole configuration (tile, stages, split, swizzle...), which the
    // heuristic fills in the same way on every rank of the same device.
    static std::string algo_id(const cublasLtMatmulAlgo_t& a) {
        int id = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
        const uint64_t h = fnv1a64(kFnvStart, &a, sizeof(a));  // over the configuration's bytes
        char buf[48];
        std::snprintf(buf, sizeof buf, "%d-%016llx", id, (unsigned long long)h);
        return buf;
    }
    // One candidate's time per call (ms): a first call (which also tells
    // whether it runs here at all: +inf if not), then kReps timed by events.
    float time_one(Entry& e, const cublasLtMatmulAlgo_t& algo, cudaEvent_t t0, cudaEvent_t t1) {
        constexpr int kReps = 5;
        set_pointers(e.desc, e.epi);
        const float alpha = 1.f;
        auto run = [&] {
            return cublasLtMatmul(handle_, e.desc, &alpha, e.A, e.la, e.B, e.lb, &e.beta, e.D, e.ld, e.D, e.ld, &algo,
                                  workspace_, workspace_bytes_, stream_) == CUBLAS_STATUS_SUCCESS;
        };
        if (!run()) return INFINITY;
        CUDA_CHECK(cudaEventRecord(t0, stream_));
        bool ok = true;
        for (int i = 0; i < kReps && ok; i++) ok = run();
        CUDA_CHECK(cudaEventRecord(t1, stream_));
        CUDA_CHECK(cudaEventSynchronize(t1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
        return ok ? ms / kReps : INFINITY;
    }
    // Gives the entry its chosen algorithm, if one is chosen for its shape
    // and the heuristic offers it here; 1 when that changed the algorithm.
    int take_choice(const Key& key, Entry& e) {
        auto c = chosen_.find(shape_text(key));
        if (!e.ok || c == chosen_.end()) return 0;
        e.settled = true;
        if (e.candidates.empty()) e.candidates = heuristics(key, e, count_);
        for (const cublasLtMatmulHeuristicResult_t& r : e.candidates)
            if (algo_id(r.algo) == c->second) {
                const bool changed = algo_id(e.result.algo) != c->second;
                e.result = r;
                return changed ? 1 : 0;
            }
        return 0;
    }

    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 0;
    cudaStream_t stream_ = 0;
    std::map<Key, Entry> cache_;
    MatmulChoices chosen_;  // --matmul-tune's choices, by shape text
    int count_ = 8;         // candidates asked of the heuristic
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
        ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, Epilogue{Epilogue::bias, bias, nullptr}))
        return;
    ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f);
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
    if (dinp) ctx.gemm<E>(dinp, weight, false, IC, dout, false, OC, IC, N, OC, 0.f);
    if (!dweight) {  // the input gradient alone (a split backward's B)
        if (dbias) bias_backward(dbias, dout, N, OC, scratch, ctx.stream());
        return;
    }
    if (dbias && ctx.bias_grad_epilogue) {
        // BGRADB sums B (dout) over the product's k (the N rows): the bias
        // gradient, overwritten into the scratch (at least OC floats, so
        // room for OC elements of E), then added to dbias (+=).
        E* fresh = reinterpret_cast<E*>(scratch);
        if (ctx.gemm<E>(dweight, inp, false, IC, dout, true, OC, IC, OC, N, 1.f,
                        Epilogue{Epilogue::bgradb, fresh, nullptr})) {
            residual_forward<E>(dbias, dbias, fresh, (size_t)OC, ctx.stream());
            return;
        }
    }
    ctx.gemm<E>(dweight, inp, false, IC, dout, true, OC, IC, OC, N, 1.f);
    if (dbias) bias_backward(dbias, dout, N, OC, scratch, ctx.stream());
}

// ---- the MLP's GELU in the epilogues (LLMC_GELU_FUSION, cuda/switches.h) ----------
// pre = inp·W^T + bias and out = GELU(pre), in one product when `fuse` and
// the epilogue's rules hold (llmc_switch::gelu_epilogue_fits): the GELU is
// taken of the fp32 accumulator plus bias, before the one rounding to E,
// while the separate kernels take it of pre already rounded to E (a
// difference of about one bf16 rounding). Otherwise, or when cuBLASLt has
// no algorithm for the epilogue, the product and then gelu_forward.
template <typename E>
void matmul_gelu_forward(MatmulContext& ctx, bool fuse, E* pre, E* out, const E* inp, const E* weight, const E* bias,
                         int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (fuse && llmc_switch::gelu_epilogue_fits((uintptr_t)out, (uintptr_t)pre, (uintptr_t)bias, OC)) {
        const Epilogue epi{bias ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux, bias, pre};
        if (ctx.gemm<E>(out, weight, true, IC, inp, false, IC, OC, N, IC, 0.f, epi)) return;
    }
    matmul_forward<E>(ctx, pre, inp, weight, bias, N, IC, OC);
    gelu_forward<E>(out, pre, (size_t)N * OC, ctx.stream());
}

// The backward of out = GELU(pre) followed by a Linear (the fcproj layer):
// dpre = GELU'(pre) ∘ (dout·W), dweight (+=) = dout^T·inp, dbias (+=) =
// column sums of dout. Fused, the input-gradient product applies GELU' in
// its epilogue (CUBLASLT_EPILOGUE_DGELU, pre as the aux input) and dpre is
// written once; else the product lands in dpre and gelu_backward rewrites
// it in place.
template <typename E>
void matmul_backward_gelu(MatmulContext& ctx, bool fuse, E* dpre, E* dweight, E* dbias, const E* dout, const E* inp,
                          const E* weight, const E* pre, int N, int IC, int OC, float* scratch) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    if (fuse && llmc_switch::gelu_epilogue_fits((uintptr_t)dpre, (uintptr_t)pre, 0, IC) &&
        ctx.gemm<E>(dpre, weight, false, IC, dout, false, OC, IC, N, OC, 0.f, Epilogue{Epilogue::dgelu, nullptr, pre})) {
        matmul_backward<E>(ctx, nullptr, dweight, dbias, dout, inp, weight, N, IC, OC, scratch);
        return;
    }
    matmul_backward<E>(ctx, dpre, dweight, dbias, dout, inp, weight, N, IC, OC, scratch);
    gelu_backward<E>(dpre, pre, dpre, (size_t)N * IC, ctx.stream());
}

}  // namespace llmc_cuda
