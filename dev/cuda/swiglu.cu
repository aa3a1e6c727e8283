// dev/cuda/swiglu.cu: kernel lab for the SwiGLU activation of the Llama
// MLP (backend.h swiglu_forward / swiglu_backward): gu holds N rows of
// [gate (H) | up (H)]; out[n, i] = silu(gate)·up; the backward writes
// dgu [N, 2H] (dgate | dup) from dout [N, H] and gu.
//   version 1: one thread per output element (naive)
//   version 2: llmc/backend/cuda/swiglu.cuh (production: grid-stride packs of 8
//              bf16 / 4 fp32 outputs, 16-byte accesses to gate, up, out and
//              their gradients when H is a multiple of the pack and the
//              buffers are aligned, element by element otherwise)
// Checked against the CPU ops (llmc/backend/cpu_ops.h) on an odd H (element-wise
// path), unaligned buffers, GPT-2-d12-like sizes (H = 4·768) and Llama-like
// ones (H = 8192, 14336 / 4 = 3584 as a tensor-parallel slice), and with
// dgu written over gu (the backward allows it). Inputs span [-12, 12] so
// the sigmoid saturates somewhere. Timing (bf16): N = 8192 tokens at
// H = 3072 and H = 8192, GB/s with bytes = each operand read once and each
// output written once (forward 3·N·H elements, backward 5·N·H).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/swiglu.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void swiglu_forward_v1(E* out, const E* gu, int N, int H) {
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * H) return;
    const size_t n = e / H, i = e % H;
    const float g = to_float(gu[n * 2 * H + i]), u = to_float(gu[n * 2 * H + H + i]);
    out[e] = from_float<E>(g / (1.f + expf(-g)) * u);
}

template <typename E>
__global__ void swiglu_backward_v1(E* dgu, const E* gu, const E* dout, int N, int H) {
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * H) return;
    const size_t n = e / H, i = e % H;
    const float g = to_float(gu[n * 2 * H + i]), u = to_float(gu[n * 2 * H + H + i]), dy = to_float(dout[e]);
    const float s = 1.f / (1.f + expf(-g));
    dgu[n * 2 * H + i] = from_float<E>(dy * u * s * (1.f + g * (1.f - s)));
    dgu[n * 2 * H + H + i] = from_float<E>(dy * g * s);
}

template <typename E>
void run_fwd(int version, E* out, const E* gu, int N, int H) {
    if (version == 1) {
        swiglu_forward_v1<E><<<(unsigned)ceil_div((size_t)N * H, 256), 256>>>(out, gu, N, H);
        CUDA_CHECK_LAUNCH();
    } else {
        swiglu_forward<E>(out, gu, N, H, 0);
    }
}
template <typename E>
void run_bwd(int version, E* dgu, const E* gu, const E* dout, int N, int H) {
    if (version == 1) {
        swiglu_backward_v1<E><<<(unsigned)ceil_div((size_t)N * H, 256), 256>>>(dgu, gu, dout, N, H);
        CUDA_CHECK_LAUNCH();
    } else {
        swiglu_backward<E>(dgu, gu, dout, N, H, 0);
    }
}

// off: element offset of every device pointer from its allocation (1 makes
// them 2 or 4 bytes off 16-byte alignment).
template <typename E>
void check(int version, const char* label, int N, int H, size_t off, double tol) {
    const size_t n = (size_t)N * H;
    const std::vector<float> gu = lab::rand_uniform(2 * n, -12.f, 12.f, 1), dout = lab::rand_normal(n, 1.f, 2);
    std::vector<float> rout(n), rdgu(2 * n);
    cpu::swiglu_forward(rout.data(), gu.data(), N, H);
    cpu::swiglu_backward(rdgu.data(), gu.data(), dout.data(), N, H);
    std::vector<float> pad(off, 0.f), gu_p = pad, dout_p = pad;
    gu_p.insert(gu_p.end(), gu.begin(), gu.end());
    dout_p.insert(dout_p.end(), dout.begin(), dout.end());
    E* dgu0 = lab::to_device<E>(gu_p);
    E* ddout0 = lab::to_device<E>(dout_p);
    E* dout_buf0 = lab::dev_alloc<E>(n + off);
    E* dgrad0 = lab::to_device<E>(lab::rand_normal(2 * n + off, 3.f, 3));  // garbage: overwritten
    E *dgu = dgu0 + off, *ddout = ddout0 + off, *out = dout_buf0 + off, *dgrad = dgrad0 + off;
    const std::string l = std::string(label) + " N=" + std::to_string(N) + " H=" + std::to_string(H) +
                          (off ? " unaligned" : "");
    run_fwd<E>(version, out, dgu, N, H);
    lab::validate((l + " forward").c_str(), lab::from_device(out, n), rout, tol);
    run_bwd<E>(version, dgrad, dgu, ddout, N, H);
    lab::validate((l + " backward").c_str(), lab::from_device(dgrad, 2 * n), rdgu, tol);
    if (version == 2) {  // dgu written over gu
        run_bwd<E>(version, dgu, dgu, ddout, N, H);
        lab::validate((l + " backward in place").c_str(), lab::from_device(dgu, 2 * n), rdgu, tol);
    }
    lab::dev_free(dgu0), lab::dev_free(ddout0), lab::dev_free(dout_buf0), lab::dev_free(dgrad0);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    std::printf("validation\n");
    struct Shape {
        int N, H;
    };
    const Shape shapes[] = {{37, 45}, {100, 8}, {512, 3072}, {256, 8192}, {200, 3584}};
    for (const Shape& s : shapes) {
        check<float>(1, "v1 fp32", s.N, s.H, 0, lab::kTolF32);
        check<float>(2, "v2 fp32", s.N, s.H, 0, lab::kTolF32);
        check<bf16>(2, "v2 bf16", s.N, s.H, 0, lab::kTolBF16);
    }
    check<float>(2, "v2 fp32", 300, 3072, 1, lab::kTolF32);  // unaligned: element-wise fallback
    check<bf16>(2, "v2 bf16", 300, 3072, 1, lab::kTolBF16);

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=8192; bytes = each operand read once, each output written once)\n");
    for (const int H : {3072, 8192}) {
        const int N = 8192;
        const size_t n = (size_t)N * H;
        bf16* gu = lab::to_device<bf16>(lab::rand_uniform(2 * n, -6.f, 6.f, 5));
        bf16* dout = lab::to_device<bf16>(lab::rand_normal(n, 1.f, 6));
        bf16* out = lab::dev_alloc<bf16>(n);
        bf16* dgu = lab::dev_alloc<bf16>(2 * n);
        const char* names[] = {"", "v1 naive", "v2 production"};
        for (int v = 1; v <= 2; v++) {
            const std::string nm = std::string(names[v]) + " H=" + std::to_string(H);
            float ms = lab::time_ms([&] { run_fwd<bf16>(v, out, gu, N, H); });
            lab::report_bw(("forward " + nm).c_str(), ms, 3.0 * n * sizeof(bf16));
            ms = lab::time_ms([&] { run_bwd<bf16>(v, dgu, gu, dout, N, H); });
            lab::report_bw(("backward " + nm).c_str(), ms, 5.0 * n * sizeof(bf16));
        }
        lab::dev_free(gu), lab::dev_free(dout), lab::dev_free(out), lab::dev_free(dgu);
    }
    return lab::finish();
}
