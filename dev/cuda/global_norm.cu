// dev/cuda/global_norm.cu: kernel lab for the sum of squares of a gradient
// buffer (global norm for clipping), returned to the host as a double.
//   version 1: a single block with a grid-stride loop (naive: one SM)
//   version 2: llmc/backend/cuda/global_norm.cuh (production: fixed grid, double partials,
//              summed on the host in block order)
// and the sum over many runs (the norm of ZeRO shards and tp slices):
//   loop:  version 2 once per run, one synchronisation each (what the
//          optimizer step did before)
//   multi: SumSqMulti of norm.cuh (production: one launch over every run's
//          chunks, one synchronisation), checked against the loop and the
//          CPU, and timed against the loop over a d12-like table of runs.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/global_norm.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void sum_squares_v1(double* result, const E* x, size_t n) {
    __shared__ double red[1024];
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const double v = (double)to_float(x[i]);
        acc += v * v;
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = red[0];
}

template <typename E>
double run(int version, const E* x, size_t n, double* scratch) {
    if (version == 1) {
        sum_squares_v1<E><<<1, 1024>>>(scratch, x, n);
        CUDA_CHECK_LAUNCH();
        double r = 0;
        CUDA_CHECK(cudaMemcpy(&r, scratch, sizeof(double), cudaMemcpyDeviceToHost));
        return r;
    }
    return sum_squares<E>(x, n, scratch, 0);
}

template <typename E>
void check(int version, const char* label, const std::vector<float>& x) {
    const double ref = cpu::sum_squares(x.data(), x.size());
    E* dx = lab::to_device<E>(x);
    double* scratch = lab::dev_alloc<double>(sum_squares_scratch_doubles(x.size()));
    const double got = run<E>(version, dx, x.size(), scratch);
    // Both sides sum exact squares in double: only the order differs.
    lab::validate(label, {(float)(got / ref)}, {1.f}, tol::kSumSquaresRatio);
    std::printf("    got %.12e  ref %.12e  rel %.2e\n", got, ref, std::fabs(got - ref) / ref);
    lab::dev_free(dx), lab::dev_free(scratch);
}

// Runs like a d12 ZeRO shard's tensors: per block 12 runs of the sizes of
// its tensors / 8, plus the embeddings; about 150 runs.
std::vector<SumSpan> d12_runs(const char* base, size_t es, size_t n) {
    const size_t C = 768, sizes[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    std::vector<SumSpan> runs;
    size_t at = 0;
    auto add = [&](size_t len) {
        len = std::max<size_t>(1, len / 8);
        if (at + len > n) return;
        runs.push_back({base + at * es, len});
        at += len + 1;  // a gap: runs need not touch
    };
    add(50304 * C);
    add(1024 * C);
    for (int l = 0; l < 12; l++)
        for (size_t z : sizes) add(z);
    return runs;
}

template <typename E>
void check_multi(const char* label, const std::vector<float>& x, const E* dx) {
    const std::vector<SumSpan> runs = d12_runs(reinterpret_cast<const char*>(dx), sizeof(E), x.size());
    double* scratch = lab::dev_alloc<double>(sum_squares_scratch_doubles(x.size()));
    double loop = 0, ref = 0;
    for (const SumSpan& r : runs) {
        loop += sum_squares<E>(static_cast<const E*>(r.x), r.n, scratch, 0);
        const size_t off = (static_cast<const char*>(r.x) - reinterpret_cast<const char*>(dx)) / sizeof(E);
        ref += cpu::sum_squares(x.data() + off, r.n);
    }
    SumSqMulti m;
    const double got = m.run<E>(runs.data(), (int)runs.size(), 0);
    const double again = m.run<E>(runs.data(), (int)runs.size(), 0);
    lab::validate(label, {(float)(got / loop), (float)(got / ref)}, {1.f, 1.f}, 1e-9);
    std::printf("    %zu runs: multi %.15e  loop %.15e  cpu %.15e\n", runs.size(), got, loop, ref);
    const bool same = got == again;
    std::printf("  %-44s %s\n", (std::string(label) + " second call bit-identical").c_str(), same ? "PASS" : "FAIL");
    (same ? lab::g_passed : lab::g_failed)++;
    m.release();
    lab::dev_free(scratch);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const size_t n = (size_t)124475904;  // GPT-2 124M parameters
    std::vector<float> x = lab::rand_normal(n, 0.01f, 1);
    std::printf("validation (n=%zu, and n=1000)\n", n);
    check<float>(1, "v1 fp32", x);
    check<float>(2, "v2 fp32", x);
    check<bf16>(2, "v2 bf16", x);
    check<float>(2, "v2 fp32 n=1000", std::vector<float>(x.begin(), x.begin() + 1000));
    {
        float* xf = lab::to_device<float>(x);
        bf16* xb = lab::to_device<bf16>(x);
        check_multi<float>("multi fp32 == loop of v2", x, xf);
        // bf16 runs: the reference squares the fp32 values, so compare the loop only.
        const std::vector<SumSpan> runs = d12_runs(reinterpret_cast<const char*>(xb), sizeof(bf16), n);
        double* sc = lab::dev_alloc<double>(sum_squares_scratch_doubles(n));
        double loop = 0;
        for (const SumSpan& r : runs) loop += sum_squares<bf16>(static_cast<const bf16*>(r.x), r.n, sc, 0);
        SumSqMulti m;
        const double got = m.run<bf16>(runs.data(), (int)runs.size(), 0);
        lab::validate("multi bf16 == loop of v2", {(float)(got / loop)}, {1.f}, 1e-9);
        m.release();
        lab::dev_free(sc), lab::dev_free(xf), lab::dev_free(xb);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (n=%zu)\n", n);
    bf16* xb = lab::to_device<bf16>(x);
    float* xf = lab::to_device<float>(x);
    double* scratch = lab::dev_alloc<double>(sum_squares_scratch_doubles(n));
    for (int v = 1; v <= 2; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, xb, n, scratch); }, v == 1 ? 3 : 20);
        lab::report_bw(v == 1 ? "v1 one block bf16" : "v2 production bf16", ms, (double)n * sizeof(bf16));
        ms = lab::time_ms([&] { run<float>(v, xf, n, scratch); }, v == 1 ? 3 : 20);
        lab::report_bw(v == 1 ? "v1 one block fp32" : "v2 production fp32", ms, (double)n * sizeof(float));
    }
    {
        const std::vector<SumSpan> runs = d12_runs(reinterpret_cast<const char*>(xb), sizeof(bf16), n);
        size_t elems = 0;
        for (const SumSpan& r : runs) elems += r.n;
        std::printf("timing over %zu runs of a d12 shard (%zu elements, bf16)\n", runs.size(), elems);
        float ms = lab::time_ms([&] {
            for (const SumSpan& r : runs) sum_squares<bf16>(static_cast<const bf16*>(r.x), r.n, scratch, 0);
        });
        lab::report_bw("loop: v2 per run, a sync each", ms, (double)elems * sizeof(bf16));
        SumSqMulti m;
        m.reserve((int)runs.size(), elems, 0);
        ms = lab::time_ms([&] { m.run<bf16>(runs.data(), (int)runs.size(), 0); });
        lab::report_bw("multi: one launch, one sync", ms, (double)elems * sizeof(bf16));
        m.release();
    }
    lab::dev_free(xb), lab::dev_free(xf), lab::dev_free(scratch);
    return lab::finish();
}
