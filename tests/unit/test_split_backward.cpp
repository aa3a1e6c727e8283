// tests/unit/test_split_backward.cpp: the backward split for zero-bubble
// pipelines (GPT::backward_chunk's parts, llmc/model/backward.cpp) against
// the whole backward, on the CPU backends. Two micro-batches in two
// activation slots accumulate their gradients; the whole backward runs
// F0 B0 F1 B1, the split ones F0 F1 B0 B1 W0 W1 (every W after every B, as
// a pipeline's cool-down runs them) and F0 B0 F1 W0 B1 W1 (W between the
// micro-batches). Every gradient must be the same bit for bit, for GPT-2,
// Llama, Qwen2 (q, k, v biases) and Mixtral (experts, router, aux loss)
// blocks in fp64, fp32 and bf16, with the last micro-step told to B and W
// alike, under every recompute mode (gelu, selective, full: B keeps what it
// recomputed for W), with --fp8 1 (W reads the amaxes of the slot) and
// under ZeRO 2 and 3 (a block's gradient buffer handed out per backward:
// W takes the norms' weight gradients from the output gradients B kept,
// and under full recompute from the norms' inputs B kept).
// The comparison can fail: leaving out one W changes the gradients. (A
// Mixtral under full recompute: B keeps the experts' input rows and row
// groups it recomputed.)
// Last line: "N passed, N failed".
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/backend/backends.h"
#include "llmc/base/rng.h"
#include "llmc/comm/comm_local.h"
#include "llmc/model/gpt.h"
#include "llmc/parallel/data_parallel.h"
#include "tests/lib/check.h"

namespace {

using Part = GPT::BackwardPart;
constexpr int B = 2, T = 16, V = 97;

struct Batch {
    std::vector<int> inputs, targets;
};

Batch batch(uint64_t seed) {
    Rng r(seed);
    Batch b;
    for (int i = 0; i < B * T; i++) b.inputs.push_back((int)(r.next_u64() % V)), b.targets.push_back((int)(r.next_u64() % V));
    return b;
}

// One step's gradients after the ops in `order` ("F0", "B1", "W0", "A1":
// forward, B, W and the whole backward of micro-batch 0 or 1, each in its
// own slot), as doubles.
// zero: the ZeRO stage of a data-parallel group of one (its gradient
// buffers handed out per backward from stage 2).
std::vector<double> grads(Backend* be, const GPTConfig& c, const std::string& order, bool split,
                          Recompute rc = Recompute::none, bool fp8 = false, int zero = 0) {
    ModelOptions o(B, T);
    o.recompute = rc;
    o.fp8 = fp8;
    o.sharding = Sharding::for_zero(zero, 1, 0, 1, 0);
    ModelChunk ch;
    ch.layers = c.num_layers, ch.embed = ch.head = true, ch.slots = 2;
    o.chunks = {ch};
    o.split_backward = split;
    GPT model(be, c, o);
    LocalComm one("dp", *be);
    std::unique_ptr<DataParallel> dp;
    if (zero) dp.reset(new DataParallel(model, one, zero));
    model.init_random(5);
    model.zero_grad();
    const Batch mb[2] = {batch(11), batch(12)};
    const double dloss = 1.0 / (2.0 * B * T);
    for (size_t i = 0; i + 1 < order.size(); i += 3) {
        const char op = order[i];
        const int k = order[i + 1] - '0';
        const bool last = k == 1;
        if (op == 'F') model.forward_chunk(0, k, mb[k].inputs.data(), nullptr, mb[k].targets.data(), B, T, dloss);
        if (op == 'A') model.backward_chunk(0, k, nullptr, last);
        if (op == 'B') model.backward_chunk(0, k, nullptr, last, Part::input);
        if (op == 'W') model.backward_chunk(0, k, nullptr, last, Part::weights);
    }
    if (dp) dp->finish_reductions();
    const size_t n = model.table().total;
    std::vector<double> g(n);
    be->download(g.data(), DType::F64, model.grads(), model.precision().grad, n);
    return g;
}

bool same(const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

int main() {
    const char* models[] = {"L=2,C=32,NH=4,V=97,T=16", "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=16",
                            "arch=qwen2,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=16",
                            "arch=mixtral,L=2,C=32,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=16,aux=0.05"};
    for (const char* dtype : {"fp64", "fp32", "bf16"}) {
        std::string err;
        std::unique_ptr<Backend> be(make_backend("cpu", dtype, 0, &err));
        CHECK(be != nullptr, "cpu %s: %s", dtype, err.c_str());
        if (!be) continue;
        for (const char* spec : models) {
            GPTConfig c;
            CHECK(parse_model_spec(spec, &c, &err), "%s: %s", spec, err.c_str());
            const std::vector<double> whole = grads(be.get(), c, "F0 A0 F1 A1", false);
            const std::vector<double> late = grads(be.get(), c, "F0 F1 B0 B1 W0 W1", true);
            const std::vector<double> mixed = grads(be.get(), c, "F0 B0 F1 W0 B1 W1", true);
            const std::vector<double> no_w = grads(be.get(), c, "F0 F1 B0 B1 W0", true);
            double norm = 0;
            for (double x : whole) norm += x * x;
            CHECK(norm > 0, "%s %s: the whole backward gave no gradient", spec, dtype);
            CHECK(same(late, whole), "%s %s: F0 F1 B0 B1 W0 W1 differs from the whole backward", spec, dtype);
            CHECK(same(mixed, whole), "%s %s: F0 B0 F1 W0 B1 W1 differs from the whole backward", spec, dtype);
            CHECK(!same(no_w, whole), "%s %s: leaving out W1 changed nothing (the check could not fail)", spec, dtype);
            // The whole backward of a model built for the split is the plain one.
            CHECK(same(grads(be.get(), c, "F0 A0 F1 A1", true), whole), "%s %s: split_backward changed 'all'", spec,
                  dtype);
            std::printf("%-48s %s: B then W equal the whole backward bit for bit\n", spec, dtype);
            {  // --fp8 1: W reads the forward's and B's amaxes from the slot
                const std::vector<double> w8 = grads(be.get(), c, "F0 A0 F1 A1", false, Recompute::none, true);
                CHECK(same(grads(be.get(), c, "F0 F1 B0 B1 W0 W1", true, Recompute::none, true), w8),
                      "%s %s --fp8: B then W", spec, dtype);
                CHECK(!same(w8, whole), "%s %s --fp8 changed nothing", spec, dtype);
            }
            for (int zero : {2, 3}) {  // W takes the norms' weight gradients (under full recompute from B's copies)
                const std::vector<double> wz = grads(be.get(), c, "F0 A0 F1 A1", false, Recompute::none, false, zero);
                CHECK(same(grads(be.get(), c, "F0 F1 B0 B1 W0 W1", true, Recompute::none, false, zero), wz) &&
                          same(grads(be.get(), c, "F0 B0 F1 W0 B1 W1", true, Recompute::none, false, zero), wz),
                      "%s %s ZeRO %d: B then W", spec, dtype, zero);
                {
                    const std::vector<double> wf = grads(be.get(), c, "F0 A0 F1 A1", false, Recompute::full, false, zero);
                    CHECK(same(grads(be.get(), c, "F0 F1 B0 B1 W0 W1", true, Recompute::full, false, zero), wf),
                          "%s %s ZeRO %d recompute full: B then W", spec, dtype, zero);
                }
                CHECK(!same(grads(be.get(), c, "F0 F1 B0 B1 W0", true, Recompute::none, false, zero), wz),
                      "%s %s ZeRO %d: leaving out W1 changed nothing", spec, dtype, zero);
            }
            if (std::string(dtype) == "bf16") continue;
            for (Recompute rc : {Recompute::gelu, Recompute::selective, Recompute::full}) {
                const std::vector<double> w = grads(be.get(), c, "F0 A0 F1 A1", false, rc);
                CHECK(same(grads(be.get(), c, "F0 F1 B0 B1 W0 W1", true, rc), w), "%s %s recompute %s: B then W",
                      spec, dtype, recompute_name(rc));
                CHECK(same(w, whole), "%s %s recompute %s: the whole backward as without", spec, dtype,
                      recompute_name(rc));
            }
        }
    }
    return check_summary();
}
