// llmc/backend/cuda/attention_wg.cuh: the Hopper attention (sm_90a), forward
// and backward: TMA copies on mbarriers, wgmma, a producer warpgroup and two
// consumer warpgroups (the designs are explained at the top of
// attention_wg_kernels.h and attention_wg_kernels_bwd.h, the layouts in
// wgmma_layout.h). This file holds the PTX context that runs the bodies on
// a GPU, the __global__ wrappers, the tensor maps (cuTensorMapEncodeTiled,
// reached through the runtime's driver entry point, so nothing links
// libcuda), the launchers, the conversion of an fp32 dq accumulator, and the
// test of whether a call may take them. attention_tc.cuh dispatches to it.
//
// When it runs: LLMC_ATTN_WG=1 in the environment (forward and backward),
// det (the same, the backward's dq added in a fixed order) or fwd (the
// forward alone), on a device of compute capability 9.0 with a
// binary built for sm_90a (the Makefile's default; LLMC_SM90A tells the host
// code), for the calls the mma.sync kernels take (heads of 64 and 128,
// 16-byte aligned rows). LLMC_ATTN_WG=0 or unset: the mma.sync kernels.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <cstring>

#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc_kernels_bwd_fused.h"
#include "llmc/backend/cuda/attention_wg_kernels.h"
#include "llmc/backend/cuda/attention_wg_kernels_bwd.h"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/switches.h"

namespace llmc_cuda {
namespace attn_wg_dev {

using attn_tc::TcParams;

extern __shared__ uint4 wg_smem[];

// wgmma needs the architecture-specific sm_90a target; other passes compile
// the wrapper empty (the dispatcher never launches it there).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ARCH_OK 1
#else
#define WG_ARCH_OK 0
#endif

template <int N>
__device__ __forceinline__ void wgmma_ss_ptx(float (&d)[N / 8][4], uint64_t da, uint64_t db, int acc);
template <int N>
__device__ __forceinline__ void wgmma_rs_ptx(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db, int acc);
template <int N>
__device__ __forceinline__ void wgmma_ss_t_ptx(float (&d)[N / 8][4], uint64_t da, uint64_t db, int acc);
#if WG_ARCH_OK
// d (+)= A·B, m64nNk16, bf16 in, fp32 accumulators; scale-d = acc (0: D = A·B).
// ss: A and B through K-major descriptors. ss_t: A M-major and B N-major
// (imm-trans-a = imm-trans-b = 1). rs: A from registers, B through an
// MN-major ("transposed") descriptor.
// The accumulator operands, once: registers %0..%31 (%0..%63) of the asm
// text, and the matching "+f" bindings of d[8][4] (d[16][4]).
#define WG_ACC32_TEXT \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_ACC64_TEXT WG_ACC32_TEXT ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_ACC32_OUT \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WG_ACC64_OUT WG_ACC32_OUT, \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

template <>
__device__ __forceinline__ void wgmma_ss_ptx<128>(float (&d)[16][4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_ACC64_TEXT "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC64_OUT
                 : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_ss_ptx<64>(float (&d)[8][4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_ACC32_TEXT "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC32_OUT
                 : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_ss_t_ptx<64>(float (&d)[8][4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_ACC32_TEXT "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : WG_ACC32_OUT
                 : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_rs_ptx<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_ACC32_TEXT "}, {%32, %33, %34, %35}, %36, "
                 "p, 1, 1, 1;\n}\n"
                 : WG_ACC32_OUT
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_rs_ptx<128>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_ACC64_TEXT "}, {%64, %65, %66, %67}, %68, "
                 "p, 1, 1, 1;\n}\n"
                 : WG_ACC64_OUT
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#endif

struct TensorMaps {
    CUtensorMap m[attn_wg::kMaxMaps];
};

// The PTX executor of attention_wg_kernels.h (the context contract is there).
struct WgDevCtx {
    const TensorMaps* maps;
    __device__ __forceinline__ int tid() const { return threadIdx.x; }
    __device__ __forceinline__ int bx() const { return blockIdx.x; }
    __device__ __forceinline__ int by() const { return blockIdx.y; }
    __device__ __forceinline__ void* smem() const { return wg_smem; }
    __device__ __forceinline__ uint32_t smem_u32(const void* p) const { return (uint32_t)__cvta_generic_to_shared(p); }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    __device__ __forceinline__ float shfl_xor(float x, int m) const { return __shfl_xor_sync(0xffffffffu, x, m); }
    __device__ __forceinline__ float shfl(float x, int src) const { return __shfl_sync(0xffffffffu, x, src); }
    __device__ __forceinline__ int warp_uniform(int x) const { return __shfl_sync(0xffffffffu, x, 0); }
    template <int N>
    __device__ __forceinline__ void fence_acc(float (&d)[N][4]) const {
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
    }
    template <int N>
    __device__ __forceinline__ void fence_frag(uint32_t (&a)[N][4]) const {
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[i][e])::"memory");
    }
#if WG_ARCH_OK
    __device__ __forceinline__ void mbar_init(uint64_t* b, int n) const {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(n) : "memory");
    }
    __device__ __forceinline__ void mbar_fence_init() const {
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) const {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
    }
    __device__ __forceinline__ void mbar_arrive(uint64_t* b) const {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
    }
    __device__ __forceinline__ void mbar_wait(uint64_t* b, int parity) const {
        uint32_t done = 0;
        while (!done)
            asm volatile(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done)
                : "r"(smem_u32(b)), "r"(parity)
                : "memory");
    }
    __device__ __forceinline__ void tma_load(void* dst, int map, int c, int row, int head, int brow, uint64_t* b) const {
        // Coordinates in the map's dimension order (selects, no indexed local array).
        const int pt = pos_t[map], ph = pos_h[map];
        const int x1 = pt == 1 ? row : ph == 1 ? head : brow;
        const int x2 = pt == 2 ? row : ph == 2 ? head : brow;
        const int x3 = pt == 3 ? row : ph == 3 ? head : brow;
        const int x[4] = {c, x1, x2, x3};
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
                smem_u32(dst)),
            "l"(reinterpret_cast<uint64_t>(&maps->m[map])), "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(smem_u32(b))
            : "memory");
    }
    __device__ __forceinline__ void wg_fence() const { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
    __device__ __forceinline__ void wg_commit() const { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
    __device__ __forceinline__ void wg_wait0() const { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
    template <int N>
    __device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, bool acc) const {
        wgmma_ss_ptx<N>(d, da, db, acc ? 1 : 0);
    }
    template <int N>
    __device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db, bool acc) const {
        wgmma_rs_ptx<N>(d, a, db, acc ? 1 : 0);
    }
    template <int N>
    __device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 8][4], uint64_t da, uint64_t db, bool acc) const {
        wgmma_ss_t_ptx<N>(d, da, db, acc ? 1 : 0);
    }
    __device__ __forceinline__ void fence_proxy_async() const {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __device__ __forceinline__ void atomic_add(float* p, float x) const { atomicAdd(p, x); }
    __device__ __forceinline__ void sem_wait(const int* p, int v) const {
        int x;
        do {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
        } while (x != v);
    }
    __device__ __forceinline__ void sem_post(int* p) const {
        asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p) : "memory");
    }
    // Through L2 (.cg): an L1 line of an earlier turn on this SM would be stale.
    __device__ __forceinline__ void add_ordered(float* p, float x) const { __stcg(p, __ldcg(p) + x); }
    __device__ __forceinline__ void bar_sync(int id, int n) const {
        asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
    }
    __device__ __forceinline__ void bar_arrive(int id, int n) const {
        asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
    }
    template <int R>
    __device__ __forceinline__ void reg_alloc() const {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
    }
    template <int R>
    __device__ __forceinline__ void reg_dealloc() const {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
    }
#endif
    int pos_t[attn_wg::kMaxMaps], pos_h[attn_wg::kMaxMaps], pos_b[attn_wg::kMaxMaps];
};

struct MapPos {
    int t[attn_wg::kMaxMaps], h[attn_wg::kMaxMaps], b[attn_wg::kMaxMaps];
};

// One block of 384 threads per SM: the register file is split by
// setmaxnreg, 24 per producer thread and 240 per consumer thread.
template <int D, typename O, bool kMerge, bool kDoc>
__global__ void __launch_bounds__(attn_wg::kThreads, 1)
    wg_fwd_kernel(O* out, float* lse, TcParams p, const __grid_constant__ TensorMaps maps, MapPos pos) {
#if WG_ARCH_OK
    WgDevCtx cx;
    cx.maps = &maps;
    for (int w = 0; w < attn_wg::kMaxMaps; w++) cx.pos_t[w] = pos.t[w], cx.pos_h[w] = pos.h[w], cx.pos_b[w] = pos.b[w];
    attn_wg::wg_fwd_body<WgDevCtx, D, O, kMerge, kDoc>(cx, out, lse, p);
#endif
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

inline void encode(CUtensorMap* m, const wg_layout::TmaBox& b) {
    const cuuint64_t dim[4] = {b.dim[0], b.dim[1], b.dim[2], b.dim[3]};
    const cuuint64_t stride[3] = {b.stride[0], b.stride[1], b.stride[2]};
    const cuuint32_t box[4] = {b.box[0], b.box[1], b.box[2], b.box[3]};
    const cuuint32_t estride[4] = {1, 1, 1, 1};
    const CUresult r = tensor_map_encoder()(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(b.base), dim, stride,
                                            box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::fprintf(stderr, "attention (sm_90a): cuTensorMapEncodeTiled failed (%d)\n", (int)r);
        std::exit(1);
    }
}

// Every box of a kernel, encoded, and where its rows, heads and batch rows went.
inline void encode_maps(const attn_wg::WgMaps& wm, TensorMaps* maps, MapPos* pos) {
    for (int w = 0; w < wm.n; w++) {
        encode(&maps->m[w], wm.box[w]);
        pos->t[w] = wm.pos_t[w], pos->h[w] = wm.pos_h[w], pos->b[w] = wm.pos_b[w];
    }
}

template <int D, typename O, bool kMerge>
void wg_forward_launch(O* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnShape& s,
                       cudaStream_t st) {
    using C = attn_wg::WgFwdCfg<D>;
    const TcParams p = attn_tc::tc_params(s);
    const attn_wg::WgMaps wm = attn_wg::wg_maps<D>(p, q, k, v);
    TensorMaps maps;
    MapPos pos{};
    encode_maps(wm, &maps, &pos);
    using R = typename std::conditional<std::is_same<O, bf16>::value, uint16_t, float>::type;
    auto kern = s.doc_start ? wg_fwd_kernel<D, R, kMerge, true> : wg_fwd_kernel<D, R, kMerge, false>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem_bytes));
    const dim3 grid((unsigned)ceil_div(s.Tq, C::BM), (unsigned)(s.B * s.NH));
    kern<<<grid, attn_wg::kThreads, C::smem_bytes, st>>>(reinterpret_cast<R*>(out), lse, p, maps, pos);
    CUDA_CHECK_LAUNCH();
}

// The fp32 dq accumulator of an atomics backward (this one and
// attention_tc.cuh's one-kernel backward) into bf16 dq with q's strides,
// two elements per thread.
__global__ void dq_acc_convert_kernel(uint16_t* dq, const float* acc, TcParams p, int D, size_t pairs) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < pairs) attn_tc::dq_convert_elem(dq, acc, p, D, idx);
}

// The backward: one block of 384 threads per 128 keys and (batch row, key/value head).
template <int D, typename G, bool kAcc, bool kDoc, bool kDet>
__global__ void __launch_bounds__(attn_wg::kThreads, 1)
    wg_bwd_kernel(float* dq_acc, size_t dq_bs, size_t dq_rs, int* turn, G* dk, G* dv, const float* lse,
                  const float* Dvec, TcParams p, const __grid_constant__ TensorMaps maps, MapPos pos) {
#if WG_ARCH_OK
    WgDevCtx cx;
    cx.maps = &maps;
    for (int w = 0; w < attn_wg::kMaxMaps; w++) cx.pos_t[w] = pos.t[w], cx.pos_h[w] = pos.h[w], cx.pos_b[w] = pos.b[w];
    attn_wg::wg_bwd_body<WgDevCtx, D, G, kAcc, kDoc, kDet>(cx, dq_acc, dq_bs, dq_rs, turn, dk, dv, lse, Dvec, p);
#endif
}

// Scratch of the backward, each part 256-byte aligned: D [B][NH][Tq]; the
// fp32 dq accumulator (attn_tc::bwd_fused_dq_acc_floats; the plain backward
// only); the turn counters of the deterministic form (ints).
inline size_t wg_round64(size_t n) { return (n + 63) / 64 * 64; }
inline size_t wg_bwd_d_floats(const AttnShape& s) { return wg_round64((size_t)s.B * s.NH * s.Tq); }
inline size_t wg_bwd_acc_floats(const AttnShape& s) {
    return wg_round64(attn_tc::bwd_fused_dq_acc_floats(attn_tc::tc_params(s), s.HS));
}
inline size_t wg_bwd_scratch_floats(const AttnShape& s) {
    return wg_bwd_d_floats(s) + wg_bwd_acc_floats(s) + wg_round64(attn_wg::wg_bwd_turn_ints(attn_tc::tc_params(s)));
}

// G: bf16 (plain backward: dq, dk, dv overwritten) or float (ring block
// backward: += into fp32 dq, dk, dv; the atomics add into dq itself). det:
// dq added in a fixed order (the key blocks' turns) instead of atomically.
template <int D, typename G, bool kAcc>
void wg_backward_launch(G* dq, G* dk, G* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, const AttnShape& s, float* scratch, bool det,
                        cudaStream_t st) {
    using C = attn_wg::WgBwdCfg<D>;
    using R = typename std::conditional<std::is_same<G, bf16>::value, uint16_t, float>::type;
    const TcParams p = attn_tc::tc_params(s);
    float* Dvec = scratch;
    const size_t rows = (size_t)s.B * s.Tq * s.NH;
    if (rows > 0) {
        attn::dot_do_o_kernel<bf16><<<(unsigned)ceil_div(rows, 256 / 32), 256, 0, st>>>(Dvec, dout, out, s, attn::strides(s));
        CUDA_CHECK_LAUNCH();
    }
    float* acc;
    size_t bs, rs;
    if constexpr (kAcc) {
        acc = reinterpret_cast<float*>(dq), bs = p.qb, rs = p.q_stride;
    } else {
        acc = scratch + wg_bwd_d_floats(s), rs = (size_t)s.NH * D, bs = (size_t)s.Tq * rs;
        CUDA_CHECK(cudaMemsetAsync(acc, 0, attn_tc::bwd_fused_dq_acc_floats(p, D) * sizeof(float), st));
    }
    if (s.Tk > 0 && s.Tq > 0) {
        const attn_wg::WgMaps wm = attn_wg::wg_bwd_maps<D>(p, q, dout, k, v);
        TensorMaps maps;
        MapPos pos{};
        encode_maps(wm, &maps, &pos);
        int* turn = reinterpret_cast<int*>(scratch + wg_bwd_d_floats(s) + wg_bwd_acc_floats(s));
        if (det) CUDA_CHECK(cudaMemsetAsync(turn, 0, attn_wg::wg_bwd_turn_ints(p) * sizeof(int), st));
        auto kern = s.doc_start ? (det ? wg_bwd_kernel<D, R, kAcc, true, true> : wg_bwd_kernel<D, R, kAcc, true, false>)
                                : (det ? wg_bwd_kernel<D, R, kAcc, false, true> : wg_bwd_kernel<D, R, kAcc, false, false>);
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem_bytes));
        const dim3 grid((unsigned)ceil_div(s.Tk, C::BN), (unsigned)(s.B * s.kv_heads()));
        kern<<<grid, attn_wg::kThreads, C::smem_bytes, st>>>(acc, bs, rs, turn, reinterpret_cast<R*>(dk),
                                                             reinterpret_cast<R*>(dv), lse, Dvec, p, maps, pos);
        CUDA_CHECK_LAUNCH();
    }
    if constexpr (!kAcc) {
        const size_t pairs = attn_tc::bwd_fused_dq_acc_floats(p, D) / 2;
        if (pairs > 0) {
            dq_acc_convert_kernel<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(reinterpret_cast<uint16_t*>(dq), acc,
                                                                                  p, D, pairs);
            CUDA_CHECK_LAUNCH();
        }
    }
}

// The backward for either head size (the callers' one entry point).
template <typename G, bool kAcc>
void wg_backward(G* dq, G* dk, G* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                 const float* lse, const AttnShape& s, float* scratch, bool det, cudaStream_t st) {
    if (s.HS == 64)
        wg_backward_launch<64, G, kAcc>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, det, st);
    else
        wg_backward_launch<128, G, kAcc>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, det, st);
}

// sm_90, a binary built with the sm_90a code (LLMC_SM90A: the Makefile sets
// it when CUDA_ARCH names compute_90a), and the driver's encoder; cached per
// device. Nothing is launched here: the first call may come while a CUDA
// graph is being captured.
inline bool device_has_wgmma() {
#if defined(LLMC_SM90A)
    static int cache[64] = {0};  // 0 unknown, 1 yes, 2 no
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < 64 && cache[dev]) return cache[dev] == 1;
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const bool ok = major == 9 && minor == 0 && tensor_map_encoder() != nullptr;
    if (dev >= 0 && dev < 64) cache[dev] = ok ? 1 : 2;
    return ok;
#else
    return false;
#endif
}

}  // namespace attn_wg_dev

// LLMC_ATTN_WG (switches.h): 1 the Hopper forward and backward, fwd the
// forward alone, where the device has them; read once (the backend refuses
// other values when it starts).
inline llmc_switch::AttnWg attention_wg_mode() {
    static const llmc_switch::AttnWg mode = [] {
        llmc_switch::AttnWg m;
        std::string err;
        return llmc_switch::parse_attn_wg(std::getenv("LLMC_ATTN_WG"), &m, &err) ? m : llmc_switch::AttnWg::off;
    }();
    return mode;
}
// For a call the mma.sync kernels take (attention_tc_supported): whether the Hopper forward takes it instead.
inline bool attention_wg_takes() {
    return attention_wg_mode() != llmc_switch::AttnWg::off && attn_wg_dev::device_has_wgmma();
}
// ... and the Hopper backward (LLMC_ATTN_WG=1 or det).
inline bool attention_wg_bwd_takes() {
    const llmc_switch::AttnWg m = attention_wg_mode();
    return (m == llmc_switch::AttnWg::both || m == llmc_switch::AttnWg::deterministic) && attn_wg_dev::device_has_wgmma();
}
// LLMC_ATTN_WG=det: the Hopper backward adds dq in a fixed order.
inline bool attention_wg_bwd_deterministic() { return attention_wg_mode() == llmc_switch::AttnWg::deterministic; }

}  // namespace llmc_cuda
