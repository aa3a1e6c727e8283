// llmc/backend/cpu_ops.h: the model's operations on the CPU, one template function
// per Backend op (same name, same argument order, typed pointers), for
// F = float or double. The CPU backend (backend_cpu.cpp) wraps them, and the
// CUDA kernel lab (dev/cuda) uses them as the reference its kernels are
// checked against.
//
// Determinism: every output element is produced by one thread in a fixed
// order (OpenMP static schedules; reductions over rows run per column, not
// per thread), and BLAS gemm does not split the inner dimension, so the same
// inputs give the same bits run to run.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/base/state_round.h"
#include "llmc/backend/cpu_attention.h"
#include "llmc/backend/cpu_gemm.h"
#include "llmc/backend/cpu_math.h"

namespace cpu {

// Sums over rows into one value per column (parameter gradients of the
// norms and embeddings) run over blocks of this many columns: each thread
// owns a block, reads its rows contiguously, and adds in row order.
constexpr int kColBlock = 64;

// ---- embeddings --------------------------------------------------------------
template <typename F>
void encoder_forward(F* out, const int* tokens, const int* pos, const F* wte, const F* wpe, int B, int T, int C,
                     int v_begin, int v_end) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)B * T; n++) {
        F* o = out + (size_t)n * C;
        int id = tokens[n];
        const F* we = (id >= v_begin && id < v_end) ? wte + (size_t)(id - v_begin) * C : nullptr;
        const F* pe = wpe ? wpe + (size_t)pos[n % T] * C : nullptr;
        for (int c = 0; c < C; c++) o[c] = (we ? we[c] : F(0)) + (pe ? pe[c] : F(0));
    }
}

// Gradient rows are gathered per parameter row (parallel over blocks of
// channels), so each row's sum runs over tokens in a fixed order.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* tokens, const int* pos, int B, int T, int C,
                      int v_begin, int v_end) {
    const long N = (long)B * T;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColBlock) {
        const int c1 = std::min(C, c0 + kColBlock);
        for (long n = 0; n < N; n++) {
            const int id = tokens[n];
            const F* g = dout + (size_t)n * C;
            if (id >= v_begin && id < v_end) {
                F* w = dwte + (size_t)(id - v_begin) * C;
                for (int c = c0; c < c1; c++) w[c] += g[c];
            }
            if (dwpe) {
                F* w = dwpe + (size_t)pos[n % T] * C;
                for (int c = c0; c < c1; c++) w[c] += g[c];
            }
        }
    }
}

// ---- LayerNorm ----------------------------------------------------------------
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N, int C) {
    const F eps = F(1e-5);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        F m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        F var = 0;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        F s = F(1) / std::sqrt(var + eps);
        F* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) out[i] = a[i] + b[i];
}

template <typename F>
void residual_layernorm_forward(F* residual, F* out, F* mean, F* rstd, const F* a, const F* b, const F* w,
                                const F* bias, int N, int C) {
    residual_forward(residual, a, b, (size_t)N * C);
    layernorm_forward(out, mean, rstd, residual, w, bias, N, C);
}

template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        const F* dy = dout + (size_t)n * C;
        F m = mean[n], s = rstd[n];
        F dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int c = 0; c < C; c++) {
            F norm = (x[c] - m) * s;
            F dnorm = w[c] * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        F* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            F norm = (x[c] - m) * s;
            F dnorm = w[c] * dy[c];
            dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColBlock) {
        const int c1 = std::min(C, c0 + kColBlock);
        F gw[kColBlock] = {}, gb[kColBlock] = {};
        for (int n = 0; n < N; n++) {
            const F* dy = dout + (size_t)n * C;
            const F* x = inp + (size_t)n * C;
            const F m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                gw[c - c0] += (x[c] - m) * s * dy[c];
                gb[c - c0] += dy[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += gw[c - c0];
            db[c] += gb[c - c0];
        }
    }
}

// ---- Llama: RMSNorm, rotary embeddings, SwiGLU ---------------------------------
template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* w, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        F ss = 0;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        F s = F(1) / std::sqrt(ss / C + F(eps));
        F* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
        rstd[n] = s;
    }
}

template <typename F>
void residual_rmsnorm_forward(F* residual, F* out, F* rstd, const F* a, const F* b, const F* w, int N, int C,
                              double eps) {
    residual_forward(residual, a, b, (size_t)N * C);
    rmsnorm_forward(out, rstd, residual, w, N, C, eps);
}

// y = x·s·w with s = 1/sqrt(mean(x²) + eps): dx = s·(w∘dy) - x·s³·mean(x∘w∘dy).
template <typename F>
void rmsnorm_backward(F* dinp, F* dw, const F* dout, const F* inp, const F* w, const F* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        const F* dy = dout + (size_t)n * C;
        F s = rstd[n], dot = 0;
        for (int c = 0; c < C; c++) dot += x[c] * w[c] * dy[c];
        dot /= C;
        F* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) dx[c] += s * w[c] * dy[c] - x[c] * s * s * s * dot;
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColBlock) {
        const int c1 = std::min(C, c0 + kColBlock);
        F gw[kColBlock] = {};
        for (int n = 0; n < N; n++) {
            const F* x = inp + (size_t)n * C;
            const F* dy = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) gw[c - c0] += x[c] * rstd[n] * dy[c];
        }
        for (int c = c0; c < c1; c++) dw[c] += gw[c - c0];
    }
}

// Rotate-half rotary embeddings (backend.h rope), in place; the angle is
// computed in double whatever F, as the reference does for fp64.
template <typename F>
void rope(F* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta, bool inverse) {
    const int half = HS / 2;
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            F* row = x + ((size_t)b * T + t) * row_stride;
            for (int i = 0; i < half; i++) {
                const double a = pos[t] * std::pow(theta, -2.0 * i / HS);
                const F c = F(std::cos(a)), sn = F(inverse ? -std::sin(a) : std::sin(a));
                for (int h = 0; h < heads; h++) {
                    F* v = row + (size_t)h * HS;
                    const F x0 = v[i], x1 = v[i + half];
                    v[i] = x0 * c - x1 * sn;
                    v[i + half] = x1 * c + x0 * sn;
                }
            }
        }
}

template <typename F>
void swiglu_forward(F* out, const F* gu, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* g = gu + (size_t)n * 2 * H;
        const F* u = g + H;
        F* o = out + (size_t)n * H;
        for (int i = 0; i < H; i++) o[i] = g[i] / (F(1) + vexp(-g[i])) * u[i];
    }
}

// d/dg [g·σ(g)·u] = u·σ(g)·(1 + g·(1 - σ(g))); d/du = g·σ(g).
template <typename F>
void swiglu_backward(F* dgu, const F* gu, const F* dout, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* g = gu + (size_t)n * 2 * H;
        const F* u = g + H;
        const F* dy = dout + (size_t)n * H;
        F* dg = dgu + (size_t)n * 2 * H;
        F* du = dg + H;
        for (int i = 0; i < H; i++) {
            const F sg = F(1) / (F(1) + vexp(-g[i]));
            dg[i] = dy[i] * u[i] * sg * (F(1) + g[i] * (F(1) - sg));
            du[i] = dy[i] * g[i] * sg;
        }
    }
}

// ---- Linear layers --------------------------------------------------------------
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC) {
    gemm(false, true, N, OC, IC, F(1), inp, IC, weight, IC, F(0), out, OC);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

// dbias += the column sums of dout (N x OC): matmul_backward's bias part,
// also the CPU bf16 backend's (its product runs apart, on bf16 operands).
template <typename F>
void bias_backward(F* dbias, const F* dout, int N, int OC) {
    // Column sums in blocks of 64 columns: contiguous reads, one owner per column.
    const int blk = kColBlock;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += blk) {
        int o1 = std::min(OC, o0 + blk);
        F acc[kColBlock] = {};
        for (int n = 0; n < N; n++) {
            const F* row = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += row[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int N, int IC,
                     int OC) {
    if (dinp) gemm(false, false, N, IC, OC, F(1), dout, OC, weight, IC, F(0), dinp, IC);
    if (dweight) gemm(true, false, OC, IC, N, F(1), dout, OC, inp, IC, F(1), dweight, IC);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

template <typename F>
void add_bias(F* out, const F* bias, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

// ---- GELU (tanh approximation) ------------------------------------------------------
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
    const F k = std::sqrt(F(2) / F(M_PI));
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < (long)n; i++) {
        F x = inp[i];
        out[i] = F(0.5) * x * (F(1) + vtanh(k * (x + F(0.044715) * x * x * x)));
    }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
    const F k = std::sqrt(F(2) / F(M_PI));
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < (long)n; i++) {
        F x = inp[i];
        F u = k * (x + F(0.044715) * x * x * x);
        F t = vtanh(u);
        F sech2 = F(1) - t * t;
        F grad = F(0.5) * (F(1) + t) + F(0.5) * x * sech2 * k * (F(1) + F(3) * F(0.044715) * x * x);
        dinp[i] = grad * dout[i];
    }
}

// ---- attention: llmc/backend/cpu_attention.h (included above) ---------------------

template <typename F>
void copy2d(F* dst, size_t dst_pitch, const F* src, size_t src_pitch, size_t rows, size_t cols) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++)
        for (size_t c = 0; c < cols; c++) dst[r * dst_pitch + c] = src[r * src_pitch + c];
}

// ---- fused softmax + cross-entropy --------------------------------------------------------
template <typename F>
void softmax_crossentropy(F* logits, F* losses, const int* targets, double dloss, int N, int V, int Vp,
                          bool write_grad) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        F* row = logits + (size_t)n * Vp;
        F mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = std::max(mx, row[i]);
        const int t = targets[n];
        const F target = row[t];
        // e^(x - max) in chunks (the exps vectorise, the sum runs in order),
        // kept in the row when the gradient is wanted.
        F sum = 0;
        for (int i0 = 0; i0 < V; i0 += 256) {
            F buf[256];
            F* e = write_grad ? row + i0 : buf;
            const int m = std::min(256, V - i0);
            for (int i = 0; i < m; i++) e[i] = vexp(row[i0 + i] - mx);
            for (int i = 0; i < m; i++) sum += e[i];
        }
        losses[n] = std::log(sum) + mx - target;
        if (!write_grad) continue;
        const F scale = F(dloss) / sum;
        for (int i = 0; i < V; i++) row[i] *= scale;
        row[t] -= F(dloss);
        for (int i = V; i < Vp; i++) row[i] = 0;
    }
}

// ---- vocab-parallel cross-entropy ---------------------------------------------------------
// Local column j holds global id v_begin + j; ids >= V are padding.
inline int ce_valid_cols(int Vl, int v_begin, int V) { return std::max(0, std::min(Vl, V - v_begin)); }

template <typename F>
void crossentropy_stats(const F* logits, const int* targets, F* row_max, F* target_logit, int N, int Vl, int v_begin,
                        int V) {
    const int nv = ce_valid_cols(Vl, v_begin, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* row = logits + (size_t)n * Vl;
        F mx = -INFINITY;
        for (int j = 0; j < nv; j++) mx = std::max(mx, row[j]);
        row_max[n] = mx;
        int t = targets[n] - v_begin;
        target_logit[n] = (t >= 0 && t < nv) ? row[t] : F(0);
    }
}

template <typename F>
void crossentropy_sumexp(const F* logits, const F* row_max, F* sumexp, int N, int Vl, int v_begin, int V) {
    const int nv = ce_valid_cols(Vl, v_begin, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const F* row = logits + (size_t)n * Vl;
        F s = 0;
        for (int j0 = 0; j0 < nv; j0 += 256) {  // as softmax_crossentropy: exps vectorised, sum in order
            F buf[256];
            const int m = std::min(256, nv - j0);
            for (int j = 0; j < m; j++) buf[j] = vexp(row[j0 + j] - row_max[n]);
            for (int j = 0; j < m; j++) s += buf[j];
        }
        sumexp[n] = s;
    }
}

template <typename F>
void crossentropy_finish(F* logits, F* losses, const int* targets, const F* row_max, const F* sumexp,
                         const F* target_logit, double dloss, int N, int Vl, int v_begin, int V, bool write_grad) {
    const int nv = ce_valid_cols(Vl, v_begin, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        losses[n] = std::log(sumexp[n]) + row_max[n] - target_logit[n];
        if (!write_grad) continue;
        F* row = logits + (size_t)n * Vl;
        int t = targets[n] - v_begin;
        const F scale = F(dloss) / sumexp[n], mx = row_max[n];
        for (int j = 0; j < nv; j++) row[j] = vexp(row[j] - mx) * scale;
        if (t >= 0 && t < nv) row[t] -= F(dloss);
        for (int j = nv; j < Vl; j++) row[j] = 0;
    }
}

// ---- optimizer ----------------------------------------------------------------------------------
// Adam's moments as stored: in the compute type F (S = F), or bf16 bits
// (S = uint16_t), widened on load and rounded on store (llmc/base/state_round.h;
// an fp64 value is narrowed to fp32 first).
template <typename F>
inline F load_moment(F x) { return x; }
template <typename F>
inline F load_moment(uint16_t x) { return F(bf16_to_f32(x)); }
template <typename F>
inline void store_moment(F* dst, F x, const AdamArgs&, uint32_t) { *dst = x; }
template <typename F>
inline void store_moment(uint16_t* dst, F x, const AdamArgs& a, uint32_t key) {
    *dst = f32_to_bf16(state_round::round_moment((float)x, a.stochastic, key));
}

template <typename F, typename S>
void adamw_update(F* param, F* master, const F* grad, S* m, S* v, size_t n, const AdamArgs& a) {
    const F b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay, gs = a.grad_scale;
    const F bc1 = F(a.bias_corr1), bc2 = F(a.bias_corr2);
    const uint32_t key_m = a.round_key, key_v = a.round_key ^ state_round::kSecondMoment;
    F* p = master ? master : param;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        F g = grad[i] * gs;
        F mi = b1 * load_moment<F>(m[i]) + (F(1) - b1) * g;
        F vi = b2 * load_moment<F>(v[i]) + (F(1) - b2) * g * g;
        store_moment(&m[i], mi, a, key_m);
        store_moment(&v[i], vi, a, key_v);
        F mhat = mi / bc1, vhat = vi / bc2;
        p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
        if (master) param[i] = p[i];
    }
}

// The update with m and v in the stored type a.bf16_state says.
template <typename F>
void adamw_update_state(F* param, F* master, const F* grad, void* m, void* v, size_t n, const AdamArgs& a) {
    if (a.bf16_state)
        adamw_update(param, master, grad, static_cast<uint16_t*>(m), static_cast<uint16_t*>(v), n, a);
    else
        adamw_update(param, master, grad, static_cast<F*>(m), static_cast<F*>(v), n, a);
}

// Partial sums over fixed chunks, added in chunk order: the result does not
// depend on the number of threads.
template <typename F>
double sum_squares(const F* x, size_t n) {
    const size_t chunk = 1 << 16;
    size_t nchunks = (n + chunk - 1) / chunk;
    std::vector<double> part(nchunks, 0.0);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < (long)nchunks; c++) {
        size_t lo = c * chunk, hi = std::min(n, lo + chunk);
        double acc = 0;
        for (size_t i = lo; i < hi; i++) acc += (double)x[i] * (double)x[i];
        part[c] = acc;
    }
    double total = 0;
    for (double p : part) total += p;
    return total;
}

}  // namespace cpu
