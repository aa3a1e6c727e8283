// dev/cuda/attention_cases.h: the attention shapes both attention lab
// programs (attention_forward.cu, attention_backward.cu) validate on: GPT-2's
// packed QKV rows, odd head sizes, padded strides with Tq != Tk, and
// grouped-query attention (Llama: NKV key/value heads shared by groups of
// NH / NKV query heads; 2:1, 3:1 and 4:1 here). The small lists (--small:
// one or two batch rows, one to four heads, T <= 200) take the same paths in
// a fraction of the work, for compute-sanitizer, whose racecheck cannot
// finish the T = 1024 cases. The masked list adds the document mask
// (AttnShape::doc_start, key_pos): causal rows of documents of mixed lengths,
// and ring-attention-like blocks whose keys all precede the queries.
#pragma once
#include <cmath>
#include <vector>

#include "llmc/backend/backend.h"

// Buffers for one case: Q lives in qbuf at offset 0; K and V in kvbuf at
// koff, voff (for the packed layout qbuf == kvbuf: qkv).
struct Case {
    const char* name;
    AttnShape s;
    bool packed;
    size_t qbuf_n, kvbuf_n, koff, voff, out_n;
    std::vector<int> docs, kpos;  // document mask (host): queries' document starts, keys' positions
};

// pad: extra elements per row in the strided (not packed) layout; 4 leaves
// rows unaligned (CUDA-core kernels only), 8 keeps them 16-byte aligned.
// NKV > 0: grouped-query attention with NKV key/value heads (KC = NKV·HS
// channels each for K and V): packed rows are [Q (C) | K (KC) | V (KC)], the
// Llama fused QKV layout; strided k|v rows are 2·KC + pad.
inline Case make_case(const char* name, int B, int NH, int HS, int Tq, int Tk, bool causal, bool packed,
                      size_t pad = 4, int NKV = 0) {
    const size_t C = (size_t)NH * HS, KC = (size_t)(NKV ? NKV : NH) * HS;
    Case c{name, {}, packed, 0, 0, 0, 0, 0};
    if (packed) {
        const size_t row = C + 2 * KC;
        c.s = {B, NH, HS, Tq, Tk, row, row, C, causal, 1.0 / std::sqrt((double)HS)};
        c.qbuf_n = c.kvbuf_n = (size_t)B * Tq * row;
        c.koff = C;
        c.voff = C + KC;
    } else {  // padded strides: q rows of C+pad, k|v rows of 2KC+pad+2 (+pad), out rows of C+pad-2 (+pad)
        const size_t pk = pad == 4 ? 6 : pad, po = pad == 4 ? 2 : pad;
        c.s = {B, NH, HS, Tq, Tk, C + pad, 2 * KC + pk, C + po, causal, 0.7 / std::sqrt((double)HS)};
        c.qbuf_n = (size_t)B * Tq * (C + pad);
        c.kvbuf_n = (size_t)B * Tk * (2 * KC + pk);
        c.koff = 0;
        c.voff = KC;
    }
    c.s.NKV = NKV;
    c.out_n = (size_t)B * Tq * c.s.o_stride;
    return c;
}

inline std::vector<Case> attention_cases() {
    return {
        make_case("gpt2 HS=64 T=256 causal", 2, 4, 64, 256, 256, true, true),
        make_case("HS=16 T=100 causal", 2, 3, 16, 100, 100, true, true),
        make_case("HS=8 T=37 causal", 3, 2, 8, 37, 37, true, true),
        make_case("HS=128 T=96 causal", 1, 2, 128, 96, 96, true, true),
        make_case("HS=40 Tq=70 Tk=130 strided", 2, 3, 40, 70, 130, false, false),
        make_case("HS=200 Tq=33 Tk=65 strided", 1, 2, 200, 33, 65, false, false),
        make_case("HS=16 T=64 non-causal strided", 2, 3, 16, 64, 64, false, false),
        make_case("GQA 2:1 HS=64 T=256 causal", 2, 8, 64, 256, 256, true, true, 4, 4),
        make_case("GQA 4:1 HS=16 T=100 causal", 2, 4, 16, 100, 100, true, true, 4, 1),
        make_case("GQA 3:1 HS=40 Tq=70 Tk=130 strided", 2, 6, 40, 70, 130, false, false, 4, 2),
        make_case("GQA 4:1 HS=128 T=96 causal", 1, 8, 128, 96, 96, true, true, 4, 2),
    };
}

// Shapes for the tensor-core kernels (bf16, HS 64 or 128, 16-byte aligned
// rows): tiles cut by T, non-causal Tq != Tk with padded strides (ring
// attention's blocks), and GPT-2 d12-like sizes (T = 1024).
inline std::vector<Case> attention_tc_cases() {
    return {
        make_case("tc HS=64 T=100 causal", 2, 3, 64, 100, 100, true, true),
        make_case("tc HS=128 T=200 causal", 1, 2, 128, 200, 200, true, true),
        make_case("tc HS=64 Tq=70 Tk=130 strided", 2, 3, 64, 70, 130, false, false, 8),
        make_case("tc HS=128 Tq=33 Tk=200 strided", 2, 2, 128, 33, 200, false, false, 8),
        make_case("tc d12 B=4 NH=12 HS=64 T=1024 causal", 4, 12, 64, 1024, 1024, true, true),
        make_case("tc B=4 NH=6 HS=128 T=1024 causal", 4, 6, 128, 1024, 1024, true, true),
        make_case("tc GQA 2:1 HS=64 T=100 causal", 2, 6, 64, 100, 100, true, true, 4, 3),
        make_case("tc GQA 4:1 HS=128 T=200 causal", 1, 8, 128, 200, 200, true, true, 4, 2),
        make_case("tc GQA 2:1 HS=64 Tq=70 Tk=130 strided", 2, 4, 64, 70, 130, false, false, 8, 2),
        make_case("tc GQA 4:1 HS=128 Tq=33 Tk=200 strided", 2, 4, 128, 33, 200, false, false, 8, 1),
        make_case("tc Llama GQA 4:1 B=1 NH=32 NKV=8 HS=128 T=1024 causal", 1, 32, 128, 1024, 1024, true, true, 4, 8),
    };
}

// --small: the paths of both lists above at a size compute-sanitizer's
// racecheck finishes in seconds. CUDA cores: tiles (32 rows) cut by T, an
// odd head size (8), the widest (200), unaligned padded strides with
// Tq != Tk non-causal, GQA 3:1. Tensor cores: past one query block (128
// rows for HS 64, 64 for HS 128) and over three or more 64-key tiles, so the
// double-buffered K/V tiles are reused; strided non-causal Tq != Tk; GQA
// 2:1 and 4:1 (packed and strided).
inline std::vector<Case> attention_small_cases() {
    return {
        make_case("small HS=64 T=70 causal", 1, 2, 64, 70, 70, true, true),
        make_case("small HS=8 T=37 causal", 2, 2, 8, 37, 37, true, true),
        make_case("small HS=200 Tq=33 Tk=65 strided", 1, 1, 200, 33, 65, false, false),
        make_case("small HS=40 Tq=20 Tk=45 strided", 1, 2, 40, 20, 45, false, false),
        make_case("small GQA 3:1 HS=16 T=50 causal", 1, 3, 16, 50, 50, true, true, 4, 1),
    };
}
inline std::vector<Case> attention_tc_small_cases() {
    return {
        make_case("tc small HS=64 T=200 causal", 1, 2, 64, 200, 200, true, true),
        make_case("tc small HS=128 T=150 causal", 1, 1, 128, 150, 150, true, true),
        make_case("tc small HS=64 Tq=70 Tk=200 strided", 1, 2, 64, 70, 200, false, false, 8),
        make_case("tc small GQA 2:1 HS=64 T=150 causal", 1, 4, 64, 150, 150, true, true, 4, 2),
        make_case("tc small GQA 4:1 HS=128 Tq=33 Tk=200 strided", 1, 4, 128, 33, 200, false, false, 8, 1),
    };
}

// The document mask on a case: documents of 1 to 2·mean - 1 tokens (a fixed
// sequence, different per row) over the positions the case covers. Causal
// cases: query and key t at position t. Non-causal (ring): keys at positions
// 0..Tk/2-1 and Tk/2+7.., queries after them all (so some query tiles see
// none of the keys and are skipped).
inline Case with_documents(Case c, int mean) {
    const AttnShape& s = c.s;
    std::vector<int> qpos(s.Tq);
    int last = s.Tq;
    if (s.causal) {
        for (int i = 0; i < s.Tq; i++) qpos[i] = i;
    } else {
        c.kpos.resize(s.Tk);
        for (int j = 0; j < s.Tk; j++) c.kpos[j] = j < s.Tk / 2 ? j : j + 7;
        for (int i = 0; i < s.Tq; i++) qpos[i] = c.kpos.back() + 4 + i;
        last = qpos.back() + 1;
    }
    c.docs.resize((size_t)s.B * s.Tq);
    unsigned x = 12345;
    for (int b = 0; b < s.B; b++) {
        std::vector<int> start(last);
        int st = 0, left = 0;
        for (int p = 0; p < last; p++) {
            if (left == 0) {
                st = p;
                x = x * 1103515245u + 12345u + (unsigned)b;
                left = 1 + (int)((x >> 8) % (unsigned)(2 * mean - 1));
            }
            start[p] = st;
            left--;
        }
        for (int i = 0; i < s.Tq; i++) c.docs[(size_t)b * s.Tq + i] = start[qpos[i]];
    }
    // c.s keeps null mask pointers: a Case is copied (into the case lists),
    // so a pointer into its own vectors would dangle; host_shape and
    // device_shape point at the copy in use.
    return c;
}

// Cases with the document mask: every kernel but the one-kernel backward
// takes it; the tensor-core ones where the rows are 16-byte aligned.
inline std::vector<Case> attention_masked_cases() {
    return {
        with_documents(make_case("docmask HS=64 T=256 causal", 2, 4, 64, 256, 256, true, true), 20),
        with_documents(make_case("docmask HS=16 T=100 causal short docs", 2, 3, 16, 100, 100, true, true), 3),
        with_documents(make_case("docmask GQA 2:1 HS=64 T=256 causal", 2, 8, 64, 256, 256, true, true, 4, 4), 40),
        with_documents(make_case("docmask ring HS=40 Tq=70 Tk=130 strided", 2, 3, 40, 70, 130, false, false), 25),
        with_documents(make_case("docmask ring GQA 3:1 HS=64 Tq=64 Tk=96", 2, 6, 64, 64, 96, false, false, 4, 2), 30),
        // 16-byte aligned rows: the tensor-core kernels take these too
        with_documents(make_case("docmask ring HS=64 Tq=64 Tk=96 aligned", 2, 4, 64, 64, 96, false, false, 8), 30),
        with_documents(make_case("docmask HS=128 T=192 causal", 1, 2, 128, 192, 192, true, true), 50),
    };
}

// The case's shape with its mask (if any) in the case's host vectors, for
// the CPU op.
inline AttnShape host_shape(const Case& c) {
    AttnShape s = c.s;
    if (!c.docs.empty()) s.doc_start = c.docs.data();
    if (!c.kpos.empty()) s.key_pos = c.kpos.data();
    return s;
}

// The case's shape with its mask in device memory (from dev_ints: host ints
// to a device copy the caller frees) for the GPU run.
template <typename Upload>
inline AttnShape device_shape(const Case& c, Upload dev_ints, std::vector<int*>* owned) {
    AttnShape s = c.s;
    if (!c.docs.empty()) owned->push_back(const_cast<int*>(s.doc_start = dev_ints(c.docs)));
    if (!c.kpos.empty()) owned->push_back(const_cast<int*>(s.key_pos = dev_ints(c.kpos)));
    return s;
}
