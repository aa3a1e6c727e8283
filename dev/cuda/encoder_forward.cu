// dev/cuda/encoder_forward.cu: kernel lab for the token + position embedding
// forward, out[b,t,:] = wte[tokens[b,t] - v_begin, :] + wpe[pos[t], :].
//   version 1: one thread per output element, no grid-stride loop (naive)
//   version 2: the previous production kernel (dev/cuda/previous.h:
//              grid-stride, one element per access)
//   version 3: llmc/backend/cuda/encoder.cuh (production: 16-byte packs of a row;
//              element by element when C is not a multiple of the pack)
// Validated on the whole vocabulary and on a tensor-parallel vocabulary slice
// (ids outside it contribute zero), with permuted positions, and on an odd C
// (the scalar path).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/encoder.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void encoder_forward_v1(E* out, const int* tokens, const int* pos, const E* wte, const E* wpe, int B, int T,
                                   int C, int v_begin, int v_end) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const size_t n = idx / C;
    const int c = (int)(idx % C), t = (int)(n % T), id = tokens[n];
    float x = (id >= v_begin && id < v_end) ? to_float(wte[(size_t)(id - v_begin) * C + c]) : 0.f;
    if (wpe) x += to_float(wpe[(size_t)pos[t] * C + c]);
    out[idx] = from_float<E>(x);
}

template <typename E>
void run(int version, E* out, const int* tok, const int* pos, const E* wte, const E* wpe, int B, int T, int C, int vb,
         int ve) {
    if (version == 1) {
        const size_t n = (size_t)B * T * C;
        encoder_forward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(out, tok, pos, wte, wpe, B, T, C, vb, ve);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::encoder_forward<E>(out, tok, pos, wte, wpe, B, T, C, vb, ve, 0);
    } else {
        encoder_forward<E>(out, tok, pos, wte, wpe, B, T, C, vb, ve, 0);
    }
}

template <typename E>
void check(int version, const char* label, const std::vector<int>& tok, const std::vector<int>& pos,
           const std::vector<float>& wte, const std::vector<float>& wpe, int B, int T, int C, int vb, int ve,
           double tol) {
    std::vector<float> ref((size_t)B * T * C);
    cpu::encoder_forward(ref.data(), tok.data(), pos.data(), wte.data(), wpe.data(), B, T, C, vb, ve);
    int* dtok = lab::ints_to_device(tok);
    int* dpos = lab::ints_to_device(pos);
    E* dwte = lab::to_device<E>(wte);
    E* dwpe = lab::to_device<E>(wpe);
    E* dout = lab::dev_alloc<E>(ref.size());
    run<E>(version, dout, dtok, dpos, dwte, dwpe, B, T, C, vb, ve);
    lab::validate(label, lab::from_device(dout, ref.size()), ref, tol);
    lab::dev_free(dtok), lab::dev_free(dpos), lab::dev_free(dwte), lab::dev_free(dwpe), lab::dev_free(dout);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    std::vector<int> tok = lab::rand_ints((size_t)B * T, 0, V, 1);
    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = (t * 7 + 3) % T;  // a permutation, as context parallelism makes
    std::vector<float> wte = lab::rand_normal((size_t)Vp * C, 0.02f, 2), wpe = lab::rand_normal((size_t)T * C, 0.01f, 3);
    // A tensor-parallel slice owns rows [vb, ve): its wte is the slice.
    const int vb = 12000, ve = 37152;
    std::vector<float> wte_slice(wte.begin() + (size_t)vb * C, wte.begin() + (size_t)ve * C);

    std::printf("validation (B=%d T=%d C=%d)\n", B, T, C);
    check<float>(1, "v1 fp32", tok, pos, wte, wpe, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(2, "v2 fp32", tok, pos, wte, wpe, B, T, C, 0, Vp, lab::kTolF32);
    check<bf16>(2, "v2 bf16", tok, pos, wte, wpe, B, T, C, 0, Vp, lab::kTolBF16);
    check<float>(3, "v3 fp32", tok, pos, wte, wpe, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(3, "v3 fp32 vocab slice", tok, pos, wte_slice, wpe, B, T, C, vb, ve, lab::kTolF32);
    check<bf16>(3, "v3 bf16", tok, pos, wte, wpe, B, T, C, 0, Vp, lab::kTolBF16);
    check<bf16>(3, "v3 bf16 vocab slice", tok, pos, wte_slice, wpe, B, T, C, vb, ve, lab::kTolBF16);
    {
        const int Cs = 45, Bs = 2, Ts = 64;  // C % 8 != 0: element by element
        std::vector<int> t2(tok.begin(), tok.begin() + Bs * Ts), p2(Ts);
        for (int t = 0; t < Ts; t++) p2[t] = (t * 5 + 1) % Ts;
        std::vector<float> wte2(wte.begin(), wte.begin() + (size_t)Vp * Cs), wpe2(wpe.begin(), wpe.begin() + (size_t)Ts * Cs);
        check<bf16>(3, "v3 bf16 C=45", t2, p2, wte2, wpe2, Bs, Ts, Cs, 0, Vp, lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, B=%d T=%d C=%d)\n", B, T, C);
    int* dtok = lab::ints_to_device(tok);
    int* dpos = lab::ints_to_device(pos);
    bf16* dwte = lab::to_device<bf16>(wte);
    bf16* dwpe = lab::to_device<bf16>(wpe);
    bf16* dout = lab::dev_alloc<bf16>((size_t)B * T * C);
    const double bytes = 3.0 * B * T * C * sizeof(bf16);  // a wte row and a wpe row read, a row written, per token
    const char* names[] = {"", "v1 naive", "v2 previous", "v3 production"};
    for (int v = 1; v <= 3; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dout, dtok, dpos, dwte, dwpe, B, T, C, 0, Vp); });
        lab::report_bw(names[v], ms, bytes);
    }
    lab::dev_free(dtok), lab::dev_free(dpos), lab::dev_free(dwte), lab::dev_free(dwpe), lab::dev_free(dout);
    return lab::finish();
}
