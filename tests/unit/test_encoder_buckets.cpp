// tests/unit/test_encoder_buckets.cpp: the CUDA encoder backward's split
// buckets, on the host. Real text has a token that is ~3% of all tokens;
// encoder.cuh cuts the sorted items into chunks of kEncChunk so such a
// bucket is summed by many blocks (pass 1) and its partials added in chunk
// order by one owner (pass 2). This replays both passes with the kernels'
// own index functions (llmc/backend/cuda/kernel_index.h, via
// tests/unit/encoder_replay.h) over key sets built to stress the chunk
// boundaries, and checks: every owned item is summed once, every row that
// collects items has exactly one writer, every partial slot written is read
// once and none is read unwritten, the sums match an fp64 reference, and a
// second replay gives the same bits. Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/backend/cuda/kernel_index.h"
#include "tests/lib/check.h"
#include "tests/unit/encoder_replay.h"

using namespace llmc_idx;

namespace {

// One case: keys (unsorted, sentinel = rows for "not held"), rep rows per item.
void run_case(const std::string& name, const std::vector<unsigned>& keys, int rows, int C, int rep) {
    const int n = (int)keys.size();
    const unsigned sentinel = (unsigned)rows;
    const int stride = n;  // item k, copy r: source row k + r·n
    std::mt19937_64 rng(7 + n);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> src((size_t)n * rep * C), dst0((size_t)rows * C);
    for (auto& v : src) v = nd(rng);
    for (auto& v : dst0) v = nd(rng);

    std::vector<float> got = dst0;
    EncReplayStats st;
    encoder_replay(got, src, keys, C, sentinel, rep, stride, &st);

    // Sorted keys, to know which items are owned and which rows collect.
    std::vector<unsigned> sk = keys;
    std::stable_sort(sk.begin(), sk.end());
    int bad_items = 0;
    for (int i = 0; i < n; i++) bad_items += st.item_uses[i] != (sk[i] == sentinel ? 0 : 1);
    CHECK(bad_items == 0, "%s: %d sorted items summed other than once (sentinels never)", name.c_str(), bad_items);

    std::vector<int> count(rows, 0);
    for (unsigned k : keys)
        if (k != sentinel) count[k]++;
    int bad_rows = 0;
    for (int r = 0; r < rows; r++) bad_rows += st.row_writes[r] != (count[r] ? 1 : 0);
    CHECK(bad_rows == 0, "%s: %d rows written other than once (or written without items)", name.c_str(), bad_rows);

    int bad_slots = 0;
    for (size_t s = 0; s < st.slot_writes.size(); s++)
        bad_slots += st.slot_writes[s] > 1 || st.slot_reads[s] != st.slot_writes[s];
    CHECK(bad_slots == 0, "%s: %d partial slots written twice, read unwritten or left unread", name.c_str(), bad_slots);
    CHECK(st.walk_mismatch == 0, "%s: %d owners find another bucket end by binary search than by walking chunks",
          name.c_str(), st.walk_mismatch);
    // A bucket longer than a chunk is always split (pass 2 reads slots).
    int longest = 0, reads = 0;
    for (int r = 0; r < rows; r++) longest = std::max(longest, count[r]);
    for (int x : st.slot_reads) reads += x;
    if (longest > kEncChunk) CHECK(reads > 0, "%s: a bucket of %d items was not split", name.c_str(), longest);

    // fp64 reference: each row plus all its items' source rows.
    std::vector<double> ref(dst0.begin(), dst0.end());
    for (int k = 0; k < n; k++) {
        if (keys[k] == sentinel) continue;
        for (int r = 0; r < rep; r++)
            for (int c = 0; c < C; c++) ref[(size_t)keys[k] * C + c] += src[((size_t)k + (size_t)r * stride) * C + c];
    }
    double d = 0, z = 0;
    bool finite = true;
    for (size_t i = 0; i < ref.size(); i++) {
        finite = finite && std::isfinite(got[i]);
        d += (got[i] - ref[i]) * (got[i] - ref[i]);
        z += ref[i] * ref[i];
    }
    const double err = std::sqrt(d / (z > 0 ? z : 1));
    CHECK(finite && err < 1e-6, "%s: rel err %.3e against fp64 (finite %d)", name.c_str(), err, (int)finite);

    std::vector<float> again = dst0;
    encoder_replay(again, src, keys, C, sentinel, rep, stride);
    CHECK(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0, "%s: second replay differs",
          name.c_str());
}

// Keys in random order from a list of (key, count) buckets.
std::vector<unsigned> from_buckets(const std::vector<std::pair<unsigned, int>>& b, uint64_t seed) {
    std::vector<unsigned> k;
    for (const auto& p : b) k.insert(k.end(), (size_t)p.second, p.first);
    std::mt19937_64 rng(seed);
    std::shuffle(k.begin(), k.end(), rng);
    return k;
}

}  // namespace

int main() {
    const int S = kEncChunk;
    // Chunk bookkeeping on small sorted arrays.
    {
        std::vector<unsigned> k(3 * S, 5);  // one bucket over three whole chunks
        CHECK(enc_chunks(3 * S) == 3 && enc_chunks(3 * S + 1) == 4 && enc_chunks(1) == 1 && enc_chunks(0) == 0,
              "enc_chunks counts chunks of %d items", S);
        CHECK(!enc_joins_prev(k.data(), 3 * S, 0) && enc_joins_prev(k.data(), 3 * S, 1) && enc_joins_next(k.data(), 3 * S, 1) &&
                  !enc_joins_next(k.data(), 3 * S, 2),
              "joins: a bucket over three chunks joins its neighbours and nothing past the end");
        CHECK(enc_owner(k.data(), 3 * S, 0) && !enc_owner(k.data(), 3 * S, 1) && enc_continues(k.data(), 3 * S, 1) &&
                  !enc_continues(k.data(), 3 * S, 2),
              "owner: the chunk where the bucket begins; it runs on through the whole middle chunk");
        CHECK(enc_segment_dest(k.data(), 3 * S, 0, 0, S) == kEncTail && enc_segment_dest(k.data(), 3 * S, 1, S, 2 * S) == kEncHead &&
                  enc_segment_dest(k.data(), 3 * S, 2, 2 * S, 3 * S) == kEncHead,
              "segment slots: tail where the bucket begins, heads after");
        std::vector<unsigned> m(2 * S, 1);
        for (int i = S; i < 2 * S; i++) m[i] = 2;  // two buckets meeting exactly at a chunk boundary
        CHECK(enc_segment_dest(m.data(), 2 * S, 0, 0, S) == kEncDirect && enc_segment_dest(m.data(), 2 * S, 1, S, 2 * S) == kEncDirect &&
                  !enc_owner(m.data(), 2 * S, 0),
              "buckets that end at a chunk boundary are added directly");
        CHECK(enc_segment_start(k.data(), 0) && !enc_segment_start(k.data(), 1) && enc_segment_start(k.data(), S) &&
                  enc_segment_start(m.data(), S) && !enc_segment_start(m.data(), S + 1),
              "segments start at bucket starts and at chunk starts inside a bucket");
        CHECK(enc_bucket_end(k.data(), 3 * S, 0) == 3 * S && enc_bucket_end(m.data(), 2 * S, 5) == S &&
                  enc_bucket_end(m.data(), 2 * S, S) == 2 * S,
              "bucket ends by binary search");
    }
    const int C = 12;
    // A token that is 3% of 4096 items (the case the split is for), among a
    // spread of ordinary ones.
    {
        std::vector<std::pair<unsigned, int>> b{{17, 123}};
        int left = 4096 - 123;
        for (unsigned r = 0; left > 0; r = (r + 37) % 300) {
            if (r == 17) continue;
            const int c = std::min(left, 1 + (int)(r % 5));
            b.push_back({r, c});
            left -= c;
        }
        run_case("3% token", from_buckets(b, 1), 300, C, 1);
    }
    // One token 40% of the items: a bucket over many whole chunks.
    run_case("40% token", from_buckets({{3, 1638}, {0, 1000}, {9, 1458}}, 2), 10, C, 1);
    // Every item the same key; exact multiples of the chunk; one past; fewer
    // than a chunk.
    run_case("one key, 4 chunks", std::vector<unsigned>(4 * S, 2), 4, C, 1);
    run_case("one key, 4 chunks + 1", std::vector<unsigned>(4 * S + 1, 2), 4, C, 1);
    run_case("one key, half a chunk", std::vector<unsigned>(S / 2, 0), 1, C, 1);
    // Buckets exactly a chunk long and aligned, then one straddling two
    // boundaries, then single items.
    run_case("aligned buckets", from_buckets({{0, S}, {1, S}, {2, 2 * S + 3}, {3, 1}, {4, 1}, {5, S - 4}}, 3), 6, C, 1);
    // Vocabulary-parallel: a third of the tokens belong to another rank (the
    // sentinel bucket sorts last, over several chunks), with a long owned
    // bucket ending right where the sentinels begin.
    run_case("sentinels", from_buckets({{7, 300}, {2, 2 * S}, {8, 2 * S - 300 % S}, {9, 500}}, 4), 9, C, 1);
    // Position buckets: each item stands for B source rows.
    run_case("positions, rep 4", from_buckets({{0, 3}, {1, 1}, {2, 2 * S + 5}, {3, 7}}, 5), 4, C, 4);
    // Random heavy-tailed keys at several sizes.
    for (int n : {1, 63, 64, 65, 1000, 8192}) {
        std::mt19937_64 rng(100 + n);
        std::geometric_distribution<int> g(0.05);
        std::vector<unsigned> k(n);
        for (auto& v : k) v = (unsigned)std::min(g(rng), 199);
        run_case("geometric n=" + std::to_string(n), k, 200, C, 1);
    }
    return check_summary();
}
