// llmc/backend/cpu_moe.h: the mixture-of-experts ops on the CPU (backend.h,
// Mixtral's section), one template per op for F = float or double: the
// router's softmax, top-k and renormalisation with the grouping of the
// tokens' rows by expert, its backward, and the moves of rows between token
// order and grouped order; the routing statistics and the figures made of
// them (moe_figures.h); the experts' products as each backend's matmul over
// each expert's contiguous group, the groups read from the offsets in place
// (CPU memory is the host's).
//
// Determinism: each output element is written by one thread in a fixed
// order; the grouping is a sequential scan (stable: by expert, then token,
// then rank j), so the same inputs give the same bits.
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/backend/cpu_math.h"
#include "llmc/backend/moe_figures.h"

namespace cpu {

// Ties between equal probabilities go to the lower expert index (the order
// of the strict comparison below); random real weights make them
// vanishingly rare.
template <typename F>
void moe_route(F* probs, F* topw, int* topi, int* offsets, int* perm, int* inv, const F* logits, int N, int E,
               int K, const F* bias = nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* l = logits + (size_t)n * E;
        F* p = probs + (size_t)n * E;
        F mx = l[0];
        for (int e = 1; e < E; e++) mx = std::max(mx, l[e]);
        F sum = 0;
        for (int e = 0; e < E; e++) sum += p[e] = vexp(l[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        int* ti = topi + (size_t)n * K;
        auto score = [&](int e) { return bias ? p[e] + bias[e] : p[e]; };  // the choice's; the weights are p's
        F ksum = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken = taken || ti[i] == e;
                if (!taken && (best < 0 || score(e) > score(best))) best = e;
            }
            ti[j] = best;
            ksum += p[best];
        }
        for (int j = 0; j < K; j++) topw[(size_t)n * K + j] = p[ti[j]] / ksum;
    }
    std::vector<int> cursor(E + 1, 0);
    for (size_t a = 0; a < (size_t)N * K; a++) cursor[topi[a] + 1]++;
    for (int e = 0; e < E; e++) cursor[e + 1] += cursor[e];
    for (int e = 0; e <= E; e++) offsets[e] = cursor[e];
    for (size_t a = 0; a < (size_t)N * K; a++) {
        const int g = cursor[topi[a]]++;
        perm[g] = (int)a;
        inv[a] = g;
    }
}

// w_j = p_j / s with s the sum of the K chosen probabilities:
// dp_i = (dw_i - sum_j dw_j w_j) / s for a chosen i; then aux_grad[e] on
// every dp_e; then the softmax: dlogit_e = p_e (dp_e - sum_e' p_e' dp_e').
template <typename F>
void moe_route_backward(F* dlogits, const F* probs, const int* topi, const F* dtopw, const F* aux_grad, int N, int E,
                        int K) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* p = probs + (size_t)n * E;
        const int* ti = topi + (size_t)n * K;
        const F* dw = dtopw + (size_t)n * K;
        F* dl = dlogits + (size_t)n * E;
        F s = 0;
        for (int j = 0; j < K; j++) s += p[ti[j]];
        F dot = 0;
        for (int j = 0; j < K; j++) dot += dw[j] * (p[ti[j]] / s);
        for (int e = 0; e < E; e++) dl[e] = aux_grad ? aux_grad[e] : F(0);  // dl holds dp first
        for (int j = 0; j < K; j++) dl[ti[j]] += (dw[j] - dot) / s;
        F pdp = 0;
        for (int e = 0; e < E; e++) pdp += p[e] * dl[e];
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - pdp);
    }
}

template <typename F>
void moe_dispatch(F* xg, F* dw, const F* x, const F* yg, const F* w, const int* inv, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (long a = 0; a < (long)N * K; a++) {
        const F* xr = x + (size_t)(a / K) * C;
        F* o = xg + (size_t)inv[a] * C;
        const F s = w ? w[a] : F(1);
        if (dw) {
            const F* yr = yg + (size_t)inv[a] * C;
            F d = 0;
            for (int c = 0; c < C; c++) d += xr[c] * yr[c];
            dw[a] = d;
        }
        for (int c = 0; c < C; c++) o[c] = s * xr[c];
    }
}

template <typename F>
void moe_combine(F* out, const F* yg, const F* w, const int* inv, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        F* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = 0;
        for (int j = 0; j < K; j++) {
            const size_t a = (size_t)n * K + j;
            const F* yr = yg + (size_t)inv[a] * C;
            const F s = w ? w[a] : F(1);
            for (int c = 0; c < C; c++) o[c] += s * yr[c];
        }
    }
}

// The experts' products (Backend::moe_expert_matmul_forward and _backward)
// on a backend whose memory the host reads: be's own matmul over each
// non-empty group, the calls the host-read step makes, so the results are
// the same bits. The groups must be the rows' (offsets[E] == rows, in order).
inline void check_groups(const int* off, int rows, int E) {
    bool ok = off[0] == 0 && off[E] == rows;
    for (int e = 0; e < E && ok; e++) ok = off[e + 1] >= off[e];
    if (!ok) throw std::invalid_argument("moe_expert_matmul: offsets are not " + std::to_string(E) + " groups of " +
                                         std::to_string(rows) + " rows");
}
inline void expert_matmul_forward(Backend& be, void* out, const void* inp, const void* weight, const int* off,
                                  int rows, int E, int IC, int OC) {
    check_groups(off, rows, E);
    const Precision p = be.precision();
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e])
            be.matmul_forward(elem_ptr(out, p.act, (size_t)off[e] * OC), elem_ptr(inp, p.act, (size_t)off[e] * IC),
                              elem_ptr(weight, p.param, (size_t)e * OC * IC), nullptr, off[e + 1] - off[e], IC, OC);
}
inline void expert_matmul_backward(Backend& be, void* dinp, void* dweight, const void* dout, const void* inp,
                                   const void* weight, const int* off, int rows, int E, int IC, int OC) {
    check_groups(off, rows, E);
    const Precision p = be.precision();
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e])
            be.matmul_backward(elem_ptr(dinp, p.act, (size_t)off[e] * IC), elem_ptr(dweight, p.grad, (size_t)e * OC * IC),
                               nullptr, elem_ptr(dout, p.act, (size_t)off[e] * OC),
                               elem_ptr(inp, p.act, (size_t)off[e] * IC), elem_ptr(weight, p.param, (size_t)e * OC * IC),
                               off[e + 1] - off[e], IC, OC);
}

// Backend::moe_route_stats, moe_aux_loss and moe_balance on host memory
// (probs and bias of type F).
template <typename F>
void moe_route_stats(double* stats, double* loads, const F* probs, const int* off, int N, int E) {
    for (int e = 0; e < E; e++) {
        const int n_e = off[e + 1] - off[e];
        stats[e] += n_e;
        if (loads) loads[e] += n_e;
        double sum = 0;
        for (int n = 0; n < N; n++) sum += (double)probs[(size_t)n * E + e];
        stats[E + e] += sum;
    }
}
template <typename F>
void moe_aux_loss(F* grad, double* aux_acc, double* stats, int E, double LN, double gscale) {
    const double aux = moe_aux_from_stats(grad, stats, stats + E, E, LN, gscale);
    for (int e = 0; e < E; e++) stats[e] = stats[E + e] = 0;
    if (aux_acc) *aux_acc += aux;
}
template <typename F>
void moe_balance(double* figures, F* bias, double* bias64, double* loads, int L, int E, double divisor, double rate) {
    for (size_t i = 0; i < (size_t)L * E; i++) loads[i] /= divisor;
    figures[step_figure::moe_maxvio] = moe_imbalance(loads, L, E);
    if (bias64 && figures[step_figure::skip] == 0.0) {
        moe_bias_step(bias64, loads, L, E, rate);
        for (size_t i = 0; i < (size_t)L * E; i++) bias[i] = (F)bias64[i];
    }
    for (size_t i = 0; i < (size_t)L * E; i++) loads[i] = 0;
}

}  // namespace cpu
