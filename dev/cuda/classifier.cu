// dev/cuda/classifier.cu: kernel lab for the fused softmax cross-entropy:
// per-row loss (fp32) and, with write_grad, dlogits = dloss*(softmax - onehot)
// written in place, padded columns V..Vp-1 excluded from the softmax and zeroed.
//   version 1: one thread per row, three passes (naive)
//   version 2: the previous production kernel (dev/cuda/previous.h: block
//              per row, online softmax in one read, then the gradient pass;
//              2-byte accesses)
//   version 3: llmc/backend/cuda/classifier.cuh (production: the same passes with
//              16-byte packs when Vp is a multiple of the pack, the valid
//              columns masked per element; element by element otherwise)
// The padding is filled with large values, which must not leak into the loss.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/classifier.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void softmax_xent_v1(E* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                bool write_grad) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    E* x = logits + (size_t)n * Vp;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, to_float(x[i]));
    float sum = 0.f;
    for (int i = 0; i < V; i++) sum += expf(to_float(x[i]) - mx);
    const int t = targets[n];
    losses[n] = logf(sum) + mx - to_float(x[t]);
    if (!write_grad) return;
    for (int i = 0; i < Vp; i++)
        x[i] = from_float<E>(i < V ? (expf(to_float(x[i]) - mx) / sum - (i == t ? 1.f : 0.f)) * dloss : 0.f);
}

template <typename E>
void run(int version, E* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp, bool grad) {
    if (version == 1) {
        softmax_xent_v1<E><<<(unsigned)ceil_div(N, 64), 64>>>(logits, losses, targets, dloss, N, V, Vp, grad);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::softmax_crossentropy<E>(logits, losses, targets, dloss, N, V, Vp, grad, 0);
    } else {
        softmax_crossentropy<E>(logits, losses, targets, dloss, N, V, Vp, grad, 0);
    }
}

std::vector<float> make_logits(int N, int V, int Vp, uint64_t seed) {
    std::vector<float> x = lab::rand_normal((size_t)N * Vp, 2.f, seed);
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) x[(size_t)n * Vp + i] = 100.f;  // padding: must be ignored
    return x;
}

template <typename E>
void check(int version, const char* label, int N, int V, int Vp, bool grad, double tol) {
    std::vector<float> logits = make_logits(N, V, Vp, 1);
    std::vector<int> targets = lab::rand_ints(N, 0, V, 2);
    const float dloss = 1.f / N;
    std::vector<float> rlogits = logits, rlosses(N);
    cpu::softmax_crossentropy(rlogits.data(), rlosses.data(), targets.data(), (double)dloss, N, V, Vp, grad);
    E* dlogits = lab::to_device<E>(logits);
    int* dtargets = lab::ints_to_device(targets);
    float* dlosses = lab::dev_alloc<float>(N);
    run<E>(version, dlogits, dlosses, dtargets, dloss, N, V, Vp, grad);
    const std::string l = std::string(label) + " V=" + std::to_string(V) + (grad ? " grad" : " loss only");
    lab::validate((l + " losses").c_str(), lab::from_device(dlosses, N), rlosses, lab::kTolF32);
    lab::validate((l + " logits/dlogits").c_str(), lab::from_device(dlogits, logits.size()), rlogits, tol);
    lab::dev_free(dlogits), lab::dev_free(dtargets), lab::dev_free(dlosses);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    std::printf("validation\n");
    for (int grad = 0; grad < 2; grad++) {
        check<float>(1, "v1 fp32", 256, 50257, 50304, grad, lab::kTolF32);
        check<float>(2, "v2 fp32", 256, 50257, 50304, grad, lab::kTolF32);
        check<bf16>(2, "v2 bf16", 256, 50257, 50304, grad, lab::kTolBF16);
        check<float>(3, "v3 fp32", 256, 50257, 50304, grad, lab::kTolF32);
        check<bf16>(3, "v3 bf16", 256, 50257, 50304, grad, lab::kTolBF16);
        check<float>(3, "v3 fp32", 100, 97, 128, grad, lab::kTolF32);
        check<bf16>(3, "v3 bf16", 100, 97, 128, grad, lab::kTolBF16);
        check<bf16>(3, "v3 bf16 (Vp % 8 != 0: element by element)", 100, 97, 100, grad, lab::kTolBF16);
    }

    const int B = 8, T = 1024, V = 50257, Vp = 50304, N = B * T;
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d V=%d Vp=%d, with gradient)\n", N, V, Vp);
    std::vector<float> logits = make_logits(N, V, Vp, 3);
    std::vector<int> targets = lab::rand_ints(N, 0, V, 4);
    bf16* dlogits = lab::to_device<bf16>(logits);
    int* dtargets = lab::ints_to_device(targets);
    float* dlosses = lab::dev_alloc<float>(N);
    const double bytes = 2.0 * N * (double)Vp * sizeof(bf16);  // read once + write once (ideal)
    const char* names[] = {"", "v1 thread per row", "v2 previous", "v3 production"};
    for (int v = 1; v <= 3; v++) {
        // Runs in place: the logits turn into gradients, which is as good an input as any for timing.
        float ms = lab::time_ms([&] { run<bf16>(v, dlogits, dlosses, dtargets, 1.f / N, N, V, Vp, true); },
                                v == 1 ? 2 : 20);
        lab::report_bw(names[v], ms, bytes);
    }
    lab::dev_free(dlogits), lab::dev_free(dtargets), lab::dev_free(dlosses);
    return lab::finish();
}
