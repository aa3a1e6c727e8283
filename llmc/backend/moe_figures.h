// llmc/backend/moe_figures.h: the arithmetic of Mixtral's routing figures,
// one definition for the host (llmc/model/moe.cpp, moe_state.cpp), the CPU
// backend and the CUDA kernels, so that a step that keeps them on the device
// (--sync-free) computes exactly what the host-read step computes
// (docs/moe.md): a micro-batch's load-balancing loss and its gradient from
// the routing statistics, the loads' imbalance and --moe-balance bias's
// update from a step's loads.
#pragma once

#ifdef __CUDACC__
#define LLMC_MOE_HD __host__ __device__ __forceinline__
#else
#define LLMC_MOE_HD inline
#endif

// From one micro-batch's statistics over its L·N routings (LN = L · tokens):
// cnt[e] the assignments to expert e, psum[e] the sum of its probabilities.
// Returns aux = E · sum_e (cnt_e / LN) · (psum_e / LN), and writes
// grad[e] = gscale · (cnt_e / LN) / LN, the gradient with respect to every
// routing probability p_e, where gscale = aux_coef · dloss · tokens · E.
// (grad's type G: double on the host, the stat type in backend memory.)
template <typename G>
LLMC_MOE_HD double moe_aux_from_stats(G* grad, const double* cnt, const double* psum, int E, double LN, double gscale) {
    double aux = 0;
    for (int e = 0; e < E; e++) {
        aux += (cnt[e] / LN) * (psum[e] / LN);
        grad[e] = (G)(gscale * (cnt[e] / LN) / LN);
    }
    return aux * E;
}

// The loads' imbalance: over the L layers of loads [L, E], the mean of
// max_e load_e / mean - 1 (0: even; DeepSeek-V3's "MaxVio").
LLMC_MOE_HD double moe_imbalance(const double* loads, int L, int E) {
    double v = 0;
    for (int l = 0; l < L; l++) {
        double mean = 0, mx = 0;
        for (int e = 0; e < E; e++) {
            const double x = loads[l * E + e];
            mean += x / E;
            mx = mx > x ? mx : x;
        }
        v += mean > 0 ? mx / mean - 1 : 0;
    }
    return L > 0 ? v / L : 0;
}

// --moe-balance bias's update (DeepSeek-V3): every expert's bias moves by
// rate toward an even load, b_e += rate · sign(mean - load_e), the mean over
// its layer's E experts.
LLMC_MOE_HD void moe_bias_step(double* bias, const double* loads, int L, int E, double rate) {
    for (int l = 0; l < L; l++) {
        double mean = 0;
        for (int e = 0; e < E; e++) mean += loads[l * E + e] / E;
        for (int e = 0; e < E; e++) {
            const double err = mean - loads[l * E + e];
            bias[l * E + e] += rate * (err > 0 ? 1 : err < 0 ? -1 : 0);
        }
    }
}
