// llmc/backend/cuda/adamw.cuh: the AdamW update (docs/design.md section 2, PyTorch
// semantics: decoupled weight decay applied to the pre-update weight), on
// one span or on many spans in one launch (multi-tensor).
//
// The master weights are fp32; m and v are fp32, or bf16 with
// --optimizer-dtype bf16 (S = bf16: widened on load, the step taken with
// the unrounded fp32 values, stored rounded to nearest or stochastically by
// llmc/base/state_round.h, the CPU backends' very function). With a master copy (the bf16 build)
// the update runs on master and param receives its round-to-nearest bf16
// value; without one (the fp32 build) it runs on param directly. Gradients of
// type G are widened to fp32 and multiplied by grad_scale first (gradient
// clipping folds in there). The double hyperparameters of AdamArgs are
// narrowed to fp32 once on the host; with the step's figures on the device
// (AdamArgs::figures) the clip scale, the learning rate, the bias
// corrections and the step of the rounding key are read there, and a skipped step
// leaves everything as it was. The per-element math is the same in
// every path (adamw_element).
//
// Work is cut into "pieces" (a contiguous run with one weight decay) and
// each piece into items of 8 elements, one item per thread (llmc_idx's
// AdamW layout, kernel_index.h): an item whose pointers are all 16-byte aligned is
// read and written with 16-byte accesses (grad and bf16 param: one each;
// fp32 master, m, v: two each), the few elements before the first aligned
// item and after the last whole one are done one at a time, and a piece
// whose buffers can never be aligned together runs element by element.
// The multi-tensor launch reads the pieces from a small device table; each
// block finds its piece by binary search over the pieces' first blocks.
#pragma once
#include <cstring>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/base/state_round.h"
#include "llmc/backend/cuda/common.cuh"
#include "llmc/backend/cuda/scratch.cuh"

namespace llmc_cuda {

struct AdamF {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
    uint32_t key;    // stochastic rounding's key of the step (m; v's is key ^ kSecondMoment)
    int stochastic;  // bf16 moments: 1 stochastic rounding, 0 nearest
    const double* figures;  // the step's figures on the device (or null): skip, clip scale, lr, bias corrections, step
    unsigned long long seed;  // with figures: key = step_key(seed, figures[step])
};

inline AdamF adam_narrow(const AdamArgs& a) {
    return {(float)a.lr,         (float)a.beta1,      (float)a.beta2,      (float)a.eps,
            (float)a.weight_decay, (float)a.grad_scale, (float)a.bias_corr1, (float)a.bias_corr2,
            a.round_key,         a.stochastic ? 1 : 0, static_cast<const double*>(a.figures),
            (unsigned long long)a.round_seed};
}

// One piece as the kernels see it. first_block: the piece's first block in a
// multi-tensor grid (0 for a single-span launch).
struct AdamPiece {
    void* param;
    float* master;  // null without a master copy
    const void* grad;
    void* m;  // type S of the kernels
    void* v;
    size_t n;
    size_t first_block;
    int head;    // llmc_idx::adam_head of the piece's pointers (vector pieces)
    int vec;     // 1: items of 8 with 16-byte accesses; 0: element by element
    int decay;   // 1: weight decay applies
    int pad_;
};

// The update of one element (in registers): g, m, v, p in and out.
__device__ __forceinline__ void adamw_element(float g_raw, float& m, float& v, float& p, float wd, const AdamF& a) {
    const float g = g_raw * a.grad_scale;
    const float mi = a.beta1 * m + (1.f - a.beta1) * g;
    const float vi = a.beta2 * v + (1.f - a.beta2) * g * g;
    m = mi;
    v = vi;
    const float mhat = mi / a.bc1, vhat = vi / a.bc2;
    p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + wd * p);
}

// The stored value of updated moments: fp32 as they are; bf16 rounded to
// nearest by the store itself, or stochastically here (exact in bf16, so
// the store's rounding keeps it).
template <typename S>
__device__ __forceinline__ void adam_round_moments(float& m, float& v, const AdamF& a) {
    if (sizeof(S) == 2 && a.stochastic) {
        m = state_round::round_moment(m, true, a.key);
        v = state_round::round_moment(v, true, a.key ^ state_round::kSecondMoment);
    }
}

// Block j of piece d: every thread updates its item (and block 0 the
// leftover elements), see llmc_idx::adam_visit.
template <typename P, typename G, typename S>
__device__ __forceinline__ void adamw_piece_block(const AdamPiece& d, size_t j, const AdamF& a_in) {
    AdamF a = a_in;
    if (a.figures) {  // a step that kept its figures on the device: its skip, clip scale, lr, t
        if (a.figures[step_figure::skip] != 0.0) return;
        a.grad_scale = (float)a.figures[step_figure::scale];
        a.lr = (float)a.figures[step_figure::lr];
        a.bc1 = (float)a.figures[step_figure::bias_corr1];
        a.bc2 = (float)a.figures[step_figure::bias_corr2];
        a.key = state_round::step_key(a.seed, (long long)a.figures[step_figure::step]);
    }
    P* param = static_cast<P*>(d.param);
    const G* grad = static_cast<const G*>(d.grad);
    S* dm = static_cast<S*>(d.m);
    S* dv = static_cast<S*>(d.v);
    float* master = d.master;
    const float wd = d.decay ? a.wd : 0.f;
    llmc_idx::adam_visit(d.n, d.vec != 0, d.head, j, threadIdx.x, [&](size_t e, int count, bool vector) {
        constexpr int I = llmc_idx::kAdamItem;
        if (vector) {
            float g[I], m[I], v[I], p[I];
            load_floats<G, I>(g, grad + e);
            load_floats<S, I>(m, dm + e);
            load_floats<S, I>(v, dv + e);
            if (master)
                load_floats<float, I>(p, master + e);
            else
                load_floats<P, I>(p, param + e);
#pragma unroll
            for (int k = 0; k < I; k++) {
                adamw_element(g[k], m[k], v[k], p[k], wd, a);
                adam_round_moments<S>(m[k], v[k], a);
            }
            store_floats<S, I>(dm + e, m);
            store_floats<S, I>(dv + e, v);
            if (master) store_floats<float, I>(master + e, p);
            store_floats<P, I>(param + e, p);
        } else {
            for (int k = 0; k < count; k++) {
                const size_t i = e + k;
                float m = to_float(dm[i]), v = to_float(dv[i]);
                float p = master ? master[i] : to_float(param[i]);
                adamw_element(to_float(grad[i]), m, v, p, wd, a);
                adam_round_moments<S>(m, v, a);
                dm[i] = from_float<S>(m);
                dv[i] = from_float<S>(v);
                if (master) master[i] = p;
                param[i] = from_float<P>(p);
            }
        }
    });
}

// One piece, passed by value (adamw_update: no table to upload).
template <typename P, typename G, typename S>
__global__ void __launch_bounds__(llmc_idx::kAdamItemsPerBlock) adamw_piece_kernel(AdamPiece d, AdamF a) {
    adamw_piece_block<P, G, S>(d, blockIdx.x, a);
}

// Many pieces: block b works on piece find_piece(b), its block b - first_block.
template <typename P, typename G, typename S>
__global__ void __launch_bounds__(llmc_idx::kAdamItemsPerBlock) adamw_multi_kernel(const AdamPiece* pieces,
                                                                                   const size_t* first_blocks,
                                                                                   int npieces, AdamF a) {
    const int i = llmc_idx::find_piece(first_blocks, npieces, blockIdx.x);
    const AdamPiece d = pieces[i];
    adamw_piece_block<P, G, S>(d, blockIdx.x - d.first_block, a);
}

// Host: describe a run of n elements (pointers to its first element).
template <typename P, typename G, typename S>
inline AdamPiece adam_make_piece(void* param, float* master, const void* grad, void* m, void* v, size_t n,
                                 bool decay) {
    AdamPiece d{param, master, grad, m, v, n, 0, 0, 0, decay ? 1 : 0, 0};
    uintptr_t addr[5] = {(uintptr_t)param, (uintptr_t)grad, (uintptr_t)m, (uintptr_t)v, (uintptr_t)master};
    const int esize[5] = {(int)sizeof(P), (int)sizeof(G), (int)sizeof(S), (int)sizeof(S), 4};
    const int h = llmc_idx::adam_head(addr, esize, master ? 5 : 4);
    if (h >= 0 && n >= (size_t)h + llmc_idx::kAdamItem) {
        d.vec = 1;
        d.head = h;
    }
    return d;
}
inline size_t adam_blocks(const AdamPiece& d) { return llmc_idx::adam_piece_blocks(d.n, d.vec != 0, d.head); }

template <typename P, typename G, typename S>
void adamw_update(P* param, float* master, const G* grad, S* m, S* v, size_t n, const AdamArgs& args,
                  cudaStream_t stream) {
    if (n == 0) return;
    const AdamPiece d = adam_make_piece<P, G, S>(param, master, grad, m, v, n, true);
    // args.weight_decay is this span's decay (0 when it has none): decay = 1.
    adamw_piece_kernel<P, G, S><<<(unsigned)adam_blocks(d), llmc_idx::kAdamItemsPerBlock, 0, stream>>>(d,
                                                                                                     adam_narrow(args));
    CUDA_CHECK_LAUNCH();
}

// The backend's single-span entry: parameters and gradients of type E, the
// moments fp32 or bf16 as a.bf16_state says.
template <typename E>
void adamw_update_any(void* param, float* master, const void* grad, void* m, void* v, size_t n, const AdamArgs& a,
                      cudaStream_t stream) {
    if (a.bf16_state)
        adamw_update<E, E, bf16>(static_cast<E*>(param), master, static_cast<const E*>(grad), static_cast<bf16*>(m),
                                 static_cast<bf16*>(v), n, a, stream);
    else
        adamw_update<E, E, float>(static_cast<E*>(param), master, static_cast<const E*>(grad),
                                  static_cast<float*>(m), static_cast<float*>(v), n, a, stream);
}

// The device table of a multi-tensor launch: pieces then first blocks. The
// table is uploaded only when the pieces change (the trainer passes the same
// spans every step), so a steady-state step queues one kernel and nothing
// else. Uploading waits for the copy (a synchronisation on the first step and
// whenever the spans change), so the host array can be reused at once. The
// table's device memory is reserved for the most pieces a step passes
// (reserve(); cuda/scratch.cuh).
inline size_t adam_table_bytes(int pieces) { return (size_t)pieces * (sizeof(AdamPiece) + sizeof(size_t)); }

class AdamMultiTable {
  public:
    template <typename P, typename G, typename S>
    void update(const std::vector<AdamPiece>& pieces_in, const AdamArgs& args, cudaStream_t stream) {
        if (pieces_in.empty()) return;
        if (!same(pieces_in)) upload(pieces_in, stream);
        adamw_multi_kernel<P, G, S><<<(unsigned)total_blocks_, llmc_idx::kAdamItemsPerBlock, 0, stream>>>(
            dev_pieces_, dev_first_, (int)host_.size(), adam_narrow(args));
        CUDA_CHECK_LAUNCH();
    }
    // The backend's multi-tensor entry: the runs as pieces (into the reused
    // host array `pieces`), then one launch with the moments' type from
    // a.bf16_state.
    template <typename E>
    void update_spans(const AdamSpan* spans, int count, const AdamArgs& a, std::vector<AdamPiece>& pieces,
                      cudaStream_t stream) {
        pieces.clear();
        for (int i = 0; i < count; i++) {
            const AdamSpan& s = spans[i];
            if (s.n == 0) continue;
            float* master = static_cast<float*>(s.master);
            pieces.push_back(a.bf16_state
                                 ? adam_make_piece<E, E, bf16>(s.param, master, s.grad, s.m, s.v, s.n, s.decay)
                                 : adam_make_piece<E, E, float>(s.param, master, s.grad, s.m, s.v, s.n, s.decay));
        }
        if (a.bf16_state)
            update<E, E, bf16>(pieces, a, stream);
        else
            update<E, E, float>(pieces, a, stream);
    }
    void reserve(int pieces, cudaStream_t stream) { buf_.reserve(adam_table_bytes(pieces), stream); }
    void release() {
        buf_.release();
        host_.clear();
    }

  private:
    bool same(const std::vector<AdamPiece>& p) const {
        if (p.size() != host_.size()) return false;
        for (size_t i = 0; i < p.size(); i++) {
            const AdamPiece &a = p[i], &b = host_[i];
            if (a.param != b.param || a.master != b.master || a.grad != b.grad || a.m != b.m || a.v != b.v ||
                a.n != b.n || a.decay != b.decay || a.vec != b.vec || a.head != b.head)
                return false;
        }
        return true;
    }
    void upload(const std::vector<AdamPiece>& p, cudaStream_t stream) {
        refuse_table_in_capture(stream, "adamw_update_multi");
        host_ = p;
        std::vector<size_t> first(p.size());
        size_t blocks = 0;
        for (size_t i = 0; i < p.size(); i++) {
            host_[i].first_block = first[i] = blocks;
            blocks += adam_blocks(p[i]);
        }
        total_blocks_ = blocks;
        const size_t pb = p.size() * sizeof(AdamPiece), fb = p.size() * sizeof(size_t);
        void* dev = buf_.get(adam_table_bytes((int)p.size()), stream, "adamw_update_multi (its table of runs)");
        dev_pieces_ = static_cast<AdamPiece*>(dev);
        dev_first_ = reinterpret_cast<size_t*>(static_cast<char*>(dev) + pb);  // pb is a multiple of 8
        CUDA_CHECK(cudaMemcpyAsync(dev_pieces_, host_.data(), pb, cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(dev_first_, first.data(), fb, cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));  // `first` is a local; host_ may change next call
    }

    std::vector<AdamPiece> host_;
    GrowBuffer buf_;
    AdamPiece* dev_pieces_ = nullptr;
    size_t* dev_first_ = nullptr;
    size_t total_blocks_ = 0;
};

}  // namespace llmc_cuda
