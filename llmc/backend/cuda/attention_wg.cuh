// llmc/backend/cuda/attention_wg.cuh: the Hopper attention forward (sm_90a):
// TMA copies on mbarriers, wgmma, a producer warpgroup and two consumer
// warpgroups in ping-pong (the design is explained at the top of
// attention_wg_kernels.h, the layouts in wgmma_layout.h). This file holds
// the PTX context that runs the body on a GPU, the __global__ wrapper, the
// tensor maps (cuTensorMapEncodeTiled, reached through the runtime's driver
// entry point, so nothing links libcuda), the launcher and the test of
// whether a call may take it. attention_tc.cuh dispatches to it.
//
// When it runs: LLMC_ATTN_WG=1 in the environment, on a device of compute
// capability 9.0 with a binary built for sm_90a (the Makefile's default;
// LLMC_SM90A tells the host code), for the calls the mma.sync kernels take
// (heads of 64 and 128, 16-byte aligned rows). LLMC_ATTN_WG=0 or unset:
// the mma.sync forward. The backward is the mma.sync one either way.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <cstring>

#include "llmc/backend/cuda/attention_wg_kernels.h"
#include "llmc/backend/cuda/common.cuh"

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
#if WG_ARCH_OK
// d (+)= A·B, m64nNk16, bf16 in, fp32 accumulators; scale-d = acc (0: D = A·B).
// ss: A and B through K-major descriptors. rs: A from registers, B through
// an MN-major ("transposed") descriptor.
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
    CUtensorMap m[3];
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
    int pos_t[3], pos_h[3], pos_b[3];
};

struct MapPos {
    int t[3], h[3], b[3];
};

// One block of 384 threads per SM: the register file is split by
// setmaxnreg, 24 per producer thread and 240 per consumer thread.
template <int D, typename O, bool kMerge, bool kDoc>
__global__ void __launch_bounds__(attn_wg::kThreads, 1)
    wg_fwd_kernel(O* out, float* lse, TcParams p, const __grid_constant__ TensorMaps maps, MapPos pos) {
#if WG_ARCH_OK
    WgDevCtx cx;
    cx.maps = &maps;
    for (int w = 0; w < 3; w++) cx.pos_t[w] = pos.t[w], cx.pos_h[w] = pos.h[w], cx.pos_b[w] = pos.b[w];
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

template <int D, typename O, bool kMerge>
void wg_forward_launch(O* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnShape& s,
                       cudaStream_t st) {
    using C = attn_wg::WgFwdCfg<D>;
    const TcParams p = attn_tc::tc_params(s);
    const attn_wg::WgMaps wm = attn_wg::wg_maps<D>(p, q, k, v);
    TensorMaps maps;
    MapPos pos;
    for (int w = 0; w < 3; w++) {
        encode(&maps.m[w], wm.box[w]);
        pos.t[w] = wm.pos_t[w], pos.h[w] = wm.pos_h[w], pos.b[w] = wm.pos_b[w];
    }
    using R = typename std::conditional<std::is_same<O, bf16>::value, uint16_t, float>::type;
    auto kern = s.doc_start ? wg_fwd_kernel<D, R, kMerge, true> : wg_fwd_kernel<D, R, kMerge, false>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem_bytes));
    const dim3 grid((unsigned)ceil_div(s.Tq, C::BM), (unsigned)(s.B * s.NH));
    kern<<<grid, attn_wg::kThreads, C::smem_bytes, st>>>(reinterpret_cast<R*>(out), lse, p, maps, pos);
    CUDA_CHECK_LAUNCH();
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

// LLMC_ATTN_WG=1: the Hopper forward where the device has it; read once.
inline bool attention_wg_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LLMC_ATTN_WG");
        return e && e[0] == '1' && e[1] == 0;
    }();
    return on;
}
// For a call the mma.sync kernels take (attention_tc_supported): whether the Hopper forward takes it instead.
inline bool attention_wg_takes() { return attention_wg_enabled() && attn_wg_dev::device_has_wgmma(); }

}  // namespace llmc_cuda
