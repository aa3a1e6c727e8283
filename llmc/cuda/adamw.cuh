// llmc/cuda/adamw.cuh: the AdamW update (reference.md section 2, PyTorch
// semantics: decoupled weight decay applied to the pre-update weight).
//
// m, v and the master weights are fp32. With a master copy (the bf16 build)
// the update runs on master and param receives its round-to-nearest bf16
// value; without one (the fp32 build) it runs on param directly. Gradients of
// type G are widened to fp32 and multiplied by grad_scale first (gradient
// clipping folds in there). The double hyperparameters of AdamArgs are
// narrowed to fp32 once on the host.
#pragma once
#include "../backend.h"
#include "common.cuh"

namespace llmc_cuda {

struct AdamF {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
};

inline AdamF adam_narrow(const AdamArgs& a) {
    return {(float)a.lr,         (float)a.beta1,      (float)a.beta2,      (float)a.eps,
            (float)a.weight_decay, (float)a.grad_scale, (float)a.bias_corr1, (float)a.bias_corr2};
}

template <typename P, typename G>
__global__ void adamw_kernel(P* param, float* master, const G* grad, float* m, float* v, size_t n, AdamF a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = to_float(grad[i]) * a.grad_scale;
        const float mi = a.beta1 * m[i] + (1.f - a.beta1) * g;
        const float vi = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / a.bc1, vhat = vi / a.bc2;
        float p = master ? master[i] : to_float(param[i]);
        p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * p);
        if (master) master[i] = p;
        param[i] = from_float<P>(p);
    }
}

template <typename P, typename G>
void adamw_update(P* param, float* master, const G* grad, float* m, float* v, size_t n, const AdamArgs& args,
                  cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    adamw_kernel<P, G><<<grid_for(n, block), block, 0, stream>>>(param, master, grad, m, v, n, adam_narrow(args));
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc_cuda
