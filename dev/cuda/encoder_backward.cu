// dev/cuda/encoder_backward.cu: kernel lab for the embedding backward,
// dwte[tokens - v_begin] (+=) and dwpe[pos] (+=) from dout.
//   version 1: one thread per (token, channel) with atomicAdd (naive;
//              bf16 atomics round at every add, so only checked in fp32)
//   version 2: the previous production kernel (dev/cuda/previous.h: ids
//              downloaded and bucketed on the host, one stream
//              synchronisation per call; one fp32 sum per parameter row)
//   version 3: the previous device-sorted kernel (dev/cuda/previous_encoder_sorted.h:
//              keys sorted by CUB, one block per bucket, so a frequent
//              token's whole bucket is one block's serial work)
//   version 4: llmc/backend/cuda/encoder.cuh (production: keys sorted on the device
//              by CUB's stable radix sort, the sorted items cut into chunks of
//              64, one block each, long buckets' partials added in chunk
//              order by a second pass; 16-byte loads; no synchronisation,
//              deterministic)
// Tokens are drawn half from a small "hot" set so rows collect many rows; a
// second set has one token at 3% of the tokens (as in real text) and one at
// 30%, where version 3 leaves one block with a long serial sum. Version 4 is
// also checked for bit-identical results over two runs and, last, captured
// into a CUDA graph: a host synchronisation or a copy to the host inside it
// would make the capture fail (the program then stops with the CUDA error).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/encoder.cuh"
#include "previous.h"
#include "previous_encoder_sorted.h"

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

struct Scratch {
    llmc_prev::EncoderBackwardScratch prev;
    llmc_prev_sorted::EncoderBackwardScratch sorted;
    EncoderBackwardScratch cur;
    void release() { prev.release(), sorted.release(), cur.release(); }
};

template <typename E>
void run(int version, E* dwte, E* dwpe, const E* dout, const int* tok, const int* pos, int B, int T, int C, int vb,
         int ve, Scratch& sc) {
    if (version == 1) {
        const size_t n = (size_t)B * T * C;
        encoder_backward_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::encoder_backward<E>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve, sc.prev, 0);
    } else if (version == 3) {
        llmc_prev_sorted::encoder_backward<E>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve, sc.sorted, 0);
    } else {
        encoder_backward<E>(dwte, dwpe, dout, tok, pos, B, T, C, vb, ve, sc.cur, 0);
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
    Scratch sc;
    run<E>(version, dwte, dwpe, ddout, dtok, dpos, B, T, C, vb, ve, sc);
    std::string l1 = std::string(label) + " dwte", l2 = std::string(label) + " dwpe";
    const std::vector<float> g_wte = lab::from_device(dwte, rwte.size()), g_wpe = lab::from_device(dwpe, rwpe.size());
    lab::validate(l1.c_str(), g_wte, rwte, tol);
    lab::validate(l2.c_str(), g_wpe, rwpe, tol);
    if (version == 4) {  // deterministic: the same bits from the same state
        lab::copy_to_device<E>(dwte, dwte0);
        lab::copy_to_device<E>(dwpe, dwpe0);
        run<E>(version, dwte, dwpe, ddout, dtok, dpos, B, T, C, vb, ve, sc);
        const bool same = lab::from_device(dwte, rwte.size()) == g_wte && lab::from_device(dwpe, rwpe.size()) == g_wpe;
        std::printf("  %-44s %s\n", (std::string(label) + " second run bit-identical").c_str(), same ? "PASS" : "FAIL");
        (same ? lab::g_passed : lab::g_failed)++;
    }
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

    // One token at 3% of the tokens and one at 30% (ids 100 and 40000: the
    // vocabulary slice below holds the first, not the second).
    std::vector<int> heavy = tok;
    for (size_t i = 0; i < heavy.size(); i++) heavy[i] = i % 33 == 0 ? 100 : i % 10 == 1 ? 40000 : tok[i];

    std::printf("validation (B=%d T=%d C=%d)\n", B, T, C);
    check<float>(1, "v1 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(2, "v2 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<bf16>(2, "v2 bf16", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolBF16);
    check<float>(3, "v3 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<bf16>(3, "v3 bf16", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolBF16);
    check<float>(4, "v4 fp32", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<float>(4, "v4 fp32 vocab slice", tok, pos, dout, dwte0_slice, dwpe0, B, T, C, vb, ve, lab::kTolF32);
    check<bf16>(4, "v4 bf16", tok, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolBF16);
    check<bf16>(4, "v4 bf16 vocab slice", tok, pos, dout, dwte0_slice, dwpe0, B, T, C, vb, ve, lab::kTolBF16);
    check<float>(4, "v4 fp32 3% and 30% tokens", heavy, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolF32);
    check<bf16>(4, "v4 bf16 3% and 30% tokens", heavy, pos, dout, dwte0, dwpe0, B, T, C, 0, Vp, lab::kTolBF16);
    check<float>(4, "v4 fp32 3%/30% tokens, vocab slice", heavy, pos, dout, dwte0_slice, dwpe0, B, T, C, vb, ve,
                 lab::kTolF32);
    {
        // C % 8 != 0 (element-by-element sums) and a repeated position (a
        // position bucket of two entries).
        const int Bs = 2, Ts = 64, Cs = 45;
        std::vector<int> t2(heavy.begin(), heavy.begin() + Bs * Ts), p2(Ts);
        for (int t = 0; t < Ts; t++) p2[t] = (t * 5 + 1) % Ts;
        p2[3] = p2[4];
        std::vector<float> d2(dout.begin(), dout.begin() + (size_t)Bs * Ts * Cs);
        std::vector<float> w2(dwte0.begin(), dwte0.begin() + (size_t)Vp * Cs), q2(dwpe0.begin(), dwpe0.begin() + (size_t)Ts * Cs);
        check<float>(4, "v4 fp32 C=45, repeated position", t2, p2, d2, w2, q2, Bs, Ts, Cs, 0, Vp, lab::kTolF32);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, B=%d T=%d C=%d; v2 includes the host bucketing and its synchronisation)\n", B, T, C);
    int* dtok = lab::ints_to_device(tok);
    int* dpos = lab::ints_to_device(pos);
    bf16* ddout = lab::to_device<bf16>(dout);
    bf16* dwte = lab::to_device<bf16>(dwte0);
    bf16* dwpe = lab::to_device<bf16>(dwpe0);
    Scratch sc;
    const double bytes = 4.0 * B * T * C * sizeof(bf16);  // dout read twice (wte, wpe) + rows read/written
    const char* names[] = {"", "v1 atomics", "v2 previous (host bucketing)", "v3 previous (one block per bucket)",
                           "v4 production (split buckets)"};
    for (int v = 1; v <= 4; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dwte, dwpe, ddout, dtok, dpos, B, T, C, 0, Vp, sc); });
        lab::report_bw(names[v], ms, bytes);
    }
    {
        std::printf("timing with one token at 3%% and one at 30%% of the tokens\n");
        int* dheavy = lab::ints_to_device(heavy);
        for (int v = 3; v <= 4; v++) {
            float ms = lab::time_ms([&] { run<bf16>(v, dwte, dwpe, ddout, dheavy, dpos, B, T, C, 0, Vp, sc); });
            lab::report_bw(names[v], ms, bytes);
        }
        lab::dev_free(dheavy);
    }

    // No host synchronisation inside version 4: it must capture into a graph
    // (warmed up above, so its scratch no longer grows), and the graph must
    // compute the same as a direct call.
    {
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        std::vector<float> w0 = lab::from_device(dwte, (size_t)Vp * C), q0 = lab::from_device(dwpe, (size_t)T * C);
        encoder_backward<bf16>(dwte, dwpe, ddout, dtok, dpos, B, T, C, 0, Vp, sc.cur, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        const std::vector<float> w1 = lab::from_device(dwte, (size_t)Vp * C), q1 = lab::from_device(dwpe, (size_t)T * C);
        lab::copy_to_device<bf16>(dwte, w0);
        lab::copy_to_device<bf16>(dwpe, q0);
        std::printf("  capturing v4 into a CUDA graph (a host sync inside it would stop the program here)\n");
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        encoder_backward<bf16>(dwte, dwpe, ddout, dtok, dpos, B, T, C, 0, Vp, sc.cur, s);
        CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        const bool same = lab::from_device(dwte, (size_t)Vp * C) == w1 && lab::from_device(dwpe, (size_t)T * C) == q1;
        std::printf("  %-44s %s\n", "v4 in a CUDA graph == direct call (bits)", same ? "PASS" : "FAIL");
        (same ? lab::g_passed : lab::g_failed)++;
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        CUDA_CHECK(cudaStreamDestroy(s));
    }
    sc.release();
    lab::dev_free(dtok), lab::dev_free(dpos), lab::dev_free(ddout), lab::dev_free(dwte), lab::dev_free(dwpe);
    return lab::finish();
}
