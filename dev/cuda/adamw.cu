// dev/cuda/adamw.cu: kernel lab for the AdamW update (PyTorch semantics,
// decoupled weight decay, bias corrections, grad_scale folded in).
//   version 1: one thread per element, no grid-stride loop (naive)
//   version 2: the previous production kernel (dev/cuda/previous.h:
//              grid-stride, 4-byte and 2-byte accesses), one launch per span
//   version 3: llmc/backend/cuda/adamw.cuh adamw_update (production single span:
//              items of 8 elements with 16-byte accesses, scalar head/tail)
//   version 4: llmc/backend/cuda/adamw.cuh AdamMultiTable (production multi-tensor:
//              every span in one launch, weight decay per span from a device
//              table; what Backend::adamw_update_multi runs)
// fp32: params updated in place (no master). bf16: fp32 master updated, bf16
// params must be exactly the round-to-nearest of the new master. Version 4
// is validated on spans laid end to end at odd offsets and sizes (so most
// start unaligned and some cannot be aligned at all), decay on every other
// span, against cpu::adamw_update per span with the span's weight decay.
// bf16 moments (--optimizer-dtype bf16): version 4 with S = bf16, rounded to
// nearest and stochastically, against cpu::adamw_update with bf16 moments
// (the same rounding function, llmc/base/state_round.h), on the odd spans.
// Timing runs GPT-2 124M's 148 tensors (decay on the 2-D ones): versions 2
// and 3 launch once per tensor, as adamw_span does, version 4 once.
#include <type_traits>

#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/adamw.cuh"
#include "previous.h"

using namespace llmc_cuda;

template <typename P>
__global__ void adamw_v1(P* param, float* master, const P* grad, float* m, float* v, size_t n, AdamF a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = to_float(grad[i]) * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.f - a.beta1) * g;
    v[i] = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
    float p = master ? master[i] : to_float(param[i]);
    p -= a.lr * ((m[i] / a.bc1) / (sqrtf(v[i] / a.bc2) + a.eps) + a.wd * p);
    if (master) master[i] = p;
    param[i] = from_float<P>(p);
}

// A run of the buffers: [off, off + n), with or without weight decay.
struct Span {
    size_t off, n;
    bool decay;
};

// Versions 1-3: one launch per span (weight decay set per span, as
// adamw_span does); version 4: one launch for all.
template <typename P, typename S = float>
void run(int version, P* param, float* master, const P* grad, S* m, S* v, const std::vector<Span>& spans,
         const AdamArgs& a, AdamMultiTable& table) {
    if (version == 4) {
        std::vector<AdamPiece> pieces;
        for (const Span& s : spans)
            pieces.push_back(adam_make_piece<P, P, S>(param + s.off, master ? master + s.off : nullptr, grad + s.off,
                                                      m + s.off, v + s.off, s.n, s.decay));
        table.update<P, P, S>(pieces, a, 0);
        return;
    }
    if constexpr (!std::is_same<S, float>::value) return;  // bf16 moments: version 4 only
    else {
    for (const Span& s : spans) {
        AdamArgs as = a;
        as.weight_decay = s.decay ? a.weight_decay : 0.0;
        P* pp = param + s.off;
        float* mp = master ? master + s.off : nullptr;
        if (version == 1) {
            adamw_v1<P><<<(unsigned)ceil_div(s.n, 256), 256>>>(pp, mp, grad + s.off, m + s.off, v + s.off, s.n,
                                                              adam_narrow(as));
            CUDA_CHECK_LAUNCH();
        } else if (version == 2) {
            llmc_prev::adamw_update<P, P>(pp, mp, grad + s.off, m + s.off, v + s.off, s.n, as, 0);
        } else {
            adamw_update<P, P, float>(pp, mp, grad + s.off, m + s.off, v + s.off, s.n, as, 0);
        }
    }
    }
}

AdamArgs make_args(int t) {
    AdamArgs a{};
    a.lr = 1e-3, a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.weight_decay = 0.1, a.grad_scale = 0.5;
    a.bias_corr1 = 1.0 - std::pow(a.beta1, t);
    a.bias_corr2 = 1.0 - std::pow(a.beta2, t);
    return a;
}

std::vector<float> diff(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> d(a.size());
    for (size_t i = 0; i < a.size(); i++) d[i] = a[i] - b[i];
    return d;
}

// The moments as the CPU holds them: fp32, or bf16 bits.
template <typename S>
using HostMoment = typename std::conditional<std::is_same<S, float>::value, float, uint16_t>::type;
template <typename S>
std::vector<HostMoment<S>> host_moments(const std::vector<float>& x) {
    std::vector<HostMoment<S>> h(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        if constexpr (std::is_same<S, float>::value) h[i] = x[i];
        else h[i] = f32_to_bf16(x[i]);
    }
    return h;
}
template <typename S>
std::vector<float> widen(const std::vector<HostMoment<S>>& h) {
    std::vector<float> x(h.size());
    for (size_t i = 0; i < h.size(); i++) x[i] = cpu::load_moment<float>(h[i]);
    return x;
}

// shift: the param buffer starts this many elements past its allocation.
// S: the moments' type (bf16: --optimizer-dtype bf16, `stochastic` its rounding).
template <typename P, typename S = float>
void check(int version, const char* label, const std::vector<Span>& spans, size_t n, int shift = 0,
           bool stochastic = false) {
    constexpr bool bf16_moments = !std::is_same<S, float>::value;
    const bool has_master = !std::is_same<P, float>::value;
    const std::vector<float> p0 = lab::rand_normal(n, 0.02f, 1), g = lab::rand_normal(n, 0.01f, 2);
    std::vector<float> m0 = lab::rand_normal(n, 0.001f, 3), v0 = lab::rand_uniform(n, 0.f, 1e-4f, 4);
    if (bf16_moments)
        for (size_t i = 0; i < n; i++) m0[i] = lab::round_bf16(m0[i]), v0[i] = lab::round_bf16(v0[i]);
    AdamArgs a = make_args(3);
    a.bf16_state = bf16_moments;
    a.stochastic = stochastic;
    a.round_key = state_round::step_key(1337, 3);
    std::vector<float> rp = p0, rmaster = p0;
    std::vector<HostMoment<S>> hm = host_moments<S>(m0), hv = host_moments<S>(v0);
    for (const Span& s : spans) {
        AdamArgs as = a;
        as.weight_decay = s.decay ? a.weight_decay : 0.0;
        cpu::adamw_update(rp.data() + s.off, has_master ? rmaster.data() + s.off : nullptr, g.data() + s.off,
                          hm.data() + s.off, hv.data() + s.off, s.n, as);
    }
    const std::vector<float> rm = widen<S>(hm), rv = widen<S>(hv);
    std::vector<float> p0s(shift, 0.f);
    p0s.insert(p0s.end(), p0.begin(), p0.end());
    P* dp0 = lab::to_device<P>(p0s);
    P* dp = dp0 + shift;
    float* dmaster = has_master ? lab::to_device<float>(p0) : nullptr;
    P* dg = lab::to_device<P>(g);
    S* dm = lab::to_device<S>(m0);
    S* dv = lab::to_device<S>(v0);
    AdamMultiTable table;
    run<P, S>(version, dp, dmaster, dg, dm, dv, spans, a, table);
    const std::string l(label);
    const std::vector<float> got_p = lab::from_device(dp, n);
    // bf16 moments: the CPU's and the GPU's fp32 values may differ in the
    // last fp32 bit (contraction), which moves a rounding now and then by
    // one bf16 ulp: a looser tolerance, still far below one ulp everywhere.
    const double tol_m = bf16_moments ? 1e-3 : lab::kTolF32;
    lab::validate((l + " m").c_str(), lab::from_device(dm, n), rm, tol_m);
    lab::validate((l + " v").c_str(), lab::from_device(dv, n), rv, tol_m);
    if (has_master) {
        const std::vector<float> got_master = lab::from_device(dmaster, n);
        lab::validate((l + " master update").c_str(), diff(got_master, p0), diff(rmaster, p0), lab::kTolF32);
        std::vector<float> rounded(n);
        for (size_t i = 0; i < n; i++) rounded[i] = lab::round_bf16(got_master[i]);
        lab::validate((l + " param == bf16(master)").c_str(), got_p, rounded, 0.0);
    } else {
        lab::validate((l + " param update").c_str(), diff(got_p, p0), diff(rp, p0), lab::kTolF32);
    }
    // Elements outside every span must not move.
    std::vector<char> in(n, 0);
    for (const Span& s : spans) std::fill(in.begin() + s.off, in.begin() + s.off + s.n, 1);
    std::vector<float> out_got, out_ref;
    for (size_t i = 0; i < n; i++)
        if (!in[i]) out_got.push_back(got_p[i]), out_ref.push_back(lab::round_bf16(p0[i]));
    if (!out_got.empty()) lab::validate((l + " gaps untouched").c_str(), out_got, out_ref, 0.0);
    table.release();
    lab::dev_free(dp0), lab::dev_free(dmaster), lab::dev_free(dg), lab::dev_free(dm), lab::dev_free(dv);
}

// GPT-2 tensors in memory order (unit-major, as llmc/model/tensors.h lays them
// out), decay on the 2-D ones.
std::vector<Span> gpt2_spans(int L, int C, int Vp, int maxT, size_t* total) {
    std::vector<Span> s;
    size_t off = 0;
    auto add = [&](size_t n, bool decay) { s.push_back({off, n, decay}), off += n; };
    add((size_t)Vp * C, true);
    add((size_t)maxT * C, true);
    for (int l = 0; l < L; l++) {
        add(C, false), add(C, false);                          // ln1
        add((size_t)3 * C * C, true), add((size_t)3 * C, false);  // qkv
        add((size_t)C * C, true), add(C, false);                 // attproj
        add(C, false), add(C, false);                          // ln2
        add((size_t)4 * C * C, true), add((size_t)4 * C, false);  // fc
        add((size_t)4 * C * C, true), add(C, false);             // fcproj
    }
    add(C, false), add(C, false);  // lnf
    *total = off;
    return s;
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const size_t nv = (size_t)1 << 22;
    std::printf("validation (one span of n=%zu)\n", nv);
    const std::vector<Span> one{{0, nv, true}};
    for (int v = 1; v <= 4; v++) {
        check<float>(v, ("v" + std::to_string(v) + " fp32").c_str(), one, nv);
        check<bf16>(v, ("v" + std::to_string(v) + " bf16+master").c_str(), one, nv);
    }
    // Spans end to end from offset 3 with odd sizes and gaps: most start off
    // 16-byte alignment (a scalar head), some are shorter than an item. With
    // the params shifted by one element against the other buffers (as a
    // ZeRO shard's master and Adam state sit at other offsets than its
    // params), bf16 params and fp32 buffers never align together: the
    // element-by-element path.
    std::vector<Span> odd;
    size_t off = 3, n_odd = 0;
    const size_t sizes[] = {1, 7, 8, 9, 13, 2048, 2049, 100003, 5, 65536, 777, 16, 31};
    int k = 0;
    for (size_t sz : sizes) {
        odd.push_back({off, sz, k % 2 == 0});
        off += sz + (k % 3 == 0 ? 1 : 0);  // a one-element gap after every third span
        k++;
    }
    n_odd = off + 5;
    std::printf("validation (%zu spans at odd offsets, decay on every other)\n", odd.size());
    for (int v = 3; v <= 4; v++) {
        const std::string l = "v" + std::to_string(v);
        check<float>(v, (l + " fp32 odd spans").c_str(), odd, n_odd);
        check<bf16>(v, (l + " bf16+master odd spans").c_str(), odd, n_odd);
        check<bf16>(v, (l + " bf16+master odd spans, params shifted").c_str(), odd, n_odd, 1);
    }
    std::printf("validation (bf16 moments, the odd spans)\n");
    check<float, bf16>(4, "v4 fp32, bf16 m/v nearest", odd, n_odd);
    check<bf16, bf16>(4, "v4 bf16+master, bf16 m/v nearest", odd, n_odd);
    check<bf16, bf16>(4, "v4 bf16+master, bf16 m/v stochastic", odd, n_odd, 0, true);
    check<bf16, bf16>(4, "v4 bf16+master shifted, bf16 m/v stochastic", odd, n_odd, 1, true);

    size_t n = 0;
    const std::vector<Span> spans = gpt2_spans(12, 768, 50304, 1024, &n);  // 124475904 elements
    if (lab::check_only()) return lab::finish();
    std::printf("timing (bf16 params and grads, fp32 master/m/v, GPT-2 124M: %zu tensors, n=%zu)\n", spans.size(), n);
    bf16* dp = lab::dev_alloc<bf16>(n);
    bf16* dg = lab::dev_alloc<bf16>(n);
    float* dmaster = lab::dev_alloc<float>(n);
    float* dm = lab::dev_alloc<float>(n);
    float* dv = lab::dev_alloc<float>(n);
    const AdamArgs a = make_args(1);
    AdamMultiTable table;
    const double bytes = (double)n * (2 + 2 + 3 * 4 * 2);  // grad in, param out, master/m/v in and out
    const char* names[] = {"", "v1 naive (per tensor)", "v2 previous (per tensor)", "v3 production (per tensor)",
                           "v4 production multi-tensor (one launch)"};
    for (int v = 1; v <= 4; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, dp, dmaster, dg, dm, dv, spans, a, table); });
        lab::report_bw(names[v], ms, bytes);
    }
    {
        // bf16 m and v (--optimizer-dtype bf16), stochastic rounding: 8 bytes
        // fewer per element moved, 4 fewer held.
        bf16* dm16 = lab::dev_alloc<bf16>(n);
        bf16* dv16 = lab::dev_alloc<bf16>(n);
        AdamArgs a16 = a;
        a16.bf16_state = a16.stochastic = true;
        const double bytes16 = (double)n * (2 + 2 + 4 * 2 + 2 * 2 * 2);
        float ms = lab::time_ms([&] { run<bf16, bf16>(4, dp, dmaster, dg, dm16, dv16, spans, a16, table); });
        lab::report_bw("v4 multi-tensor, bf16 m/v stochastic", ms, bytes16);
        lab::dev_free(dm16), lab::dev_free(dv16);
    }
    table.release();
    lab::dev_free(dp), lab::dev_free(dg), lab::dev_free(dmaster), lab::dev_free(dm), lab::dev_free(dv);
    return lab::finish();
}
