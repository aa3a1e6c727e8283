// dev/cuda/ring_attention.cu: kernel lab for the ring-attention block ops
// (context parallel; backend.h attention_block_forward/backward) and the
// batch and lse strides of AttnShape they rely on.
//   ring forward:  a zigzag ring of R ranks emulated on one GPU. The sequence
//                  is cut into 2R chunks; rank r holds chunks r and 2R-1-r. At
//                  ring step t rank r has the K/V of rank (r - t) mod R and
//                  runs one block per (own query chunk, visiting key chunk)
//                  with key chunk <= query chunk (causal on the diagonal),
//                  merging into fp32 (out, lse) by log-sum-exp; the first block
//                  of each query chunk overwrites (the buffers start as
//                  garbage). Chunks are addressed in place in whole-sequence
//                  buffers through the batch and lse strides. The result must
//                  equal cpu::attention_forward over the whole sequence.
//   ring backward: the same schedule with attention_block_backward, adding
//                  into fp32 dq, dk, dv (which start from nonzero values, to
//                  check +=) given the global out and lse; must equal the
//                  start plus cpu::attention_backward over the whole sequence.
//   strided plain: the production attention_forward/backward (E outputs,
//                  overwrite) on one chunk pair addressed in place, against
//                  the cpu ops on the same views.
// Each runs on the CUDA-core kernels (llmc/backend/cuda/attention.cuh) in fp32 and
// bf16, and, for head sizes 64 and 128, on the tensor-core kernels
// (llmc/backend/cuda/attention_tc.cuh, "tc" lines) in bf16, which is what the CUDA
// backend dispatches to in its default bf16 mode.
// q comes from a packed qkv buffer (q_stride 3C; C + 2·NKV·HS with
// grouped-query attention, Llama's [Q | K | V] rows); k and v from a K|V
// buffer (kv_stride 2C or 2·NKV·HS, as ring attention packs them for
// sending). GQA setups (2:1, 4:1) run every check above. Document-mask
// setups (doc > 0: documents of 1 to 2·doc-1 tokens) give every block the
// queries' document starts and the keys' positions, as ring attention does,
// on the CUDA-core kernels (the tensor-core ones do not take the mask); the
// reference is the masked CPU attention over the whole sequence. References run
// in fp64 on the CPU, so the tolerances measure the GPU's error alone; the
// bf16 runs differ from fp32 only by the inputs' type (the block outputs and
// gradients are fp32), except strided plain, whose outputs are bf16.
// Flags: --no-timing; --quick (no T=1024 setup, no timing); --small (four
// small setups with the same paths: one batch row, T <= 272, for
// compute-sanitizer).
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/attention.cuh"
#include "llmc/backend/cuda/attention_tc.cuh"

#include <algorithm>
#include <type_traits>

using namespace llmc_cuda;

constexpr double kTolF32 = tol::kFp32;
constexpr double kTolBF16 = tol::kBf16TwoRoundings;  // partial results merged

struct Setup {
    const char* name;
    int B, NH, HS, R, c;  // c rows per chunk; T = 2*R*c
    int NKV = 0;          // grouped-query attention: key/value heads (0: NH)
    int doc = 0;          // document mask: mean document length (0: no mask)
    int T() const { return 2 * R * c; }
    size_t C() const { return (size_t)NH * HS; }
    size_t KC() const { return (size_t)(NKV ? NKV : NH) * HS; }  // channels of K (and of V)
    size_t QW() const { return C() + 2 * KC(); }                  // a qkv row: [Q | K | V]
    double scale() const { return 1.0 / std::sqrt((double)HS); }
    // Element offsets of chunk n in the qkv, K|V, out and lse buffers.
    size_t q_off(int n) const { return (size_t)n * c * QW(); }
    size_t kv_off(int n) const { return (size_t)n * c * 2 * KC(); }
    size_t o_off(int n) const { return (size_t)n * c * C(); }
    size_t l_off(int n) const { return (size_t)n * c; }
};

// The whole sequence, causal, dense batch strides.
AttnShape full_shape(const Setup& u) {
    AttnShape s{u.B, u.NH, u.HS, u.T(), u.T(), u.QW(), 2 * u.KC(), u.C(), true, u.scale()};
    s.NKV = u.NKV;
    return s;
}

// One chunk of queries against one chunk of keys, in place in the
// whole-sequence buffers: batch strides span T rows, lse is [B, NH, T].
AttnShape chunk_shape(const Setup& u, bool causal) {
    const size_t C = u.C(), T = (size_t)u.T();
    AttnShape s{u.B, u.NH, u.HS, u.c, u.c, u.QW(), 2 * u.KC(), C, causal, u.scale()};
    s.NKV = u.NKV;
    s.q_bstride = T * u.QW();
    s.kv_bstride = T * 2 * u.KC();
    s.o_bstride = T * C;
    s.lse_hstride = T;
    s.lse_bstride = (size_t)u.NH * T;
    return s;
}

// The document mask of a setup (host): each position's document start, [B, T]
// (documents of 1 to 2·doc-1 tokens, a fixed sequence per row), and the
// positions 0..T-1 (the keys' positions of chunk kc start at kc·c).
struct Mask {
    std::vector<int> docs, pos;
};
Mask make_mask(const Setup& u) {
    Mask m;
    if (!u.doc) return m;
    m.pos.resize(u.T());
    for (int t = 0; t < u.T(); t++) m.pos[t] = t;
    m.docs.resize((size_t)u.B * u.T());
    unsigned x = 777;
    for (int b = 0; b < u.B; b++)
        for (int t = 0, start = 0, left = 0; t < u.T(); t++) {
            if (left == 0) {
                start = t;
                x = x * 1103515245u + 12345u;
                left = 1 + (int)((x >> 8) % (unsigned)(2 * u.doc - 1));
            }
            m.docs[(size_t)b * u.T() + t] = start;
            left--;
        }
    return m;
}
// Block (qc, kc) of the ring with the mask (device docs and pos, or null).
AttnShape masked_chunk(const Setup& u, bool causal, int qc, int kc, const int* docs, const int* pos) {
    AttnShape s = chunk_shape(u, causal);
    if (docs) {
        s.doc_start = docs + u.l_off(qc);
        s.doc_bstride = u.T();
        s.key_pos = pos + (size_t)kc * u.c;
    }
    return s;
}

// Calls block(qc, kc, causal, first) in the order a zigzag ring of R ranks
// runs its blocks; every pair kc <= qc comes exactly once, and first marks
// the first block of each query chunk.
template <typename Fn>
void zigzag_ring(int R, Fn&& block) {
    for (int r = 0; r < R; r++) {
        const int mine[2] = {r, 2 * R - 1 - r};
        bool started[2] = {false, false};
        for (int t = 0; t < R; t++) {
            const int src = (r - t + R) % R;
            const int theirs[2] = {src, 2 * R - 1 - src};
            for (int a = 0; a < 2; a++)
                for (int kc : theirs) {
                    if (kc > mine[a]) continue;
                    block(mine[a], kc, kc == mine[a], !started[a]);
                    started[a] = true;
                }
        }
    }
}

std::vector<double> f64(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
std::vector<float> f32(const std::vector<double>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = (float)x[i];
    return y;
}

struct Data {
    std::vector<float> qkv, kv, dout;  // inputs, bf16-representable
    std::vector<float> out, lse;       // full causal forward (fp64, then fp32)
    std::vector<float> out_in;         // out rounded to bf16: the backward's input in both precisions
    std::vector<float> gq0, gkv0;      // starting values of the fp32 gradient accumulators
    std::vector<float> dq, dkv;        // gq0, gkv0 plus the full backward (fp64, then fp32)
    Mask mask;                         // the document mask (doc > 0)
};

Data make_data(const Setup& u, uint64_t seed) {
    const size_t C = u.C(), KC = u.KC(), QW = u.QW(), BT = (size_t)u.B * u.T();
    AttnShape s = full_shape(u);
    Data d;
    d.mask = make_mask(u);
    if (u.doc) s.doc_start = d.mask.docs.data();
    d.qkv = lab::rand_normal(BT * QW, 1.f, seed);
    d.kv.resize(BT * 2 * KC);
    for (size_t r = 0; r < BT; r++)
        for (size_t x = 0; x < 2 * KC; x++) d.kv[r * 2 * KC + x] = d.qkv[r * QW + C + x];
    d.dout = lab::rand_normal(BT * C, 1.f, seed + 1);
    const std::vector<double> qkv = f64(d.qkv), kv = f64(d.kv);
    std::vector<double> out(BT * C, 0.0), lse((size_t)u.B * u.NH * u.T(), 0.0);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), kv.data(), kv.data() + KC, s);
    d.out = f32(out);
    d.lse = f32(lse);
    d.out_in = d.out;
    for (float& x : d.out_in) x = lab::round_bf16(x);

    d.gq0 = lab::rand_normal(BT * QW, 0.01f, seed + 2);
    d.gkv0 = lab::rand_normal(BT * 2 * KC, 0.01f, seed + 3);
    std::vector<double> dq(BT * QW, 0.0), dkv(BT * 2 * KC, 0.0);
    const std::vector<double> dout = f64(d.dout), out_in = f64(d.out_in), lse_in = f64(d.lse);
    cpu::attention_backward(dq.data(), dkv.data(), dkv.data() + KC, dout.data(), qkv.data(), kv.data(), kv.data() + KC,
                            out_in.data(), lse_in.data(), s);
    for (size_t i = 0; i < dq.size(); i++) dq[i] += d.gq0[i];
    for (size_t i = 0; i < dkv.size(); i++) dkv[i] += d.gkv0[i];
    d.dq = f32(dq);
    d.dkv = f32(dkv);
    return d;
}

// tc: the tensor-core kernels (E = bf16 only).
template <typename E>
void ring_forward(const Setup& u, float* out, float* lse, const E* qkv, const E* kv, bool tc = false,
                  const int* docs = nullptr, const int* pos = nullptr) {
    zigzag_ring(u.R, [&](int qc, int kc, bool causal, bool first) {
        const AttnShape s = masked_chunk(u, causal, qc, kc, docs, pos);
        float* o = out + u.o_off(qc);
        float* l = lse + u.l_off(qc);
        const E* q = qkv + u.q_off(qc);
        const E* k = kv + u.kv_off(kc);
        const E* v = kv + u.kv_off(kc) + u.KC();
        if constexpr (std::is_same<E, bf16>::value) {
            if (tc) {
                attention_block_forward_tc(o, l, q, k, v, s, first, 0);
                return;
            }
        }
        attention_block_forward<E>(o, l, q, k, v, s, first, 0);
    });
}

template <typename E>
void ring_backward(const Setup& u, float* dq, float* dkv, const E* dout, const E* qkv, const E* kv, const E* out,
                   const float* lse, float* scratch, bool tc = false, const int* docs = nullptr,
                   const int* pos = nullptr) {
    zigzag_ring(u.R, [&](int qc, int kc, bool causal, bool) {
        const AttnShape s = masked_chunk(u, causal, qc, kc, docs, pos);
        float *gq = dq + u.q_off(qc), *gk = dkv + u.kv_off(kc), *gv = dkv + u.kv_off(kc) + u.KC();
        const E *go = dout + u.o_off(qc), *q = qkv + u.q_off(qc), *k = kv + u.kv_off(kc),
                *v = kv + u.kv_off(kc) + u.KC(), *o = out + u.o_off(qc);
        const float* l = lse + u.l_off(qc);
        if constexpr (std::is_same<E, bf16>::value) {
            if (tc) {
                attention_block_backward_tc(gq, gk, gv, go, q, k, v, o, l, s, scratch, 0);
                return;
            }
        }
        attention_block_backward<E>(gq, gk, gv, go, q, k, v, o, l, s, scratch, 0);
    });
}

// Whether the tensor-core dispatch takes every block of the ring (head size,
// 16-byte aligned chunk rows).
bool tc_takes(const Setup& u) {
    bool ok = true;
    bf16* probe = lab::dev_alloc<bf16>(8);
    zigzag_ring(u.R, [&](int qc, int kc, bool causal, bool) {
        ok &= attention_tc_supported(chunk_shape(u, causal), {probe + u.q_off(qc), probe + u.kv_off(kc),
                                                              probe + u.kv_off(kc) + u.KC(), probe + u.o_off(qc)});
    });
    lab::dev_free(probe);
    return ok;
}

template <typename E>
void check_ring(const Setup& u, const Data& d, const char* label, double tol, bool tc = false) {
    const size_t C = u.C(), KC = u.KC(), QW = u.QW(), BT = (size_t)u.B * u.T(), nlse = (size_t)u.B * u.NH * u.T();
    const std::string l = std::string(label) + " " + u.name;
    E* qkv = lab::to_device<E>(d.qkv);
    E* kv = lab::to_device<E>(d.kv);
    // Garbage in the accumulators: each chunk's first block must overwrite it.
    float* out = lab::to_device<float>(lab::rand_normal(BT * C, 3.f, 77));
    float* lse = lab::to_device<float>(lab::rand_normal(nlse, 3.f, 78));
    int* docs = u.doc ? lab::ints_to_device(d.mask.docs) : nullptr;
    int* pos = u.doc ? lab::ints_to_device(d.mask.pos) : nullptr;
    ring_forward<E>(u, out, lse, qkv, kv, tc, docs, pos);
    lab::validate((l + " fwd out").c_str(), lab::from_device(out, BT * C), d.out, tol);
    lab::validate((l + " fwd lse").c_str(), lab::from_device(lse, nlse), d.lse, kTolF32);

    E* dout = lab::to_device<E>(d.dout);
    E* out_in = lab::to_device<E>(d.out_in);
    float* lse_in = lab::to_device<float>(d.lse);
    float* dq = lab::to_device<float>(d.gq0);
    float* dkv = lab::to_device<float>(d.gkv0);
    // Sized for either path (the tensor-core one's depends on LLMC_ATTN_BWD and LLMC_ATTN_WG).
    float* scratch = lab::dev_alloc<float>(std::max(attention_backward_scratch_floats(chunk_shape(u, false)),
                                                    attention_backward_tc_scratch_floats(chunk_shape(u, false))));
    ring_backward<E>(u, dq, dkv, dout, qkv, kv, out_in, lse_in, scratch, tc, docs, pos);
    if (docs) lab::dev_free(docs), lab::dev_free(pos);
    lab::validate((l + " bwd dq").c_str(), lab::from_device(dq, BT * QW), d.dq, tol);
    lab::validate((l + " bwd dk|dv").c_str(), lab::from_device(dkv, BT * 2 * KC), d.dkv, tol);
    lab::dev_free(qkv), lab::dev_free(kv), lab::dev_free(out), lab::dev_free(lse), lab::dev_free(dout),
        lab::dev_free(out_in), lab::dev_free(lse_in), lab::dev_free(dq), lab::dev_free(dkv), lab::dev_free(scratch);
}

// The production forward and backward on query chunk qc against key chunk kc,
// in place (batch strides of T rows, lse [B, NH, T]); the rest of each buffer
// must stay untouched (zero).
template <typename E>
void check_plain(const Setup& u, const Data& d, int qc, int kc, const char* label, double tol, bool tc = false) {
    const size_t C = u.C(), KC = u.KC(), QW = u.QW(), BT = (size_t)u.B * u.T(), nlse = (size_t)u.B * u.NH * u.T();
    const AttnShape s = chunk_shape(u, qc == kc);
    const std::string l = std::string(label) + " " + u.name + (qc == kc ? " diag" : " off-diag");
    const std::vector<double> qkv = f64(d.qkv), kv = f64(d.kv), dout = f64(d.dout);
    std::vector<double> rout(BT * C, 0.0), rlse(nlse, 0.0);
    cpu::attention_forward(rout.data() + u.o_off(qc), rlse.data() + u.l_off(qc), qkv.data() + u.q_off(qc),
                           kv.data() + u.kv_off(kc), kv.data() + u.kv_off(kc) + KC, s);
    // The backward's inputs: this block's out (rounded to bf16) and lse.
    std::vector<float> out_in = f32(rout), lse_in = f32(rlse);
    for (float& x : out_in) x = lab::round_bf16(x);
    std::vector<double> rdq(BT * QW, 0.0), rdkv(BT * 2 * KC, 0.0);
    const std::vector<double> out64 = f64(out_in), lse64 = f64(lse_in);
    cpu::attention_backward(rdq.data() + u.q_off(qc), rdkv.data() + u.kv_off(kc), rdkv.data() + u.kv_off(kc) + KC,
                            dout.data() + u.o_off(qc), qkv.data() + u.q_off(qc), kv.data() + u.kv_off(kc),
                            kv.data() + u.kv_off(kc) + KC, out64.data() + u.o_off(qc), lse64.data() + u.l_off(qc), s);

    E* q_d = lab::to_device<E>(d.qkv);
    E* kv_d = lab::to_device<E>(d.kv);
    E* out_d = lab::dev_alloc<E>(BT * C);
    float* lse_d = lab::dev_alloc<float>(nlse);
    if constexpr (std::is_same<E, bf16>::value) {
        if (tc)
            attention_forward_tc(out_d + u.o_off(qc), lse_d + u.l_off(qc), q_d + u.q_off(qc), kv_d + u.kv_off(kc),
                                 kv_d + u.kv_off(kc) + KC, s, 0);
    }
    if (!tc)
        attention_forward<E>(out_d + u.o_off(qc), lse_d + u.l_off(qc), q_d + u.q_off(qc), kv_d + u.kv_off(kc),
                             kv_d + u.kv_off(kc) + KC, s, 0);
    lab::validate((l + " fwd out").c_str(), lab::from_device(out_d, BT * C), f32(rout), tol);
    lab::validate((l + " fwd lse").c_str(), lab::from_device(lse_d, nlse), f32(rlse), kTolF32);

    E* dout_d = lab::to_device<E>(d.dout);
    E* out_in_d = lab::to_device<E>(out_in);
    float* lse_in_d = lab::to_device<float>(lse_in);
    E* dq_d = lab::dev_alloc<E>(BT * QW);
    E* dkv_d = lab::dev_alloc<E>(BT * 2 * KC);
    float* scratch =
        lab::dev_alloc<float>(std::max(attention_backward_scratch_floats(s), attention_backward_tc_scratch_floats(s)));
    if constexpr (std::is_same<E, bf16>::value) {
        if (tc)
            attention_backward_tc(dq_d + u.q_off(qc), dkv_d + u.kv_off(kc), dkv_d + u.kv_off(kc) + KC,
                                  dout_d + u.o_off(qc), q_d + u.q_off(qc), kv_d + u.kv_off(kc),
                                  kv_d + u.kv_off(kc) + KC, out_in_d + u.o_off(qc), lse_in_d + u.l_off(qc), s, scratch,
                                  0);
    }
    if (!tc)
        attention_backward<E>(dq_d + u.q_off(qc), dkv_d + u.kv_off(kc), dkv_d + u.kv_off(kc) + KC,
                              dout_d + u.o_off(qc), q_d + u.q_off(qc), kv_d + u.kv_off(kc), kv_d + u.kv_off(kc) + KC,
                              out_in_d + u.o_off(qc), lse_in_d + u.l_off(qc), s, scratch, 0);
    lab::validate((l + " bwd dq").c_str(), lab::from_device(dq_d, BT * QW), f32(rdq), tol);
    lab::validate((l + " bwd dk|dv").c_str(), lab::from_device(dkv_d, BT * 2 * KC), f32(rdkv), tol);
    lab::dev_free(q_d), lab::dev_free(kv_d), lab::dev_free(out_d), lab::dev_free(lse_d), lab::dev_free(dout_d),
        lab::dev_free(out_in_d), lab::dev_free(lse_in_d), lab::dev_free(dq_d), lab::dev_free(dkv_d),
        lab::dev_free(scratch);
}

int main(int argc, char** argv) {
    const lab::RunFlags flags = lab::parse_flags(argc, argv);
    const bool timing = flags.timing, quick = flags.quick;
    if (!lab::have_gpu()) return lab::finish();
    const Setup setups[] = {
        {"R=1 HS=64 T=128", 2, 4, 64, 1, 64},    // two halves
        {"R=2 HS=16 T=200", 2, 3, 16, 2, 50},    // chunks not a multiple of the tile
        {"R=3 HS=40 T=78", 3, 2, 40, 3, 13},     // chunks smaller than a tile
        {"R=4 HS=128 T=256", 1, 2, 128, 4, 32},  // chunk = one tile
        {"R=2 HS=200 T=100", 1, 2, 200, 2, 25},  // widest head
        {"R=2 HS=64 T=200", 2, 3, 64, 2, 50},    // tensor cores: chunks cut the tiles
        {"R=3 HS=128 T=78", 2, 2, 128, 3, 13},   // tensor cores: chunks smaller than a tile
        {"R=2 HS=64 T=1024", 2, 12, 64, 2, 256},  // tensor cores: d12 heads, long chunks
        {"GQA 2:1 R=2 HS=64 T=200", 2, 4, 64, 2, 50, 2},    // tensor cores and CUDA cores
        {"GQA 4:1 R=3 HS=128 T=78", 1, 8, 128, 3, 13, 2},   // tensor cores: chunks smaller than a tile
        {"GQA 3:1 R=2 HS=40 T=100", 2, 6, 40, 2, 25, 2},    // CUDA cores only
        {"docmask R=2 HS=64 T=200", 2, 3, 64, 2, 50, 0, 15},       // document mask (CUDA cores)
        {"docmask GQA 2:1 R=3 HS=40 T=78", 2, 4, 40, 3, 13, 2, 4},  // short documents, small chunks
    };
    // --small: one batch row; chunks past one 64-key tile and smaller than a
    // tile (tensor cores), an odd head size (CUDA cores only), GQA 2:1.
    const Setup small[] = {
        {"small R=2 HS=64 T=272", 1, 2, 64, 2, 68},
        {"small R=3 HS=128 T=78", 1, 2, 128, 3, 13},
        {"small R=2 HS=40 T=100", 1, 2, 40, 2, 25},
        {"small GQA 2:1 R=2 HS=64 T=200", 1, 4, 64, 2, 50, 2},
    };
    std::printf("validation (fp64 CPU references)\n");
    std::vector<Setup> list(setups, setups + sizeof(setups) / sizeof(setups[0]));
    if (flags.small) list.assign(small, small + sizeof(small) / sizeof(small[0]));
    int n = 0;
    for (const Setup& u : list) {
        if (quick && u.T() >= 1024) continue;
        const Data d = make_data(u, 1 + n);
        check_ring<float>(u, d, "ring fp32", kTolF32);
        check_ring<bf16>(u, d, "ring bf16", kTolBF16);
        // Alternate a causal diagonal block and a non-causal off-diagonal one.
        const int qc = 2 * u.R - 1, kc = n % 2 ? 0 : qc;
        check_plain<float>(u, d, qc, kc, "strided fp32", kTolF32);
        check_plain<bf16>(u, d, qc, kc, "strided bf16", kTolBF16);
        if ((u.HS == 64 || u.HS == 128) && !u.doc) {
            if (!tc_takes(u)) {
                std::printf("  tc %-40s not taken by the tensor-core dispatch  FAIL\n", u.name);
                lab::g_failed++;
            } else {
                check_ring<bf16>(u, d, "tc ring bf16", kTolBF16, true);
                check_plain<bf16>(u, d, qc, kc, "tc strided bf16", kTolBF16, true);
                check_plain<bf16>(u, d, qc, n % 2 ? qc : 0, "tc strided bf16", kTolBF16, true);  // the other kind
            }
        }
        n++;
    }

    if (!timing) return lab::finish();

    // Timing: the ring's blocks one after another against one full call.
    const Setup u{"d12", 8, 12, 64, 4, 128};
    const size_t C = u.C(), BT = (size_t)u.B * u.T();
    const AttnShape s = full_shape(u);
    const double flops = 4.0 * u.B * u.NH * u.HS * (double)u.T() * u.T() / 2;
    if (lab::check_only()) return lab::finish();
    std::printf("timing bf16 (B=%d NH=%d HS=%d T=%d causal, ring R=%d: %d blocks of %d rows; backward FLOPs "
                "counted as 2.5x the forward's)\n",
                u.B, u.NH, u.HS, u.T(), u.R, u.R * (2 * u.R + 1), u.c);
    const std::vector<float> qkv_h = lab::rand_normal(BT * 3 * C, 1.f, 5);
    std::vector<float> kv_h(BT * 2 * C);
    for (size_t r = 0; r < BT; r++)
        for (size_t x = 0; x < 2 * C; x++) kv_h[r * 2 * C + x] = qkv_h[r * 3 * C + C + x];
    bf16* qkv = lab::to_device<bf16>(qkv_h);
    bf16* kv = lab::to_device<bf16>(kv_h);
    bf16* dout = lab::to_device<bf16>(lab::rand_normal(BT * C, 1.f, 6));
    bf16* out = lab::dev_alloc<bf16>(BT * C);
    bf16* dq = lab::dev_alloc<bf16>(BT * 3 * C);
    bf16* dkv = lab::dev_alloc<bf16>(BT * 2 * C);
    float* lse = lab::dev_alloc<float>((size_t)u.B * u.NH * u.T());
    float* out32 = lab::dev_alloc<float>(BT * C);
    float* dq32 = lab::dev_alloc<float>(BT * 3 * C);
    float* dkv32 = lab::dev_alloc<float>(BT * 2 * C);
    float* scratch =
        lab::dev_alloc<float>(std::max(attention_backward_scratch_floats(s), attention_backward_tc_scratch_floats(s)));
    for (int tc = 0; tc < 2; tc++) {
        const char* k = tc ? "tensor cores" : "CUDA cores";
        std::printf(" %s\n", k);
        auto fwd = [&] {
            if (tc)
                attention_forward_tc(out, lse, qkv, kv, kv + C, s, 0);
            else
                attention_forward<bf16>(out, lse, qkv, kv, kv + C, s, 0);
        };
        fwd();  // a consistent (out, lse) for the backward
        float ms = lab::time_ms(fwd, tc ? 20 : 5);
        lab::report_tflops("forward, one call", ms, flops);
        ms = lab::time_ms([&] { ring_forward<bf16>(u, out32, lse, qkv, kv, tc); }, tc ? 20 : 5);
        lab::report_tflops("forward, ring blocks (fp32 merge)", ms, flops);
        fwd();  // the ring overwrote lse: restore it
        ms = lab::time_ms(
            [&] {
                if (tc)
                    attention_backward_tc(dq, dkv, dkv + C, dout, qkv, kv, kv + C, out, lse, s, scratch, 0);
                else
                    attention_backward<bf16>(dq, dkv, dkv + C, dout, qkv, kv, kv + C, out, lse, s, scratch, 0);
            },
            tc ? 10 : 3);
        lab::report_tflops("backward, one call", ms, 2.5 * flops);
        ms = lab::time_ms([&] { ring_backward<bf16>(u, dq32, dkv32, dout, qkv, kv, out, lse, scratch, tc); },
                          tc ? 10 : 3);
        lab::report_tflops("backward, ring blocks (fp32 +=)", ms, 2.5 * flops);
    }
    lab::dev_free(qkv), lab::dev_free(kv), lab::dev_free(dout), lab::dev_free(out), lab::dev_free(dq),
        lab::dev_free(dkv), lab::dev_free(lse), lab::dev_free(out32), lab::dev_free(dq32), lab::dev_free(dkv32),
        lab::dev_free(scratch);
    return lab::finish();
}
