// tests/unit/test_real_shapes.cpp: the CUDA backend at GPT-2 d12's real shapes
// against the CPU backend in fp64, on the same weights and batch.
//
// Cases (d12 shape: C=768, HS=64, V=50257, Vp=50304, maxT=T=1024, L=2):
//   d12    B=--rows rows: logits (every row), loss and every gradient tensor
//          of CUDA fp32 and CUDA bf16 against CPU fp64;
//   hs128  the same with NH=6, so heads of 128;
//   llama  a Llama of about the same cost: L=2, C=1024, NH=8, NKV=2 (GQA
//          4:1, heads of 128), F=2816, V=Vp=32000, T=1024, rotary base
//          500000, untied head: RMSNorm, RoPE, SwiGLU and GQA attention
//          kernels, same checks (small stand-in: C=64, NH=4, NKV=2, F=176);
//   big    B=48 rows, so N*Vp = 49152*50304 = 2.47e9 > 2^31 classifier
//          elements. The fp64 truth at that size would cost ~20 GB and an
//          hour of CPU, so two checks stand in for it:
//          (a) periodic: the 48 rows are 48/rows copies of the d12 case's
//              rows, whose fp64 truth is known: every row's logits, the loss
//              and every gradient (a mean over copies equals the mean over
//              one period) against CPU fp64, in fp32 and bf16;
//          (b) distinct rows: 48 different rows in one CUDA fp32 forward and
//              backward against the same rows run through a --rows model in
//              48/rows accumulated micro-batches (the path (a) and the d12
//              case check against fp64): logits of every row, loss, gradients.
// The weights are the model's initialisation with wte, qkvw (and an untied
// lm_head) scaled by 2, so
// the softmaxes (vocabulary and attention) are far from uniform as in a
// trained model (loss 11.4 on random targets, against ln V = 10.8); at 4x
// the problem is so ill-conditioned that the CPU fp32 backend itself is off
// by 1e-5 (measured, B=1). They are rounded to fp32 once, so fp32 runs and
// the fp64 truth see the same numbers. Errors are ‖a-b‖/‖b‖ per tensor kind.
// Tolerances: tests/lib/tolerances.h (fp32 1e-5, tight; bf16 provisional
// until measured on a GPU, see docs/gpu-results.md).
//
// Without a CUDA device (a CPU-only machine, CI) the same cases run at small
// shapes with the CPU fp32 backend in the CUDA backend's place, which checks
// this program's own logic; --device cpu forces that, and --shape real with
// it times the CPU side at the real shapes.
// Each measured error is also printed as "figure NAME VALUE rel" for
// scripts/gpu/check.sh. Last line: "N passed, N failed".
//
// usage: test_real_shapes [--device auto|cuda|cpu] [--cases d12,hs128,big,llama]
//                         [--shape auto|real|small] [--rows 4] [--big-rows 48]
//                         [--bf16-tol FWD,GRAD]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/base/args.h"
#include "llmc/backend/backends.h"
#include "llmc/model/gpt.h"
#include "llmc/base/rng.h"
#include "tests/lib/tolerances.h"

namespace {

struct Checker {
    int passed = 0, failed = 0;
    void check(const std::string& name, double rel, double tol) {
        bool ok = rel <= tol;  // false for NaN
        (ok ? passed : failed)++;
        std::printf("%s %-44s rel err %.3e (tol %.0e)\n", ok ? "PASS" : "FAIL", name.c_str(), rel, tol);
        std::printf("figure %s %.6e rel\n", name.c_str(), rel);
        std::fflush(stdout);
    }
    void require(const std::string& what, bool ok) {
        (ok ? passed : failed)++;
        std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    }
};

// ‖a-b‖ and ‖b‖ accumulated piecewise (the logits never sit whole on the host).
struct RelErr {
    double diff = 0, ref = 0;
    void add(const double* a, const double* b, size_t n) {
        for (size_t i = 0; i < n; i++) {
            diff += (a[i] - b[i]) * (a[i] - b[i]);
            ref += b[i] * b[i];
        }
    }
    double value() const { return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What a model computed on one batch: loss, every logit row, every gradient.
struct Result {
    int B = 0, T = 0;
    double loss = 0;
    std::vector<double> logits;  // [B*T, V]
    std::vector<double> grads;   // file order
};

void set_weights(GPT& m, const std::vector<double>& w) { m.set_weights_file_order(w.data(), DType::F64); }

std::vector<double> grads_of(GPT& m) {
    std::vector<double> g(m.table().file_params);
    m.get_file_order(g.data(), DType::F64, m.grads(), false, m.precision().grad);
    return g;
}

// Forward (logits and loss), then forward + backward with dloss = 1/N.
Result run(Backend* be, const GPTConfig& c, int B, int T, const std::vector<double>& w, const std::vector<int>& in,
           const std::vector<int>& tg) {
    GPT m(be, c, {B, T});
    be->reserve_workspace(m.workspace());  // as the trainer does (parallel/layout.cpp)
    set_weights(m, w);
    Result r;
    r.B = B;
    r.T = T;
    const size_t V = c.vocab_size, N = (size_t)B * T;
    r.loss = m.forward(in.data(), tg.data(), B, T);
    r.logits.resize(N * V);
    for (size_t n = 0; n < N; n++) m.logits_row((int)(n / T), (int)(n % T), &r.logits[n * V], DType::F64);
    m.zero_grad();
    m.forward(in.data(), tg.data(), B, T, 1.0 / (double)N);
    m.backward();
    r.grads = grads_of(m);
    return r;
}

// Per tensor kind (all layers together), as test_gpt compares.
void check_grads(Checker& ck, const std::string& prefix, const GPTConfig& c, const std::vector<double>& got,
                 const std::vector<double>& ref, double tol) {
    TensorTable table(c);
    for (int k = 0; k < (int)Param::count; k++) {
        if (!kind_in_model(c, (Param)k)) continue;  // another architecture's kind
        const TensorEntry& first = table.get((Param)k, 0);
        const size_t n = first.numel * (param_kind((Param)k).per_layer ? c.num_layers : 1);
        RelErr e;
        e.add(&got[first.file_offset], &ref[first.file_offset], n);
        ck.check(prefix + "_grad_" + param_kind((Param)k).name, e.value(), tol);
    }
}

// A model of `rows` rows on the device against the truth; row b of the model
// is row b % truth.B of the truth (rows > truth.B: the periodic batch).
void check_against_truth(Checker& ck, const std::string& prefix, Backend* be, const GPTConfig& c, int rows,
                         const std::vector<double>& w, const std::vector<int>& in, const std::vector<int>& tg,
                         const Result& truth, double tol_fwd, double tol_grad) {
    const auto t0 = std::chrono::steady_clock::now();
    const int T = truth.T;
    const size_t V = c.vocab_size, N = (size_t)rows * T;
    std::vector<int> in_rows(N), tg_rows(N);
    for (size_t n = 0; n < N; n++) {
        const size_t src = (size_t)((n / T) % truth.B) * T + n % T;
        in_rows[n] = in[src];
        tg_rows[n] = tg[src];
    }
    GPT m(be, c, {rows, T});
    be->reserve_workspace(m.workspace());
    set_weights(m, w);
    const double loss = m.forward(in_rows.data(), tg_rows.data(), rows, T);
    RelErr el;
    std::vector<double> row(V);
    for (size_t n = 0; n < N; n++) {
        m.logits_row((int)(n / T), (int)(n % T), row.data(), DType::F64);
        const size_t src = (size_t)((n / T) % truth.B) * T + n % T;
        el.add(row.data(), &truth.logits[src * V], V);
    }
    ck.check(prefix + "_logits", el.value(), tol_fwd);
    RelErr ell;
    ell.add(&loss, &truth.loss, 1);
    ck.check(prefix + "_loss", ell.value(), tol_fwd);
    m.zero_grad();
    m.forward(in_rows.data(), tg_rows.data(), rows, T, 1.0 / (double)N);
    m.backward();
    check_grads(ck, prefix, c, grads_of(m), truth.grads, tol_grad);
    std::printf("  (%s: %.1f s)\n", prefix.c_str(), seconds_since(t0));
}

// Distinct rows: one forward/backward over `big` rows against the same rows
// in micro-batches of `small` rows, gradients accumulated (1/N each).
void check_chunked(Checker& ck, const std::string& prefix, Backend* be, const GPTConfig& c, int big, int small,
                   int T, const std::vector<double>& w, const std::vector<int>& in, const std::vector<int>& tg,
                   double tol) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t V = c.vocab_size, N = (size_t)big * T, n_small = (size_t)small * T;
    const double dloss = 1.0 / (double)N;
    GPT mb(be, c, {big, T}), ms(be, c, {small, T});
    be->reserve_workspace(mb.workspace());
    be->reserve_workspace(ms.workspace());
    set_weights(mb, w);
    set_weights(ms, w);
    const double loss_big = mb.forward(in.data(), tg.data(), big, T);
    double loss_chunks = 0;
    RelErr el;
    std::vector<double> rb(V), rs(V);
    for (int k = 0; k < big / small; k++) {
        loss_chunks += ms.forward(&in[k * n_small], &tg[k * n_small], small, T) / (big / small);
        for (size_t n = 0; n < n_small; n++) {
            ms.logits_row((int)(n / T), (int)(n % T), rs.data(), DType::F64);
            mb.logits_row(k * small + (int)(n / T), (int)(n % T), rb.data(), DType::F64);
            el.add(rb.data(), rs.data(), V);
        }
    }
    ck.check(prefix + "_logits", el.value(), tol);
    RelErr ell;
    ell.add(&loss_big, &loss_chunks, 1);
    ck.check(prefix + "_loss", ell.value(), tol);
    mb.zero_grad();
    mb.forward(in.data(), tg.data(), big, T, dloss);
    mb.backward();
    const std::vector<double> gb = grads_of(mb);
    ms.zero_grad();
    for (int k = 0; k < big / small; k++) {
        ms.forward(&in[k * n_small], &tg[k * n_small], small, T, dloss);
        ms.backward();
    }
    check_grads(ck, prefix, c, gb, grads_of(ms), tol);
    std::printf("  (%s: %.1f s)\n", prefix.c_str(), seconds_since(t0));
}

// GPT-2 initialisation (the trainer's), wte and qkvw x2, rounded to fp32.
std::vector<double> make_weights(const GPTConfig& c, uint64_t seed) {
    std::unique_ptr<Backend> be(make_backend("cpu", "fp64", 0, nullptr));
    GPT m(be.get(), c, {1, 1});
    m.init_random(seed);
    std::vector<double> w(m.table().file_params);
    m.get_file_order(w.data(), DType::F64, m.weights(), false, m.weights_dtype());
    TensorTable table(c);
    for (Param p : {Param::wte, Param::qkvw, Param::lm_head}) {
        if (!kind_in_model(c, p)) continue;
        const TensorEntry& e = table.get(p, 0);
        const size_t n = e.file_rows * e.file_cols * (param_kind(p).per_layer ? c.num_layers : 1);
        for (size_t i = 0; i < n; i++) w[e.file_offset + i] *= 2.0;
    }
    for (double& x : w) x = (double)(float)x;
    return w;
}

std::vector<int> random_tokens(size_t n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> t(n);
    for (int& x : t) x = (int)(rng.next_u64() % (uint64_t)V);
    return t;
}

bool has(const std::string& list, const std::string& item) {
    std::stringstream ss(list);
    std::string x;
    while (std::getline(ss, x, ','))
        if (x == item || x == "all") return true;
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    std::string device = "auto", cases = "d12,hs128,big,llama", bf16_tol = "", shape = "auto";
    int rows = 4, big_rows = 48;
    ArgParser p("test_real_shapes", "The CUDA backend at d12's real shapes against the CPU backend in fp64.");
    p.add({0, "device", Option::String, &device, "device under test (cpu: small shapes, CPU fp32)", 0, 0,
           {"auto", "cuda", "cpu"}});
    p.add({0, "shape", Option::String, &shape, "real (d12) or small shapes (auto: real on a GPU)", 0, 0,
           {"auto", "real", "small"}});
    p.add({0, "cases", Option::String, &cases, "comma-separated: d12, hs128, big, llama, or all"});
    p.add({0, "rows", Option::Int, &rows, "rows of the fp64-checked batches", 1, 64});
    p.add({0, "big-rows", Option::Int, &big_rows, "rows of the big batch (a multiple of --rows)", 1, 1024});
    p.add({0, "bf16-tol", Option::String, &bf16_tol, "bf16 tolerances: forward,gradients (default: tests/lib/tolerances.h)"});
    bool help = false;
    std::string err;
    if (!p.parse(argc, argv, &help, &err)) {
        std::fprintf(stderr, "test_real_shapes: error: %s\n%s", err.c_str(), p.usage().c_str());
        return 1;
    }
    if (help) {
        std::printf("%s", p.usage().c_str());
        return 0;
    }
    double tol_bf16_fwd = tol::kBf16Forward, tol_bf16_grad = tol::kBf16Grad;
    if ((!bf16_tol.empty() && std::sscanf(bf16_tol.c_str(), "%lf,%lf", &tol_bf16_fwd, &tol_bf16_grad) != 2) ||
        big_rows % rows != 0) {
        std::fprintf(stderr, "test_real_shapes: error: flag --bf16-tol wants A,B and --big-rows a multiple of --rows\n");
        return 1;
    }
    // The devices under test: CUDA fp32 and bf16, or the CPU fp32 stand-in.
    std::vector<std::pair<std::string, std::unique_ptr<Backend>>> devs;
    if (device != "cpu") {
        std::unique_ptr<Backend> f32(make_backend("cuda", "fp32", 0, &err));
        if (f32) {
            devs.emplace_back("cuda_fp32", std::move(f32));
            devs.emplace_back("cuda_bf16", std::unique_ptr<Backend>(make_backend("cuda", "bf16", 0, &err)));
        } else if (device == "cuda") {
            std::fprintf(stderr, "test_real_shapes: error: %s\n", err.c_str());
            return 1;
        } else {
            std::printf("test_real_shapes: no CUDA device (%s): small shapes, CPU fp32 in its place\n", err.c_str());
        }
    }
    const bool on_gpu = !devs.empty(), real = shape == "auto" ? on_gpu : shape == "real";
    if (!on_gpu) devs.emplace_back("cpu_fp32", std::unique_ptr<Backend>(make_backend("cpu", "fp32", 0, &err)));
    std::unique_ptr<Backend> cpu64(make_backend("cpu", "fp64", 0, &err));

    // Shapes: d12's (L=2) on a GPU; a small stand-in otherwise.
    GPTConfig d12;
    std::string spec = real ? "L=2,C=768,NH=12,V=50257,Vp=50304,T=1024" : "L=2,C=64,NH=4,V=500,Vp=512,T=64";
    if (!parse_model_spec(spec, &d12, &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
    GPTConfig hs128 = d12;
    hs128.num_heads = real ? 6 : 2;
    GPTConfig llama;
    const std::string lspec = real ? "arch=llama,L=2,C=1024,NH=8,NKV=2,F=2816,V=32000,T=1024,theta=500000"
                                   : "arch=llama,L=2,C=64,NH=4,NKV=2,F=176,V=500,T=64,theta=500000";
    if (!parse_model_spec(lspec, &llama, &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
    const int T = d12.max_seq_len;
    if (!real && big_rows == 48) big_rows = 3 * rows;
    Checker ck;
    auto tol_fwd = [&](const std::string& d) { return d == "cuda_bf16" ? tol_bf16_fwd : tol::kFp32; };
    auto tol_grad = [&](const std::string& d) { return d == "cuda_bf16" ? tol_bf16_grad : tol::kFp32; };

    for (const GPTConfig* c : {&d12, &hs128, &llama}) {
        const std::string name = c == &d12 ? "d12" : c == &hs128 ? "hs128" : "llama";
        const bool want_big = c == &d12 && has(cases, "big");
        if (!has(cases, name) && !want_big) continue;
        std::printf("== %s: %s, B=%d T=%d, head size %d\n", name.c_str(), config_string(*c).c_str(), rows, T,
                    c->head_size());
        const std::vector<double> w = make_weights(*c, 1337);
        const std::vector<int> in = random_tokens((size_t)rows * T, c->vocab_size, 1),
                               tg = random_tokens((size_t)rows * T, c->vocab_size, 2);
        auto t0 = std::chrono::steady_clock::now();
        const Result truth = run(cpu64.get(), *c, rows, T, w, in, tg);
        std::printf("  cpu fp64 truth: loss %.9f (%.1f s)\n", truth.loss, seconds_since(t0));
        if (has(cases, name))
            for (auto& d : devs)
                check_against_truth(ck, name + "_" + d.first, d.second.get(), *c, rows, w, in, tg, truth,
                                    tol_fwd(d.first), tol_grad(d.first));
        if (!want_big) continue;
        const size_t N = (size_t)big_rows * T;
        std::printf("== big: %d rows of %d, N*Vp = %zu classifier elements (2^31 = %zu)\n", big_rows, T,
                    N * c->padded_vocab_size, (size_t)1 << 31);
        if (real) ck.require("big batch has N*Vp > 2^31", N * c->padded_vocab_size > ((size_t)1 << 31));
        for (auto& d : devs)
            check_against_truth(ck, "big_periodic_" + d.first, d.second.get(), *c, big_rows, w, in, tg, truth,
                                tol_fwd(d.first), tol_grad(d.first));
        const std::vector<int> in_big = random_tokens(N, c->vocab_size, 3), tg_big = random_tokens(N, c->vocab_size, 4);
        check_chunked(ck, "big_chunked_" + devs[0].first, devs[0].second.get(), *c, big_rows, rows, T, w, in_big,
                      tg_big, tol::kFp32);
    }
    std::printf("%d passed, %d failed\n", ck.passed, ck.failed);
    return ck.failed ? 1 : 0;
}
