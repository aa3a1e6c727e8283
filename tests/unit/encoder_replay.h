// tests/unit/encoder_replay.h: the CUDA encoder backward's bucket sums
// (llmc/backend/cuda/encoder.cuh) replayed on the host with the kernels' own
// index functions (llmc/backend/cuda/kernel_index.h): the stable sort CUB's radix
// sort gives, pass 1 over chunks of kEncChunk sorted items (each segment
// into its row or a partial slot), pass 2 from each owner chunk. Shared by
// tests/unit/test_kernel_index.cpp and tests/unit/test_encoder_buckets.cpp.
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "llmc/backend/cuda/kernel_index.h"

// What the replay touched, to check ownership: uses of each sorted item by
// pass 1, writes into each destination row (a row has one writer: a direct
// segment or an owner), and writes and reads of each partial slot.
struct EncReplayStats {
    std::vector<int> item_uses, row_writes, slot_writes, slot_reads;
    int walk_mismatch = 0;  // owners whose bucket end and enc_continues disagree
};

// dst[key·C ...] += the rows of src that each key collects: item k (unsorted
// position) stands for rows k + r·rep_stride, r < rep. keys equal to
// sentinel feed nothing.
static void encoder_replay(std::vector<float>& dst, const std::vector<float>& src, const std::vector<unsigned>& keys,
                           int C, unsigned sentinel, int rep, int rep_stride, EncReplayStats* st = nullptr) {
    using namespace llmc_idx;
    const int n = (int)keys.size();
    std::vector<int> vals(n);
    std::iota(vals.begin(), vals.end(), 0);
    std::stable_sort(vals.begin(), vals.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    std::vector<unsigned> sk(n);
    for (int i = 0; i < n; i++) sk[i] = keys[vals[i]];
    const int nch = enc_chunks(n);
    std::vector<float> partial(enc_partial_floats(n, C), NAN);  // an unwritten slot read shows as NaN
    EncReplayStats local;
    EncReplayStats& s = st ? *st : local;
    s.item_uses.assign(n, 0);
    s.row_writes.assign(dst.size() / (size_t)C, 0);
    s.slot_writes.assign(2 * (size_t)nch, 0);
    s.slot_reads.assign(2 * (size_t)nch, 0);
    // Pass 1: a block per segment start.
    for (int a = 0; a < n; a++) {
        const unsigned key = sk[a];
        if (key == sentinel) break;
        if (!enc_segment_start(sk.data(), a)) continue;
        const int k = a / kEncChunk, c1 = std::min(n, (k + 1) * kEncChunk);
        int b = a + 1;
        while (b < c1 && sk[b] == key) b++;
        const int dest = enc_segment_dest(sk.data(), n, k, a, b);
        for (int i = a; i < b; i++) s.item_uses[i]++;
        const size_t slot = 2 * (size_t)k + (dest == kEncHead ? 0 : 1);
        if (dest == kEncDirect) s.row_writes[key]++;
        else s.slot_writes[slot]++;
        for (int c = 0; c < C; c++) {
            float acc = 0.f;
            for (int i = a; i < b; i++)
                for (int r = 0; r < rep; r++) acc += src[((size_t)vals[i] + (size_t)r * rep_stride) * C + c];
            if (dest == kEncDirect) dst[(size_t)key * C + c] += acc;
            else partial[slot * C + c] = acc;
        }
    }
    // Pass 2: the owners, up to the chunk of the bucket's end.
    for (int k = 0; k < nch; k++) {
        if (!enc_owner(sk.data(), n, k)) continue;
        const int last = (k + 1) * kEncChunk - 1;
        const unsigned key = sk[last];
        if (key == sentinel) continue;
        const int end_chunk = (enc_bucket_end(sk.data(), n, last) - 1) / kEncChunk;
        int walk = k + 1;  // the same chunks by enc_continues
        while (enc_continues(sk.data(), n, walk)) walk++;
        if (walk != end_chunk) s.walk_mismatch++;
        s.row_writes[key]++;
        s.slot_reads[2 * (size_t)k + 1]++;
        for (int jc = k + 1; jc <= end_chunk; jc++) s.slot_reads[2 * (size_t)jc]++;
        for (int c = 0; c < C; c++) {
            float acc = partial[(2 * (size_t)k + 1) * C + c];
            for (int jc = k + 1; jc <= end_chunk; jc++) acc += partial[2 * (size_t)jc * C + c];
            dst[(size_t)key * C + c] += acc;
        }
    }
}
