// dev/cuda/bias.cu: kernel lab for the two bias kernels of
// llmc/backend/cuda/matmul.cuh: the bias gradient dbias (+=) = column sums of
// dout[N, OC], and add_bias out[n, :] += bias.
//   version 1: one thread per column over all rows / one thread per element
//              (naive)
//   version 2: the previous production kernels (dev/cuda/previous.h: 2-byte
//              accesses; column sums in 64-row chunks, chunk order finish)
//   version 3: production (16-byte packs of 8 columns per lane, rows of a
//              chunk per warp, warps in warp order, chunks by the fixed-order
//              column sum; add_bias in 16-byte packs), element by element
//              when OC is not a multiple of the pack or dout is unaligned
// The bias gradient is checked against cpu::matmul_backward's dbias (with a
// one-column input so the weight gradient costs nothing), and version 3 for
// bit-identical results over two runs.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/matmul.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename E>
__global__ void dbias_v1(E* db, const E* dout, int N, int OC) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float acc = 0.f;
    for (int n = 0; n < N; n++) acc += to_float(dout[(size_t)n * OC + o]);
    db[o] = from_float<E>(to_float(db[o]) + acc);
}
template <typename E>
__global__ void add_bias_v1(E* out, const E* bias, int N, int OC) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) out[i] = from_float<E>(to_float(out[i]) + to_float(bias[i % OC]));
}

inline size_t scratch_floats(int N, int OC) {
    return std::max(matmul_backward_scratch_floats(N, OC), llmc_prev::matmul_backward_scratch_floats(N, OC));
}

template <typename E>
void run_grad(int version, E* db, const E* dout, int N, int OC, float* scratch) {
    if (version == 1) {
        dbias_v1<E><<<(unsigned)ceil_div(OC, 128), 128>>>(db, dout, N, OC);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::bias_backward<E>(db, dout, N, OC, scratch, 0);
    } else {
        bias_backward<E>(db, dout, N, OC, scratch, 0);
    }
}
template <typename E>
void run_add(int version, E* out, const E* bias, int N, int OC) {
    if (version == 1) {
        add_bias_v1<E><<<(unsigned)ceil_div((size_t)N * OC, 256), 256>>>(out, bias, N, OC);
        CUDA_CHECK_LAUNCH();
    } else if (version == 2) {
        llmc_prev::add_bias<E>(out, bias, N, OC, 0);
    } else {
        add_bias<E>(out, bias, N, OC, 0);
    }
}

// off: element offset of dout and out from their allocations (1: unaligned).
template <typename E>
void check(int version, const char* label, int N, int OC, double tol, int off = 0) {
    std::vector<float> dout = lab::rand_normal((size_t)N * OC, 1.f, 1), db0 = lab::rand_normal(OC, 1.f, 2);
    std::vector<float> bias = lab::rand_normal(OC, 1.f, 3);
    // Reference bias gradient: cpu::matmul_backward with IC = 1.
    std::vector<float> rdb = db0, inp(N, 0.f), w(OC, 0.f), dw(OC, 0.f);
    cpu::matmul_backward<float>(nullptr, dw.data(), rdb.data(), dout.data(), inp.data(), w.data(), N, 1, OC);
    std::vector<float> radd = dout;
    cpu::add_bias(radd.data(), bias.data(), N, OC);

    std::vector<float> doutp(off, 0.f);
    doutp.insert(doutp.end(), dout.begin(), dout.end());
    E* ddout0 = lab::to_device<E>(doutp);
    E* ddout = ddout0 + off;
    E* ddb = lab::to_device<E>(db0);
    E* dbias = lab::to_device<E>(bias);
    float* scratch = lab::dev_alloc<float>(scratch_floats(N, OC));
    const std::string l = std::string(label) + " N=" + std::to_string(N) + " OC=" + std::to_string(OC);
    run_grad<E>(version, ddb, ddout, N, OC, scratch);
    const std::vector<float> got = lab::from_device(ddb, OC);
    lab::validate((l + " dbias").c_str(), got, rdb, tol);
    if (version == 3) {
        lab::copy_to_device<E>(ddb, db0);
        run_grad<E>(version, ddb, ddout, N, OC, scratch);
        const bool same = lab::from_device(ddb, OC) == got;
        std::printf("  %-44s %s\n", (l + " dbias second run bit-identical").c_str(), same ? "PASS" : "FAIL");
        (same ? lab::g_passed : lab::g_failed)++;
    }
    run_add<E>(version, ddout, dbias, N, OC);
    lab::validate((l + " add_bias").c_str(), lab::from_device(ddout, radd.size()), radd, tol);
    lab::dev_free(ddout0), lab::dev_free(ddb), lab::dev_free(dbias), lab::dev_free(scratch);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int N = 8192;  // B = 8, T = 1024
    std::printf("validation\n");
    for (int v = 1; v <= 3; v++) {
        const std::string l = "v" + std::to_string(v);
        check<float>(v, (l + " fp32").c_str(), N, 3072, lab::kTolF32);
        check<bf16>(v, (l + " bf16").c_str(), N, 768, lab::kTolBF16);
    }
    check<bf16>(3, "v3 bf16", N, 2304, lab::kTolBF16);
    check<float>(3, "v3 fp32", 1000, 13, lab::kTolF32);               // OC % 4 != 0: element by element
    check<bf16>(3, "v3 bf16 unaligned", 3000, 768, lab::kTolBF16, 1);  // dout one element off alignment
    check<bf16>(3, "v3 bf16 few rows", 5, 264, lab::kTolBF16);         // one chunk, most warps idle
    check<float>(3, "v3 fp32 many rows", 100003, 64, lab::kTolF32);    // the chunk cap

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16, N=%d; bytes = dout read once / out read and written once + bias)\n", N);
    const char* names[] = {"", "v1 naive", "v2 previous", "v3 production"};
    for (int OC : {768, 2304, 3072}) {
        std::vector<float> dout = lab::rand_normal((size_t)N * OC, 1.f, 4);
        bf16* ddout = lab::to_device<bf16>(dout);
        bf16* ddb = lab::dev_alloc<bf16>(OC);
        float* scratch = lab::dev_alloc<float>(scratch_floats(N, OC));
        for (int v = 1; v <= 3; v++) {
            const std::string l = std::string(names[v]) + " OC=" + std::to_string(OC);
            float ms = lab::time_ms([&] { run_grad<bf16>(v, ddb, ddout, N, OC, scratch); });
            lab::report_bw(("dbias " + l).c_str(), ms, (double)N * OC * sizeof(bf16));
            ms = lab::time_ms([&] { run_add<bf16>(v, ddout, ddb, N, OC); });
            lab::report_bw(("add_bias " + l).c_str(), ms, 2.0 * N * OC * sizeof(bf16));
        }
        lab::dev_free(ddout), lab::dev_free(ddb), lab::dev_free(scratch);
    }
    return lab::finish();
}
