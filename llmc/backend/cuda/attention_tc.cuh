// llmc/backend/cuda/attention_tc.cuh: softmax attention on tensor cores for bf16
// activations and head sizes 64 and 128 (FlashAttention-2 style, sm_80 and
// up): forward (out, lse), backward (dq, dk, dv) and the ring-attention block
// ops, with the layout and stride conventions of backend.h AttnShape. The
// kernel bodies live in attention_tc_kernels.h, attention_tc_kernels_bwd.h
// and attention_tc_kernels_bwd_fused.h (shared with a CPU emulation in
// tests/unit/test_mma_layout.cpp); this file holds the PTX context, the __global__ wrappers, the launchers and the
// dispatch test. Other head sizes, fp32 activations and unaligned layouts use
// attention.cuh (CUDA cores).
//
// Instructions. mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: a warp
// multiplies a 16x16 bf16 A by a 16x8 bf16 B into 16x8 fp32 accumulators.
// Operands reach registers through ldmatrix.sync.aligned.m8n8.x4(.trans).b16
// (four 8x8 matrices per instruction, one row address per lane) from shared
// memory that cp.async (16 bytes per thread, zero-fill past the last row)
// filled straight from global memory. Fragment layouts (PTX ISA 9.7.14.5.8;
// mma_layout.h spells them out): with g = lane/4 and t = lane%4, a lane holds
// A rows g and g+8, columns 2t, 2t+1 and 8+2t, 8+2t+1; B columns (n) g, rows
// (k) 2t, 2t+1, 8+2t, 8+2t+1; C rows g and g+8, columns 2t, 2t+1. Three
// ldmatrix patterns cover every operand: A from a row-major [m][k] tile
// (Q, dout, K, V as left operands), B from an [n][k] tile without transpose
// (K for Q·K^T, V for dout·V^T, Q and dout for the transposed products of the
// dk/dv kernel) and B from a [k][n] tile with .trans (V for P·V, K for dS·K,
// dout and Q for P^T·dout and dS^T·Q). Shared rows are padded to D+8 bf16
// (16 bytes more than the row), so the 8 rows of one ldmatrix matrix hit 8
// distinct bank groups: no bank conflicts, no swizzle arithmetic.
//
// The key register trick (FlashAttention-2): the fp32 accumulators of two
// adjacent 16x8 score tiles are, element for element, the A fragment of the
// 16x16 tile they form (mma_layout.h c_to_a). So P (or dS) is rounded to
// bf16 and fed to the next product without touching shared memory.
//
// Forward (one block = 4 warps = BM query rows of one (b, h); BM = 128 for
// HS 64 (two 16-row m-tiles per warp: each K/V fragment read from shared
// memory feeds two mma), 64 for HS 128 (registers: O alone is 64 fp32 per
// lane)). Q is loaded once and kept as A fragments; K/V stream through
// shared memory in 64-row tiles, double-buffered (tile kt+1 loads while tile
// kt computes). Per tile and warp: S = Q·K^T (fp32), masking (keys >= Tk;
// causal j > i) only on tiles that cross a boundary, then the online softmax
// in the log2 domain: scores are multiplied by scale·log2(e) once, the row
// max m and sum l are updated as m' = max(m, rowmax), l' = l·2^(m-m') +
// Σ 2^(s-m'), O' = O·2^(m-m') + P·V. The row statistics of a row live in the
// 4 lanes of a quad (2 shuffles reduce them); l stays a per-lane partial sum
// until the end. The epilogue divides by l and writes out (bf16 pairs) and
// lse = (m + log2 l)·ln 2, or merges into ring attention's fp32 running
// (out, lse) by log-sum-exp. Causal blocks run longest first; tiles after
// the diagonal are never loaded, and a warp whose rows all precede a tile
// skips it.
//
// Backward (FlashAttention-2 algebra): D_i = dout_i·out_i (a small kernel,
// attention.cuh's), P = exp(S - lse) recomputed from q, k and lse, dP =
// dout·V^T, dS = P∘(dP - D); dv = P^T·dout, dk = scale·dS^T·q, dq =
// scale·dS·k. Deterministic, no atomics and no T x T buffer: one kernel per
// 64-key tile accumulates dk and dv over the query tiles (it computes S^T =
// K·Q^T and dP^T = V·dout^T, so the warp's keys are the rows and P^T, dS^T
// are directly the A operands of dv and dk; lse and D of each query tile are
// staged in shared memory), and one kernel per 64-query tile accumulates dq
// over the key tiles (recomputing S and dP). The price of determinism is
// that S and dP are computed twice: 7 matrix products where FlashAttention-2
// with fp32 atomics on dq needs 5 (the lab still counts 2.5x the forward's
// FLOPs, the usual convention, so its TFLOP/s is comparable). The plain
// backward overwrites bf16 dq, dk, dv; the ring block backward adds into
// fp32 ones (+=).
//
// LLMC_ATTN_BWD=5 (off by default) swaps in a one-kernel backward for head
// size 64 (attention_tc_kernels_bwd_fused.h): 5 products instead of 7, dq summed
// with fp32 atomics (not bitwise reproducible run to run), D folded into the
// kernel, 128-query tiles in a 3-stage cp.async ring. Plain, ring and GQA
// shapes all take it; head size 128 keeps the two kernels.
//
// Grouped-query attention (AttnShape::NKV): query head h reads key/value head
// h / (NH / NKV). The forward and dq kernels offset their K/V reads by that
// head; the dk/dv kernel runs one block per 64-key tile and key/value head
// and iterates over (query head of the group, query tile) pairs in a fixed
// order, the double buffering running on across heads, so dk and dv sum the
// group in registers and are written once (deterministic, no atomics).
// Without GQA the group is one head and the kernels do what they did.
//
// Registers (ptxas -v, sm_90, no spills; see docs/attention.md): HS 64 keeps
// Q (forward, dq) or K and V (dk/dv) as A fragments in registers; HS 128
// re-reads them from shared memory at each k-step to stay under 255.
#pragma once
#include <cstdlib>
#include <initializer_list>

#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc_kernels.h"
#include "llmc/backend/cuda/attention_tc_kernels_bwd.h"
#include "llmc/backend/cuda/attention_tc_kernels_bwd_fused.h"
#include "llmc/backend/cuda/attention_wg.cuh"
#include "llmc/backend/cuda/common.cuh"

namespace llmc_cuda {
namespace attn_tc_dev {

using attn_tc::TcParams;
using mma_layout::RC;

extern __shared__ uint4 tc_smem[];

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The PTX executor of attention_tc_kernels.h (see the context contract there).
struct DevCtx {
    __device__ __forceinline__ int tid() const { return threadIdx.x; }
    __device__ __forceinline__ int bx() const { return blockIdx.x; }
    __device__ __forceinline__ int by() const { return blockIdx.y; }
    __device__ __forceinline__ void* smem() const { return tc_smem; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    __device__ __forceinline__ void cp_async16(void* s, const void* g, bool ok) const {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s)),
                     "l"(__cvta_generic_to_global(g)), "r"(ok ? 16 : 0)
                     : "memory");
    }
    __device__ __forceinline__ void cp_commit() const { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
    __device__ __forceinline__ void cp_wait_all() const { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
    __device__ __forceinline__ void cp_wait(int n) const {  // n is a constant after inlining
        if (n <= 0)
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        else if (n == 1)
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else
            asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    }
    __device__ __forceinline__ void atomic_add(float* p, float x) const { atomicAdd(p, x); }
    __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) const {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(p)));
    }
    __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const uint16_t* p) const {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(p)));
    }
    __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ float shfl_xor(float x, int m) const { return __shfl_xor_sync(0xffffffffu, x, m); }
    __device__ __forceinline__ float shfl(float x, int src) const { return __shfl_sync(0xffffffffu, x, src); }
};

// mma.sync, ldmatrix and cp.async need sm_80; older targets get a trap (the
// dispatcher never launches these there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TC_ARCH_OK 1
#else
#define TC_ARCH_OK 0
#endif

// Two blocks of 128 threads per SM: the 255-register cap either way, and the
// launch bound under which ptxas places these kernels without spills.
#ifndef TC_MINB
#define TC_MINB 2
#endif

template <int D, int MT, int BN, typename O, bool kMerge, bool kDoc>
__global__ void __launch_bounds__(attn_tc::kThreads, TC_MINB)
    fwd_kernel(O* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v, TcParams p) {
#if TC_ARCH_OK
    DevCtx cx;
    attn_tc::fwd_body<DevCtx, D, MT, BN, O, kMerge, kDoc>(cx, out, lse, q, k, v, p);
#else
    __trap();
#endif
}

template <int D, int BN, bool kARegs, typename G, bool kAcc, bool kDoc>
__global__ void __launch_bounds__(attn_tc::kThreads, TC_MINB)
    dq_kernel(G* dq, const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* lse,
              const float* Dvec, TcParams p) {
#if TC_ARCH_OK
    DevCtx cx;
    attn_tc::dq_body<DevCtx, D, BN, kARegs, G, kAcc, kDoc>(cx, dq, dout, q, k, v, lse, Dvec, p);
#else
    __trap();
#endif
}

template <int D, int BQ, bool kARegs, typename G, bool kAcc, bool kDoc>
__global__ void __launch_bounds__(attn_tc::kThreads, TC_MINB)
    dkdv_kernel(G* dk, G* dv, const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                const float* lse, const float* Dvec, TcParams p) {
#if TC_ARCH_OK
    DevCtx cx;
    attn_tc::dkdv_body<DevCtx, D, BQ, kARegs, G, kAcc, kDoc>(cx, dk, dv, dout, q, k, v, lse, Dvec, p);
#else
    __trap();
#endif
}

// The one-kernel backward (attention_tc_kernels_bwd_fused.h): a block of 64 keys
// per (key tile, b * KVH + kv head); one block per SM at its shared memory.
template <int BQ, int STAGES, bool kFoldD, typename G, bool kAcc>
__global__ void __launch_bounds__(attn_tc::kThreads, 1)
    bwd_fused_kernel(float* dq_acc, size_t dq_bs, size_t dq_rs, G* dk, G* dv, const uint16_t* dout, const uint16_t* q,
                const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse, const float* Dvec,
                TcParams p) {
#if TC_ARCH_OK
    DevCtx cx;
    attn_tc::bwd_fused_body<DevCtx, 64, BQ, STAGES, kFoldD, G, kAcc>(cx, dq_acc, dq_bs, dq_rs, dk, dv, dout, q, k, v, out,
                                                                 lse, Dvec, p);
#else
    __trap();
#endif
}

// The kernels see bf16 as raw bits (attention_tc_kernels.h compiles without
// CUDA headers); fp32 stays fp32.
template <typename T>
struct Raw {
    using type = T;
};
template <>
struct Raw<bf16> {
    using type = uint16_t;
};
template <typename T>
typename Raw<T>::type* raw(T* p) {
    return reinterpret_cast<typename Raw<T>::type*>(p);
}
inline const uint16_t* raw(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }

// O: bf16 (plain forward) or float (ring block forward).
template <int D, typename O, bool kMerge>
void forward_launch(O* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnShape& s,
                    cudaStream_t st) {
    using Cfg = attn_tc::TcConfig<D>;
    using F = attn_tc::FwdCfg<D, Cfg::kFwdMT, Cfg::kFwdBN>;
    // The document mask in its own instantiation (the plain one keeps its registers).
    auto kern = s.doc_start ? fwd_kernel<D, Cfg::kFwdMT, Cfg::kFwdBN, typename Raw<O>::type, kMerge, true>
                            : fwd_kernel<D, Cfg::kFwdMT, Cfg::kFwdBN, typename Raw<O>::type, kMerge, false>;
    allow_smem(kern, F::smem_bytes);
    const dim3 grid((unsigned)ceil_div(s.Tq, F::BM), (unsigned)(s.B * s.NH));
    kern<<<grid, attn_tc::kThreads, F::smem_bytes, st>>>(raw(out), lse, raw(q), raw(k), raw(v),
                                                         attn_tc::tc_params(s));
    CUDA_CHECK_LAUNCH();
}

// G: bf16 (plain backward, overwrite) or float (ring block backward, +=).
// scratch: attention_backward_scratch_floats(s) floats for D.
template <int D, typename G, bool kAcc>
void backward_launch(G* dq, G* dk, G* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* out, const float* lse, const AttnShape& s, float* Dvec, cudaStream_t st) {
    using Cfg = attn_tc::TcConfig<D>;
    using Q = attn_tc::DqCfg<D, Cfg::kDqBN>;
    using K = attn_tc::DkvCfg<D, Cfg::kDkvBQ>;
    using GR = typename Raw<G>::type;
    const TcParams p = attn_tc::tc_params(s);
    const size_t rows = (size_t)s.B * s.Tq * s.NH;
    if (rows > 0) {
        const int block = 256;
        attn::dot_do_o_kernel<bf16>
            <<<(unsigned)ceil_div(rows, block / 32), block, 0, st>>>(Dvec, dout, out, s, attn::strides(s));
        CUDA_CHECK_LAUNCH();
    }
    if (s.Tq > 0) {
        auto kern = p.doc ? dq_kernel<D, Cfg::kDqBN, Cfg::kDqARegs, GR, kAcc, true>
                          : dq_kernel<D, Cfg::kDqBN, Cfg::kDqARegs, GR, kAcc, false>;
        allow_smem(kern, Q::smem_bytes);
        const dim3 grid((unsigned)ceil_div(s.Tq, Q::BM), (unsigned)(s.B * s.NH));
        kern<<<grid, attn_tc::kThreads, Q::smem_bytes, st>>>(raw(dq), raw(dout), raw(q), raw(k), raw(v), lse, Dvec,
                                                             p);
        CUDA_CHECK_LAUNCH();
    }
    if (s.Tk > 0) {
        auto kern = p.doc ? dkdv_kernel<D, Cfg::kDkvBQ, Cfg::kDkvARegs, GR, kAcc, true>
                          : dkdv_kernel<D, Cfg::kDkvBQ, Cfg::kDkvARegs, GR, kAcc, false>;
        allow_smem(kern, K::smem_bytes);
        const dim3 grid((unsigned)ceil_div(s.Tk, K::BN), (unsigned)(s.B * s.kv_heads()));  // per kv head (GQA)
        kern<<<grid, attn_tc::kThreads, K::smem_bytes, st>>>(raw(dk), raw(dv), raw(dout), raw(q), raw(k), raw(v),
                                                             lse, Dvec, p);
        CUDA_CHECK_LAUNCH();
    }
}

// The one-kernel backward, HS 64, 128-query tiles, D folded in. Plain
// (kAcc false, bf16 dq, dk, dv): dq accumulates in fp32 in dq_acc
// (attn_tc::bwd_fused_dq_acc_floats floats, zeroed here) and a second kernel
// converts it; ring (kAcc, fp32 +=): the atomics add into dq itself.
template <typename G, bool kAcc>
void bwd_fused_launch(G* dq, G* dk, G* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                 const bf16* out, const float* lse, const AttnShape& s, float* dq_acc, cudaStream_t st) {
    constexpr int BQ = 128, STAGES = TC_BWD5_STAGES;
    using C = attn_tc::Bwd5Cfg<64, BQ, STAGES, true>;
    using GR = typename Raw<G>::type;
    const TcParams p = attn_tc::tc_params(s);
    float* acc;
    size_t bs, rs;
    if constexpr (kAcc) {
        acc = dq, bs = p.qb, rs = p.q_stride;
    } else {
        acc = dq_acc, rs = (size_t)s.NH * 64, bs = (size_t)s.Tq * rs;
        CUDA_CHECK(cudaMemsetAsync(acc, 0, attn_tc::bwd_fused_dq_acc_floats(p, 64) * sizeof(float), st));
    }
    if (s.Tk > 0) {
        auto kern = bwd_fused_kernel<BQ, STAGES, true, GR, kAcc>;
        allow_smem(kern, C::smem_bytes);
        const dim3 grid((unsigned)ceil_div(s.Tk, C::BN), (unsigned)(s.B * s.kv_heads()));
        kern<<<grid, attn_tc::kThreads, C::smem_bytes, st>>>(acc, bs, rs, raw(dk), raw(dv), raw(dout), raw(q), raw(k),
                                                             raw(v), raw(out), lse, nullptr, p);
        CUDA_CHECK_LAUNCH();
    }
    if constexpr (!kAcc) {
        const size_t pairs = attn_tc::bwd_fused_dq_acc_floats(p, 64) / 2;
        if (pairs > 0) {
            attn_wg_dev::dq_acc_convert_kernel<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(raw(dq), acc, p, 64, pairs);
            CUDA_CHECK_LAUNCH();
        }
    }
}

inline bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

// Compute capability >= 8.0 on the current device (cached per device).
inline bool device_has_mma_sync() {
    static int cache[64] = {0};  // 0 unknown, 1 yes, 2 no
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < 64 && cache[dev]) return cache[dev] == 1;
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (dev >= 0 && dev < 64) cache[dev] = major >= 8 ? 1 : 2;
    return major >= 8;
}

// The device's opt-in shared memory per block (cached per device): the
// one-kernel backward needs about 203 KB (H100, H200: 227 KB; A100: 163 KB).
inline size_t device_smem_optin() {
    static size_t cache[64] = {0};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < 64 && cache[dev]) return cache[dev];
    int bytes = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (dev >= 0 && dev < 64) cache[dev] = (size_t)bytes;
    return (size_t)bytes;
}

}  // namespace attn_tc_dev

// Whether the tensor-core kernels take this call: head size 64 or 128; rows
// of 16-byte aligned bf16 (every pointer 16-byte aligned, row and batch
// strides multiples of 8 elements; fp32 outputs then follow); causal only
// with Tq == Tk (as everywhere); a device of compute capability >= 8.0.
inline bool attention_tc_supported(const AttnShape& s, std::initializer_list<const void*> ptrs) {
    if (s.HS != 64 && s.HS != 128) return false;
    if (s.causal && s.Tq != s.Tk) return false;
    for (size_t x : {s.q_stride, s.kv_stride, s.o_stride, s.qb(), s.kb(), s.ob()})
        if (x % 8 != 0) return false;
    for (const void* p : ptrs)
        if (!attn_tc_dev::aligned16(p)) return false;
    return attn_tc_dev::device_has_mma_sync();
}

// LLMC_ATTN_TC=0 in the environment routes every call to the CUDA-core
// kernels (A/B comparisons on a GPU); read once.
inline bool attention_tc_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LLMC_ATTN_TC");
        return !(e && e[0] == '0');
    }();
    return on;
}

// LLMC_ATTN_BWD=5 selects the one-kernel backward (attention_tc_kernels_bwd_fused.h)
// where it applies (head size 64, plain and ring, with or without GQA, a
// device with about 203 KB of shared memory per block); head size 128 and
// smaller devices keep the two-kernel backward. Its dq is summed with fp32 atomics,
// so dq is not bitwise reproducible run to run (dk, dv are). Default (unset,
// or 2): the two-kernel backward, deterministic; the backend refuses other
// values when it starts (cuda/switches.h). Read once.
inline bool attention_bwd_fused_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LLMC_ATTN_BWD");
        return e && e[0] == '5' && e[1] == 0;
    }();
    return on;
}
// Head size 64 on a device with the shared memory for it, without the
// document mask (else the two kernels, which take it).
inline bool attention_bwd_fused_takes(const AttnShape& s) {
    using C = attn_tc::Bwd5Cfg<64, 128, TC_BWD5_STAGES, true>;
    return attention_bwd_fused_enabled() && s.HS == 64 && !s.doc_start &&
           attn_tc_dev::device_smem_optin() >= C::smem_bytes;
}

// Scratch of attention_backward_tc: the D vector, or with the one-kernel
// backward the fp32 dq accumulator (D is computed in the kernel there).
inline size_t attention_backward_tc_scratch_floats(const AttnShape& s) {
    if (attention_wg_bwd_takes()) return attn_wg_dev::wg_bwd_scratch_floats(s);
    if (attention_bwd_fused_takes(s)) return attn_tc::bwd_fused_dq_acc_floats(attn_tc::tc_params(s), 64);
    return attention_backward_scratch_floats(s);
}

// The entry points below assume attention_tc_supported(s, {all pointers}).
inline void attention_forward_tc(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 const AttnShape& s, cudaStream_t stream) {
    attn::check_shape(s);  // head size, causal Tq == Tk, NKV dividing NH
    if (s.B == 0 || s.NH == 0 || s.Tq == 0) return;
    if (attention_wg_takes()) {  // Hopper: TMA and wgmma (attention_wg.cuh)
        if (s.HS == 64)
            attn_wg_dev::wg_forward_launch<64, bf16, false>(out, lse, q, k, v, s, stream);
        else
            attn_wg_dev::wg_forward_launch<128, bf16, false>(out, lse, q, k, v, s, stream);
        return;
    }
    if (s.HS == 64)
        attn_tc_dev::forward_launch<64, bf16, false>(out, lse, q, k, v, s, stream);
    else
        attn_tc_dev::forward_launch<128, bf16, false>(out, lse, q, k, v, s, stream);
}

// Ring attention block forward (backend.h attention_block_forward): fp32
// running out/lse, overwritten when first, merged by log-sum-exp otherwise.
inline void attention_block_forward_tc(float* out_acc, float* lse_acc, const bf16* q, const bf16* k, const bf16* v,
                                       const AttnShape& s, bool first, cudaStream_t stream) {
    attn::check_shape(s);  // head size, causal Tq == Tk, NKV dividing NH
    if (s.B == 0 || s.NH == 0 || s.Tq == 0) return;
    if (attention_wg_takes()) {  // Hopper: TMA and wgmma (attention_wg.cuh)
        if (s.HS == 64) {
            if (first)
                attn_wg_dev::wg_forward_launch<64, float, false>(out_acc, lse_acc, q, k, v, s, stream);
            else
                attn_wg_dev::wg_forward_launch<64, float, true>(out_acc, lse_acc, q, k, v, s, stream);
        } else {
            if (first)
                attn_wg_dev::wg_forward_launch<128, float, false>(out_acc, lse_acc, q, k, v, s, stream);
            else
                attn_wg_dev::wg_forward_launch<128, float, true>(out_acc, lse_acc, q, k, v, s, stream);
        }
        return;
    }
    if (s.HS == 64) {
        if (first)
            attn_tc_dev::forward_launch<64, float, false>(out_acc, lse_acc, q, k, v, s, stream);
        else
            attn_tc_dev::forward_launch<64, float, true>(out_acc, lse_acc, q, k, v, s, stream);
    } else {
        if (first)
            attn_tc_dev::forward_launch<128, float, false>(out_acc, lse_acc, q, k, v, s, stream);
        else
            attn_tc_dev::forward_launch<128, float, true>(out_acc, lse_acc, q, k, v, s, stream);
    }
}

// dq, dk, dv (bf16) overwritten. scratch: attention_backward_tc_scratch_floats(s).
inline void attention_backward_tc(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                  const bf16* v, const bf16* out, const float* lse, const AttnShape& s,
                                  float* scratch, cudaStream_t stream) {
    attn::check_shape(s);  // head size, causal Tq == Tk, NKV dividing NH
    if (s.B == 0 || s.NH == 0) return;
    if (attention_wg_bwd_takes()) {  // Hopper: TMA and wgmma (attention_wg.cuh)
        attn_wg_dev::wg_backward<bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                               attention_wg_bwd_deterministic(), stream);
        return;
    }
    if (attention_bwd_fused_takes(s)) {
        attn_tc_dev::bwd_fused_launch<bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
        return;
    }
    if (s.HS == 64)
        attn_tc_dev::backward_launch<64, bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
    else
        attn_tc_dev::backward_launch<128, bf16, false>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
}

// Ring attention block backward: += into fp32 dq, dk, dv.
inline void attention_block_backward_tc(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                                        const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                        const AttnShape& s, float* scratch, cudaStream_t stream) {
    attn::check_shape(s);  // head size, causal Tq == Tk, NKV dividing NH
    if (s.B == 0 || s.NH == 0 || s.Tq == 0 || s.Tk == 0) return;  // nothing to add
    if (attention_wg_bwd_takes()) {  // Hopper: TMA and wgmma; the atomics add into dq itself
        attn_wg_dev::wg_backward<float, true>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                               attention_wg_bwd_deterministic(), stream);
        return;
    }
    if (attention_bwd_fused_takes(s))  // atomics straight into the fp32 dq; no scratch
        attn_tc_dev::bwd_fused_launch<float, true>(dq, dk, dv, dout, q, k, v, out, lse, s, nullptr, stream);
    else if (s.HS == 64)
        attn_tc_dev::backward_launch<64, float, true>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
    else
        attn_tc_dev::backward_launch<128, float, true>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
}

}  // namespace llmc_cuda
