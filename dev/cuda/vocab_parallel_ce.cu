// dev/cuda/vocab_parallel_ce.cu: kernel lab for the vocab-parallel (tensor
// parallel) cross-entropy of llmc/backend/cuda/classifier.cuh and for add_bias of
// llmc/backend/cuda/matmul.cuh.
//
// The logits [N, Vp] are cut into P vocabulary slices of Vl = Vp / P columns
// (V not divisible by P; the last slice, sometimes the last two, hold padding
// columns filled with large values that must not leak in). Each slice runs
//   crossentropy_stats -> (host: max / sum over slices, the all-reduces)
//   crossentropy_sumexp -> (host: sum over slices) -> crossentropy_finish
// on the GPU, and the losses, the per-slice statistics and the reassembled
// dlogits are checked against the cpu:: ops of the same three steps (same
// combine) and against the fused cpu::softmax_crossentropy on the full rows.
// One configuration has a slice with no valid column at all (row_max -inf
// before the combine). add_bias is checked against cpu::add_bias.
//   version 2: the previous production kernels (dev/cuda/previous.h: 2-byte
//              accesses)
//   version 3: llmc/backend/cuda/classifier.cuh (production: 16-byte packs when the
//              slice width is a multiple of the pack; element by element
//              otherwise, e.g. the bf16 slices of 20 columns below)
#include <algorithm>

#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/classifier.cuh"
#include "llmc/backend/cuda/matmul.cuh"
#include "previous.h"

using namespace llmc_cuda;

// The three steps of either version.
template <typename E>
void ce_stats(int version, const E* logits, const int* targets, float* row_max, float* target_logit, int N, int Vl,
              int v_begin, int V) {
    if (version == 2) llmc_prev::crossentropy_stats<E>(logits, targets, row_max, target_logit, N, Vl, v_begin, V, 0);
    else crossentropy_stats<E>(logits, targets, row_max, target_logit, N, Vl, v_begin, V, 0);
}
template <typename E>
void ce_sumexp(int version, const E* logits, const float* row_max, float* sumexp, int N, int Vl, int v_begin, int V) {
    if (version == 2) llmc_prev::crossentropy_sumexp<E>(logits, row_max, sumexp, N, Vl, v_begin, V, 0);
    else crossentropy_sumexp<E>(logits, row_max, sumexp, N, Vl, v_begin, V, 0);
}
template <typename E>
void ce_finish(int version, E* logits, float* losses, const int* targets, const float* row_max, const float* sumexp,
               const float* target_logit, float dloss, int N, int Vl, int v_begin, int V, bool grad) {
    if (version == 2)
        llmc_prev::crossentropy_finish<E>(logits, losses, targets, row_max, sumexp, target_logit, dloss, N, Vl, v_begin,
                                          V, grad, 0);
    else
        crossentropy_finish<E>(logits, losses, targets, row_max, sumexp, target_logit, dloss, N, Vl, v_begin, V, grad,
                               0);
}

// Columns [p*Vl, (p+1)*Vl) of x[N, Vp].
std::vector<float> slice_of(const std::vector<float>& x, int N, int Vp, int Vl, int p) {
    std::vector<float> s((size_t)N * Vl);
    for (int n = 0; n < N; n++)
        std::copy_n(x.begin() + (size_t)n * Vp + (size_t)p * Vl, Vl, s.begin() + (size_t)n * Vl);
    return s;
}
void put_slice(std::vector<float>& x, const std::vector<float>& s, int N, int Vp, int Vl, int p) {
    for (int n = 0; n < N; n++)
        std::copy_n(s.begin() + (size_t)n * Vl, Vl, x.begin() + (size_t)n * Vp + (size_t)p * Vl);
}

std::vector<float> make_logits(int N, int V, int Vp, uint64_t seed) {
    std::vector<float> x = lab::rand_normal((size_t)N * Vp, 2.f, seed);
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) x[(size_t)n * Vp + i] = 100.f;  // padding: must be ignored
    return x;
}

// What one three-step run produces: per-slice stats, combined stats, losses
// (of slice 0; every slice's losses must agree) and the reassembled logits.
struct Result {
    std::vector<std::vector<float>> row_max, target_logit, sumexp;  // per slice
    std::vector<float> losses, logits;
    bool slices_agree = true;
};

void combine_max(std::vector<float>& acc, const std::vector<float>& x) {
    for (size_t i = 0; i < acc.size(); i++) acc[i] = std::max(acc[i], x[i]);
}
void combine_sum(std::vector<float>& acc, const std::vector<float>& x) {
    for (size_t i = 0; i < acc.size(); i++) acc[i] += x[i];
}

// The three steps with the CPU ops (float), combining on the host.
Result run_cpu(const std::vector<float>& logits, const std::vector<int>& targets, float dloss, int N, int V, int Vp,
               int P, bool grad) {
    const int Vl = Vp / P;
    Result r;
    std::vector<std::vector<float>> sl(P);
    std::vector<float> gmax(N, -INFINITY), gtl(N, 0.f), gsum(N, 0.f);
    for (int p = 0; p < P; p++) {
        sl[p] = slice_of(logits, N, Vp, Vl, p);
        std::vector<float> mx(N), tl(N);
        cpu::crossentropy_stats(sl[p].data(), targets.data(), mx.data(), tl.data(), N, Vl, p * Vl, V);
        combine_max(gmax, mx);
        combine_sum(gtl, tl);
        r.row_max.push_back(mx), r.target_logit.push_back(tl);
    }
    for (int p = 0; p < P; p++) {
        std::vector<float> se(N);
        cpu::crossentropy_sumexp(sl[p].data(), gmax.data(), se.data(), N, Vl, p * Vl, V);
        combine_sum(gsum, se);
        r.sumexp.push_back(se);
    }
    r.logits = logits;
    for (int p = 0; p < P; p++) {
        std::vector<float> losses(N);
        cpu::crossentropy_finish(sl[p].data(), losses.data(), targets.data(), gmax.data(), gsum.data(), gtl.data(),
                                 (double)dloss, N, Vl, p * Vl, V, grad);
        if (p == 0) r.losses = losses;
        put_slice(r.logits, sl[p], N, Vp, Vl, p);
    }
    return r;
}

// The three steps on the GPU in element type E, combining on the host.
template <typename E>
Result run_gpu(int version, const std::vector<float>& logits, const std::vector<int>& targets, float dloss, int N,
               int V, int Vp, int P, bool grad) {
    const int Vl = Vp / P;
    Result r;
    std::vector<E*> dl(P);
    for (int p = 0; p < P; p++) dl[p] = lab::to_device<E>(slice_of(logits, N, Vp, Vl, p));
    int* dtargets = lab::ints_to_device(targets);
    float* dmax = lab::dev_alloc<float>(N);
    float* dtl = lab::dev_alloc<float>(N);
    float* dsum = lab::dev_alloc<float>(N);
    float* dlosses = lab::dev_alloc<float>(N);

    std::vector<float> gmax(N, -INFINITY), gtl(N, 0.f), gsum(N, 0.f);
    for (int p = 0; p < P; p++) {
        ce_stats<E>(version, dl[p], dtargets, dmax, dtl, N, Vl, p * Vl, V);
        r.row_max.push_back(lab::from_device(dmax, N));
        r.target_logit.push_back(lab::from_device(dtl, N));
        combine_max(gmax, r.row_max.back());
        combine_sum(gtl, r.target_logit.back());
    }
    CUDA_CHECK(cudaMemcpy(dmax, gmax.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    for (int p = 0; p < P; p++) {
        ce_sumexp<E>(version, dl[p], dmax, dsum, N, Vl, p * Vl, V);
        r.sumexp.push_back(lab::from_device(dsum, N));
        combine_sum(gsum, r.sumexp.back());
    }
    CUDA_CHECK(cudaMemcpy(dsum, gsum.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dtl, gtl.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    r.logits = logits;
    for (int p = 0; p < P; p++) {
        CUDA_CHECK(cudaMemset(dlosses, 0xff, N * sizeof(float)));  // NaN: a row left unwritten fails
        ce_finish<E>(version, dl[p], dlosses, dtargets, dmax, dsum, dtl, dloss, N, Vl, p * Vl, V, grad);
        std::vector<float> losses = lab::from_device(dlosses, N);
        if (p == 0) r.losses = losses;
        else if (std::memcmp(losses.data(), r.losses.data(), N * sizeof(float)) != 0) r.slices_agree = false;
        put_slice(r.logits, lab::from_device(dl[p], (size_t)N * Vl), N, Vp, Vl, p);
    }
    for (E* p : dl) lab::dev_free(p);
    lab::dev_free(dtargets), lab::dev_free(dmax), lab::dev_free(dtl), lab::dev_free(dsum), lab::dev_free(dlosses);
    return r;
}

template <typename E>
void check(int version, const char* label_, int N, int V, int Vp, int P, bool grad, double tol) {
    const std::string lv = "v" + std::to_string(version) + " " + label_;
    const char* label = lv.c_str();
    std::vector<float> logits = make_logits(N, V, Vp, 1);
    std::vector<int> targets = lab::rand_ints(N, 0, V, 2);
    const float dloss = 1.f / N;
    const Result ref = run_cpu(logits, targets, dloss, N, V, Vp, P, grad);
    std::vector<float> flogits = logits, flosses(N);
    cpu::softmax_crossentropy(flogits.data(), flosses.data(), targets.data(), (double)dloss, N, V, Vp, grad);
    const Result got = run_gpu<E>(version, logits, targets, dloss, N, V, Vp, P, grad);

    const std::string l = std::string(label) + " V=" + std::to_string(V) + " P=" + std::to_string(P) +
                          (grad ? " grad" : " loss");
    for (int p = 0; p < P; p++) {
        const std::string s = l + " slice " + std::to_string(p);
        // row_max of a slice with no valid column is -inf on both sides:
        // validate() would see inf - inf, so compare those exactly.
        bool empty = false;
        for (float m : ref.row_max[p]) empty |= m == -INFINITY;
        if (empty) {
            bool same = got.row_max[p] == ref.row_max[p];
            std::printf("  %-44s %s\n", (s + " row_max (-inf)").c_str(), same ? "PASS" : "FAIL");
            (same ? lab::g_passed : lab::g_failed)++;
        } else {
            lab::validate((s + " row_max").c_str(), got.row_max[p], ref.row_max[p], 0.0);
        }
        lab::validate((s + " target_logit").c_str(), got.target_logit[p], ref.target_logit[p], 0.0);
        lab::validate((s + " sumexp").c_str(), got.sumexp[p], ref.sumexp[p], lab::kTolF32);
    }
    std::printf("  %-44s %s\n", (l + " losses equal on all slices").c_str(), got.slices_agree ? "PASS" : "FAIL");
    (got.slices_agree ? lab::g_passed : lab::g_failed)++;
    // Inputs are bf16-representable, so the statistics and losses are fp32
    // computations in both builds.
    lab::validate((l + " losses vs cpu 3-step").c_str(), got.losses, ref.losses, lab::kTolF32);
    lab::validate((l + " losses vs cpu fused").c_str(), got.losses, flosses, lab::kTolF32);
    lab::validate((l + " logits/dlogits vs cpu 3-step").c_str(), got.logits, ref.logits, tol);
    lab::validate((l + " logits/dlogits vs cpu fused").c_str(), got.logits, flogits, tol);
}

// sumexp guard: a row whose valid logits are all -inf, with row_max -inf,
// sums to 0 (exp(-inf - -inf) would be NaN).
void check_neg_inf_guard() {
    const int N = 4, Vl = 40, V = 30;
    std::vector<float> x((size_t)N * Vl, -INFINITY), mx(N, -INFINITY);
    float* dx = lab::to_device<float>(x);
    float* dmx = lab::to_device<float>(mx);
    float* ds = lab::dev_alloc<float>(N);
    crossentropy_sumexp<float>(dx, dmx, ds, N, Vl, 0, V, 0);
    lab::validate("sumexp all -inf row, row_max -inf -> 0", lab::from_device(ds, N), std::vector<float>(N, 0.f), 0.0);
    lab::dev_free(dx), lab::dev_free(dmx), lab::dev_free(ds);
}

template <typename E>
void check_add_bias(const char* label, int N, int OC, double tol) {
    std::vector<float> out = lab::rand_normal((size_t)N * OC, 1.f, 5);
    std::vector<float> bias = lab::rand_normal(OC, 1.f, 6);
    std::vector<float> ref = out;
    cpu::add_bias(ref.data(), bias.data(), N, OC);
    E* dout = lab::to_device<E>(out);
    E* dbias = lab::to_device<E>(bias);
    add_bias<E>(dout, dbias, N, OC, 0);
    const std::string l = std::string(label) + " add_bias N=" + std::to_string(N) + " OC=" + std::to_string(OC);
    lab::validate(l.c_str(), lab::from_device(dout, out.size()), ref, tol);
    lab::dev_free(dout), lab::dev_free(dbias);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    std::printf("validation\n");
    for (int grad = 0; grad < 2; grad++) {
        // GPT-2 vocabulary padded to 50304: 2 and 3 slices (16768 columns), the last holding the padding.
        check<float>(2, "fp32", 64, 50257, 50304, 2, grad, lab::kTolF32);
        check<bf16>(2, "bf16", 64, 50257, 50304, 3, grad, lab::kTolBF16);
        for (int v = 2; v <= 3; v++) {
            check<float>(v, "fp32", 64, 50257, 50304, 3, grad, lab::kTolF32);
            // Small: 3 slices of 40, the last with 17 valid columns.
            check<float>(v, "fp32", 100, 97, 120, 3, grad, lab::kTolF32);
            check<bf16>(v, "bf16", 100, 97, 120, 3, grad, lab::kTolBF16);
            // A slice without any valid column: 3 slices of 20, V = 37 (slice 2 starts at 40).
            check<float>(v, "fp32", 50, 37, 60, 3, grad, lab::kTolF32);
            check<bf16>(v, "bf16", 50, 37, 60, 3, grad, lab::kTolBF16);
        }
        check<float>(3, "fp32", 64, 50257, 50304, 2, grad, lab::kTolF32);
        check<bf16>(3, "bf16", 64, 50257, 50304, 3, grad, lab::kTolBF16);
    }
    check_neg_inf_guard();
    check_add_bias<float>("fp32", 300, 768, lab::kTolF32);
    check_add_bias<bf16>("bf16", 300, 768, lab::kTolBF16);
    check_add_bias<float>("fp32", 7, 13, lab::kTolF32);

    // Timing: one slice of the two-way split (what one rank runs) against the
    // fused kernel on the whole row.
    const int B = 8, T = 1024, V = 50257, Vp = 50304, N = B * T, P = 2, Vl = Vp / P;
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d V=%d Vp=%d, with gradient)\n", N, V, Vp);
    std::vector<float> logits = make_logits(N, V, Vp, 3);
    std::vector<int> targets = lab::rand_ints(N, 0, V, 4);
    bf16* dfull = lab::to_device<bf16>(logits);
    bf16* dslice = lab::to_device<bf16>(slice_of(logits, N, Vp, Vl, 0));
    int* dtargets = lab::ints_to_device(targets);
    float* dlosses = lab::dev_alloc<float>(N);
    float* dmax = lab::dev_alloc<float>(N);
    float* dtl = lab::dev_alloc<float>(N);
    float* dsum = lab::dev_alloc<float>(N);
    // Runs in place: the logits turn into gradients, which is as good an input as any for timing.
    // Bytes: the fused kernel reads and writes the row once; the three steps
    // read the slice three times and write it once.
    for (int v = 2; v <= 3; v++) {
        const std::string nm = v == 2 ? "v2 previous" : "v3 production";
        float ms = lab::time_ms([&] {
            if (v == 2) llmc_prev::softmax_crossentropy<bf16>(dfull, dlosses, dtargets, 1.f / N, N, V, Vp, true, 0);
            else softmax_crossentropy<bf16>(dfull, dlosses, dtargets, 1.f / N, N, V, Vp, true, 0);
        });
        lab::report_bw((nm + " fused, full row").c_str(), ms, 2.0 * N * (double)Vp * sizeof(bf16));
        ms = lab::time_ms([&] {
            ce_stats<bf16>(v, dslice, dtargets, dmax, dtl, N, Vl, 0, V);
            ce_sumexp<bf16>(v, dslice, dmax, dsum, N, Vl, 0, V);
            ce_finish<bf16>(v, dslice, dlosses, dtargets, dmax, dsum, dtl, 1.f / N, N, Vl, 0, V, true);
        });
        lab::report_bw((nm + " 3-step, one slice of 2 (no all-reduce)").c_str(), ms, 4.0 * N * (double)Vl * sizeof(bf16));
    }
    lab::dev_free(dfull), lab::dev_free(dslice), lab::dev_free(dtargets), lab::dev_free(dlosses);
    lab::dev_free(dmax), lab::dev_free(dtl), lab::dev_free(dsum);
    return lab::finish();
}
