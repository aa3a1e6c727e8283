// llmc/plan/calibrate.cpp: measuring a hardware profile (llmc/plan/calibrate.h).
#include "llmc/plan/calibrate.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "llmc/backend/backends.h"
#include "llmc/base/rng.h"
#include "llmc/plan/cost_model.h"

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of fn: the median over 7 rounds of `reps` calls each,
// after two calls to warm up; each round's time is the slowest rank's when
// the ranks run it together (they start after a barrier). One round is as
// noisy as the machine: on a shared host a single round's figure moved by
// 15-50% from run to run, the median of 7 by a few percent.
template <typename Fn>
double time_op(Backend& be, Comm& world, int reps, Fn fn) {
    fn();
    fn();
    be.synchronize();
    std::vector<double> rounds;
    for (int r = 0; r < 7; r++) {
        world.host_all_reduce(0.0, ReduceOp::Sum);
        const double t0 = now_s();
        for (int i = 0; i < reps; i++) fn();
        be.synchronize();
        rounds.push_back(world.host_all_reduce((now_s() - t0) / reps, ReduceOp::Max));
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[rounds.size() / 2];
}

// Least-squares line t = a + b·n through the points.
void fit_line(const std::vector<double>& n, const std::vector<double>& t, double* a, double* b) {
    const double k = (double)n.size();
    double sn = 0, st = 0, snn = 0, snt = 0;
    for (size_t i = 0; i < n.size(); i++) sn += n[i], st += t[i], snn += n[i] * n[i], snt += n[i] * t[i];
    *b = (k * snt - sn * st) / (k * snn - sn * sn);
    *a = (st - *b * sn) / k;
    if (*a < 0) *a = 0;
}

struct Buffers {
    Backend& be;
    std::vector<void*> owned;
    explicit Buffers(Backend& b) : be(b) {}
    ~Buffers() {
        for (void* p : owned) be.release(p);
    }
    // n elements of type t, filled with small random values.
    void* make(size_t n, DType t, Rng& rng) {
        void* p = be.alloc(n * dtype_size(t));
        owned.push_back(p);
        std::vector<double> host(n);
        for (double& x : host) x = 0.02 * rng.normal();
        be.upload(p, t, host.data(), DType::F64, n);
        return p;
    }
};

}  // namespace

bool calibrate(Backend& be, ProcessGrid& grid, const GPTConfig& mc, int B, int T, const std::string& name, Hardware* hw,
               std::string* err) {
    Comm& world = *grid.world;
    const Precision p = be.precision();
    const DType a = p.act, st = p.stat, pt = p.param, gt = p.grad;
    const int C = mc.channels, NH = mc.num_heads, HS = C / NH, N = B * T, H = 4 * C;
    if (T > mc.max_seq_len) {
        *err = "flag -t: T=" + std::to_string(T) + " exceeds the model's maxT=" + std::to_string(mc.max_seq_len);
        return false;
    }
    Rng rng(7);
    Buffers buf(be);
    const double ab = (double)dtype_size(a);
    // These ops run outside a model stack: their scratch (CUDA's partial
    // sums and FP8 operands, which a stack reserves when it is built, and
    // without which an FP8 product refuses to run) reserved here at their
    // largest shapes, as GPT::workspace would.
    Workspace ws;
    ws.rows = N, ws.seq = T, ws.channels = C, ws.bias_width = H;
    ws.attn_rows = (size_t)B * NH * T, ws.head_size = HS;
    for (size_t& e : ws.fp8_elems) e = std::max(((size_t)N + 15) / 16 * 16 * H, (size_t)H * C);  // (K padded to 16)
    be.reserve_workspace(ws);

    // The block's four matrix products, forward and backward (3 x 24·N·C² FLOPs).
    void* x = buf.make((size_t)N * H, a, rng);
    void* y = buf.make((size_t)N * H, a, rng);
    void* dx = buf.make((size_t)N * H, a, rng);
    void* w = buf.make((size_t)4 * C * C, pt, rng);
    void* dw = buf.make((size_t)4 * C * C, gt, rng);
    void* bias = buf.make(H, pt, rng);
    void* dbias = buf.make(H, gt, rng);
    const int shapes[4][2] = {{C, 3 * C}, {C, C}, {C, H}, {H, C}};  // (in, out): qkv, attproj, fc, fcproj
    const double mm_s = time_op(be, world, 5, [&] {
        for (const auto& s : shapes) be.matmul_forward(y, x, w, bias, N, s[0], s[1]);
        for (const auto& s : shapes) be.matmul_backward(dx, dw, dbias, y, x, w, N, s[0], s[1]);
    });
    const double mm_flops = 3.0 * 24.0 * N * (double)C * C;

    // One large square product, the rate the wave model of the built-in
    // profiles starts from: how far below it the model's own shapes run is
    // the GEMM efficiency at these shapes (the source line says it). The
    // profile keeps the rate at the model's shapes, and no wave model.
    const int big = std::string(be.name()) == "cpu" ? 512 : 8192;
    void* bx = buf.make((size_t)big * big, a, rng);
    void* by = buf.make((size_t)big * big, a, rng);
    void* bw = buf.make((size_t)big * big, pt, rng);
    const double big_s = time_op(be, world, 3, [&] { be.matmul_forward(by, bx, bw, nullptr, big, big, big); });
    const double big_flops = 2.0 * big * (double)big * big / big_s;

    // Causal attention forward and backward (3.5 x 2·B·T²·C FLOPs).
    void* qkv = buf.make((size_t)N * 3 * C, a, rng);
    void* dqkv = buf.make((size_t)N * 3 * C, a, rng);
    void* out = buf.make((size_t)N * C, a, rng);
    void* dout = buf.make((size_t)N * C, a, rng);
    void* lse = buf.make((size_t)N * NH, st, rng);
    const AttnShape as{B, NH, HS, T, T, (size_t)3 * C, (size_t)3 * C, (size_t)C, true, 1.0 / std::sqrt((double)HS)};
    auto at = [&](void* base, int k) { return elem_ptr(base, a, (size_t)k * C); };
    const double attn_s = time_op(be, world, 3, [&] {
        be.attention_forward(out, lse, qkv, at(qkv, 1), at(qkv, 2), as);
        be.attention_backward(dqkv, at(dqkv, 1), at(dqkv, 2), dout, qkv, at(qkv, 1), at(qkv, 2), out, lse, as);
    });
    const double attn_flops = 3.5 * 2.0 * B * (double)T * T * C;

    // The block's memory-bound kernels, forward and backward: the bytes the
    // planner counts for them, a·(9·N·C + 2·N·H) and a·(8·N·C + 3·N·H).
    void* r1 = buf.make((size_t)N * C, a, rng);
    void* r2 = buf.make((size_t)N * C, a, rng);
    void* ln = buf.make((size_t)N * C, a, rng);
    void* mean = buf.make(N, st, rng);
    void* rstd = buf.make(N, st, rng);
    void* lw = buf.make(C, pt, rng);
    void* lb = buf.make(C, pt, rng);
    void* dlw = buf.make(C, gt, rng);
    void* dlb = buf.make(C, gt, rng);
    const double mem_s = time_op(be, world, 5, [&] {
        be.layernorm_forward(ln, mean, rstd, r1, lw, lb, N, C);
        be.residual_layernorm_forward(r2, ln, mean, rstd, r1, out, lw, lb, N, C);
        be.gelu_forward(y, x, (size_t)N * H);
        be.residual_layernorm_forward(r2, ln, mean, rstd, r1, out, lw, lb, N, C);
        be.layernorm_backward(dout, dlw, dlb, ln, r1, lw, mean, rstd, N, C);
        be.layernorm_backward(dout, dlw, dlb, ln, r1, lw, mean, rstd, N, C);
        be.gelu_backward(dx, x, y, (size_t)N * H);
    });
    const double mem_bytes = ab * (9.0 * N * C + 2.0 * N * H) + ab * (8.0 * N * C + 3.0 * N * H);

    // One kernel's fixed cost: an add of one element.
    const double launch = time_op(be, world, 200, [&] { be.residual_forward(r1, r1, r2, 1); });

    // The FP8 products (--fp8 1, docs/fp8.md) at the same shapes, where the
    // backend has them and takes the shapes (Backend::fp8: cuBLASLt's need
    // multiples of 16). Their ops quantise their own operands first: that
    // part, the bytes the cost model counts for it at the memory rate just
    // measured, is taken off, and what is left gives the products' rate.
    double fp8_flops = 0;
    const bool cpu = std::string(be.name()) == "cpu";
    if (be.fp8() > 0 && C % be.fp8() == 0 && N % be.fp8() == 0) {
        void* am = buf.make(3, DType::F64, rng);
        be.amax_to(elem_ptr(am, DType::F64, 0), x, a, (size_t)N * H);
        be.amax_to(elem_ptr(am, DType::F64, 1), w, pt, (size_t)4 * C * C);
        be.amax_to(elem_ptr(am, DType::F64, 2), y, a, (size_t)N * H);
        const double t8 = time_op(be, world, 5, [&] {
            for (const auto& s : shapes) be.matmul_forward_fp8(y, x, w, bias, N, s[0], s[1], am);
            for (const auto& s : shapes) be.matmul_backward_fp8(dx, dw, dbias, y, x, w, N, s[0], s[1], am);
        });
        double quant = 0;
        for (const auto& s : shapes)
            for (bool backward : {false, true}) {
                const CostModel::Fp8Passes f =
                    CostModel::fp8_passes(cpu, ab, (double)dtype_size(pt), N, s[0], s[1], backward);
                quant += f.quant_bytes / (mem_bytes / mem_s) + f.quant_ops * launch;
            }
        fp8_flops = mm_flops / std::max(t8 - quant, 0.1 * t8);
    }

    Hardware h;
    h.name = name;
    h.device = be.name();
    h.dtype = dtype_name(p.param);
    h.threads = std::string(be.name()) == "cpu" ? omp_get_max_threads() : 0;
    h.peak_flops = backend_peak_flops(be);
    h.matmul_flops = mm_flops / mm_s;
    h.fp8_matmul_flops = fp8_flops;
    h.attn_flops = attn_flops / attn_s;
    h.mem_bw = mem_bytes / mem_s;
    h.launch_s = launch;
    h.mem_bytes = (double)be.free_memory(dist_local_size());
    h.gpus_per_node = std::max(1, dist_local_size());
    // On the CPU, MPI moves data only inside its calls: nothing overlaps.
    h.comm_overlap = std::string(be.name()) == "cpu" ? 0.0 : 1.0;

    // Collectives over the ranks of the launch (one node here: intra = inter).
    const int g = world.size();
    if (g > 1) {
        std::vector<double> ns, t_ar, t_p2p;
        const size_t max_n = (size_t)1 << 21;  // elements of fp32: 8 MiB
        void* cb = be.alloc(max_n * 4);
        void* cr = be.alloc(max_n * 4);
        for (size_t n : {(size_t)1 << 10, (size_t)1 << 14, (size_t)1 << 17, (size_t)1 << 19, max_n}) {
            ns.push_back((double)n * 4);
            t_ar.push_back(time_op(be, world, 10, [&] { world.all_reduce(cb, n, DType::F32); }));
            const int r = world.rank();
            t_p2p.push_back(time_op(be, world, 10, [&] { world.send_recv(cb, (r + 1) % g, cr, (r + g - 1) % g, n, DType::F32); }));
        }
        be.release(cb);
        be.release(cr);
        world.counts().reset();
        double A, Bs;
        fit_line(ns, t_ar, &A, &Bs);  // t = 2(g-1)·lat + 2n(g-1)/(g·bw)
        h.intra_lat = A / (2.0 * (g - 1));
        h.intra_bw = Bs > 0 ? 2.0 * (g - 1) / (g * Bs) : 1e12;
        fit_line(ns, t_p2p, &A, &Bs);  // t = lat + n/bw
        h.p2p_lat = A;
        h.p2p_bw = Bs > 0 ? 1.0 / Bs : 1e12;
    } else {
        h.intra_bw = h.p2p_bw = 1e12;  // nothing to measure alone; a one-rank plan needs none
    }
    h.inter_bw = h.intra_bw;
    h.inter_lat = h.intra_lat;
    char src[768];
    std::snprintf(src, sizeof(src),
                  "measured by --calibrate on %d %s rank(s)%s at L=%d C=%d NH=%d, B=%d, T=%d: matmul %.3g FLOP/s "
                  "at the block's shapes, %.0f%% of a %dx%dx%d product's %.3g FLOP/s; attention %.3g FLOP/s, "
                  "memory-bound %.3g B/s, %.3g s per launch; FP8 products %.3g FLOP/s (0: none here); all-reduce "
                  "and send-recv fitted over 4 KiB-8 MiB",
                  g, be.name(), h.threads ? (" (" + std::to_string(h.threads) + " thread(s) each)").c_str() : "",
                  mc.num_layers, C, NH, B, T, h.matmul_flops, 100 * h.matmul_flops / big_flops, big, big, big,
                  big_flops, h.attn_flops, h.mem_bw, h.launch_s, h.fp8_matmul_flops);
    h.source = src;
    *hw = h;
    return true;
}
