// llmc/parallel/context_parallel.cpp: see context_parallel.h.
#include "llmc/parallel/context_parallel.h"

#include <algorithm>
#include <stdexcept>

void* ContextParallel::alloc(size_t bytes) {
    void* p = be_.alloc(bytes);
    owned_.push_back(p);
    bytes_ += bytes;
    return p;
}

ContextParallel::ContextParallel(Comm& group, Backend& be, int B, int T_local, int NHl, int HS, int NKVl,
                                 Comm* a2a_group, Comm* ring_group)
    : comm_(group), xc_(a2a_group), be_(be), prec_(be.precision()), B_(B), Tl_(T_local), NHl_(NHl), HS_(HS),
      Cl_(NHl * HS), NKVl_(NKVl > 0 ? NKVl : NHl), Ckv_(NKVl_ * HS), W_(Cl_ + 2 * Ckv_),
      a2a_(a2a_group && group.size() > 1) {
    kv_[0] = kv_[1] = dkv_[0] = dkv_[1] = out_acc_ = dqkv_acc_ = nullptr;
    if (group.size() == 1) return;  // no ring: nothing to hold
    if (T_local % 2 != 0) throw std::invalid_argument("context parallel: local sequence must hold two chunks");
    if (a2a_) {
        const int n = xc_->size(), c = group.size();
        // hybrid: the all-to-all over n ranks, then the ring over c/n groups.
        if (n < c && (c % n != 0 || !ring_group || ring_group->size() * n != c))
            throw std::logic_error("context parallel: hybrid needs a ring group of cp/N ranks");
        a2a_alloc();
        if (n < c)
            ring_.reset(new ContextParallel(*ring_group, be, B, T_local * n, NHl / n, HS, NKVl_ / n));
        return;
    }
    const size_t N = (size_t)B * T_local, a = dtype_size(prec_.act), st = dtype_size(prec_.stat);
    for (int i = 0; i < 2; i++) {
        kv_[i] = alloc(N * 2 * Ckv_ * a);
        dkv_[i] = alloc(N * 2 * Ckv_ * st);
    }
    out_acc_ = alloc(N * Cl_ * st);
    dqkv_acc_ = alloc(N * W_ * st);
}

ContextParallel::~ContextParallel() {
    for (void* p : owned_) be_.release(p);
}

std::vector<int> ContextParallel::positions(int T, int c, int rank) {
    if (c == 1) {
        std::vector<int> all(T);
        for (int t = 0; t < T; t++) all[t] = t;
        return all;
    }
    const int chunk = T / (2 * c);
    std::vector<int> pos;
    for (int k : {rank, 2 * c - 1 - rank})
        for (int t = 0; t < chunk; t++) pos.push_back(k * chunk + t);
    return pos;
}

void ContextParallel::shard_rows(const int* full, int nrows, int T, int* local) const {
    if (size() == 1) {
        std::copy(full, full + (size_t)nrows * T, local);
        return;
    }
    const std::vector<int> pos = positions(T, size(), rank());
    const size_t Tl = pos.size();
    for (int r = 0; r < nrows; r++)
        for (size_t t = 0; t < Tl; t++) local[r * Tl + t] = full[(size_t)r * T + pos[t]];
}

void ContextParallel::set_document_mask() {
    if (size() == 1 || !key_pos_.empty() || docs_full_) return;
    if (a2a_) {  // the group's document starts, then its whole rows' in order
        const size_t n = xc_->size();
        docs_gather_ = (int*)alloc((size_t)B_ * Tl_ * n * sizeof(int));
        docs_full_ = (int*)alloc((size_t)B_ * Tl_ * n * sizeof(int));
        if (ring_) ring_->set_document_mask();  // and the ring's key positions
        return;
    }
    for (int j = 0; j < size(); j++) {
        const std::vector<int> pos = positions(Tl_ * size(), size(), j);
        key_pos_.push_back((int*)alloc(pos.size() * sizeof(int)));
        be_.upload(key_pos_.back(), DType::I32, pos.data(), DType::I32, pos.size());
    }
}

ContextParallel::Block ContextParallel::block(int s, int B, double scale, const int* docs) const {
    const int i = rank(), c = size(), j = ((i - s) % c + c) % c, half = Tl_ / 2;
    Block b{};
    AttnShape& a = b.shape;
    a.B = B;
    a.NH = NHl_;
    a.HS = HS_;
    a.q_stride = W_;                 // queries inside the model's QKV rows
    a.kv_stride = 2 * (size_t)Ckv_;  // a travelling block: K then V per token
    a.o_stride = Cl_;
    a.NKV = NKVl_;
    a.scale = scale;
    a.q_bstride = (size_t)Tl_ * a.q_stride;
    a.kv_bstride = (size_t)Tl_ * a.kv_stride;
    a.o_bstride = (size_t)Tl_ * a.o_stride;
    a.lse_hstride = Tl_;
    a.lse_bstride = (size_t)NHl_ * Tl_;
    a.Tq = a.Tk = Tl_;
    a.causal = s == 0;
    if (s > 0 && j < i) a.Tk = half;  // only the block's first chunk is earlier than ours
    if (s > 0 && j > i) {             // only our second chunk is later than the block's
        a.Tq = half;
        b.q_off = (size_t)half * a.q_stride;
        b.o_off = (size_t)half * a.o_stride;
        b.lse_off = half;
    }
    if (docs) {  // the queries' document starts (from the rows they start at) and the block's key positions
        if (key_pos_.empty()) throw std::logic_error("context parallel: document mask without set_document_mask()");
        a.doc_start = docs + b.lse_off;
        a.doc_bstride = Tl_;
        a.key_pos = key_pos_[j];
    }
    return b;
}

void ContextParallel::attention_forward(void* out, void* lse, const void* qkv, int B, double scale, const int* docs) {
    if (a2a_) return a2a_forward(out, lse, qkv, B, scale, docs);
    const DType act = prec_.act, st = prec_.stat;
    const int c = size(), next = (rank() + 1) % c, prev = (rank() + c - 1) % c;
    const size_t N = (size_t)B * Tl_, kvn = N * 2 * Ckv_;
    be_.copy2d(kv_[0], 2 * Ckv_, elem_ptr(qkv, act, Cl_), W_, N, 2 * Ckv_, act);
    int cur = 0;
    for (int s = 0; s < c; s++) {
        CommHandle h = 0;
        if (s + 1 < c) h = comm_.start_send_recv(kv_[cur], next, kv_[1 - cur], prev, kvn, act);
        Block b = block(s, B, scale, docs);
        be_.attention_block_forward(elem_ptr(out_acc_, st, b.o_off), elem_ptr(lse, st, b.lse_off),
                                    elem_ptr(qkv, act, b.q_off), kv_[cur], elem_ptr(kv_[cur], act, Ckv_), b.shape,
                                    s == 0);
        if (s + 1 < c) comm_.wait(h);
        cur = 1 - cur;
    }
    be_.convert(out, act, out_acc_, st, N * Cl_);
}

void ContextParallel::attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                         const void* lse, int B, double scale, const int* docs) {
    if (a2a_) return a2a_backward(dqkv, dout, qkv, out, lse, B, scale, docs);
    const DType act = prec_.act, st = prec_.stat;
    const int c = size(), next = (rank() + 1) % c, prev = (rank() + c - 1) % c;
    const size_t N = (size_t)B * Tl_, kvn = N * 2 * Ckv_;
    be_.zero(dqkv_acc_, N * W_ * dtype_size(st));
    be_.zero(dkv_[0], kvn * dtype_size(st));
    be_.copy2d(kv_[0], 2 * Ckv_, elem_ptr(qkv, act, Cl_), W_, N, 2 * Ckv_, act);
    int cur = 0;
    for (int s = 0; s < c; s++) {
        Block b = block(s, B, scale, docs);
        be_.attention_block_backward(elem_ptr(dqkv_acc_, st, b.q_off), dkv_[cur], elem_ptr(dkv_[cur], st, Ckv_),
                                     elem_ptr(dout, act, b.o_off), elem_ptr(qkv, act, b.q_off), kv_[cur],
                                     elem_ptr(kv_[cur], act, Ckv_), elem_ptr(out, act, b.o_off),
                                     elem_ptr(lse, st, b.lse_off), b.shape);
        // The block and its accumulators move on together; after the last
        // step only the accumulators take the final hop home.
        CommHandle hk = 0;
        if (s + 1 < c) hk = comm_.start_send_recv(kv_[cur], next, kv_[1 - cur], prev, kvn, act);
        CommHandle hd = comm_.start_send_recv(dkv_[cur], next, dkv_[1 - cur], prev, kvn, st);
        if (s + 1 < c) comm_.wait(hk);
        comm_.wait(hd);
        cur = 1 - cur;
    }
    // dkv_[cur] now holds the gradients of this rank's own K and V.
    be_.copy2d(elem_ptr(dqkv_acc_, st, Cl_), W_, dkv_[cur], 2 * Ckv_, N, 2 * Ckv_, st);
    be_.convert(dqkv, act, dqkv_acc_, st, N * W_);
}
