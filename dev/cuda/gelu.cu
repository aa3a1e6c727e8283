// dev/cuda/gelu.cu: kernel lab for the elementwise ops: GELU (tanh
// approximation) forward and backward (dinp = gelu'(inp) * dout, also with
// dinp aliasing dout as the model uses it), and the residual add out = a + b
// (also in place, as Backend::accumulate uses it).
//   version 1: one thread per element, no grid-stride loop (naive)
//   version 2: the previous production kernels (dev/cuda/previous.h:
//              grid-stride, one element per access)
//   version 3: llmc/backend/cuda/elementwise.cuh (production: 16-byte packs, scalar tail,
//              scalar fallback for unaligned pointers)
// Besides the d12 size, version 3 is checked on an odd length (a tail after
// the last pack) and on pointers one element off 16-byte alignment (the
// fallback).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/elementwise.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void gelu_forward_v1(E* out, const E* inp, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = to_float(inp[i]);
    out[i] = from_float<E>(0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))));
}

template <typename E>
__global__ void gelu_backward_v1(E* dinp, const E* inp, const E* dout, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = to_float(inp[i]), k = 0.7978845608f;
    const float t = tanhf(k * (x + 0.044715f * x * x * x));
    const float g = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] = from_float<E>(g * to_float(dout[i]));
}

template <typename E>
__global__ void residual_v1(E* out, const E* a, const E* b, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<E>(to_float(a[i]) + to_float(b[i]));
}

template <typename E>
void run_fwd(int version, E* out, const E* inp, size_t n) {
    if (version == 1) {
        gelu_forward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(out, inp, n);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::gelu_forward<E>(out, inp, n, 0);
    } else {
        gelu_forward<E>(out, inp, n, 0);
    }
}
template <typename E>
void run_bwd(int version, E* dinp, const E* inp, const E* dout, size_t n) {
    if (version == 1) {
        gelu_backward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(dinp, inp, dout, n);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::gelu_backward<E>(dinp, inp, dout, n, 0);
    } else {
        gelu_backward<E>(dinp, inp, dout, n, 0);
    }
}
template <typename E>
void run_res(int version, E* out, const E* a, const E* b, size_t n) {
    if (version == 1) {
        residual_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(out, a, b, n);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::residual_forward<E>(out, a, b, n, 0);
    } else {
        residual_forward<E>(out, a, b, n, 0);
    }
}

// off: element offset of every device pointer from its allocation (1 makes
// them 2 or 4 bytes off 16-byte alignment).
template <typename E>
void check(int version, const char* label, const std::vector<float>& inp, const std::vector<float>& dout, size_t off,
           double tol) {
    const size_t n = inp.size();
    std::vector<float> rout(n), rdinp(n), rres(n);
    cpu::gelu_forward(rout.data(), inp.data(), n);
    cpu::gelu_backward(rdinp.data(), inp.data(), dout.data(), n);
    cpu::residual_forward(rres.data(), inp.data(), dout.data(), n);
    std::vector<float> pad(off, 0.f), inp_p = pad, dout_p = pad;
    inp_p.insert(inp_p.end(), inp.begin(), inp.end());
    dout_p.insert(dout_p.end(), dout.begin(), dout.end());
    E* dinp0 = lab::to_device<E>(inp_p);
    E* ddout0 = lab::to_device<E>(dout_p);
    E* dres0 = lab::dev_alloc<E>(n + off);
    E* dd0 = lab::dev_alloc<E>(n + off);
    E *dinp = dinp0 + off, *ddout = ddout0 + off, *dres = dres0 + off, *dd = dd0 + off;
    const std::string l(label);
    run_fwd<E>(version, dres, dinp, n);
    lab::validate((l + " gelu forward").c_str(), lab::from_device(dres, n), rout, tol);
    run_bwd<E>(version, dd, dinp, ddout, n);
    lab::validate((l + " gelu backward").c_str(), lab::from_device(dd, n), rdinp, tol);
    run_res<E>(version, dres, dinp, ddout, n);
    lab::validate((l + " residual").c_str(), lab::from_device(dres, n), rres, tol);
    run_bwd<E>(version, ddout, dinp, ddout, n);  // in place, as gpt.cpp calls it
    lab::validate((l + " gelu backward in place").c_str(), lab::from_device(ddout, n), rdinp, tol);
    lab::copy_to_device<E>(ddout0, dout_p);
    run_res<E>(version, ddout, ddout, dinp, n);  // accumulate: dst += src
    lab::validate((l + " residual in place (accumulate)").c_str(), lab::from_device(ddout, n), rres, tol);
    lab::dev_free(dinp0), lab::dev_free(ddout0), lab::dev_free(dres0), lab::dev_free(dd0);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768;
    const size_t n = (size_t)B * T * 4 * C;
    std::vector<float> inp = lab::rand_normal(n, 2.f, 1), dout = lab::rand_normal(n, 1.f, 2);
    std::printf("validation (n=%zu = B*T*4C)\n", n);
    for (int v = 1; v <= 3; v++) check<float>(v, ("v" + std::to_string(v) + " fp32").c_str(), inp, dout, 0, lab::kTolF32);
    check<bf16>(2, "v2 bf16", inp, dout, 0, lab::kTolBF16);
    check<bf16>(3, "v3 bf16", inp, dout, 0, lab::kTolBF16);
    {
        const size_t m = 100003;  // not a multiple of 8: a tail after the last pack
        std::vector<float> i2(inp.begin(), inp.begin() + m), d2(dout.begin(), dout.begin() + m);
        check<float>(3, "v3 fp32 n=100003", i2, d2, 0, lab::kTolF32);
        check<bf16>(3, "v3 bf16 n=100003", i2, d2, 0, lab::kTolBF16);
        check<bf16>(3, "v3 bf16 unaligned (scalar fallback)", i2, d2, 1, lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, n=%zu; bytes = each operand read once, the output written once)\n", n);
    bf16* dinp = lab::to_device<bf16>(inp);
    bf16* ddout = lab::to_device<bf16>(dout);
    bf16* dout_ = lab::dev_alloc<bf16>(n);
    const char* names[] = {"", "v1 naive", "v2 previous", "v3 production"};
    for (int v = 1; v <= 3; v++) {
        const std::string nm(names[v]);
        float ms = lab::time_ms([&] { run_fwd<bf16>(v, dout_, dinp, n); });
        lab::report_bw(("gelu forward " + nm).c_str(), ms, 2.0 * n * sizeof(bf16));
        ms = lab::time_ms([&] { run_bwd<bf16>(v, dout_, dinp, ddout, n); });
        lab::report_bw(("gelu backward " + nm).c_str(), ms, 3.0 * n * sizeof(bf16));
        ms = lab::time_ms([&] { run_res<bf16>(v, dout_, dinp, ddout, n); });
        lab::report_bw(("residual " + nm).c_str(), ms, 3.0 * n * sizeof(bf16));
    }
    lab::dev_free(dinp), lab::dev_free(ddout), lab::dev_free(dout_);
    return lab::finish();
}
