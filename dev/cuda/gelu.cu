// dev/cuda/gelu.cu: kernel lab for GELU (tanh approximation), forward and
// backward (dinp = gelu'(inp) * dout, here also with dinp aliasing dout as
// the model uses it).
//   version 1: one thread per element, no grid-stride loop (naive)
//   version 2: llmc/cuda/gelu.cuh (production)
#include "common.h"
#include "llmc/cpu_ops.h"
#include "llmc/cuda/gelu.cuh"

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
void run_fwd(int version, E* out, const E* inp, size_t n) {
    if (version == 1) {
        gelu_forward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(out, inp, n);
        CUDA_CHECK_LAUNCH();
    } else {
        gelu_forward<E>(out, inp, n, 0);
    }
}
template <typename E>
void run_bwd(int version, E* dinp, const E* inp, const E* dout, size_t n) {
    if (version == 1) {
        gelu_backward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(dinp, inp, dout, n);
        CUDA_CHECK_LAUNCH();
    } else {
        gelu_backward<E>(dinp, inp, dout, n, 0);
    }
}

template <typename E>
void check(int version, const char* label, const std::vector<float>& inp, const std::vector<float>& dout, double tol) {
    const size_t n = inp.size();
    std::vector<float> rout(n), rdinp(n);
    cpu::gelu_forward(rout.data(), inp.data(), n);
    cpu::gelu_backward(rdinp.data(), inp.data(), dout.data(), n);
    E* dinp = lab::to_device<E>(inp);
    E* ddout = lab::to_device<E>(dout);
    E* dout_ = lab::dev_alloc<E>(n);
    E* dd = lab::dev_alloc<E>(n);
    run_fwd<E>(version, dout_, dinp, n);
    run_bwd<E>(version, dd, dinp, ddout, n);
    const std::string l(label);
    lab::validate((l + " forward").c_str(), lab::from_device(dout_, n), rout, tol);
    lab::validate((l + " backward").c_str(), lab::from_device(dd, n), rdinp, tol);
    run_bwd<E>(version, ddout, dinp, ddout, n);  // in place, as gpt.cpp calls it
    lab::validate((l + " backward in place").c_str(), lab::from_device(ddout, n), rdinp, tol);
    lab::dev_free(dinp), lab::dev_free(ddout), lab::dev_free(dout_), lab::dev_free(dd);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768;
    const size_t n = (size_t)B * T * 4 * C;
    std::vector<float> inp = lab::rand_normal(n, 2.f, 1), dout = lab::rand_normal(n, 1.f, 2);
    std::printf("validation (n=%zu = B*T*4C)\n", n);
    check<float>(1, "v1 fp32", inp, dout, lab::kTolF32);
    check<float>(2, "v2 fp32", inp, dout, lab::kTolF32);
    check<bf16>(2, "v2 bf16", inp, dout, lab::kTolBF16);

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, n=%zu)\n", n);
    bf16* dinp = lab::to_device<bf16>(inp);
    bf16* ddout = lab::to_device<bf16>(dout);
    bf16* dout_ = lab::dev_alloc<bf16>(n);
    for (int v = 1; v <= 2; v++) {
        float ms = lab::time_ms([&] { run_fwd<bf16>(v, dout_, dinp, n); });
        lab::report_bw(v == 1 ? "forward v1 naive" : "forward v2 production", ms, 2.0 * n * sizeof(bf16));
        ms = lab::time_ms([&] { run_bwd<bf16>(v, dout_, dinp, ddout, n); });
        lab::report_bw(v == 1 ? "backward v1 naive" : "backward v2 production", ms, 3.0 * n * sizeof(bf16));
    }
    lab::dev_free(dinp), lab::dev_free(ddout), lab::dev_free(dout_);
    return lab::finish();
}
