// dev/cuda/adamw.cu: kernel lab for the AdamW update (PyTorch semantics,
// decoupled weight decay, bias corrections, grad_scale folded in).
//   version 1: one thread per element, no grid-stride loop (naive)
//   version 2: llmc/cuda/adamw.cuh (production)
// fp32: params updated in place (no master). bf16: fp32 master updated, bf16
// params must be exactly the round-to-nearest of the new master.
#include "common.h"
#include "llmc/cpu_ops.h"
#include "llmc/cuda/adamw.cuh"

#include <type_traits>

using namespace llmc_cuda;

template <typename P>
__global__ void adamw_v1(P* param, float* master, const P* grad, float* m, float* v, size_t n, AdamF a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = to_float(grad[i]) * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.f - a.beta1) * g;
    v[i] = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
    float p = master ? master[i] : to_float(param[i]);
    p -= a.lr * ((m[i] / a.bc1) / (sqrtf(v[i] / a.bc2) + a.eps) + a.wd * p);
    if (master) master[i] = p;
    param[i] = from_float<P>(p);
}

template <typename P>
void run(int version, P* param, float* master, const P* grad, float* m, float* v, size_t n, const AdamArgs& a) {
    if (version == 1) {
        adamw_v1<P><<<(unsigned)ceil_div(n, 256), 256>>>(param, master, grad, m, v, n, adam_narrow(a));
        CUDA_CHECK_LAUNCH();
    } else {
        adamw_update<P, P>(param, master, grad, m, v, n, a, 0);
    }
}

AdamArgs make_args(int t) {
    AdamArgs a{};
    a.lr = 1e-3, a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.weight_decay = 0.1, a.grad_scale = 0.5;
    a.bias_corr1 = 1.0 - std::pow(a.beta1, t);
    a.bias_corr2 = 1.0 - std::pow(a.beta2, t);
    return a;
}

std::vector<float> diff(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> d(a.size());
    for (size_t i = 0; i < a.size(); i++) d[i] = a[i] - b[i];
    return d;
}

template <typename P>
void check(int version, const char* label, size_t n) {
    const bool has_master = !std::is_same<P, float>::value;
    const std::vector<float> p0 = lab::rand_normal(n, 0.02f, 1), g = lab::rand_normal(n, 0.01f, 2);
    std::vector<float> m0 = lab::rand_normal(n, 0.001f, 3), v0 = lab::rand_uniform(n, 0.f, 1e-4f, 4);
    const AdamArgs a = make_args(3);
    std::vector<float> rp = p0, rmaster = p0, rm = m0, rv = v0;
    cpu::adamw_update(rp.data(), has_master ? rmaster.data() : nullptr, g.data(), rm.data(), rv.data(), n, a);
    P* dp = lab::to_device<P>(p0);
    float* dmaster = has_master ? lab::to_device<float>(p0) : nullptr;
    P* dg = lab::to_device<P>(g);
    float* dm = lab::to_device<float>(m0);
    float* dv = lab::to_device<float>(v0);
    run<P>(version, dp, dmaster, dg, dm, dv, n, a);
    const std::string l(label);
    const std::vector<float> got_p = lab::from_device(dp, n);
    lab::validate((l + " m").c_str(), lab::from_device(dm, n), rm, lab::kTolF32);
    lab::validate((l + " v").c_str(), lab::from_device(dv, n), rv, lab::kTolF32);
    if (has_master) {
        const std::vector<float> got_master = lab::from_device(dmaster, n);
        lab::validate((l + " master update").c_str(), diff(got_master, p0), diff(rmaster, p0), lab::kTolF32);
        std::vector<float> rounded(n);
        for (size_t i = 0; i < n; i++) rounded[i] = lab::round_bf16(got_master[i]);
        lab::validate((l + " param == bf16(master)").c_str(), got_p, rounded, 0.0);
    } else {
        lab::validate((l + " param update").c_str(), diff(got_p, p0), diff(rp, p0), lab::kTolF32);
    }
    lab::dev_free(dp), lab::dev_free(dmaster), lab::dev_free(dg), lab::dev_free(dm), lab::dev_free(dv);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const size_t n = (size_t)124475904;  // GPT-2 124M (Vp = 50304)
    const size_t nv = (size_t)1 << 22;
    std::printf("validation (n=%zu)\n", nv);
    check<float>(1, "v1 fp32", nv);
    check<float>(2, "v2 fp32", nv);
    check<bf16>(1, "v1 bf16+master", nv);
    check<bf16>(2, "v2 bf16+master", nv);

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16 params and grads, fp32 master/m/v, n=%zu)\n", n);
    bf16* dp = lab::dev_alloc<bf16>(n);
    bf16* dg = lab::dev_alloc<bf16>(n);
    float* dmaster = lab::dev_alloc<float>(n);
    float* dm = lab::dev_alloc<float>(n);
    float* dv = lab::dev_alloc<float>(n);
    const AdamArgs a = make_args(1);
    const double bytes = (double)n * (2 + 2 + 3 * 4 * 2);  // grad in, param out, master/m/v in and out
    for (int v = 1; v <= 2; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dp, dmaster, dg, dm, dv, n, a); });
        lab::report_bw(v == 1 ? "v1 naive" : "v2 production", ms, bytes);
    }
    lab::dev_free(dp), lab::dev_free(dg), lab::dev_free(dmaster), lab::dev_free(dm), lab::dev_free(dv);
    return lab::finish();
}
