// tests/unit/test_regions.cpp: recorded regions (backend.h, docs/design.md
// section 2.9) on the CPU, through the recording backend that emulates CUDA
// graph capture (llmc/backend/backend_recorder.h). The truth is the same
// ops run as they come:
//   - the recording rules: while recording, ops are kept and not run, and a
//     transfer, allocation, synchronisation or host-side result inside a
//     region is refused naming the op (a CUDA graph could not hold it);
//   - a replay runs the recorded ops again on whatever the buffers now hold;
//   - a model's forward and backward (GPT-2 with whole and chunked heads
//     and full recompute, Llama) over micro-steps of new data give, bit for
//     bit in fp64, the losses and gradients of the plain backend, with the
//     passes replayed rather than run.
// Last line: "N passed, N failed".
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/backend_recorder.h"
#include "llmc/base/rng.h"
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
    CHECK(refused([&] { be->region_begin(8); }, "region_begin"), "regions do not nest");
    be->region_end();
    CHECK(out[0] == 11 && out[3] == 44, "region_end runs the recording (%g %g)", out[0], out[3]);
    // A replay runs the same ops on what the buffers hold now.
    const double z[4] = {100, 200, 300, 400};
    be->upload(a, DType::F64, z, DType::F64, 4);
    CHECK(be->region_replay(7), "key 7 replays");
    CHECK(out[0] == 110 && out[3] == 440, "the replay read the new input (%g %g)", out[0], out[3]);
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
    test_two_models();
    test_model("gpt-2", "L=2,C=32,NH=4,V=61,T=16", Recompute::none, 0);
    test_model("gpt-2 head chunks of 5 rows, full recompute", "L=2,C=32,NH=4,V=61,T=16", Recompute::full, 5);
    test_model("llama", "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=61,T=16", Recompute::selective, 0);
    return check_summary();
}
