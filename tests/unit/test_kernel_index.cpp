// tests/unit/test_kernel_index.cpp: the CUDA kernels' index arithmetic, run on
// the host (no GPU needed). llmc/backend/cuda/kernel_index.h holds every "which thread
// takes which element, in which order are partial sums added" decision of
// the memory-bound kernels; this test runs those same functions over every
// thread of a grid and checks that each element is visited exactly once,
// then replays the reductions in the kernels' order (LayerNorm and bias
// gradients, encoder backward buckets, multi-tensor AdamW, RMSNorm
// backward, RoPE's thread ownership and angle arithmetic) and compares
// them with the CPU backend's ops (llmc/backend/cpu_ops.h), the independent truth.
// It also checks that adamw_spans (one multi-tensor backend call) gives the
// same bits as adamw_span per unit on the CPU backend.
// Last line: "N passed, N failed".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/kernel_index.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/tensors.h"
#include "tests/lib/check.h"
#include "tests/unit/encoder_replay.h"

using namespace llmc_idx;

static double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
    double d = 0, r = 0;
    for (size_t i = 0; i < got.size(); i++) {
        d += (got[i] - ref[i]) * (got[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

// ---- elementwise packs ----------------------------------------------------------------
static void test_for_each_pack() {
    const size_t ns[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 100, 1000, 1023, 4097, 65541};
    const int ws[] = {1, 4, 8};
    const size_t threads[] = {1, 3, 32, 256, 1000, 100000};
    int bad = 0, cases = 0;
    for (size_t n : ns)
        for (int W : ws)
            for (size_t nth : threads) {
                std::vector<int> seen(n, 0);
                bool shape_ok = true;
                for (size_t tid = 0; tid < nth; tid++)
                    for_each_pack(n, W, tid, nth, [&](size_t first, int count) {
                        // a pack starts on a multiple of W; a tail element lies past the last pack
                        if (count == W) shape_ok = shape_ok && first % W == 0 && first + W <= n;
                        else shape_ok = shape_ok && count == 1 && first >= n / W * W && first < n;
                        for (int j = 0; j < count; j++)
                            if (first + j < n) seen[first + j]++;
                            else shape_ok = false;
                    });
                cases++;
                if (!shape_ok || std::any_of(seen.begin(), seen.end(), [](int s) { return s != 1; })) bad++;
            }
    CHECK(bad == 0, "for_each_pack: %d of %d (n, W, threads) cases visit an element other than once", bad, cases);
}

// ---- LayerNorm row packs ----------------------------------------------------------------
static void test_ln_packs() {
    int bad = 0;
    for (int W : {4, 8})
        for (int C = W; C <= 2048; C += W) {
            const int K = ln_packs_per_lane(C, W);
            std::vector<int> seen(C, 0);
            for (int k = 0; k < K; k++)
                for (int lane = 0; lane < 32; lane++) {
                    const int c = ln_pack_channel(k, lane, W);
                    if (c < C)
                        for (int j = 0; j < W; j++) seen[c + j]++;  // C % W == 0: a pack is all in or all out
                }
            // every channel once, and no lane idles for a whole k (K is minimal)
            const bool once = std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; });
            const bool minimal = ln_pack_channel(K - 1, 0, W) < C;
            if (!once || !minimal) bad++;
        }
    CHECK(bad == 0, "ln packs: %d channel counts C miss or repeat a channel", bad);
    // the GPT-2 sizes fit the register path (kLnMaxPacks = 8 in layernorm.cuh)
    CHECK(ln_packs_per_lane(768, 8) == 3 && ln_packs_per_lane(1024, 8) == 4 && ln_packs_per_lane(1600, 8) == 7,
          "ln packs for C = 768, 1024, 1600: %d %d %d", ln_packs_per_lane(768, 8), ln_packs_per_lane(1024, 8),
          ln_packs_per_lane(1600, 8));
}

// The fixed-order column sum (common.cuh column_sum_finish_kernel), replayed.
static std::vector<float> colsum_replay(const std::vector<float>& partial, int K, int ncols) {
    std::vector<float> out(ncols);
    for (int c = 0; c < ncols; c++) {
        float lanes[kColSumLanes];
        for (int y = 0; y < kColSumLanes; y++) {
            float acc = 0.f;
            for (int k = colsum_first(y); k < K; k += colsum_stride()) acc += partial[(size_t)k * ncols + c];
            lanes[y] = acc;
        }
        float t = 0.f;
        for (int y = 0; y < kColSumLanes; y++) t += lanes[y];
        out[c] = t;
    }
    return out;
}

static void test_colsum_order() {
    int bad = 0;
    for (int K : {1, 2, 7, 8, 9, 63, 64, 65, 256, 2048}) {
        std::vector<int> seen(K, 0);
        for (int y = 0; y < kColSumLanes; y++)
            for (int k = colsum_first(y); k < K; k += colsum_stride()) seen[k]++;
        if (std::any_of(seen.begin(), seen.end(), [](int s) { return s != 1; })) bad++;
    }
    CHECK(bad == 0, "column sum: %d partial counts K add a partial other than once", bad);
}

// ---- LayerNorm backward ---------------------------------------------------------------
// Replays layernorm_backward_vec_kernel's dw/db order (rows per warp in row
// order, warps in warp order, blocks by the column sum) in fp32 and
// compares with the CPU op in fp64. Also checks the row assignment.
static void test_ln_backward() {
    int bad_rows = 0;
    for (int N : {1, 5, 8, 9, 100, 2047, 2048, 2049, 8192, 65536, 100003}) {
        const int grid = ln_bwd_blocks(N);
        std::vector<int> seen(N, 0);
        for (int b = 0; b < grid; b++)
            for (int w = 0; w < kLnBwdWarps; w++)
                for (int r = ln_bwd_first_row(b, w); r < N; r += ln_bwd_row_stride(grid)) seen[r]++;
        if (grid > kLnBwdMaxBlocks || std::any_of(seen.begin(), seen.end(), [](int s) { return s != 1; }))
            bad_rows++;
    }
    CHECK(bad_rows == 0, "layernorm backward: %d row counts N give a row to no warp or to two", bad_rows);

    const int N = 3000, C = 64;
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> x((size_t)N * C), dy((size_t)N * C), w(C), b(C, 0.0), out((size_t)N * C), mean(N), rstd(N);
    for (auto& v : x) v = nd(rng) + 0.3;
    for (auto& v : dy) v = nd(rng);
    for (auto& v : w) v = 1.0 + 0.2 * nd(rng);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<double> dinp((size_t)N * C, 0.0), dw(C, 0.0), db(C, 0.0);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), N, C);

    const int grid = ln_bwd_blocks(N);
    std::vector<float> partial((size_t)grid * 2 * C);
    for (int blk = 0; blk < grid; blk++) {
        std::vector<float> sm(2 * C);
        for (int warp = 0; warp < kLnBwdWarps; warp++) {
            std::vector<float> dwa(C, 0.f), dba(C, 0.f);
            for (int r = ln_bwd_first_row(blk, warp); r < N; r += ln_bwd_row_stride(grid))
                for (int c = 0; c < C; c++) {
                    const float xhat = ((float)x[(size_t)r * C + c] - (float)mean[r]) * (float)rstd[r];
                    const float g = (float)dy[(size_t)r * C + c];
                    dwa[c] += g * xhat;
                    dba[c] += g;
                }
            for (int c = 0; c < C; c++) {
                sm[c] = warp == 0 ? dwa[c] : sm[c] + dwa[c];
                sm[C + c] = warp == 0 ? dba[c] : sm[C + c] + dba[c];
            }
        }
        std::copy(sm.begin(), sm.end(), partial.begin() + (size_t)blk * 2 * C);
    }
    const std::vector<float> sums = colsum_replay(partial, grid, 2 * C);
    std::vector<double> gdw(sums.begin(), sums.begin() + C), gdb(sums.begin() + C, sums.end());
    const double ew = rel_err(gdw, dw), eb = rel_err(gdb, db);
    CHECK(ew < 1e-5 && eb < 1e-5, "layernorm backward replay: dw rel err %.3e, db rel err %.3e", ew, eb);
}

// ---- bias gradient -----------------------------------------------------------------------
static void test_bias_grad() {
    int bad = 0;
    for (int N : {1, 2, 255, 256, 257, 1000, 8192, 16384, 16385, 65536, 100003}) {
        const int chunks = bias_chunks(N), rows = bias_rows_per_chunk(N);
        std::vector<int> seen(N, 0);
        for (int ch = 0; ch < chunks; ch++) {
            const int r0 = ch * rows, r1 = std::min(N, r0 + rows);
            for (int w = 0; w < kBiasWarps; w++)
                for (int r = r0 + w; r < r1; r += kBiasWarps) seen[r]++;
        }
        if (chunks > kBiasMaxChunks || std::any_of(seen.begin(), seen.end(), [](int s) { return s != 1; })) bad++;
    }
    CHECK(bad == 0, "bias gradient: %d row counts N give a row to no warp or to two", bad);

    // Replay (rows per warp, warps in order, chunks by the column sum) against fp64 sums.
    const int N = 5000, OC = 40;
    std::mt19937_64 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> dout((size_t)N * OC);
    for (auto& v : dout) v = nd(rng);
    const int chunks = bias_chunks(N), rows = bias_rows_per_chunk(N);
    std::vector<float> partial((size_t)chunks * OC);
    for (int ch = 0; ch < chunks; ch++)
        for (int c = 0; c < OC; c++) {
            float sum = 0.f;
            for (int w = 0; w < kBiasWarps; w++) {
                float acc = 0.f;
                for (int r = ch * rows + w; r < std::min(N, ch * rows + rows); r += kBiasWarps)
                    acc += dout[(size_t)r * OC + c];
                sum += acc;
            }
            partial[(size_t)ch * OC + c] = sum;
        }
    const std::vector<float> got = colsum_replay(partial, chunks, OC);
    std::vector<double> g(got.begin(), got.end()), ref(OC, 0.0);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < OC; c++) ref[c] += dout[(size_t)r * OC + c];
    const double e = rel_err(g, ref);
    CHECK(e < 1e-5, "bias gradient replay: rel err %.3e", e);
}

// ---- encoder backward buckets -------------------------------------------------------------
// Replays encoder.cuh (tests/unit/encoder_replay.h: keys, a stable sort,
// chunks of sorted items, segment sums, the split buckets' partials added
// by their owners); against cpu::encoder_backward. Heavy buckets and the
// ownership of every row and slot: tests/unit/test_encoder_buckets.cpp.
static void test_encoder_backward() {
    int bad = 0;
    for (int mk : {0, 1, 2, 3, 255, 256, 50304, 1 << 20, (1 << 20) + 1}) {
        const int b = key_bits(mk);
        const bool fits = (long long)mk < (1LL << b);
        const bool minimal = b == 1 || (long long)mk >= (1LL << (b - 1));
        if (!fits || !minimal) bad++;
    }
    CHECK(bad == 0, "key_bits: %d maximum keys get too few or too many bits", bad);

    const int B = 3, T = 50, C = 24, Vrows = 40;
    std::mt19937_64 rng(11);
    std::uniform_int_distribution<int> tokd(0, 99), hot(0, 4);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<int> tok((size_t)B * T), pos(T);
    for (size_t i = 0; i < tok.size(); i++) tok[i] = i % 2 ? tokd(rng) : hot(rng) + 30;  // hot ids straddle v_begin
    for (int t = 0; t < T; t++) pos[t] = (t * 7 + 3) % T;
    pos[5] = pos[6];  // a repeated position: a bucket of two entries
    std::vector<float> dout((size_t)B * T * C);
    for (auto& v : dout) v = nd(rng);
    for (int v_begin : {0, 32}) {
        const int v_end = v_begin + Vrows;
        std::vector<float> rwte((size_t)Vrows * C), rwpe((size_t)T * C);
        for (auto& v : rwte) v = nd(rng);
        for (auto& v : rwpe) v = nd(rng);
        std::vector<float> gwte = rwte, gwpe = rwpe;
        cpu::encoder_backward(rwte.data(), rwpe.data(), dout.data(), tok.data(), pos.data(), B, T, C, v_begin, v_end);
        std::vector<unsigned> tk(tok.size()), pk(T);
        for (size_t n = 0; n < tok.size(); n++) tk[n] = (unsigned)encoder_key(tok[n], v_begin, v_end);
        for (int t = 0; t < T; t++) pk[t] = (unsigned)pos[t];
        encoder_replay(gwte, dout, tk, C, (unsigned)(v_end - v_begin), 1, 0);
        encoder_replay(gwpe, dout, pk, C, 0xffffffffu, B, T);
        std::vector<double> a(gwte.begin(), gwte.end()), r(rwte.begin(), rwte.end());
        std::vector<double> a2(gwpe.begin(), gwpe.end()), r2(rwpe.begin(), rwpe.end());
        const double e1 = rel_err(a, r), e2 = rel_err(a2, r2);
        CHECK(e1 < 1e-6 && e2 < 1e-6, "encoder backward replay (v_begin %d): dwte %.3e dwpe %.3e", v_begin, e1, e2);
    }
}

// ---- multi-tensor AdamW ---------------------------------------------------------------------
static void test_adam_layout() {
    // adam_head: every pointer aligned after h elements, h minimal, -1 when impossible.
    int bad = 0;
    for (int pm = 0; pm < 8; pm++)        // param (bf16) misalignment in elements
        for (int fm = 0; fm < 4; fm++) {  // fp32 buffers' misalignment in elements
            uintptr_t addr[5] = {4096 + 2 * (uintptr_t)pm, 8192 + 2 * (uintptr_t)pm, 16384 + 4 * (uintptr_t)fm,
                                 32768 + 4 * (uintptr_t)fm, 65536 + 4 * (uintptr_t)fm};
            const int es[5] = {2, 2, 4, 4, 4};
            const int h = adam_head(addr, es, 5);
            int want = -1;
            for (int k = 0; k < kAdamItem && want < 0; k++)
                if ((pm + k) % 8 == 0 && (fm + k) % 4 == 0) want = k;
            if (h != want) bad++;
        }
    CHECK(bad == 0, "adam_head: %d alignment cases wrong", bad);

    // Every element of a piece visited once, vector items 8-aligned after the head.
    bad = 0;
    int cases = 0;
    for (size_t n : {1, 7, 8, 9, 15, 16, 17, 2047, 2048, 2049, 4100, 20000})
        for (int head = 0; head < kAdamItem; head++)
            for (bool vec : {true, false}) {
                if (vec && n < (size_t)head + kAdamItem) continue;  // adam_make_piece makes such pieces scalar
                if (!vec && head) continue;
                std::vector<int> seen(n, 0);
                bool ok = true;
                const size_t blocks = adam_piece_blocks(n, vec, head);
                for (size_t j = 0; j < blocks; j++)
                    for (int tid = 0; tid < kAdamItemsPerBlock; tid++)
                        adam_visit(n, vec, head, j, tid, [&](size_t e, int count, bool vector) {
                            if (vector) ok = ok && count == kAdamItem && (e - head) % kAdamItem == 0;
                            for (int k = 0; k < count; k++)
                                if (e + k < n) seen[e + k]++;
                                else ok = false;
                        });
                cases++;
                if (!ok || std::any_of(seen.begin(), seen.end(), [](int s) { return s != 1; })) bad++;
            }
    CHECK(bad == 0, "adam_visit: %d of %d (n, head, vec) cases visit an element other than once", bad, cases);

    // find_piece over a table of pieces of various block counts.
    std::vector<size_t> first;
    size_t total = 0;
    for (size_t cnt : {1, 3, 1, 1, 10, 2, 7, 1}) {
        first.push_back(total);
        total += cnt;
    }
    bad = 0;
    for (size_t b = 0; b < total; b++) {
        const int i = find_piece(first.data(), (int)first.size(), b);
        const size_t end = i + 1 < (int)first.size() ? first[i + 1] : total;
        if (!(first[i] <= b && b < end)) bad++;
    }
    CHECK(bad == 0, "find_piece: %d blocks mapped to the wrong piece", bad);
}

// adamw_spans (one Backend::adamw_update_multi call) against adamw_span per
// unit (the data-parallel trainer's loop today), on the CPU backend: the same
// bits, and weight decay exactly where the table says.
static void test_adamw_spans_cpu() {
    GPTConfig cfg;
    std::string err;
    parse_model_spec("L=2,C=16,NH=2,V=50,T=8", &cfg, &err);
    TableSplit three;
    three.shards = 3;
    const TensorTable t(cfg, three);  // 3 shards: units padded, odd offsets
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F32));
    const Precision p = be->precision();
    const size_t n = t.total;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> param(n), grad(n), m(n), v(n);
    for (auto& x : param) x = nd(rng);
    for (auto& x : grad) x = nd(rng);
    for (auto& x : m) x = 0.1f * nd(rng);
    for (auto& x : v) x = std::fabs(0.1f * nd(rng));
    OptimConfig o;
    o.weight_decay = 0.1;
    o.lr = 1e-2;
    const AdamArgs a = adam_args(o, 3, 3, 0.7);

    std::vector<float> p1 = param, m1 = m, v1 = v, p2 = param, m2 = m, v2 = v;
    std::vector<UpdateSpan> spans;
    for (int u = 0; u < t.num_units(); u++) {
        const size_t b = t.unit_begin[u];
        UpdateSpan s{b, t.unit_size(u), &p1[b], nullptr, &grad[b], &m1[b], &v1[b]};
        adamw_span(*be, p, t, s, o, a);
        spans.push_back({b, t.unit_size(u), &p2[b], nullptr, &grad[b], &m2[b], &v2[b]});
    }
    adamw_spans(*be, p, t, spans, o, a);
    CHECK(p1 == p2 && m1 == m2 && v1 == v2, "adamw_spans differs from adamw_span per unit");

    // Independent check of the decay mask: an element of a decayed tensor
    // and one of a non-decayed tensor against the formula.
    int checked = 0;
    for (const TensorEntry& e : t.entries) {
        const size_t i = e.offset;
        const double g = grad[i] * a.grad_scale;
        const double mi = a.beta1 * m[i] + (1 - a.beta1) * g, vi = a.beta2 * v[i] + (1 - a.beta2) * g * g;
        const double wd = e.decay ? o.weight_decay : 0.0;
        const double want = param[i] - a.lr * ((mi / a.bias_corr1) / (std::sqrt(vi / a.bias_corr2) + a.eps) + wd * param[i]);
        if (std::fabs(p2[i] - want) > 1e-6 * (1 + std::fabs(want))) {
            std::printf("  %s: got %.9g want %.9g\n", e.name().c_str(), p2[i], want);
            checked = -1000;
        }
        checked++;
    }
    CHECK(checked == (int)t.entries.size(), "adamw_spans: the first element of some tensor is off the formula");
    // Padding between tensors is left alone.
    bool pad_ok = true;
    std::vector<char> covered(n, 0);
    for (const TensorEntry& e : t.entries) std::fill(covered.begin() + e.offset, covered.begin() + e.offset + e.numel, 1);
    for (size_t i = 0; i < n; i++)
        if (!covered[i] && (p2[i] != param[i] || m2[i] != m[i])) pad_ok = false;
    CHECK(pad_ok, "adamw_spans touched padding");
}

// ---- RMSNorm backward ---------------------------------------------------------------
// Replays rmsnorm_backward_vec_kernel's dw order (rows per warp in row order
// by the LayerNorm row assignment, warps in warp order, blocks by the column
// sum) and its dx formula in fp32, against cpu::rmsnorm_backward in fp64.
static void test_rms_backward() {
    const int N = 2500, C = 96;
    const double eps = 1e-6;
    std::mt19937_64 rng(11);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> x((size_t)N * C), dy((size_t)N * C), w(C), out((size_t)N * C), rstd(N);
    for (auto& v : x) v = nd(rng) + 0.2;
    for (auto& v : dy) v = nd(rng);
    for (auto& v : w) v = 1.0 + 0.2 * nd(rng);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    std::vector<double> dinp((size_t)N * C, 0.0), dw(C, 0.0);
    cpu::rmsnorm_backward(dinp.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);

    const int grid = ln_bwd_blocks(N);
    std::vector<float> partial((size_t)grid * C);
    std::vector<double> gdx((size_t)N * C, 0.0);
    for (int blk = 0; blk < grid; blk++) {
        std::vector<float> sm(C);
        for (int warp = 0; warp < kLnBwdWarps; warp++) {
            std::vector<float> dwa(C, 0.f);
            for (int r = ln_bwd_first_row(blk, warp); r < N; r += ln_bwd_row_stride(grid)) {
                const float rs = (float)rstd[r];
                float dot = 0.f;
                for (int c = 0; c < C; c++) {
                    const float xv = (float)x[(size_t)r * C + c], g = (float)dy[(size_t)r * C + c];
                    dot += xv * (float)w[c] * g;
                    dwa[c] += xv * rs * g;
                }
                const float coef = dot / C * rs * rs * rs;
                for (int c = 0; c < C; c++)
                    gdx[(size_t)r * C + c] = rs * (float)w[c] * (float)dy[(size_t)r * C + c] -
                                             (float)x[(size_t)r * C + c] * coef;
            }
            for (int c = 0; c < C; c++) sm[c] = warp == 0 ? dwa[c] : sm[c] + dwa[c];
        }
        std::copy(sm.begin(), sm.end(), partial.begin() + (size_t)blk * C);
    }
    const std::vector<float> sums = colsum_replay(partial, grid, C);
    const std::vector<double> gdw(sums.begin(), sums.end());
    const double ew = rel_err(gdw, dw), ex = rel_err(gdx, dinp);
    CHECK(ew < 1e-5 && ex < 1e-5, "rmsnorm backward replay: dw rel err %.3e, dx rel err %.3e", ew, ex);
}

// ---- RoPE ---------------------------------------------------------------------------
// Every (row, head, channel) of the rotated part is owned by exactly one
// thread, with its pair partner (i, i + half) in the same thread; then the
// kernel's arithmetic (angle in double reduced by rope_reduce, fp32 sin/cos
// and rotation) replayed against cpu::rope in fp64 at positions up to 1e6.
static void test_rope() {
    int bad = 0, cases = 0;
    for (int HS : {2, 8, 16, 40, 64, 128})
        for (int W : {1, 4, 8}) {
            if ((HS / 2) % W) continue;
            for (int heads : {1, 3, 8, 9, 32})
                for (size_t rows : {(size_t)1, (size_t)5, (size_t)33}) {
                    const size_t items = rope_items(rows, heads, HS, W);
                    std::vector<int> seen(rows * heads * HS, 0);
                    bool ok = true;
                    for (size_t t = 0; t < items; t++) {
                        const RopeItem it = rope_item(t, heads, HS, W);
                        ok = ok && it.row < rows && it.h0 < it.h1 && it.h1 <= heads && it.i0 % W == 0 &&
                             it.i0 + W <= HS / 2 && it.h1 - it.h0 <= kRopeHeadsPerThread;
                        if (!ok) break;
                        for (int h = it.h0; h < it.h1; h++)
                            for (int j = 0; j < W; j++) {
                                seen[(it.row * heads + h) * HS + it.i0 + j]++;
                                seen[(it.row * heads + h) * HS + HS / 2 + it.i0 + j]++;
                            }
                    }
                    cases++;
                    if (!ok || std::any_of(seen.begin(), seen.end(), [](int x) { return x != 1; })) bad++;
                }
        }
    CHECK(bad == 0, "rope: %d of %d (HS, W, heads, rows) cases own an element other than once", bad, cases);

    // Angle accuracy: the kernel's fp32 cos/sin of the reduced double angle
    // against double cos/sin of the unreduced angle.
    double worst = 0;
    for (int pos : {0, 1, 7, 1000, 4095, 65535, 131071, 1000000})
        for (int i = 0; i < 64; i++) {
            const double a = pos * std::pow(500000.0, -2.0 * i / 128);
            const float r = (float)rope_reduce(a);
            worst = std::max({worst, std::fabs((double)std::cos(r) - std::cos(a)),
                              std::fabs((double)std::sin(r) - std::sin(a))});
        }
    CHECK(worst < 5e-7, "rope: fp32 sin/cos of the reduced angle off by %.3e (positions to 1e6)", worst);

    // The whole op replayed in fp32 (the CUDA fp32 build) against cpu::rope in fp64.
    const int B = 2, T = 37, heads = 3, HS = 16;
    const size_t stride = heads * HS + 5;
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> x((size_t)B * T * stride);
    for (auto& v : x) v = nd(rng);
    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = 100000 + 977 * t;  // long-context positions
    for (bool inverse : {false, true}) {
        std::vector<double> ref = x;
        cpu::rope(ref.data(), stride, heads, HS, pos.data(), B, T, 10000.0, inverse);
        std::vector<double> got = x;
        const size_t items = rope_items((size_t)B * T, heads, HS, 1);
        for (size_t t = 0; t < items; t++) {
            const RopeItem it = rope_item(t, heads, HS, 1);
            const double f = std::pow(10000.0, -2.0 * it.i0 / HS);
            const float r = (float)rope_reduce((double)pos[it.row % T] * f);
            const float c = std::cos(r), sn = inverse ? -std::sin(r) : std::sin(r);
            for (int h = it.h0; h < it.h1; h++) {
                double* v = got.data() + it.row * stride + (size_t)h * HS;
                const float a = (float)v[it.i0], b = (float)v[it.i0 + HS / 2];
                v[it.i0] = a * c - b * sn;
                v[it.i0 + HS / 2] = b * c + a * sn;
            }
        }
        const double e = rel_err(got, ref);
        CHECK(e < 1e-6, "rope replay (%s): rel err %.3e against the fp64 CPU op", inverse ? "inverse" : "forward", e);
    }
}

int main() {
    test_for_each_pack();
    test_ln_packs();
    test_colsum_order();
    test_ln_backward();
    test_rms_backward();
    test_rope();
    test_bias_grad();
    test_encoder_backward();
    test_adam_layout();
    test_adamw_spans_cpu();
    return check_summary();
}
