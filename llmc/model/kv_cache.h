// llmc/model/kv_cache.h: the keys and values of every layer for the
// positions of one sequence seen so far, and the small buffers of a forward
// over a few new tokens (GPT::decode, decode.cpp: text generation).
//
// Generating token t+1 needs the attention of token t against the keys and
// values of positions 0..t of every layer. Those of 0..t-1 do not change
// once computed (causal attention: a position never sees later ones), so
// they are kept here and each new token costs one forward of one row
// instead of one of t+1 rows. Layer l's cache is `capacity` rows of
// [K (NKV·HS) | V (NKV·HS)], the layout of the K and V part of a QKV row,
// so a block copies its new rows in with one copy2d and the attention reads
// K and V in place with a row stride of 2·NKV·HS (AttnShape's kv_stride).
#pragma once
#include <cstddef>
#include <vector>

#include "llmc/model/gpt.h"

struct KVCache {
    // Room for `capacity` positions and forwards of up to `rows` new tokens
    // at once (the prompt's prefill), in the model's activation type on its
    // backend. The model must be whole (one process, no parallel mode).
    KVCache(GPT& model, int capacity, int rows);
    ~KVCache();
    KVCache(const KVCache&) = delete;
    KVCache& operator=(const KVCache&) = delete;

    int len = 0;       // positions cached (the next token's position)
    int capacity = 0;  // positions the cache holds at most (<= the model's maxT)
    int rows = 0;      // most new tokens of one decode
    size_t bytes = 0;  // backend memory held (the cache and the row buffers)

    // backend memory, all owned here
    void* kv = nullptr;     // [L, capacity, 2·NKV·HS] act: keys | values
    int* tokens = nullptr;  // [rows] the new tokens' ids
    int* pos = nullptr;     // [rows] their positions len..len+n-1
    void *x = nullptr, *x2 = nullptr;  // [rows, C] the residual stream, before and after attention
    void* ln = nullptr;     // [rows, C] a norm's output
    void *mean = nullptr, *rstd = nullptr;  // [rows] stat
    void* qkv = nullptr;    // [rows, (NH + 2·NKV)·HS]
    void* atty = nullptr;   // [rows, NH·HS]
    void* lse = nullptr;    // [NH, rows] stat
    void* proj = nullptr;   // [rows, C] an output projection
    void *fch = nullptr, *h = nullptr;  // [rows, F or 2F], [rows, F]: the MLP's hidden rows (Mixtral: rows·K of them)
    void* logits = nullptr; // [Vp] act: the last new token's
    // Mixtral's MoE block (null otherwise): router logits [rows, E] act,
    // probabilities [rows, E] stat, weights [rows, K] act, the routing's
    // ints (topi [rows, K], offsets [E + 1], perm and inv [rows·K]), the
    // experts' grouped input and output rows [rows·K, C] act; and the
    // offsets read back.
    void *moe_logits = nullptr, *moe_probs = nullptr, *moe_topw = nullptr;
    int *moe_topi = nullptr, *moe_offsets = nullptr, *moe_perm = nullptr, *moe_inv = nullptr;
    void *moe_xg = nullptr, *moe_yg = nullptr;
    std::vector<int> moe_offsets_host;

  private:
    Backend* be_;
    void* take(size_t count, DType t);
    void* owned_[32] = {};
    int n_owned_ = 0;
};
