// dev/cuda/rope.cu: kernel lab for rotary position embeddings (Llama,
// rotate-half convention; backend.h rope), in place on the Q and K heads at
// the start of strided rows (the fused QKV rows), forward and inverse.
//   version 1: one thread per (row, head, channel pair), the angle and its
//              sin/cos in double (naive, slow, accurate)
//   version 2: llmc/backend/cuda/rope.cuh (production: a thread owns one pack of a
//              head's first half and the matching pack of its second half,
//              for up to 8 heads of a row, computing the pack's angles once;
//              16-byte accesses when the half head and the row stride allow,
//              element-wise otherwise; angle in double reduced mod 2pi, then
//              fp32 sin/cos)
// Checked against cpu::rope (llmc/backend/cpu_ops.h) over the whole buffer (so the
// V heads and padding, which rope must not touch, are compared too) on: an
// odd head size (HS = 10, element-wise path) with padded rows, GPT-2 d12's
// packed QKV rows (HS = 64), and Llama-like GQA rows (NH = 32, NKV = 8,
// HS = 128; the Q part, then the K part at offset NH·HS) at long-context
// positions (context parallel passes global positions: 100000 + t), with
// theta 500000. Timing (bf16): the Q and K parts of Llama-like rows (B = 4,
// T = 2048) and of d12, GB/s with bytes = the rotated elements read and
// written once.
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/rope.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void rope_v1(E* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
                        bool inverse) {
    const int half = HS / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * heads * half) return;
    const int i = (int)(idx % half);
    const int h = (int)(idx / half % heads);
    const size_t row = idx / half / heads;
    const double a = pos[row % T] * pow(theta, -2.0 * i / HS);
    const float c = (float)cos(a), s = (float)(inverse ? -sin(a) : sin(a));
    E* v = x + row * row_stride + (size_t)h * HS;
    const float x0 = to_float(v[i]), x1 = to_float(v[i + half]);
    v[i] = from_float<E>(x0 * c - x1 * s);
    v[i + half] = from_float<E>(x1 * c + x0 * s);
}

template <typename E>
void run(int version, E* x, size_t row_stride, int heads, int HS, const int* pos, int B, int T, double theta,
         bool inverse) {
    if (version == 1) {
        const size_t n = (size_t)B * T * heads * (HS / 2);
        rope_v1<E><<<(unsigned)ceil_div(n, 256), 256>>>(x, row_stride, heads, HS, pos, B, T, theta, inverse);
        CUDA_CHECK_LAUNCH();
    } else {
        rope<E>(x, row_stride, heads, HS, pos, B, T, theta, inverse, 0);
    }
}

// One case: rows of row_stride elements; the rotated part is `heads` heads
// of HS channels at element offset `off` of each row.
struct Case {
    const char* name;
    int B, T, heads, HS;
    size_t row_stride, off;
    int pos0;  // positions pos0 + t
    double theta;
};

template <typename E>
void check(int version, const Case& c, const char* label, double tol) {
    const size_t n = (size_t)c.B * c.T * c.row_stride;
    const std::vector<float> x = lab::rand_normal(n, 1.f, 1);
    std::vector<int> pos(c.T);
    for (int t = 0; t < c.T; t++) pos[t] = c.pos0 + t;
    int* dpos = lab::ints_to_device(pos);
    E* dx = lab::to_device<E>(x);
    const std::string l = std::string(label) + " " + c.name;
    for (bool inverse : {false, true}) {
        std::vector<float> ref = x;
        cpu::rope(ref.data() + c.off, c.row_stride, c.heads, c.HS, pos.data(), c.B, c.T, c.theta, inverse);
        lab::copy_to_device<E>(dx, x);
        run<E>(version, dx + c.off, c.row_stride, c.heads, c.HS, dpos, c.B, c.T, c.theta, inverse);
        lab::validate((l + (inverse ? " inverse" : " forward")).c_str(), lab::from_device(dx, n), ref, tol);
    }
    // Round trip: the inverse undoes the forward (to rounding).
    lab::copy_to_device<E>(dx, x);
    run<E>(version, dx + c.off, c.row_stride, c.heads, c.HS, dpos, c.B, c.T, c.theta, false);
    run<E>(version, dx + c.off, c.row_stride, c.heads, c.HS, dpos, c.B, c.T, c.theta, true);
    lab::validate((l + " forward then inverse").c_str(), lab::from_device(dx, n), x, sizeof(E) == 2 ? tol::kBf16TwoRoundings : tol::kFp32);
    lab::dev_free(dx), lab::dev_free(dpos);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const int NH = 32, NKV = 8, HSL = 128;
    const size_t llama_row = (size_t)(NH + 2 * NKV) * HSL;
    const Case cases[] = {
        {"HS=10 heads=3 padded rows (element-wise)", 2, 37, 3, 10, 3 * 10 + 7, 0, 0, 10000.0},
        {"HS=16 heads=5 rows of 100 at offset 4", 3, 50, 5, 16, 100, 4, 7, 10000.0},
        {"d12 Q of packed qkv (HS=64)", 2, 256, 12, 64, 3 * 768, 0, 0, 10000.0},
        {"d12 K of packed qkv (HS=64)", 2, 256, 12, 64, 3 * 768, 768, 0, 10000.0},
        {"Llama Q (NH=32 HS=128) at pos 100000+", 1, 300, NH, HSL, llama_row, 0, 100000, 500000.0},
        {"Llama K (NKV=8 HS=128) at pos 100000+", 1, 300, NKV, HSL, llama_row, (size_t)NH * HSL, 100000, 500000.0},
    };
    std::printf("validation\n");
    for (const Case& c : cases) {
        check<float>(1, c, "v1 fp32", lab::kTolF32);
        check<float>(2, c, "v2 fp32", lab::kTolF32);
        check<bf16>(2, c, "v2 bf16", lab::kTolBF16);
    }

    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16; bytes = the rotated elements read once and written once)\n");
    struct Shape {
        const char* name;
        int B, T, heads, HS;
        size_t row_stride, off;
    };
    const Shape shapes[] = {
        {"Llama Q B=4 T=2048 NH=32 HS=128", 4, 2048, NH, HSL, llama_row, 0},
        {"Llama K B=4 T=2048 NKV=8 HS=128", 4, 2048, NKV, HSL, llama_row, (size_t)NH * HSL},
        {"d12 Q B=8 T=1024 NH=12 HS=64", 8, 1024, 12, 64, 3 * 768, 0},
    };
    for (const Shape& s : shapes) {
        const size_t n = (size_t)s.B * s.T * s.row_stride;
        bf16* x = lab::to_device<bf16>(lab::rand_normal(n, 1.f, 3));
        std::vector<int> pos(s.T);
        for (int t = 0; t < s.T; t++) pos[t] = t;
        int* dpos = lab::ints_to_device(pos);
        const double bytes = 2.0 * s.B * s.T * s.heads * s.HS * sizeof(bf16);
        std::printf(" %s\n", s.name);
        const char* names[] = {"", "v1 naive", "v2 production"};
        for (int v = 1; v <= 2; v++) {
            const float ms = lab::time_ms([&] { run<bf16>(v, x + s.off, s.row_stride, s.heads, s.HS, dpos, s.B, s.T, 500000.0, false); });
            lab::report_bw((std::string(names[v]) + " " + s.name).c_str(), ms, bytes);
        }
        lab::dev_free(x), lab::dev_free(dpos);
    }
    return lab::finish();
}
