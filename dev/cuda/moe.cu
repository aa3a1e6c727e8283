// dev/cuda/moe.cu: kernel lab for Mixtral's mixture-of-experts ops
// (backend.h, Mixtral's section; docs/moe.md), the production kernels of
// llmc/backend/cuda/moe.cuh against the CPU ops of llmc/backend/cpu_moe.h:
//   route      softmax over E, top-k, renormalisation, and the grouping of the
//              N·K assignments by expert (offsets, perm, inv: exact ints)
//   route bwd  dlogits from the gradient of the top-k weights and the
//              load-balancing gradient
//   dispatch   rows to the grouped order, scaled by the weights, and with dw
//              the combine's weight gradient (row dot products)
//   combine    back to token order, weighted sums of K rows
//   grouped    the experts' products with the groups' sizes on the device
//              (--sync-free: forward, input and weight gradients over every
//              group in one launch each, grouped_gemm.h) against the CPU's
//              matmul over each group, with empty and partial groups
// The route is checked with and without the balancing bias of --moe-balance
// bias (it moves the choice of the K, not their weights).
// One version each (the production kernels are the simple first ones: a
// thread per token for the routing and one thread for the stable grouping).
// Shapes: odd sizes (N=37, E=5, K=3, C=100), Mixtral's E=8, K=2 at C=4096,
// and E=64, K=6 (DeepSeek-like routing widths). Inputs: fp32, and bf16 with
// the CPU fed the same rounded values. Timing (bf16, N=8192 tokens, E=8,
// K=2, C=4096): ms per op and, for dispatch and combine, GB/s with bytes =
// each row read once and written once; the grouped products in TFLOP/s at
// N·K = 16384 rows, C=1024, 2H=4096.
#include <type_traits>

#include "common.h"
#include "llmc/backend/cpu_moe.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/moe.cuh"

using namespace llmc_cuda;

static std::vector<int> ints_from_device(const int* d, size_t n) {
    std::vector<int> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}
// Exact equality of int outputs (a routing that differs anywhere fails).
static void check_ints(const std::string& what, const std::vector<int>& got, const std::vector<int>& ref) {
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) bad += got[i] != ref[i];
    std::printf("  %-44s %zu of %zu differ  %s\n", what.c_str(), bad, ref.size(), bad ? "FAIL" : "PASS");
    (bad ? lab::g_failed : lab::g_passed)++;
}
// Inputs as the GPU sees them: bf16-rounded when E is bf16.
template <typename E>
static std::vector<float> as_seen(std::vector<float> v) {
    if (std::is_same<E, bf16>::value)
        for (float& x : v) x = lab::round_bf16(x);
    return v;
}

template <typename E>
void check(const char* label, int N, int NE, int K, int C, double tol, bool with_bias) {
    const bool fp32 = std::is_same<E, float>::value;
    const std::string l = std::string(label) + " N=" + std::to_string(N) + " E=" + std::to_string(NE) +
                          " K=" + std::to_string(K) + " C=" + std::to_string(C) + (with_bias ? " bias" : "");
    const size_t NK = (size_t)N * K;
    // route
    const std::vector<float> logits = as_seen<E>(lab::rand_normal((size_t)N * NE, 2.f, 1));
    std::vector<float> probs((size_t)N * NE), topw(NK);
    std::vector<int> topi(NK), offsets(NE + 1), perm(NK), inv(NK);
    // The balancing bias (--moe-balance bias) moves the choice, not the weights.
    const std::vector<float> bias = lab::rand_normal(NE, 0.05f, 4);
    cpu::moe_route(probs.data(), topw.data(), topi.data(), offsets.data(), perm.data(), inv.data(), logits.data(), N,
                   NE, K, with_bias ? bias.data() : nullptr);
    float* d_bias = with_bias ? lab::to_device<float>(bias) : nullptr;
    E* d_logits = lab::to_device<E>(logits);
    float* d_probs = lab::dev_alloc<float>(probs.size());
    E* d_topw = lab::dev_alloc<E>(NK);
    int *d_topi = lab::dev_alloc<int>(NK), *d_off = lab::dev_alloc<int>(NE + 1), *d_perm = lab::dev_alloc<int>(NK),
        *d_inv = lab::dev_alloc<int>(NK);
    moe_route(fp32, d_probs, d_topw, d_topi, d_off, d_perm, d_inv, d_logits, N, NE, K, d_bias, 0);
    lab::validate((l + " route probs").c_str(), lab::from_device(d_probs, probs.size()), probs, lab::kTolF32);
    lab::validate((l + " route topw").c_str(), lab::from_device(d_topw, NK), topw, tol);
    check_ints(l + " route topi", ints_from_device(d_topi, NK), topi);
    check_ints(l + " route offsets", ints_from_device(d_off, NE + 1), offsets);
    check_ints(l + " route perm", ints_from_device(d_perm, NK), perm);
    check_ints(l + " route inv", ints_from_device(d_inv, NK), inv);

    // route backward (from the CPU's probabilities and routing, on both sides)
    const std::vector<float> dtopw = lab::rand_normal(NK, 1.f, 2), aux = lab::rand_normal(NE, 0.1f, 3);
    std::vector<float> dlogits((size_t)N * NE);
    cpu::moe_route_backward(dlogits.data(), probs.data(), topi.data(), dtopw.data(), aux.data(), N, NE, K);
    float *d_p = lab::to_device<float>(probs), *d_dtopw = lab::to_device<float>(dtopw),
          *d_aux = lab::to_device<float>(aux);
    int* d_ti = lab::ints_to_device(topi);
    E* d_dlogits = lab::dev_alloc<E>(dlogits.size());
    moe_route_backward(fp32, d_dlogits, d_p, d_ti, d_dtopw, d_aux, N, NE, K, 0);
    lab::validate((l + " route backward").c_str(), lab::from_device(d_dlogits, dlogits.size()), dlogits, tol);

    // dispatch (with and without dw) and combine, on the CPU's grouping
    const std::vector<float> x = as_seen<E>(lab::rand_normal((size_t)N * C, 1.f, 4));
    const std::vector<float> yg = as_seen<E>(lab::rand_normal(NK * C, 1.f, 5));
    const std::vector<float> w = as_seen<E>(topw);
    std::vector<float> xg(NK * C), dw(NK), out((size_t)N * C);
    cpu::moe_dispatch<float>(xg.data(), dw.data(), x.data(), yg.data(), w.data(), inv.data(), N, K, C);
    cpu::moe_combine<float>(out.data(), yg.data(), w.data(), inv.data(), N, K, C);
    E *d_x = lab::to_device<E>(x), *d_yg = lab::to_device<E>(yg), *d_w = lab::to_device<E>(w);
    int* d_iv = lab::ints_to_device(inv);
    E* d_xg = lab::to_device<E>(lab::rand_normal(NK * C, 3.f, 6));  // garbage: every row is written
    float* d_dw = lab::dev_alloc<float>(NK);
    moe_dispatch(fp32, d_xg, d_dw, d_x, d_yg, d_w, d_iv, N, K, C, 0);
    lab::validate((l + " dispatch rows").c_str(), lab::from_device(d_xg, NK * C), xg, tol);
    lab::validate((l + " dispatch dw").c_str(), lab::from_device(d_dw, NK), dw, fp32 ? 1e-5 : 1e-3);
    E* d_out = lab::dev_alloc<E>((size_t)N * C);
    moe_combine(fp32, d_out, d_yg, d_w, d_iv, N, K, C, 0);
    lab::validate((l + " combine").c_str(), lab::from_device(d_out, (size_t)N * C), out, tol);
    std::vector<float> xg1(NK * C);  // the dispatch without weights (the combine's backward)
    cpu::moe_dispatch<float>(xg1.data(), nullptr, x.data(), nullptr, nullptr, inv.data(), N, K, C);
    moe_dispatch(fp32, d_xg, nullptr, d_x, nullptr, nullptr, d_iv, N, K, C, 0);
    lab::validate((l + " dispatch unweighted").c_str(), lab::from_device(d_xg, NK * C), xg1, tol);

    for (void* p : {(void*)d_logits, (void*)d_probs, (void*)d_topw, (void*)d_topi, (void*)d_off, (void*)d_perm,
                    (void*)d_inv, (void*)d_p, (void*)d_dtopw, (void*)d_aux, (void*)d_ti, (void*)d_dlogits,
                    (void*)d_x, (void*)d_yg, (void*)d_w, (void*)d_iv, (void*)d_xg, (void*)d_dw, (void*)d_out})
        lab::dev_free(p);
    if (d_bias) lab::dev_free(d_bias);
}

// Group sizes summing to rows, some experts empty.
static std::vector<int> groups(int NE, int rows) {
    std::vector<int> off(NE + 1, 0);
    for (int e = 0; e < NE; e++) off[e + 1] = (e % 3 == 1) ? off[e] : off[e] + rows / NE + (e * 7) % 13;
    off[NE] = rows;
    for (int e = NE - 1; e >= 0; e--) off[e] = std::min(off[e], off[e + 1]);
    return off;
}

template <typename E>
void check_grouped(const char* label, int rows, int NE, int IC, int OC, double tol) {
    const bool fp32 = std::is_same<E, float>::value;
    const std::vector<int> off = groups(NE, rows);
    const std::vector<float> x = as_seen<E>(lab::rand_normal((size_t)rows * IC, 1.f, 11));
    const std::vector<float> w = as_seen<E>(lab::rand_normal((size_t)NE * OC * IC, 0.05f, 12));
    const std::vector<float> dy = as_seen<E>(lab::rand_normal((size_t)rows * OC, 1.f, 13));
    const std::vector<float> dw0 = as_seen<E>(lab::rand_normal((size_t)NE * OC * IC, 0.01f, 14));
    std::vector<float> y((size_t)rows * OC), dx((size_t)rows * IC), dw = dw0;
    for (int e = 0; e < NE; e++) {
        const int n = off[e + 1] - off[e];
        if (n <= 0) continue;
        const size_t we = (size_t)e * OC * IC;
        cpu::matmul_forward(y.data() + (size_t)off[e] * OC, x.data() + (size_t)off[e] * IC, w.data() + we,
                            (const float*)nullptr, n, IC, OC);
        cpu::matmul_backward(dx.data() + (size_t)off[e] * IC, dw.data() + we, (float*)nullptr,
                             dy.data() + (size_t)off[e] * OC, x.data() + (size_t)off[e] * IC, w.data() + we, n, IC, OC);
    }
    E *d_x = lab::to_device<E>(x), *d_w = lab::to_device<E>(w), *d_dy = lab::to_device<E>(dy),
      *d_dw = lab::to_device<E>(dw0);
    E *d_y = lab::dev_alloc<E>(y.size()), *d_dx = lab::dev_alloc<E>(dx.size());
    int* d_off = lab::ints_to_device(off);
    moe_expert_matmul_forward(fp32, d_y, d_x, d_w, d_off, rows, NE, IC, OC, 0);
    moe_expert_matmul_backward(fp32, d_dx, d_dw, d_dy, d_x, d_w, d_off, rows, NE, IC, OC, 0);
    const std::string l = std::string(label) + " grouped rows=" + std::to_string(rows) + " E=" + std::to_string(NE) +
                          " " + std::to_string(IC) + "->" + std::to_string(OC);
    lab::validate((l + " forward").c_str(), lab::from_device(d_y, y.size()), y, tol);
    lab::validate((l + " input grad").c_str(), lab::from_device(d_dx, dx.size()), dx, tol);
    lab::validate((l + " weight grad").c_str(), lab::from_device(d_dw, dw.size()), dw, tol);
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_dy, (void*)d_dw, (void*)d_y, (void*)d_dx, (void*)d_off})
        lab::dev_free(p);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    std::printf("validation\n");
    struct Shape {
        int N, E, K, C;
    };
    const Shape shapes[] = {{37, 5, 3, 100}, {1024, 8, 2, 4096}, {512, 64, 6, 256}, {3000, 8, 1, 64}};
    for (const Shape& s : shapes) {
        check<float>("fp32", s.N, s.E, s.K, s.C, lab::kTolF32, false);
        check<bf16>("bf16", s.N, s.E, s.K, s.C, lab::kTolBF16, false);
    }
    check<float>("fp32", 1024, 8, 2, 64, lab::kTolF32, true);
    check<bf16>("bf16", 37, 5, 3, 100, lab::kTolBF16, true);
    check_grouped<float>("fp32", 300, 4, 48, 80, lab::kTolF32);
    check_grouped<float>("fp32", 2048, 8, 256, 512, lab::kTolF32);
    check_grouped<bf16>("bf16", 2048, 8, 256, 512, lab::kTolBF16);
    check_grouped<bf16>("bf16", 129, 3, 17, 33, lab::kTolBF16);

    if (lab::check_only()) return lab::finish();
    const int N = 8192, NE = 8, K = 2, C = 4096;
    const size_t NK = (size_t)N * K;
    std::printf("timing (bf16, N=%d tokens, E=%d, K=%d, C=%d)\n", N, NE, K, C);
    bf16* logits = lab::to_device<bf16>(lab::rand_normal((size_t)N * NE, 2.f, 7));
    float* probs = lab::dev_alloc<float>((size_t)N * NE);
    bf16 *topw = lab::dev_alloc<bf16>(NK), *x = lab::to_device<bf16>(lab::rand_normal((size_t)N * C, 1.f, 8));
    bf16 *xg = lab::dev_alloc<bf16>(NK * C), *out = lab::dev_alloc<bf16>((size_t)N * C);
    int *topi = lab::dev_alloc<int>(NK), *off = lab::dev_alloc<int>(NE + 1), *perm = lab::dev_alloc<int>(NK),
        *inv = lab::dev_alloc<int>(NK);
    float ms = lab::time_ms([&] { moe_route(false, probs, topw, topi, off, perm, inv, logits, N, NE, K, nullptr, 0); });
    std::printf("  %-44s %8.4f ms\n", "route (softmax, top-k, one-thread grouping)", ms);
    std::printf("figure route_ms %g ms\n", ms);
    ms = lab::time_ms([&] { moe_dispatch(false, xg, nullptr, x, nullptr, topw, inv, N, K, C, 0); });
    lab::report_bw("dispatch", ms, 2.0 * NK * C * sizeof(bf16));
    ms = lab::time_ms([&] { moe_combine(false, out, xg, topw, inv, N, K, C, 0); });
    lab::report_bw("combine", ms, ((double)NK * C + (double)N * C) * sizeof(bf16));
    for (void* p : {(void*)logits, (void*)probs, (void*)topw, (void*)x, (void*)xg, (void*)out, (void*)topi, (void*)off,
                    (void*)perm, (void*)inv})
        lab::dev_free(p);
    {  // the grouped products (--sync-free's), even groups
        const int R = 16384, G = 8, IC = 1024, OC = 4096;
        std::vector<int> eo(G + 1);
        for (int e = 0; e <= G; e++) eo[e] = e * (R / G);
        int* d_eo = lab::ints_to_device(eo);
        bf16 *gx = lab::to_device<bf16>(lab::rand_normal((size_t)R * IC, 1.f, 15)),
             *gw = lab::to_device<bf16>(lab::rand_normal((size_t)G * OC * IC, 0.02f, 16));
        bf16 *gy = lab::dev_alloc<bf16>((size_t)R * OC), *gdw = lab::dev_alloc<bf16>((size_t)G * OC * IC);
        const double flop = 2.0 * R * IC * OC;
        ms = lab::time_ms([&] { moe_expert_matmul_forward(false, gy, gx, gw, d_eo, R, G, IC, OC, 0); }, 5);
        std::printf("  %-44s %8.4f ms  %6.1f TFLOP/s\n", "grouped forward (SIMT)", ms, flop / ms / 1e9);
        std::printf("figure grouped_forward_tflops %g TFLOP/s\n", flop / ms / 1e9);
        ms = lab::time_ms([&] { moe_expert_matmul_backward(false, gx, gdw, gy, gx, gw, d_eo, R, G, IC, OC, 0); }, 5);
        std::printf("  %-44s %8.4f ms  %6.1f TFLOP/s\n", "grouped backward (input + weight)", ms, 2 * flop / ms / 1e9);
        for (void* p : {(void*)d_eo, (void*)gx, (void*)gw, (void*)gy, (void*)gdw}) lab::dev_free(p);
    }
    return lab::finish();
}
