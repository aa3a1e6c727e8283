// llmc/backend/attn_shape.h: the shape of one attention call (AttnShape),
// which the backends' attention ops take (backend.h): batch, heads, head
// size, the query and key blocks, their strides in memory, grouped-query
// heads and the document mask.
#pragma once
#include <cstddef>

// Shape of one attention call over a block of queries and a block of keys.
// Element (b, t, h, d) of q lives at q[b*qb() + t*q_stride + h*HS + d];
// likewise k, v with kb(), kv_stride and Tk (over kv_heads() heads); out
// and dout with ob() and o_stride. lse (type stat) holds the log-sum-exp of each query row's scaled
// scores at lse[b*lb() + h*lh() + t]. The batch strides default to dense
// blocks (Tq*q_stride, ...; lse [B, NH, Tq]); ring attention sets them to
// address half of a sequence's rows in place.
struct AttnShape {
    int B, NH, HS;
    int Tq, Tk;
    size_t q_stride, kv_stride, o_stride;
    bool causal;   // key j visible to query i only when j <= i (Tq == Tk)
    double scale;  // usually 1/sqrt(HS); double so fp64 runs are exact
    size_t q_bstride = 0, kv_bstride = 0, o_bstride = 0, lse_bstride = 0, lse_hstride = 0;  // 0: dense
    // Grouped-query attention: k and v hold NKV heads (0: NH), and query
    // head h reads key/value head h / (NH / NKV); dk and dv sum over the
    // query heads of their group.
    int NKV = 0;
    // Document masking (docs/attention.md): with doc_start set (int32,
    // backend memory), query t of row b sees key s only when
    // doc_start[b*db() + t] <= kpos(s), on top of the causal rule; doc_start
    // is the global position of the first token of the query's document.
    // key_pos (int32, backend memory, null: key s is at position s) gives
    // the global position of each key, increasing (ring attention's blocks).
    // Positions increase along the keys, so each query tile sees one range
    // of keys and a tile whose keys are all before its documents is skipped.
    const int* doc_start = nullptr;
    const int* key_pos = nullptr;
    size_t doc_bstride = 0;  // 0: Tq
    size_t db() const { return doc_bstride ? doc_bstride : (size_t)Tq; }
    int kv_heads() const { return NKV ? NKV : NH; }
    int kv_head(int h) const { return NKV ? h / (NH / NKV) : h; }
    size_t qb() const { return q_bstride ? q_bstride : (size_t)Tq * q_stride; }
    size_t kb() const { return kv_bstride ? kv_bstride : (size_t)Tk * kv_stride; }
    size_t ob() const { return o_bstride ? o_bstride : (size_t)Tq * o_stride; }
    size_t lh() const { return lse_hstride ? lse_hstride : (size_t)Tq; }
    size_t lb() const { return lse_bstride ? lse_bstride : (size_t)NH * lh(); }
};
