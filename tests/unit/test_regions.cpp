// tests/unit/test_regions.cpp: recorded regions (backend.h, docs/design.md
// section 2.9) on the CPU, through the recording backend that emulates CUDA
// graph capture (llmc/backend/backend_recorder.h). The truth is the same
// ops run as they come:
//   - the recording rules: while recording, ops are kept and not run, and a
//     transfer, allocation, synchronisation or host-side result inside a
//     region is refused naming the op (a CUDA graph could not hold it);
//   - a region inside one being recorded folds into it;
//   - the optimizer and the norm inside a region: refused with a new table
//     of runs or host-side values, else replayed with the step's figures
//     (and the bf16 moments' rounding key from the figures' step);
//   - a replay runs the recorded ops again on whatever the buffers now hold;
//   - a model's forward and backward (GPT-2 with whole and chunked heads
//     and full recompute, Llama) over micro-steps of new data give, bit for
//     bit in fp64, the losses and gradients of the plain backend, with the
//     passes replayed rather than run.
// Last line: "N passed, N failed".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_recorder.h"
#include "llmc/base/rng.h"
#include "llmc/base/state_round.h"
#include "llmc/model/config.h"
#include "llmc/model/gpt.h"
#include "tests/lib/check.h"

static bool refused(const std::function<void()>& fn, const char* op) {
    try {
        fn();
    } catch (const std::logic_error& e) {
        return std::string(e.what()).find(op) != std::string::npos;
    }
    return false;
}

static void test_rules() {
    std::unique_ptr<Backend> be(make_recording_backend(make_cpu_backend(DType::F64)));
    CHECK(be->region_stats().on, "the recorder reports regions on");
    double* a = static_cast<double*>(be->alloc(4 * sizeof(double)));
    double* b = static_cast<double*>(be->alloc(4 * sizeof(double)));
    double* out = static_cast<double*>(be->alloc(4 * sizeof(double)));
    const double x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40};
    be->upload(a, DType::F64, x, DType::F64, 4);
    be->upload(b, DType::F64, y, DType::F64, 4);
    CHECK(!be->region_replay(7), "no recording under key 7 yet");
    CHECK(be->region_begin(7), "the recorder records");
    be->residual_forward(out, a, b, 4);
    // Recorded, not run: as in CUDA stream capture, nothing has happened yet.
    CHECK(out[0] == 0 && out[3] == 0, "an op inside a recording has not run before region_end");
    double host[4];
    CHECK(refused([&] { be->download(host, DType::F64, out, DType::F64, 4); }, "download"), "download refused");
    CHECK(refused([&] { be->upload(a, DType::F64, x, DType::F64, 4); }, "upload"), "upload refused");
    CHECK(refused([&] { be->alloc(8); }, "alloc"), "alloc refused");
    CHECK(refused([&] { be->release(a); }, "release"), "release refused");
    CHECK(refused([&] { be->synchronize(); }, "synchronize"), "synchronize refused");
    CHECK(refused([&] { be->sum_squares(a, DType::F64, 4); }, "sum_squares"), "sum_squares refused");
    // A region inside the one being recorded folds into it: no replay, no
    // recording of its own; its ops join the outer recording.
    CHECK(!be->region_replay(7) && !be->region_begin(8), "an inner region neither replays nor records");
    be->residual_forward(b, b, a, 4);
    CHECK(b[0] == 10, "the inner region's op has not run either");
    be->region_end();
    CHECK(out[0] == 11 && out[3] == 44 && b[0] == 11 && b[3] == 44, "region_end runs the recording (%g %g %g)",
          out[0], out[3], b[3]);
    CHECK(be->region_stats().recorded == 1, "the inner region kept no recording of its own");
    // A replay runs the same ops on what the buffers hold now.
    const double z[4] = {100, 200, 300, 400};
    be->upload(a, DType::F64, z, DType::F64, 4);
    be->upload(b, DType::F64, y, DType::F64, 4);
    CHECK(be->region_replay(7), "key 7 replays");
    CHECK(out[0] == 110 && out[3] == 440 && b[0] == 110, "the replay read the new input (%g %g %g)", out[0], out[3],
          b[0]);
    CHECK(be->region_stats().recorded == 1 && be->region_stats().replays == 1, "stats: %d recorded, %lld replays",
          be->region_stats().recorded, be->region_stats().replays);
    // Outside a region the same calls are fine.
    be->download(host, DType::F64, out, DType::F64, 4);
    CHECK(host[1] == 220, "download outside a region");
    be->release(a), be->release(b), be->release(out);
    std::unique_ptr<Backend> plain(make_cpu_backend(DType::F64));
    CHECK(!plain->region_stats().on && !plain->region_begin(1) && !plain->region_replay(1),
          "the plain CPU backend records nothing");
}

// The optimizer and the norm inside a region (the whole step as one,
// llmc/run/step_graph.h): allowed when their tables of runs are those of
// the last call (a GPU keeps them on the device) and the step's values come
// from the figures in backend memory; then a replay takes the figures'
// values of its own step. The truth: the plain backend with host-side
// arguments (AdamArgs without figures) holding the same values.
static void test_optimizer_in_region() {
    const size_t n = 6;
    auto make = [] { return std::unique_ptr<Backend>(make_recording_backend(make_cpu_backend(DType::F64))); };
    std::unique_ptr<Backend> be = make(), plain(make_cpu_backend(DType::F64));
    struct Bufs {
        double *p, *g, *m, *v, *f, *ss;
    };
    auto bufs = [&](Backend& b) {
        Bufs r;
        for (double** q : {&r.p, &r.g, &r.m, &r.v, &r.ss}) *q = static_cast<double*>(b.alloc(n * sizeof(double)));
        r.f = static_cast<double*>(b.alloc(step_figure::count * sizeof(double)));
        const double p0[n] = {0.5, -1, 2, 0.25, -0.75, 1.5}, g0[n] = {0.1, -0.2, 0.3, -0.4, 0.5, -0.6}, z[n] = {};
        b.upload(r.p, DType::F64, p0, DType::F64, n), b.upload(r.g, DType::F64, g0, DType::F64, n);
        b.upload(r.m, DType::F64, z, DType::F64, n), b.upload(r.v, DType::F64, z, DType::F64, n);
        return r;
    };
    Bufs r = bufs(*be), q = bufs(*plain);
    // The step's figures: lr, bias corrections, clip scale, not skipped, step 4.
    auto figures = [&](Backend& b, double* f, double lr, double scale, double step) {
        double h[step_figure::count] = {};
        h[step_figure::lr] = lr, h[step_figure::scale] = scale, h[step_figure::step] = step;
        h[step_figure::bias_corr1] = 0.1, h[step_figure::bias_corr2] = 0.05;
        b.upload(f, DType::F64, h, DType::F64, step_figure::count);
    };
    AdamArgs a{};
    a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.weight_decay = 0.1, a.round_seed = 99;
    a.lr = 7, a.grad_scale = 7, a.bias_corr1 = a.bias_corr2 = 1;  // values a replay must not use
    const AdamSpan span{r.p, nullptr, r.g, r.m, r.v, n, true}, other{r.p, nullptr, r.g, r.m, r.v, n - 1, true};
    const SumSpan sspan{r.g, n}, sother{r.g, n - 1};
    AdamArgs af = a;
    af.figures = r.f;
    figures(*be, r.f, 1e-2, 1.0, 4);
    be->adamw_update_multi(&span, 1, af);  // the runs' first call: outside any region
    be->sum_squares_to(r.ss, &sspan, 1, DType::F64, nullptr);
    CHECK(be->region_begin(21), "recording");
    CHECK(refused([&] { be->adamw_update_multi(&span, 1, a); }, "adamw_update_multi with the step's values"),
          "adamw_update_multi with host-side values refused in a region");
    CHECK(refused([&] { be->adamw_update_multi(&other, 1, af); }, "adamw_update_multi with new runs"),
          "adamw_update_multi with a new table of runs refused in a region");
    be->region_end();
    be->adamw_update_multi(&span, 1, af);  // back to the recorded runs (a new table, outside: fine)
    CHECK(be->region_begin(22), "recording");
    CHECK(refused([&] { be->sum_squares_to(r.ss, &sother, 1, DType::F64, nullptr); }, "sum_squares_to with new runs"),
          "sum_squares_to with a new table of runs refused in a region");
    be->region_end();
    // sum_squares_multi and sum_squares_to share one table on a GPU.
    be->sum_squares_to(r.ss, &sspan, 1, DType::F64, nullptr);
    be->sum_squares_multi(&sother, 1, DType::F64);
    CHECK(be->region_begin(23), "recording");
    CHECK(refused([&] { be->sum_squares_to(r.ss, &sspan, 1, DType::F64, nullptr); }, "sum_squares_to with new runs"),
          "sum_squares_to after sum_squares_multi over other runs refused in a region");
    be->region_end();
    be->sum_squares_to(r.ss, &sspan, 1, DType::F64, nullptr);
    // Recorded with the same tables and figures: allowed; replayed with the
    // next step's figures, it takes them.
    std::unique_ptr<Backend> fresh = make();
    Bufs t = bufs(*fresh);
    const AdamSpan tspan{t.p, nullptr, t.g, t.m, t.v, n, true};
    AdamArgs tf = a;
    tf.figures = t.f;
    figures(*fresh, t.f, 1e-2, 1.0, 0);
    fresh->adamw_update_multi(&tspan, 1, tf);  // step 0, outside: the table goes up
    AdamArgs host = a;
    host.lr = 1e-2, host.grad_scale = 1, host.bias_corr1 = 0.1, host.bias_corr2 = 0.05;
    const AdamSpan qspan{q.p, nullptr, q.g, q.m, q.v, n, true};
    plain->adamw_update_multi(&qspan, 1, host);
    bool ok = true;
    for (int k = 1; k <= 3; k++) {
        figures(*fresh, t.f, 1e-2 * (k + 1), 0.5, k);
        if (!fresh->region_replay(31)) {
            ok = ok && fresh->region_begin(31);
            fresh->adamw_update_multi(&tspan, 1, tf);
            fresh->region_end();
        }
        host.lr = 1e-2 * (k + 1), host.grad_scale = 0.5;
        plain->adamw_update_multi(&qspan, 1, host);
    }
    double got[n], want[n];
    fresh->download(got, DType::F64, t.p, DType::F64, n);
    plain->download(want, DType::F64, q.p, DType::F64, n);
    CHECK(ok && fresh->region_stats().recorded == 1 && fresh->region_stats().replays == 2,
          "AdamW with the figures recorded once, replayed twice");
    CHECK(std::equal(got, got + n, want), "the replays took each step's lr and clip scale from the figures "
                                          "(%.17g against %.17g)", got[0], want[0]);
    // A skipped step in the figures: the replay leaves the weights alone.
    double h[step_figure::count];
    fresh->download(h, DType::F64, t.f, DType::F64, step_figure::count);
    h[step_figure::skip] = 1;
    fresh->upload(t.f, DType::F64, h, DType::F64, step_figure::count);
    CHECK(fresh->region_replay(31), "replayed");
    fresh->download(got, DType::F64, t.p, DType::F64, n);
    CHECK(std::equal(got, got + n, want), "a replay of a skipped step changes nothing");
}

// The rounding key of bf16 moments from the figures: step_key(round_seed,
// figures' step), as the host makes it from the step (state_round.h). The
// fp64 and bf16 CPU backends give the bits of the host-keyed update.
static void test_round_key_from_figures() {
    for (DType dt : {DType::F64, DType::BF16}) {
        std::unique_ptr<Backend> be(dt == DType::BF16 ? make_cpu_bf16_backend() : make_cpu_backend(dt));
        const Precision pr = be->precision();
        const size_t n = 64;
        auto buf = [&](DType t, double base) {
            void* p = be->alloc(n * dtype_size(t));
            std::vector<double> h(n);
            for (size_t i = 0; i < n; i++) h[i] = base * (1 + 0.37 * (double)((i * 7919) % 13)) * (i % 2 ? -1 : 1);
            be->upload(p, t, h.data(), DType::F64, n);
            return p;
        };
        AdamArgs a{};
        a.lr = 3e-3, a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.weight_decay = 0, a.grad_scale = 1;
        a.bias_corr1 = 0.1, a.bias_corr2 = 0.05, a.bf16_state = true, a.stochastic = true, a.round_seed = 12345;
        std::vector<uint16_t> out[2];
        for (int with : {0, 1}) {
            void *p = buf(pr.param, 0.5), *g = buf(pr.grad, 1e-3);
            // The moments in bf16 from zero (CPU backend memory is the host's).
            void *m = be->alloc(n * 2), *v = be->alloc(n * 2);
            std::memset(m, 0, n * 2), std::memset(v, 0, n * 2);
            void* master = pr.has_master ? buf(pr.master, 0.5) : nullptr;
            AdamArgs x = a;
            if (with) {
                double* f = static_cast<double*>(be->alloc(step_figure::count * sizeof(double)));
                double h[step_figure::count] = {};
                h[step_figure::lr] = a.lr, h[step_figure::scale] = 1, h[step_figure::step] = 17;
                h[step_figure::bias_corr1] = a.bias_corr1, h[step_figure::bias_corr2] = a.bias_corr2;
                be->upload(f, DType::F64, h, DType::F64, step_figure::count);
                x.figures = f, x.round_key = 0;
            } else {
                x.round_key = state_round::step_key(a.round_seed, 17);
            }
            const AdamSpan sp{p, master, g, m, v, n, false};
            be->adamw_update_multi(&sp, 1, x);
            out[with].resize(2 * n);
            std::memcpy(out[with].data(), m, n * 2);
            std::memcpy(out[with].data() + n, v, n * 2);
        }
        CHECK(out[0] == out[1], "%s: the moments rounded with the figures' step equal the host-keyed ones",
              dt == DType::F64 ? "fp64" : "bf16");
    }
}

// Losses and gradients of `steps` optimizer steps of `micro` micro-steps
// each (new random tokens every micro-step), zeroing the gradients per step.
struct PassResult {
    std::vector<double> losses, grads;
    Backend::RegionStats stats;
};
static PassResult run_passes(Backend* be, const GPTConfig& c, int B, int T, Recompute rc, int head_chunk, int steps,
                             int micro, uint64_t seed = 11) {
    PassResult r;
    ModelOptions o(B, T);
    o.recompute = rc;
    o.head_chunk = head_chunk;
    GPT m(be, c, o);
    m.init_random(seed);
    Rng rng(5);
    std::vector<int> in(B * T), tg(B * T);
    for (int s = 0; s < steps; s++) {
        m.zero_grad();
        for (int k = 0; k < micro; k++) {
            for (int i = 0; i < B * T; i++) in[i] = (int)(rng.next_u64() % c.vocab_size);
            for (int i = 0; i < B * T; i++) tg[i] = (int)(rng.next_u64() % c.vocab_size);
            r.losses.push_back(m.forward(in.data(), tg.data(), B, T, 1.0 / (micro * B * T)));
            m.backward(k == micro - 1);
        }
        // A forward with targets and no gradient (validation) between steps.
        r.losses.push_back(m.forward(in.data(), tg.data(), B, T, 0.0));
        std::vector<double> g(m.table().total);
        be->download(g.data(), DType::F64, m.grads(), DType::F64, g.size());
        r.grads.insert(r.grads.end(), g.begin(), g.end());
    }
    r.stats = be->region_stats();
    return r;
}

static void test_model(const char* name, const char* spec, Recompute rc, int head_chunk) {
    GPTConfig c;
    std::string err;
    if (!parse_model_spec(spec, &c, &err)) {
        CHECK(false, "%s: %s", spec, err.c_str());
        return;
    }
    const int B = 2, T = 8, steps = 3, micro = 2;
    std::unique_ptr<Backend> plain(make_cpu_backend(DType::F64));
    std::unique_ptr<Backend> rec(make_recording_backend(make_cpu_backend(DType::F64)));
    PassResult want = run_passes(plain.get(), c, B, T, rc, head_chunk, steps, micro);
    PassResult got = run_passes(rec.get(), c, B, T, rc, head_chunk, steps, micro);
    size_t diff = 0;
    for (size_t i = 0; i < want.grads.size(); i++) diff += want.grads[i] != got.grads[i];
    CHECK(want.losses == got.losses, "%s: losses of recorded regions equal the plain run's", name);
    CHECK(want.grads.size() == got.grads.size() && diff == 0, "%s: %zu of %zu gradients differ", name, diff,
          want.grads.size());
    // Four regions: the forward with a gradient, the backward of an earlier
    // and of the last micro-step, the forward without; all but their first
    // runs replayed.
    const long long runs = (long long)steps * (2 * micro + 1);
    CHECK(got.stats.recorded == 4 && got.stats.replays == runs - 4, "%s: %d recorded, %lld replays (want 4, %lld)",
          name, got.stats.recorded, got.stats.replays, runs - 4);
}

// Two models of the same shapes on one backend (a test, or an evaluation
// beside the trained model): each replays its own regions only, never the
// other's, whose buffers are elsewhere (on a GPU a replay of the other's
// graph read freed memory).
static void test_two_models() {
    GPTConfig c;
    std::string err;
    parse_model_spec("L=2,C=32,NH=4,V=61,T=16", &c, &err);
    const int B = 2, T = 8;
    std::unique_ptr<Backend> plain(make_cpu_backend(DType::F64));
    std::unique_ptr<Backend> rec(make_recording_backend(make_cpu_backend(DType::F64)));
    GPT first(rec.get(), c, {B, T});
    first.init_random(3);
    std::vector<int> in(B * T, 1);
    for (int k = 0; k < 2; k++) {  // recorded, then replayed
        first.forward(in.data(), in.data(), B, T, 1.0 / (B * T));
        first.backward(true);
    }
    PassResult want = run_passes(plain.get(), c, B, T, Recompute::none, 0, 2, 2, 12);
    PassResult got = run_passes(rec.get(), c, B, T, Recompute::none, 0, 2, 2, 12);
    CHECK(want.losses == got.losses && want.grads == got.grads,
          "a second model of the same shapes on one backend runs its own regions, not the first's");
}

int main() {
    test_rules();
    test_optimizer_in_region();
    test_round_key_from_figures();
    test_two_models();
    test_model("gpt-2", "L=2,C=32,NH=4,V=61,T=16", Recompute::none, 0);
    test_model("gpt-2 head chunks of 5 rows, full recompute", "L=2,C=32,NH=4,V=61,T=16", Recompute::full, 5);
    test_model("llama", "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=61,T=16", Recompute::selective, 0);
    return check_summary();
}
