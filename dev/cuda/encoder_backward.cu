// dev/cuda/encoder_backward.cu: kernel lab for the embedding backward,
// dwte[tokens - v_begin] (+=) and dwpe[pos] (+=) from dout.
//   version 1: one thread per (token, channel) with atomicAdd (naive;
//              bf16 atomics round at every add, so only checked in fp32)
//   version 2: llmc/cuda/encoder.cuh (production: host bucketing, one fp32
//              sum per parameter row, deterministic)
// Tokens are drawn half from a small "hot" set so rows collect many rows.
#include "common.h"
#include "llmc/cpu_ops.h"
#include "llmc/cuda/encoder.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void encoder_backward_v1(E* dwte, E* dwpe, const E* dout, const int* tokens, const int* pos, int B, int T,
                                    int C, int v_begin, int v_end) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const size_t n = idx / C;
    const int c = (int)(idx % C), t = (int)(n % T), id = tokens[n];
    const E g = dout[idx];
    if (id >= v_begin && id < v_end) atomicAdd(&dwte[(size_t)(id - v_begin) * C + c], g);
    if (dwpe) atomicAdd(&dwpe[(size_t)pos[t] * C + c], g);
}

template <typename E>
void run(int version, E* dwte, E* dwpe, const E* dout, const int* tok, const int* pos, int B, int T, int C, int vb,
         int ve, EncoderBackwardScratch& sc) {
    if (version == 1) {
        const size_t n = (size_t)B * T * C;
        encoder_backward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve);
        CUDA_CHECK_LAUNCH();
    } else {
        encoder_backward<E>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve, sc, 0);
    }
}

template <typename E>
void check(int version, const char* label, const std::vector<int>& tok, const std::vector<int>& pos,
           const std::vector<float>& dout, const std::vector<float>& dwte0, const std::vector<float>& dwpe0, int B,
           int T, int C, int vb, int ve, double tol) {
    std::vector<float> rwte = dwte0, rwpe = dwpe0;
    cpu::encoder_backward(rwte.data(), rwpe.data(), dout.data(), tok.data(), pos.data(), B, T, C, vb, ve);
    int* dtok = lab::ints_to_device(tok);
    int* dpos = lab::ints_to_device(pos);
    E* ddout = lab::to_device<E>(dout);
    E* dwte = lab::to_device<E>(dwte0);
    E* dwpe = lab::to_device<E>(dwpe0);
    EncoderBackwardScratch sc;
    run<E>(version, dwte, dwpe, ddout, dtok, dpos, B, T, C, vb, ve, sc);
    std::string l1 = std::string(label) + " dwte", l2 = std::string(label) + " dwpe";
    lab::validate(l1.c_str(), lab::from_device(dwte, rwte.size()), rwte, tol);
    lab::validate(l2.c_str(), lab::from_device(dwpe, rwpe.size()), rwpe, tol);
    sc.release();
    lab::dev_free(dtok), lab::dev_free(dpos), lab::dev_free(ddout), lab::dev_free(dwte), lab::dev_free(dwpe);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    std::vector<int> tok = lab::rand_ints((size_t)B * T, 0, V, 1), hot = lab::rand_ints((size_t)B * T, 0, 64, 2);
    for (size_t i = 0; i < tok.size(); i += 2) tok[i] = hot[i];
    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = (t * 7 + 3) % T;
    std::vector<float> dout = lab::rand_normal((size_t)B * T * C, 1.f, 3);
    std::vector<float> dwte0 = lab::rand_normal((size_t)Vp * C, 0.1f, 4), dwpe0 = lab::rand_normal((size_t)T * C, 0.1f, 5);
    const int vb = 32, ve = 25184;  // a vocabulary slice that cuts the hot set
    std::vector<float> dwte0_slice(dwte0.begin() + (size_t)vb * C, dwte0.begin() + (size_t)ve * C);

    std::printf("validation (B=%d T=%d C=%d)\n", B, T, C);
    check<float>(1, "v1 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(2, "v2 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(2, "v2 fp32 vocab slice", tok, pos, dout, dwte0_slice, dwpe0, B, T, C, vb, ve, lab::kTolF32);
    check<bf16>(2, "v2 bf16", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolBF16);

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, B=%d T=%d C=%d, includes the host bucketing)\n", B, T, C);
    int* dtok = lab::ints_to_device(tok);
    int* dpos = lab::ints_to_device(pos);
    bf16* ddout = lab::to_device<bf16>(dout);
    bf16* dwte = lab::to_device<bf16>(dwte0);
    bf16* dwpe = lab::to_device<bf16>(dwpe0);
    EncoderBackwardScratch sc;
    const double bytes = 4.0 * B * T * C * sizeof(bf16);  // dout read twice (wte, wpe) + rows read/written
    for (int v = 1; v <= 2; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dwte, dwpe, ddout, dtok, dpos, B, T, C, 0, Vp, sc); });
        lab::report_bw(v == 1 ? "v1 atomics" : "v2 production", ms, bytes);
    }
    sc.release();
    lab::dev_free(dtok), lab::dev_free(dpos), lab::dev_free(ddout), lab::dev_free(dwte), lab::dev_free(dwpe);
    return lab::finish();
}
