// llmc/backend/backend_cuda.cu: the Backend on one CUDA device.
//
// Precision (backend.h): by default bf16 parameters, gradients and activations, fp32 master weights, Adam m/v
// and per-row statistics; the fp32 build keeps everything in fp32 (no master copy) so kernels can be checked
// tightly against the CPU backend. Ops dispatch to llmc/backend/cuda/*.cuh with E = bf16 or float. All work goes
// to one stream owned by the backend (cuBLASLt included), so ops run in call order; transfers synchronise it,
// converting on the device through a fixed staging buffer (cuda/staging.cuh). The kernels' temporary memory is
// in scratch buffers the model stack reserves once (reserve_workspace, cuda/scratch.cuh, cuda/workspace.h):
// nothing is allocated or freed between steps, and bytes_in_use() is the model's own buffers. Switches come from
// the environment once (cuda/switches.h).
#include "llmc/backend/backend_cuda.h"

#include <algorithm>
#include <new>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "llmc/backend/cuda/adamw.cuh"
#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc.cuh"
#include "llmc/backend/cuda/classifier.cuh"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/encoder.cuh"
#include "llmc/backend/cuda/elementwise.cuh"
#include "llmc/backend/cuda/event_marks.cuh"
#include "llmc/backend/cuda/fp8.cuh"
#include "llmc/backend/cuda/graphs.cuh"
#include "llmc/backend/cuda/matmul.cuh"
#include "llmc/backend/cuda/moe.cuh"
#include "llmc/backend/cuda/global_norm.cuh"
#include "llmc/backend/cuda/norms.cuh"
#include "llmc/backend/cuda/rope.cuh"
#include "llmc/backend/cuda/scratch.cuh"
#include "llmc/backend/cuda/staging.cuh"
#include "llmc/backend/cuda/step_figures.cuh"
#include "llmc/backend/cuda/swiglu.cuh"
#include "llmc/backend/cuda/workspace.h"

using llmc_cuda::bf16;
using llmc_cuda::device_convert;
using llmc_cuda::GrowBuffer;
namespace {

class CudaBackend final : public Backend {
  public:
    CudaBackend(int device, bool fp32) : device_(device), fp32_(fp32) {
        CUDA_CHECK(cudaSetDevice(device_));
        // A blocking stream: work queued on the legacy default stream (a communicator's copies) stays ordered.
        CUDA_CHECK(cudaStreamCreate(&stream_));
        std::string err;  // the optimization switches (cuda/switches.h), read once
        size_t workspace = 0;
        bool bgrad = false; llmc_switch::AttnWg attn_wg;  // LLMC_ATTN_WG: cuda/attention_wg.cuh reads it; checked here
        if (!llmc_switch::parse_gelu_fusion(std::getenv("LLMC_GELU_FUSION"), &gelu_fusion_, &err) ||
            !llmc_switch::parse_gemm_workspace(std::getenv("LLMC_GEMM_WORKSPACE_MB"), &workspace, &err) ||
            !llmc_switch::parse_on_off("LLMC_BIAS_GRAD_EPILOGUE", std::getenv("LLMC_BIAS_GRAD_EPILOGUE"), &bgrad, &err) ||
            !llmc_switch::parse_on_off("LLMC_CUDA_GRAPH", std::getenv("LLMC_CUDA_GRAPH"), &graphs_.on, &err) ||
            !llmc_switch::parse_attn_wg(std::getenv("LLMC_ATTN_WG"), &attn_wg, &err) ||
            !llmc_switch::check_attention_switches(std::getenv("LLMC_ATTN_BWD"), std::getenv("LLMC_ATTN_TC"), &err))
            throw std::runtime_error("cuda backend: " + err);
        mm_.init(stream_, workspace);
        mm_.bias_grad_epilogue = bgrad;
        staging_.reserve(kStagingElems * dtype_size(DType::F64), stream_);
        cudaDeviceProp p;
        CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
        fp8_capable_ = p.major * 10 + p.minor >= 89;
    }
    ~CudaBackend() override {
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);
        graphs_.release();
        marks_.release();
        for (auto& kv : sizes_) cudaFree(kv.first);
        scratch_.release();
        staging_.release();
        enc_.release();
        adam_table_.release();
        sumsq_.release(), late_[0].release(), late_[1].release();
        mm_.destroy();
        cudaStreamDestroy(stream_);
    }
    const char* name() const override { return "cuda"; }
    Precision precision() const override {
        if (fp32_) return {DType::F32, DType::F32, DType::F32, false, DType::F32, DType::F32, DType::F32};
        return {DType::BF16, DType::BF16, DType::F32, true, DType::F32, DType::BF16, DType::F32};
    }
    // Norm and bias gradients, attention's dk/dv, encoder backward and the norm sum add in an order fixed by the
    // shapes (no float atomics), but cuBLASLt's algorithm choice may not give the same bits on every run.
    bool deterministic() const override { return false; }
    // ---- memory ---------------------------------------------------------------------
    // The GPU's free memory, shared by the ranks that run on it (local ranks are dealt to the GPUs in turn).
    size_t free_memory(int local_ranks) const override {
        activate();
        size_t free = 0, total = 0;
        int gpus = 1;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess || cudaGetDeviceCount(&gpus) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        const int sharing = std::max(1, (local_ranks + gpus - 1) / std::max(1, gpus));
        return free / (size_t)sharing;
    }
    void* alloc(size_t bytes) override {
        activate();
        if (over_budget(bytes)) throw std::bad_alloc();
        void* p = nullptr;
        if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
            (void)cudaGetLastError();  // out of memory is not sticky: clear it and report it the C++ way
            throw std::bad_alloc();
        }
        if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
        sizes_[p] = bytes;
        in_use_ += bytes;
        peak_ = std::max(peak_, in_use_);
        return p;
    }
    void release(void* p) override {
        if (!p) return;
        activate();
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued work may still use p
        auto it = sizes_.find(p);
        if (it != sizes_.end()) in_use_ -= it->second, sizes_.erase(it);
        CUDA_CHECK(cudaFree(p));
    }
    void* alloc_host(size_t bytes) override { return activate(), llmc_cuda::pinned_alloc(bytes); }
    void release_host(void* p) override { activate(), llmc_cuda::pinned_free(p); }
    void zero(void* p, size_t bytes) override {
        activate();
        if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        activate();
        if (bytes && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    void upload(void* dst, DType dt, const void* host_src, DType st, size_t n) override {
        activate();
        if (n == 0) return;
        if (dt == st) {
            CUDA_CHECK(cudaMemcpyAsync(dst, host_src, n * dtype_size(st), cudaMemcpyHostToDevice, stream_));
        } else {
            llmc_cuda::check_float_pair(dt, st);
            for (size_t i0 = 0; i0 < n; i0 += kStagingElems) {
                const size_t c = std::min(kStagingElems, n - i0);
                void* stg = staging_.get(std::min(n, kStagingElems) * dtype_size(DType::F64), stream_, "staging");
                CUDA_CHECK(cudaMemcpyAsync(stg, elem_ptr(host_src, st, i0), c * dtype_size(st),
                                           cudaMemcpyHostToDevice, stream_));
                device_convert(elem_ptr(dst, dt, i0), dt, stg, st, c, stream_);
            }
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free or reuse host_src
    }
    void download(void* host_dst, DType dt, const void* src, DType st, size_t n) override {
        activate();
        if (n == 0) return;
        if (dt == st) {
            CUDA_CHECK(cudaMemcpyAsync(host_dst, src, n * dtype_size(st), cudaMemcpyDeviceToHost, stream_));
        } else {
            llmc_cuda::check_float_pair(dt, st);
            for (size_t i0 = 0; i0 < n; i0 += kStagingElems) {
                const size_t c = std::min(kStagingElems, n - i0);
                void* stg = staging_.get(std::min(n, kStagingElems) * dtype_size(DType::F64), stream_, "staging");
                device_convert(stg, dt, elem_ptr(src, st, i0), st, c, stream_);
                CUDA_CHECK(cudaMemcpyAsync(elem_ptr(host_dst, dt, i0), stg, c * dtype_size(dt),
                                           cudaMemcpyDeviceToHost, stream_));
            }
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void convert(void* dst, DType dt, const void* src, DType st, size_t n) override {
        activate();
        if (dt != st) llmc_cuda::check_float_pair(dt, st);
        device_convert(dst, dt, src, st, n, stream_);
    }
    void synchronize() override {
        activate();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(cudaGetLastError());
    }
    size_t bytes_in_use() const override { return in_use_; }
    size_t bytes_peak() const override { return peak_; }
    // Every scratch buffer at the size of the stack's largest call; from here on none of them allocates.
    void reserve_workspace(const Workspace& w) override {
        activate();
        scratch_.reserve(llmc_idx::scratch_bytes(w, llmc_cuda::attention_bwd_fused_enabled()), stream_);
        llmc_cuda::encoder_backward_reserve(enc_, w.rows, w.seq, w.channels, w.vocab_rows, stream_);
        adam_table_.reserve(w.runs, stream_);
        sumsq_.reserve(w.runs, w.run_elems, stream_);
        fp8_.reserve(w.fp8_elems, stream_);
    }
    // ---- model ops --------------------------------------------------------------------
    void encoder_forward(void* out, const int* tokens, const int* pos, const void* wte, const void* wpe, int B,
                         int T, int C, int v_begin, int v_end) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::encoder_forward<E>(ptr<E>(out), tokens, pos, cptr<E>(wte), cptr<E>(wpe), B, T, C, v_begin,
                                          v_end, stream_);
        });
    }
    void encoder_backward(void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos, int B, int T,
                          int C, int v_begin, int v_end) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::encoder_backward<E>(ptr<E>(dwte), ptr<E>(dwpe), cptr<E>(dout), tokens, pos, B, T, C, v_begin,
                                           v_end, enc_, stream_);
        });
    }
    // ---- the norms (cuda/norms.cuh; Llama's RMSNorm); stats fp32; with --fp8 (norm_amax,
    // norm_backward_amax) their kernels take the amax of what they write (fp8.cuh's measured).
    void layernorm_forward(void* out, void* mean, void* rstd, const void* inp, const void* w, const void* b, int N,
                           int C) override {
        norm_k(false, nullptr, out, mean, rstd, inp, nullptr, w, b, N, C, 0, nullptr); }
    void residual_layernorm_forward(void* residual, void* out, void* mean, void* rstd, const void* a, const void* b,
                                    const void* w, const void* bias, int N, int C) override {
        norm_k(false, residual, out, mean, rstd, a, b, w, bias, N, C, 0, nullptr); }
    void rmsnorm_forward(void* out, void* rstd, const void* inp, const void* w, int N, int C, double eps) override {
        norm_k(true, nullptr, out, nullptr, rstd, inp, nullptr, w, nullptr, N, C, eps, nullptr); }
    void residual_rmsnorm_forward(void* residual, void* out, void* rstd, const void* a, const void* b, const void* w,
                                  int N, int C, double eps) override {
        norm_k(true, residual, out, nullptr, rstd, a, b, w, nullptr, N, C, eps, nullptr); }
    void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C) override {
        norm_bwd_k(false, dinp, dw, db, dout, inp, w, mean, rstd, N, C, nullptr); }
    void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const void* rstd,
                          int N, int C) override {
        norm_bwd_k(true, dinp, dw, nullptr, dout, inp, w, nullptr, rstd, N, C, nullptr); }
    void norm_amax(bool rms, void* res, void* out, void* mean, void* rstd, const void* a, const void* b, const void* w,
                   const void* bias, int N, int C, double eps, void* amax, const Fp8Cast* cast) override {
        auto k = [&](void* o, unsigned* m) { norm_k(rms, res, o, mean, rstd, a, b, w, bias, N, C, eps, m); };
        if (!cast) return activate(), fp8_.measured(amax, [&](unsigned* m) { k(out, m); });
        activate(), fp8_.norm_cast(fp32_, rms, out, b ? res : a, mean, rstd, w, bias, N, C, amax, *cast,
                                   [&] { k(nullptr, nullptr); });  // (the kernel leaves the residual and statistics)
    }
    void norm_backward_amax(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                            const void* mean, const void* rstd, int N, int C, void* amax) override {
        activate(), fp8_.measured(amax, [&](unsigned* m) { norm_bwd_k(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C, m); });
    }
    void rope(void* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
              bool inverse) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::rope<E>(ptr<E>(x), row_stride, heads, HS, pos, B, T, theta, inverse, stream_);
        });
    }
    void swiglu_forward(void* out, const void* gu, int N, int H) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::swiglu_forward<E>(ptr<E>(out), cptr<E>(gu), N, H, stream_);
        });
    }
    void swiglu_backward(void* dgu, const void* gu, const void* dout, int N, int H) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::swiglu_backward<E>(ptr<E>(dgu), cptr<E>(gu), cptr<E>(dout), N, H, stream_);
        });
    }
    // ---- Mixtral (cuda/moe.cuh: the element type from fp32_); probabilities and dw are fp32 (stat); with
    // --sync-free the groups' sizes and the routing figures stay on the device (moe_expert_matmul_*, figures).
    void moe_route(void* p, void* tw, int* ti, int* off, int* perm, int* inv, const void* lg, int N, int NE, int K,
                   const void* bias) override {
        activate(), llmc_cuda::moe_route(fp32_, p, tw, ti, off, perm, inv, lg, N, NE, K, bias, stream_); }
    void moe_route_backward(void* dl, const void* p, const int* topi, const void* dw, const void* aux, int N, int NE,
                            int K) override {
        activate(), llmc_cuda::moe_route_backward(fp32_, dl, p, topi, dw, aux, N, NE, K, stream_); }
    void moe_dispatch(void* xg, void* dw, const void* x, const void* yg, const void* w, const int* inv, int N, int K,
                      int C) override {
        activate(), llmc_cuda::moe_dispatch(fp32_, xg, dw, x, yg, w, inv, N, K, C, stream_); }
    void moe_combine(void* out, const void* yg, const void* w, const int* inv, int N, int K, int C) override {
        activate(), llmc_cuda::moe_combine(fp32_, out, yg, w, inv, N, K, C, stream_); }
    void moe_expert_matmul_forward(void* y, const void* x, const void* w, const int* off, int R, int NE, int IC,
                                   int OC) override {
        activate(), llmc_cuda::moe_expert_matmul_forward(fp32_, y, x, w, off, R, NE, IC, OC, stream_); }
    void moe_expert_matmul_backward(void* dx, void* dw, const void* dy, const void* x, const void* w, const int* off,
                                    int R, int NE, int IC, int OC) override {
        activate(), llmc_cuda::moe_expert_matmul_backward(fp32_, dx, dw, dy, x, w, off, R, NE, IC, OC, stream_); }
    void moe_route_stats(void* st, void* ld, const void* p, const int* off, int N, int NE) override {
        activate(), llmc_cuda::moe_route_stats(st, ld, p, off, N, NE, stream_); }
    void moe_aux_loss(void* g, void* aux, void* st, int NE, double LN, double k) override {
        activate(), llmc_cuda::moe_aux_loss(g, aux, st, NE, LN, k, stream_); }
    void moe_balance(void* f, void* b, void* b64, void* ld, int L, int NE, double div, double rate) override {
        activate(), llmc_cuda::moe_balance(f, b, b64, ld, L, NE, div, rate, stream_); }
    // ---- FP8 products (cuda/fp8.cuh), on FP8 tensor cores (compute capability 8.9 and later).
    int fp8() const override { return fp8_capable_ ? 16 : 0; }  // cuBLASLt's FP8 products
    void amax_to(void* dst, const void* x, DType, size_t n) override { activate(), fp8_.amax(fp32_, dst, x, n); }
    void fp8_delayed(void* a, void* s, const void* h, int n, bool r) override { activate(), fp8_.delayed(a, s, h, n, r); }
    void fp8_history_push(void* h, void* s, int n, int len, const void* f, bool skip) override {
        activate(), fp8_.history_push(h, s, n, len, f, skip); }
    void activation_amax(bool sw, void* o, const void* a, const void* d, int N, int H, void* am, const Fp8Cast* c)
        override { activate(), fp8_.activation(fp32_, sw, o, a, d, N, H, am, c); }
    void matmul_forward_fp8(void* y, const void* x, const void* w, const void* b, int N, int IC, int OC, const void* am,
                            const Fp8Delayed* d, const Fp8Weight* q) override {
        activate(), fp8_.forward(fp32_, y, x, w, b, N, IC, OC, am, d, q); }
    void matmul_backward_fp8(void* dx, void* dw, void* db, const void* dy, const void* x, const void* w, int N, int IC,
                             int OC, const void* am, const Fp8Kept* k, const Fp8Delayed* d, const Fp8Weight* q) override {
        const size_t nsc = db ? llmc_cuda::matmul_backward_scratch_floats(N, OC) : 0;
        activate(), fp8_.backward(fp32_, dx, dw, db, dy, x, w, N, IC, OC, am, scratch_floats(nsc, "fp8 dbias"), k, d,
                                  q); }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::matmul_forward<E>(mm_, ptr<E>(out), cptr<E>(inp), cptr<E>(weight), cptr<E>(bias), N, IC, OC);
        });
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                         const void* weight, int N, int IC, int OC) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            float* scratch =
                dbias ? scratch_floats(llmc_cuda::matmul_backward_scratch_floats(N, OC), "matmul_backward") : nullptr;
            llmc_cuda::matmul_backward<E>(mm_, ptr<E>(dinp), ptr<E>(dweight), ptr<E>(dbias), cptr<E>(dout),
                                          cptr<E>(inp), cptr<E>(weight), N, IC, OC, scratch);
        });
    }
    void matmul_gelu_forward(void* pre, void* out, const void* inp, const void* weight, const void* bias, int N,
                             int IC, int OC) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::matmul_gelu_forward<E>(mm_, gelu_fusion_ != llmc_switch::GeluFusion::none, ptr<E>(pre),
                                              ptr<E>(out), cptr<E>(inp), cptr<E>(weight), cptr<E>(bias), N, IC, OC);
        });
    }
    void matmul_backward_gelu(void* dpre, void* dweight, void* dbias, const void* dout, const void* inp,
                              const void* weight, const void* pre, int N, int IC, int OC) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            float* scratch =
                dbias ? scratch_floats(llmc_cuda::matmul_backward_scratch_floats(N, OC), "matmul_backward") : nullptr;
            llmc_cuda::matmul_backward_gelu<E>(mm_, gelu_fusion_ == llmc_switch::GeluFusion::both, ptr<E>(dpre),
                                               ptr<E>(dweight), ptr<E>(dbias), cptr<E>(dout), cptr<E>(inp),
                                               cptr<E>(weight), cptr<E>(pre), N, IC, OC, scratch);
        });
    }
    void add_bias(void* out, const void* bias, int N, int OC) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::add_bias<E>(ptr<E>(out), cptr<E>(bias), N, OC, stream_);
        });
    }
    void gelu_forward(void* out, const void* inp, size_t n) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::gelu_forward<E>(ptr<E>(out), cptr<E>(inp), n, stream_);
        });
    }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::gelu_backward<E>(ptr<E>(dinp), cptr<E>(inp), cptr<E>(dout), n, stream_);
        });
    }
    void residual_forward(void* out, const void* a, const void* b, size_t n) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::residual_forward<E>(ptr<E>(out), cptr<E>(a), cptr<E>(b), n, stream_);
        });
    }
    // Gradients have the activation type in both precisions (bf16 or fp32).
    void accumulate(void* dst, const void* src, size_t n) override { residual_forward(dst, dst, src, n); }
    void* native_stream() override { return stream_; }
    // Attention: bf16 with head size 64 or 128 (16-byte aligned rows) on tensor cores (cuda/attention_tc.cuh),
    // the rest (or LLMC_ATTN_TC=0) on the CUDA-core kernels (cuda/attention.cuh). Both take the document
    // mask; the one-kernel backward (LLMC_ATTN_BWD=5) does not, so masked calls keep the two kernels.
    static bool use_tc(const AttnShape& s, std::initializer_list<const void*> ptrs) {
        return llmc_cuda::attention_tc_enabled() && llmc_cuda::attention_tc_supported(s, ptrs);
    }
    void attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                           const AttnShape& s) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            if constexpr (std::is_same<E, bf16>::value) {
                if (use_tc(s, {out, q, k, v})) {
                    llmc_cuda::attention_forward_tc(ptr<E>(out), ptr<float>(lse), cptr<E>(q), cptr<E>(k), cptr<E>(v),
                                                    s, stream_);
                    return;
                }
            }
            llmc_cuda::attention_forward<E>(ptr<E>(out), ptr<float>(lse), cptr<E>(q), cptr<E>(k), cptr<E>(v), s,
                                            stream_);
        });
    }
    void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                            const void* v, const void* out, const void* lse, const AttnShape& s) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            if constexpr (std::is_same<E, bf16>::value) {
                if (use_tc(s, {dq, dk, dv, dout, q, k, v, out})) {
                    // the same D vector, or LLMC_ATTN_BWD=5's fp32 dq accumulator
                    float* scratch =
                        scratch_floats(llmc_cuda::attention_backward_tc_scratch_floats(s), "attention_backward");
                    llmc_cuda::attention_backward_tc(ptr<E>(dq), ptr<E>(dk), ptr<E>(dv), cptr<E>(dout), cptr<E>(q),
                                                     cptr<E>(k), cptr<E>(v), cptr<E>(out), cptr<float>(lse), s,
                                                     scratch, stream_);
                    return;
                }
            }
            float* scratch = scratch_floats(llmc_cuda::attention_backward_scratch_floats(s), "attention_backward");
            llmc_cuda::attention_backward<E>(ptr<E>(dq), ptr<E>(dk), ptr<E>(dv), cptr<E>(dout), cptr<E>(q),
                                             cptr<E>(k), cptr<E>(v), cptr<E>(out), cptr<float>(lse), s, scratch,
                                             stream_);
        });
    }
    // Ring attention: running out/lse and block gradients fp32 (stat); q, k, v, dout, out the activation type.
    void attention_block_forward(void* out_acc, void* lse_acc, const void* q, const void* k, const void* v,
                                 const AttnShape& s, bool first) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            if constexpr (std::is_same<E, bf16>::value) {
                if (use_tc(s, {out_acc, q, k, v})) {
                    llmc_cuda::attention_block_forward_tc(ptr<float>(out_acc), ptr<float>(lse_acc), cptr<E>(q),
                                                          cptr<E>(k), cptr<E>(v), s, first, stream_);
                    return;
                }
            }
            llmc_cuda::attention_block_forward<E>(ptr<float>(out_acc), ptr<float>(lse_acc), cptr<E>(q), cptr<E>(k),
                                                  cptr<E>(v), s, first, stream_);
        });
    }
    void attention_block_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                  const void* v, const void* out, const void* lse, const AttnShape& s) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            float* scratch = scratch_floats(llmc_cuda::attention_backward_scratch_floats(s), "attention_backward");
            if constexpr (std::is_same<E, bf16>::value) {
                if (use_tc(s, {dq, dk, dv, dout, q, k, v, out})) {
                    llmc_cuda::attention_block_backward_tc(ptr<float>(dq), ptr<float>(dk), ptr<float>(dv),
                                                           cptr<E>(dout), cptr<E>(q), cptr<E>(k), cptr<E>(v),
                                                           cptr<E>(out), cptr<float>(lse), s, scratch, stream_);
                    return;
                }
            }
            llmc_cuda::attention_block_backward<E>(ptr<float>(dq), ptr<float>(dk), ptr<float>(dv), cptr<E>(dout),
                                                   cptr<E>(q), cptr<E>(k), cptr<E>(v), cptr<E>(out),
                                                   cptr<float>(lse), s, scratch, stream_);
        });
    }
    // Pitches and widths in elements of t; one strided copy on the stream.
    void copy2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t rows, size_t cols,
                DType t) override {
        activate();
        if (rows == 0 || cols == 0) return;
        const size_t es = dtype_size(t);
        if (rows == 1) {  // pitches then do not matter (cudaMemcpy2D would insist they be >= the width)
            if (dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, cols * es, cudaMemcpyDeviceToDevice, stream_));
            return;
        }
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch * es, src, src_pitch * es, cols * es, rows,
                                     cudaMemcpyDeviceToDevice, stream_));
    }
    void softmax_crossentropy(void* logits, void* losses, const int* targets, double dloss, int N, int V, int Vp,
                              bool write_grad) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::softmax_crossentropy<E>(ptr<E>(logits), ptr<float>(losses), targets, (float)dloss, N, V, Vp,
                                               write_grad, stream_);
        });
    }
    // Vocab-parallel cross-entropy: logits the activation type; row_max, target_logit, sumexp, losses fp32.
    void crossentropy_stats(const void* logits, const int* targets, void* row_max, void* target_logit, int N, int Vl,
                            int v_begin, int V) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::crossentropy_stats<E>(cptr<E>(logits), targets, ptr<float>(row_max), ptr<float>(target_logit),
                                             N, Vl, v_begin, V, stream_);
        });
    }
    void crossentropy_sumexp(const void* logits, const void* row_max, void* sumexp, int N, int Vl, int v_begin,
                             int V) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::crossentropy_sumexp<E>(cptr<E>(logits), cptr<float>(row_max), ptr<float>(sumexp), N, Vl,
                                              v_begin, V, stream_);
        });
    }
    void crossentropy_finish(void* logits, void* losses, const int* targets, const void* row_max, const void* sumexp,
                             const void* target_logit, double dloss, int N, int Vl, int v_begin, int V,
                             bool write_grad) override {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::crossentropy_finish<E>(ptr<E>(logits), ptr<float>(losses), targets, cptr<float>(row_max),
                                              cptr<float>(sumexp), cptr<float>(target_logit), (float)dloss, N, Vl,
                                              v_begin, V, write_grad, stream_);
        });
    }
    // ---- optimizer ---------------------------------------------------------------------
    void adamw_update(void* param, void* master, const void* grad, void* m, void* v, size_t n,
                      const AdamArgs& a) override {
        dispatch([&](auto tag) {
            llmc_cuda::adamw_update_any<decltype(tag)>(param, ptr<float>(master), grad, m, v, n, a, stream_);
        });
    }
    // One launch for every run (cuda/adamw.cuh); the piece table stays on the device while the runs repeat.
    void adamw_update_multi(const AdamSpan* spans, int count, const AdamArgs& a) override {
        dispatch([&](auto tag) { adam_table_.update_spans<decltype(tag)>(spans, count, a, pieces_, stream_); });
    }
    double sum_squares(const void* x, DType t, size_t n) override {
        activate();
        double* scratch = static_cast<double*>(
            scratch_.get(llmc_cuda::sum_squares_scratch_doubles(n) * sizeof(double), stream_, "sum_squares"));
        switch (t) {
            case DType::F32: return llmc_cuda::sum_squares(cptr<float>(x), n, scratch, stream_);
            case DType::BF16: return llmc_cuda::sum_squares(cptr<bf16>(x), n, scratch, stream_);
            case DType::F64: return llmc_cuda::sum_squares(cptr<double>(x), n, scratch, stream_);
            default: throw std::invalid_argument("cuda sum_squares: unsupported type");
        }
    }
    // One launch over every run, one synchronisation (cuda/global_norm.cuh).
    double sum_squares_multi(const SumSpan* spans, int count, DType t) override {
        activate();
        switch (t) {
            case DType::F32: return sumsq_.run<float>(spans, count, stream_);
            case DType::BF16: return sumsq_.run<bf16>(spans, count, stream_);
            case DType::F64: return sumsq_.run<double>(spans, count, stream_);
            default: throw std::invalid_argument("cuda sum_squares_multi: unsupported type");
        }
    }
    // The step's figures on the device (cuda/step_figures.cuh, global_norm.cuh).
    void sum_to_figure(void* acc, const void* x, DType t, size_t n, double d) override {
        activate(), llmc_cuda::sum_to_figure(acc, x, t, n, d, stream_);
    }
    void sum_squares_to(void* dst, const SumSpan* sp, int k, DType t, const void* add) override {
        activate(), sumsq_.run_to(dst, sp, k, t, add, stream_);
    }
    void step_verdict(void* f, const StepVerdict& v) override { activate(), llmc_cuda::step_verdict(f, v, stream_); }
    void download_late(int k, const void* src, int n) override { activate(), late_[k & 1].start(src, n, stream_); }
    void wait_late(int k, double* dst) override { activate(), late_[k & 1].wait(dst); }
    // ---- recorded regions: CUDA graphs under LLMC_CUDA_GRAPH=1 (cuda/graphs.cuh) ----------
    bool region_replay(uint64_t key) override { return activate(), graphs_.replay(key, stream_); }
    bool region_begin(uint64_t key) override { return activate(), graphs_.begin(key, stream_); }
    void region_end() override { activate(), graphs_.end(stream_); }
    RegionStats region_stats() const override { return {graphs_.on, graphs_.recorded(), graphs_.replays()}; }
    // ---- matmul algorithms: cuBLASLt's candidates, timed (cuda/matmul.cuh) ---------------------
    std::string matmul_scope() const override { return activate(), mm_.scope(device_); }
    std::vector<MatmulTrial> time_matmul_candidates(int n) override { return activate(), mm_.time_candidates(n); }
    int choose_matmul_algorithms(const MatmulChoices& c) override { return activate(), graphs_.release(), mm_.choose(c); }
    // Timing marks: events on the stream (cuda/event_marks.cuh).
    int mark() override { return activate(), marks_.mark(stream_); }
    double mark_ms(int a, int b) override { return marks_.ms(a, b); }
    void clear_marks() override { marks_.clear(); }
  private:
    static constexpr size_t kStagingElems = (size_t)1 << 20;  // per transfer chunk (8 MiB of fp64)
    template <typename E> static E* ptr(void* p) { return static_cast<E*>(p); }
    template <typename E> static const E* cptr(const void* p) { return static_cast<const E*>(p); }
    void activate() const { CUDA_CHECK(cudaSetDevice(device_)); }  // several backends may share a process
    // Call fn with a value of the element type of this build.
    template <typename Fn>
    void dispatch(Fn&& fn) {
        activate();
        fp32_ ? fn(float{}) : fn(bf16{});
    }
    // The norms by kind (cuda/norms.cuh; b: after the residual add), bits their amax (or null).
    void norm_k(bool rms, void* res, void* o, void* m, void* r, const void* a, const void* b, const void* w,
                const void* bias, int N, int C, double eps, unsigned* bits) {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            llmc_cuda::norm_forward<E>(rms, ptr<E>(res), ptr<E>(o), ptr<float>(m), ptr<float>(r), cptr<E>(a),
                                       cptr<E>(b), cptr<E>(w), cptr<E>(bias), N, C, eps, stream_, bits);
        });
    }
    void norm_bwd_k(bool rms, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                    const void* m, const void* r, int N, int C, unsigned* bits) {
        dispatch([&](auto tag) {
            using E = decltype(tag);
            float* sc = scratch_floats(llmc_cuda::norm_backward_scratch_floats(rms, N, C), "norm_backward");
            llmc_cuda::norm_backward<E>(rms, ptr<E>(dinp), ptr<E>(dw), ptr<E>(db), cptr<E>(dout), cptr<E>(inp),
                                        cptr<E>(w), cptr<float>(m), cptr<float>(r), N, C, sc, stream_, bits);
        });
    }
    float* scratch_floats(size_t n, const char* what) {
        return static_cast<float*>(scratch_.get(n * sizeof(float), stream_, what));
    }
    int device_;
    bool fp32_;
    cudaStream_t stream_ = nullptr;
    llmc_cuda::MatmulContext mm_;
    llmc_cuda::Fp8Ops fp8_;
    bool fp8_capable_ = false;  // FP8 tensor cores
    llmc_switch::GeluFusion gelu_fusion_ = llmc_switch::GeluFusion::none;
    llmc_cuda::EncoderBackwardScratch enc_;
    llmc_cuda::AdamMultiTable adam_table_;
    llmc_cuda::SumSqMulti sumsq_;
    llmc_cuda::LateDownload late_[2];  // the step's figures, one step late
    llmc_cuda::StepGraphs graphs_;
    llmc_cuda::EventMarks marks_;
    std::vector<llmc_cuda::AdamPiece> pieces_;  // reused host array of adamw_update_multi
    GrowBuffer scratch_, staging_;
    std::unordered_map<void*, size_t> sizes_;
    size_t in_use_ = 0, peak_ = 0;
};
}  // namespace

Backend* make_cuda_backend(int device_index, bool fp32) {
    const int n = cuda_device_count();
    if (device_index < 0 || device_index >= n)
        throw std::runtime_error("cuda backend: device " + std::to_string(device_index) + " not available (" +
                                 std::to_string(n) + " CUDA device(s) found)");
    return new CudaBackend(device_index, fp32);
}
