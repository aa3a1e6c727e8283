// llmc/parallel/context_parallel_a2a.cpp: all-to-all context parallelism
// (DeepSpeed-Ulysses), the --cp-impl a2a half of llmc/parallel/context_parallel.h.
//
// Every rank holds T/c tokens of each sequence (the same zigzag chunks as
// the ring) for all NHl heads. Before attention one all-to-all turns that
// into all T tokens for NHl/c heads (and NKVl/c key/value heads): rank r
// receives from every rank s the columns of heads [r·NHl/c, (r+1)·NHl/c)
// of s's tokens, and puts s's two chunks at their global places, so the
// sequence is whole and in order. Attention then runs as in one process
// (causal, no ring), and a second all-to-all sends each token's output
// heads back to the rank that holds the token.
// Backward: Q,K,V, the output and its gradient go to the head layout the
// same way (the forward's head-layout copies are not kept: one layer's
// worth of buffers serves every layer), attention's backward runs there,
// and dQ,dK,dV come back. lse stays in the head layout between the two
// ([B, NHl/c, T]: as many elements as the token layout's [B, NHl, T/c]).
// The document mask needs the whole rows' document starts: one all-gather
// of every rank's (B·T/c integers) per attention call.
// Traffic per layer and micro-batch, elements sent by each rank: (c-1)/c
// of N·(W + Cl) forward and of N·(2·W + 2·Cl) backward (N = B·T/c tokens,
// W a QKV row's width, Cl the output's channels), in c-1 messages each way
// per exchange.
//
// Hybrid (--cp-impl hybrid --cp-a2a n): the same exchanges inside a group
// of n consecutive cp ranks (everything above with c = n: the group's n·T/c
// tokens for NHl/n heads), and between them the ring of context_parallel.cpp
// over the c/n ranks holding the same heads in each group. The group holds
// chunks gn..gn+n-1 and 2c-gn-n..2c-1-gn, which the placement above puts in
// global order: super-chunks g and 2c/n-1-g of the sequence cut into 2c/n,
// the ring's zigzag shard of rank g, so the ring runs unchanged on the head
// layout (its key positions, for the document mask, are the ring's own);
// the document starts gathered here are the head layout's queries'.
#include <stdexcept>

#include "llmc/parallel/context_parallel.h"

// Columns of a token-layout row that belong to rank r's heads: for each
// segment, width columns starting at base + r·width.
struct ContextParallel::Seg {
    size_t base, width;
};

void ContextParallel::a2a_alloc() {
    const int c = xc_->size();
    const std::string flag = c == size() ? "flag --cp-impl a2a: --cp " : "flag --cp-a2a: N=";
    if (NHl_ % c != 0)
        throw std::invalid_argument(flag + std::to_string(c) + " does not divide the " + std::to_string(NHl_) +
                                    " attention heads of a rank");
    if (NKVl_ % c != 0)
        throw std::invalid_argument(flag + std::to_string(c) + " does not divide the " +
                                    std::to_string(NKVl_) + " key/value heads of a rank (grouped-query attention; "
                                    "key/value heads are split, not replicated)");
    const size_t N = (size_t)B_ * Tl_, a = dtype_size(prec_.act);
    send_ = alloc(N * W_ * a);
    recv_ = alloc(N * W_ * a);
    fqkv_ = alloc(N * W_ * a);
    fdqkv_ = alloc(N * W_ * a);
    fo_ = alloc(N * Cl_ * a);
    fdo_ = alloc(N * Cl_ * a);
}

// Sends block r of send_ ([N, w] each) to rank r and receives block s of
// recv_ from rank s; this rank's own block is copied.
void ContextParallel::all_to_all(size_t block_elems) {
    const DType act = prec_.act;
    const int c = xc_->size(), me = xc_->rank();
    std::vector<P2POp> ops;
    for (int r = 0; r < c; r++) {
        if (r == me) continue;
        ops.push_back({true, elem_ptr(send_, act, r * block_elems), r, block_elems, 0});
        ops.push_back({false, elem_ptr(recv_, act, r * block_elems), r, block_elems, 0});
    }
    std::vector<CommHandle> hs;
    xc_->start_p2p(ops, act, &hs);
    be_.copy2d(elem_ptr(recv_, act, me * block_elems), block_elems, elem_ptr(send_, act, me * block_elems),
               block_elems, 1, block_elems, act);
    for (CommHandle h : hs) xc_->wait(h);
}

// Token layout [B·Tl, ld] -> head layout [B, T, w] (w: the segments' widths
// summed), the sequence whole and in global order.
void ContextParallel::to_heads(const void* src, size_t ld, const std::vector<Seg>& segs, void* full, int B) {
    const DType act = prec_.act;
    const int c = xc_->size(), ch = Tl_ / 2, T = Tl_ * c;
    const size_t N = (size_t)B * Tl_;
    size_t w = 0;
    for (const Seg& s : segs) w += s.width;
    for (int r = 0; r < c; r++) {
        size_t off = 0;
        for (const Seg& s : segs) {
            be_.copy2d(elem_ptr(send_, act, r * N * w + off), w, elem_ptr(src, act, s.base + r * s.width), ld, N,
                       s.width, act);
            off += s.width;
        }
    }
    all_to_all(N * w);
    // Rank s sent its chunks s and 2c-1-s of every row: one strided copy
    // per chunk puts it in place in all B rows.
    for (int s = 0; s < c; s++)
        for (int half = 0; half < 2; half++) {
            const int chunk = half ? 2 * c - 1 - s : s;
            be_.copy2d(elem_ptr(full, act, (size_t)chunk * ch * w), (size_t)T * w,
                       elem_ptr(recv_, act, (s * N + (size_t)half * ch) * w), (size_t)Tl_ * w, B, (size_t)ch * w, act);
        }
}

// The inverse: head layout [B, T, w] -> each rank's tokens, its columns of
// every rank's heads in dst [B·Tl, ld].
void ContextParallel::to_tokens(const void* full, const std::vector<Seg>& segs, void* dst, size_t ld, int B) {
    const DType act = prec_.act;
    const int c = xc_->size(), ch = Tl_ / 2, T = Tl_ * c;
    const size_t N = (size_t)B * Tl_;
    size_t w = 0;
    for (const Seg& s : segs) w += s.width;
    for (int s = 0; s < c; s++)
        for (int half = 0; half < 2; half++) {
            const int chunk = half ? 2 * c - 1 - s : s;
            be_.copy2d(elem_ptr(send_, act, (s * N + (size_t)half * ch) * w), (size_t)Tl_ * w,
                       elem_ptr(full, act, (size_t)chunk * ch * w), (size_t)T * w, B, (size_t)ch * w, act);
        }
    all_to_all(N * w);
    for (int r = 0; r < xc_->size(); r++) {
        size_t off = 0;
        for (const Seg& s : segs) {
            be_.copy2d(elem_ptr(dst, act, s.base + r * s.width), ld, elem_ptr(recv_, act, r * N * w + off), w, N,
                       s.width, act);
            off += s.width;
        }
    }
}

// This rank's share of the heads in the head layout: attention over the
// whole sequence, with the model's scale.
AttnShape ContextParallel::a2a_shape(int B, double scale) const {
    const int c = xc_->size(), h = NHl_ / c, kvh = NKVl_ / c, T = Tl_ * c;
    const size_t w = (size_t)W_ / c;
    AttnShape s{B, h, HS_, T, T, w, w, (size_t)h * HS_, true, scale};
    s.NKV = kvh;
    return s;
}

std::vector<ContextParallel::Seg> ContextParallel::qkv_segs() const {
    const size_t hq = (size_t)NHl_ / xc_->size() * HS_, hkv = (size_t)NKVl_ / xc_->size() * HS_;
    return {{0, hq}, {(size_t)Cl_, hkv}, {(size_t)Cl_ + Ckv_, hkv}};
}

// The document mask: every rank's document starts gathered, and placed as
// whole rows in global order for the head layout's attention (null without
// the mask).
const int* ContextParallel::whole_docs(const int* docs, int B) {
    if (!docs) return nullptr;
    if (!docs_full_) throw std::logic_error("context parallel: document mask without set_document_mask()");
    const int c = xc_->size(), ch = Tl_ / 2, T = Tl_ * c;
    const size_t N = (size_t)B * Tl_;
    xc_->all_gather(docs, docs_gather_, N, DType::I32);
    for (int r = 0; r < c; r++)
        for (int half = 0; half < 2; half++) {
            const int chunk = half ? 2 * c - 1 - r : r;
            be_.copy2d(docs_full_ + (size_t)chunk * ch, T, docs_gather_ + r * N + (size_t)half * ch, Tl_, B, ch,
                       DType::I32);
        }
    return docs_full_;
}

void ContextParallel::a2a_forward(void* out, void* lse, const void* qkv, int B, double scale, const int* docs) {
    const DType act = prec_.act;
    AttnShape s = a2a_shape(B, scale);
    s.doc_start = whole_docs(docs, B);
    const size_t hq = (size_t)s.NH * HS_, hkv = (size_t)s.NKV * HS_;
    to_heads(qkv, W_, qkv_segs(), fqkv_, B);
    // hybrid: the head layout is a ring rank's shard of the whole sequence
    // (its rows are [Q | K | V] of this rank's heads, as the ring expects).
    if (ring_) ring_->attention_forward(fo_, lse, fqkv_, B, scale, s.doc_start);
    else be_.attention_forward(fo_, lse, fqkv_, elem_ptr(fqkv_, act, hq), elem_ptr(fqkv_, act, hq + hkv), s);
    to_tokens(fo_, {{0, hq}}, out, Cl_, B);
}

void ContextParallel::a2a_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                                   int B, double scale, const int* docs) {
    const DType act = prec_.act;
    AttnShape s = a2a_shape(B, scale);
    s.doc_start = whole_docs(docs, B);
    const size_t hq = (size_t)s.NH * HS_, hkv = (size_t)s.NKV * HS_;
    to_heads(qkv, W_, qkv_segs(), fqkv_, B);
    to_heads(out, Cl_, {{0, hq}}, fo_, B);
    to_heads(dout, Cl_, {{0, hq}}, fdo_, B);
    if (ring_)
        ring_->attention_backward(fdqkv_, fdo_, fqkv_, fo_, lse, B, scale, s.doc_start);
    else
        be_.attention_backward(fdqkv_, elem_ptr(fdqkv_, act, hq), elem_ptr(fdqkv_, act, hq + hkv), fdo_, fqkv_,
                               elem_ptr(fqkv_, act, hq), elem_ptr(fqkv_, act, hq + hkv), fo_, lse, s);
    to_tokens(fdqkv_, qkv_segs(), dqkv, W_, B);
}
