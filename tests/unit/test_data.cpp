// tests/unit/test_data.cpp: tests of DataLoader and Tokenizer against independent
// truth, plus a check of make_tiny's output.
//
//   test_data [TINY_DIR]   TINY_DIR holds make_tiny's output (default data/tiny)
//
// The shards are written here by a small helper of its own (not by code under
// test), and the expected rows come from the formula of docs/design.md section
// 2 applied to a token vector kept in memory: row i = stream[i*T .. i*T+T],
// positions modulo the stream length. Last line: "N passed, M failed"; the
// exit code is non-zero when anything failed.
//
// The shard writer and the tally are in tests/unit/shard_files.h.
// Build (one line): g++ -std=c++17 -O2 -Wall -Wextra -I. tests/unit/test_data.cpp llmc/io/dataloader.cpp llmc/io/tokenizer.cpp
//          llmc/base/fileio.cpp -o test_data
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "tests/unit/shard_files.h"

namespace fs = std::filesystem;

namespace {

// The independent truth: rows [first, first+nrows) by the formula.
bool rows_match(DataLoader& dl, const std::vector<uint32_t>& stream, int T, size_t first, int nrows,
                std::string* why) {
    std::vector<int> in((size_t)nrows * T), tg((size_t)nrows * T);
    std::string err;
    if (!dl.read_rows(first, nrows, in.data(), tg.data(), &err)) {
        *why = "read_rows failed: " + err;
        return false;
    }
    const size_t N = stream.size();
    for (size_t r = 0; r < (size_t)nrows; ++r) {
        for (size_t t = 0; t < (size_t)T; ++t) {
            // Reduced first so huge row numbers don't overflow the truth.
            const size_t row = (first % N + r) % N;
            const size_t p = (row * (size_t)T + t) % N;
            const int want_in = (int)stream[p];
            const int want_tg = (int)stream[(p + 1) % N];
            if (in[r * T + t] != want_in || tg[r * T + t] != want_tg) {
                *why = "row " + std::to_string(first + r) + " t " + std::to_string(t) + ": got " +
                       std::to_string(in[r * T + t]) + "/" + std::to_string(tg[r * T + t]) + " want " +
                       std::to_string(want_in) + "/" + std::to_string(want_tg);
                return false;
            }
        }
    }
    return true;
}

void test_stream_formula(Tally& t, const std::string& dir) {
    // Three uint16 shards of odd sizes; T does not divide the total, so rows
    // cross shard boundaries and the wrap at varying offsets.
    const std::vector<size_t> sizes{7, 13, 5};
    std::vector<uint32_t> stream;
    for (size_t s = 0; s < sizes.size(); ++s) {
        std::vector<uint32_t> toks = seq(sizes[s], 1000 * (uint32_t)(s + 1), 3);
        write_u16(dir + "/f_" + std::to_string(s) + ".bin", toks);
        stream.insert(stream.end(), toks.begin(), toks.end());
    }
    DataLoader dl;
    std::string err;
    const int T = 4;
    t.check(dl.open(dir + "/f_*.bin", T, 4000, &err), "open 3 uint16 shards: " + err);
    t.check(dl.total_tokens() == 25, "total_tokens 25, got " + std::to_string(dl.total_tokens()));
    t.check(dl.rows_per_epoch() == 6, "rows_per_epoch 6, got " + std::to_string(dl.rows_per_epoch()));
    t.check(dl.files().size() == 3, "3 files");
    bool all = true;
    std::string why;
    for (size_t first = 0; first < 40 && all; ++first) {
        for (int nrows = 1; nrows <= 9 && all; ++nrows) {
            // nrows = 9: 37 tokens, more than the whole stream: wraps twice.
            if (!rows_match(dl, stream, T, first, nrows, &why)) all = false;
        }
    }
    t.check(all, "rows match the stream formula across boundaries and the wrap: " + why);
    // Far beyond the first epoch, where first_row*T needs the modular product.
    all = rows_match(dl, stream, T, 123456789, 3, &why) &&
          rows_match(dl, stream, T, (size_t)1 << 62, 2, &why) && rows_match(dl, stream, T, ~(size_t)0, 2, &why);
    t.check(all, "rows match for huge row numbers: " + why);
    // read_tokens at the wrap.
    std::vector<int> out(5);
    t.check(dl.read_tokens(23, 5, out.data(), &err) && out[0] == (int)stream[23] && out[1] == (int)stream[24] &&
                out[2] == (int)stream[0] && out[4] == (int)stream[2],
            "read_tokens across the wrap");
    // T = 1 and T equal to the whole stream minus one.
    DataLoader d1;
    all = d1.open(dir + "/f_*.bin", 1, 4000, &err) && rows_match(d1, stream, 1, 0, 30, &why);
    t.check(all, "T=1 rows: " + why + err);
    DataLoader d24;
    all = d24.open(dir + "/f_*.bin", 24, 4000, &err) && rows_match(d24, stream, 24, 0, 3, &why);
    t.check(all, "T=total-1 rows: " + why + err);
    // Zero rows is a no-op; negative is an error.
    t.check(dl.read_rows(5, 0, nullptr, nullptr, &err), "nrows=0 succeeds");
    int dummy[4];
    t.check(!dl.read_rows(0, -1, dummy, dummy, &err), "nrows<0 fails");
    // Moving a loader keeps it usable.
    DataLoader moved(std::move(dl));
    t.check(!dl.is_open() && moved.is_open() && rows_match(moved, stream, T, 3, 4, &why), "move: " + why);
}

void test_uint32_and_mixed(Tally& t, const std::string& dir) {
    // Ids above 65535 need the uint32 format; mix it with a uint16 shard.
    std::vector<uint32_t> a = seq(11, 70000, 1001);   // uint32, up to 80010
    std::vector<uint32_t> b = seq(9, 60000, 7);       // uint16
    std::vector<uint32_t> c = seq(6, 100000, 12345);  // uint32, up to 161725
    write_u32(dir + "/m_a.bin", a);
    write_u16(dir + "/m_b.bin", b);
    write_u32(dir + "/m_c.bin", c);
    std::vector<uint32_t> stream = a;
    stream.insert(stream.end(), b.begin(), b.end());
    stream.insert(stream.end(), c.begin(), c.end());
    DataLoader dl;
    std::string err, why;
    const int T = 5;
    t.check(dl.open(dir + "/m_*.bin", T, 200000, &err), "open uint32+uint16 shards: " + err);
    t.check(dl.total_tokens() == 26, "uint32 total 26");
    bool all = true;
    for (size_t first = 0; first < 12 && all; ++first) all = rows_match(dl, stream, T, first, 4, &why);
    t.check(all, "uint32/mixed rows match: " + why);
    // A uint32-only single-file path (no glob characters).
    DataLoader one;
    all = one.open(dir + "/m_c.bin", 2, 200000, &err) && rows_match(one, c, 2, 0, 5, &why);
    t.check(all, "single uint32 file by path: " + why + err);
}

void test_glob_order(Tally& t, const std::string& dir) {
    // Written in the order c, a, b: the stream must follow names, a b c.
    fs::create_directories(dir + "/order");
    const std::vector<std::string> names{"s_c.bin", "s_a.bin", "s_b.bin"};
    const std::vector<uint32_t> bases{300, 100, 200};
    for (size_t i = 0; i < names.size(); ++i) write_u16(dir + "/order/" + names[i], seq(4, bases[i]));
    DataLoader dl;
    std::string err, why;
    t.check(dl.open(dir + "/order/s_*.bin", 3, 1000, &err), "open glob: " + err);
    const std::vector<std::string>& f = dl.files();
    t.check(f.size() == 3 && contains(f[0], "s_a.bin") && contains(f[1], "s_b.bin") && contains(f[2], "s_c.bin"),
            "files() sorted by name");
    std::vector<uint32_t> stream = seq(4, 100);
    for (uint32_t base : {200u, 300u}) {
        std::vector<uint32_t> s = seq(4, base);
        stream.insert(stream.end(), s.begin(), s.end());
    }
    t.check(rows_match(dl, stream, 3, 0, 5, &why), "stream in name order: " + why);
    // '?' and '[..]' patterns work too.
    DataLoader q;
    t.check(q.open(dir + "/order/s_[ab].bin", 3, 1000, &err) && q.total_tokens() == 8, "bracket glob: " + err);
}

void test_many_shards(Tally& t, const std::string& dir) {
    // More shards than the descriptor cache holds (64): evictions must not
    // change what is read.
    fs::create_directories(dir + "/many");
    std::vector<uint32_t> stream;
    for (int s = 0; s < 150; ++s) {
        char name[64];
        std::snprintf(name, sizeof(name), "/many/x_%03d.bin", s);
        std::vector<uint32_t> toks = seq((size_t)(3 + s % 5), (uint32_t)(s * 10));
        write_u16(dir + name, toks);
        stream.insert(stream.end(), toks.begin(), toks.end());
    }
    // Descriptors of this process, where Linux lets us count them.
    auto open_fds = []() -> long {
        std::error_code ec;
        long n = 0;
        for (fs::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++n;
        return ec ? -1 : n;
    };
    const long fds_before = open_fds();
    DataLoader dl;
    std::string err, why;
    const int T = 7;
    t.check(dl.open(dir + "/many/x_*.bin", T, 2000, &err), "open 150 shards: " + err);
    bool all = rows_match(dl, stream, T, 0, (int)(stream.size() / T) + 3, &why);
    for (size_t first = 0; first < 200 && all; first += 13) all = rows_match(dl, stream, T, first * 7919, 2, &why);
    t.check(all, "150 shards, fd cache evictions: " + why);
    const long fds_during = open_fds();
    if (fds_before >= 0 && fds_during >= 0) {
        t.check(fds_during - fds_before <= 64,
                "at most 64 shard descriptors open, saw " + std::to_string(fds_during - fds_before));
        dl.close();
        t.check(open_fds() == fds_before, "close() releases every descriptor");
    }
}

void test_large_shard(Tally& t, const std::string& dir) {
    // Bigger than one internal read chunk (1 MiB) in both formats.
    std::vector<uint32_t> a(700000), b(300000);
    for (size_t i = 0; i < a.size(); ++i) a[i] = (uint32_t)((i * 2654435761u) % 50257);
    for (size_t i = 0; i < b.size(); ++i) b[i] = (uint32_t)((i * 40503u + 7) % 100000);
    write_u16(dir + "/big_0.bin", a);
    write_u32(dir + "/big_1.bin", b);
    std::vector<uint32_t> stream = a;
    stream.insert(stream.end(), b.begin(), b.end());
    DataLoader dl;
    std::string err, why;
    const int T = 1024;
    t.check(dl.open(dir + "/big_*.bin", T, 100000, &err), "open big shards: " + err);
    bool all = rows_match(dl, stream, T, 0, 1000, &why) && rows_match(dl, stream, T, 600, 400, &why) &&
               rows_match(dl, stream, T, 976, 8, &why);
    t.check(all, "rows over a 1.4 MB shard, its end and the wrap: " + why);
}

// open() must fail, naming the file, and the message must hold every part.
void expect_open_error(Tally& t, const std::string& what, const std::string& pattern, int T, int V,
                       const std::vector<std::string>& parts) {
    DataLoader dl;
    std::string err;
    const bool ok = dl.open(pattern, T, V, &err);
    bool named = !ok && !err.empty() && err.find('\n') == std::string::npos;
    for (const std::string& p : parts) named = named && contains(err, p);
    t.check(named && !dl.is_open(), what + " -> " + (ok ? std::string("open succeeded") : err));
}

void test_open_errors(Tally& t, const std::string& dir) {
    const std::string e = dir + "/err";
    fs::create_directories(e);
    const std::vector<uint32_t> ten = seq(10, 1);

    expect_open_error(t, "missing file", e + "/nope.bin", 4, 100, {"nope.bin"});
    expect_open_error(t, "glob without match", e + "/nothing_*.bin", 4, 100, {"nothing_*.bin"});

    ShardSpec short_header;
    short_header.total_bytes = 100;
    write_raw(e + "/short.bin", ten, short_header);
    expect_open_error(t, "short header", e + "/short.bin", 4, 100, {"short.bin", "100", "1024"});

    ShardSpec magic;
    magic.magic = 12345;
    write_raw(e + "/magic.bin", ten, magic);
    expect_open_error(t, "wrong magic", e + "/magic.bin", 4, 100, {"magic.bin", "12345", "20240520"});

    ShardSpec v16;
    v16.version = 7;
    write_raw(e + "/v16.bin", ten, v16);
    expect_open_error(t, "uint16 magic with version 7", e + "/v16.bin", 4, 100, {"v16.bin", "7", "expected 1"});

    ShardSpec v32;
    v32.magic = 20240801;
    v32.version = 1;
    v32.token_bytes = 4;
    write_raw(e + "/v32.bin", ten, v32);
    expect_open_error(t, "uint32 magic with version 1", e + "/v32.bin", 4, 100, {"v32.bin", "expected 7"});

    ShardSpec trunc;
    trunc.drop_tokens = 1;
    write_raw(e + "/trunc.bin", ten, trunc);
    expect_open_error(t, "truncated payload", e + "/trunc.bin", 4, 100, {"trunc.bin", "truncated", "1042", "1044"});

    ShardSpec half;
    half.extra_bytes = 0;
    half.total_bytes = 1024 + 2 * 10 - 1;  // half a token missing
    write_raw(e + "/half.bin", ten, half);
    expect_open_error(t, "truncated mid-token", e + "/half.bin", 4, 100, {"half.bin", "1043"});

    ShardSpec trail;
    trail.extra_bytes = 3;
    write_raw(e + "/trail.bin", ten, trail);
    expect_open_error(t, "trailing bytes", e + "/trail.bin", 4, 100, {"trail.bin", "trailing", "1047", "1044"});

    ShardSpec zero;
    zero.header_count = 0;
    write_raw(e + "/zero.bin", {}, zero);
    expect_open_error(t, "zero tokens", e + "/zero.bin", 4, 100, {"zero.bin", "zero"});

    ShardSpec neg;
    neg.header_count = 0xFFFFFFFF;  // -1 as int32
    write_raw(e + "/neg.bin", ten, neg);
    expect_open_error(t, "negative count", e + "/neg.bin", 4, 100, {"neg.bin", "-1"});

    // Stream shorter than T+1: 10 tokens are enough for T=9, not for T=10.
    write_u16(e + "/ten.bin", ten);
    expect_open_error(t, "stream shorter than T+1", e + "/ten.bin", 10, 100, {"ten.bin", "10 tokens", "11"});
    {
        DataLoader dl;
        std::string err;
        t.check(dl.open(e + "/ten.bin", 9, 100, &err) && dl.rows_per_epoch() == 1, "T+1 == total is accepted");
    }

    // A bad shard among good ones is found at open, before any read.
    fs::create_directories(e + "/mixed");
    write_u16(e + "/mixed/p_0.bin", ten);
    write_raw(e + "/mixed/p_1.bin", ten, trunc);
    write_u16(e + "/mixed/p_2.bin", ten);
    expect_open_error(t, "bad second shard of a glob", e + "/mixed/p_*.bin", 4, 100, {"p_1.bin"});

    // A directory matched by the glob is not a shard.
    fs::create_directories(e + "/dirs/q_0.bin");
    expect_open_error(t, "directory instead of a file", e + "/dirs/q_*.bin", 4, 100, {"q_0.bin"});

    expect_open_error(t, "T <= 0", e + "/ten.bin", 0, 100, {"ten.bin"});
    expect_open_error(t, "vocab <= 0", e + "/ten.bin", 4, 0, {"ten.bin"});

    // After a failed open the loader is closed and refuses to read.
    DataLoader dl;
    std::string err;
    dl.open(e + "/ten.bin", 4, 100, &err);
    dl.open(e + "/trunc.bin", 4, 100, &err);
    int buf[4];
    t.check(!dl.is_open() && !dl.read_rows(0, 1, buf, buf, &err), "failed re-open leaves the loader closed");
}

void test_bad_token(Tally& t, const std::string& dir) {
    const std::string d = dir + "/badtok";
    fs::create_directories(d);
    write_u16(d + "/b_0.bin", seq(8, 0));
    std::vector<uint32_t> second = seq(12, 10);
    second[5] = 50;  // vocab is 50: id 50 is one too many
    write_u16(d + "/b_1.bin", second);
    DataLoader dl;
    std::string err;
    const int T = 4;
    t.check(dl.open(d + "/b_*.bin", T, 50, &err), "open succeeds (ids are checked on read): " + err);
    std::vector<int> in(4 * T), tg(4 * T);
    // Rows 0..1 cover stream positions 0..8: no bad id yet.
    t.check(dl.read_rows(0, 2, in.data(), tg.data(), &err), "rows before the bad id read fine: " + err);
    // Stream position 13 = offset 5 of b_1.bin; row 3 covers 12..16.
    err.clear();
    const bool ok = dl.read_rows(3, 1, in.data(), tg.data(), &err);
    t.check(!ok && contains(err, "b_1.bin") && contains(err, "offset 5") && contains(err, " 50") &&
                contains(err, "vocab size 50"),
            "bad id names shard, offset, value, vocab: " + err);
    // The target of the last row alone can hit it: row 2 is positions 8..12,
    // 13 is not in it, so it reads; row with span ending at 13 fails.
    t.check(dl.read_rows(2, 1, in.data(), tg.data(), &err), "row ending before the bad id is fine: " + err);
    DataLoader d3;
    t.check(d3.open(d + "/b_*.bin", 13, 50, &err) && !d3.read_rows(0, 1, in.data(), tg.data(), &err) &&
                contains(err, "offset 5"),
            "a bad id that is only a target is caught");
    // check_ids reads the shards up front, split among parts: the part that
    // holds b_1.bin (index 1) finds the id, the other does not.
    DataLoader d4;
    err.clear();
    t.check(d4.open(d + "/b_*.bin", T, 50, &err), "open for check_ids: " + err);
    t.check(!d4.check_ids(0, 1, &err) && contains(err, "b_1.bin") && contains(err, "offset 5") &&
                contains(err, "vocab size 50"),
            "check_ids over every shard finds the bad id: " + err);
    err.clear();
    t.check(d4.check_ids(0, 2, &err) && err.empty(), "check_ids of part 0 of 2 (b_0.bin) is clean: " + err);
    t.check(!d4.check_ids(1, 2, &err) && contains(err, "b_1.bin"), "check_ids of part 1 of 2 finds it: " + err);
    DataLoader d5;
    t.check(d5.open(d + "/b_*.bin", T, 51, &err) && d5.check_ids(0, 1, &err), "with vocab 51 every id is fine");

    // uint32: a huge id (above INT_MAX) is reported as its unsigned value.
    std::vector<uint32_t> big = seq(6, 1);
    big[2] = 0xFFFFFFFFu;
    write_u32(d + "/u32.bin", big);
    DataLoader du;
    err.clear();
    t.check(du.open(d + "/u32.bin", 2, 70000, &err) && !du.read_rows(0, 2, in.data(), tg.data(), &err) &&
                contains(err, "u32.bin") && contains(err, "offset 2") && contains(err, "4294967295") &&
                contains(err, "70000"),
            "uint32 bad id: " + err);
}

void test_tokenizer(Tally& t, const std::string& dir) {
    std::string err;
    const std::string path = dir + "/tok.bin";
    t.check(write_byte_tokenizer(path, &err), "write_byte_tokenizer: " + err);
    // The file format, checked byte by byte.
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto i32 = [&](size_t k) {
        return (int32_t)((uint32_t)(unsigned char)bytes[4 * k] | ((uint32_t)(unsigned char)bytes[4 * k + 1] << 8) |
                         ((uint32_t)(unsigned char)bytes[4 * k + 2] << 16) |
                         ((uint32_t)(unsigned char)bytes[4 * k + 3] << 24));
    };
    t.check(bytes.size() == 1024 + 256 * 2 + 1 + 13, "tokenizer file size " + std::to_string(bytes.size()));
    t.check(bytes.size() >= 1024 && i32(0) == 20240328 && i32(1) == 2 && i32(2) == 257 && i32(3) == 256,
            "tokenizer header");
    t.check(bytes.size() > 1026 && bytes[1024] == 1 && bytes[1025] == 0 && bytes[1024 + 2 * 255 + 1] == (char)255,
            "tokenizer entries");
    bool stray = false;
    for (const auto& entry : fs::directory_iterator(dir)) stray = stray || contains(entry.path().string(), ".tmp");
    t.check(!stray, "no temporary file left");

    Tokenizer tok;
    t.check(tok.load(path, &err), "load byte tokenizer: " + err);
    t.check(tok.vocab_size() == 257 && tok.eot() == 256, "vocab 257, eot 256");
    bool all = true;
    for (int b = 0; b < 256; ++b) all = all && tok.decode(b) == std::string(1, (char)b);
    t.check(all, "decode every byte");
    t.check(tok.decode(256) == "<|endoftext|>", "decode EOT");
    t.check(tok.decode(257) == "<?>" && tok.decode(-1) == "<?>", "decode out of range");
    Tokenizer mem;
    mem.init_bytes();
    all = mem.vocab_size() == 257 && mem.eot() == 256;
    for (int id = -2; id < 260; ++id) all = all && mem.decode(id) == tok.decode(id);
    t.check(all, "init_bytes equals the loaded file");
    Tokenizer empty;
    t.check(empty.decode(0) == "<?>" && empty.vocab_size() == 0, "decode before load");

    // Version 1 (no EOT field) with the GPT-2 vocab: EOT 50256 assumed.
    {
        std::string v1;
        put32(&v1, 20240328);
        put32(&v1, 1);
        put32(&v1, 50257);
        v1.resize(1024, '\0');
        for (int i = 0; i < 50257; ++i) {
            const std::string s = "t" + std::to_string(i);
            v1.push_back((char)s.size());
            v1 += s;
        }
        std::ofstream(dir + "/v1.bin", std::ios::binary).write(v1.data(), (std::streamsize)v1.size());
        Tokenizer g;
        t.check(g.load(dir + "/v1.bin", &err) && g.eot() == 50256 && g.decode(50256) == "<|endoftext|>" &&
                    g.decode(17) == "t17",
                "version 1 tokenizer: " + err);
    }
    // Broken tokenizer files: each names the file; a failed load changes nothing.
    auto expect_bad = [&](const std::string& name, const std::string& data, const std::string& part) {
        std::ofstream(dir + "/" + name, std::ios::binary).write(data.data(), (std::streamsize)data.size());
        Tokenizer k;
        k.init_bytes();
        std::string e;
        const bool ok = k.load(dir + "/" + name, &e);
        t.check(!ok && contains(e, name) && contains(e, part) && k.vocab_size() == 257,
                "bad tokenizer " + name + " -> " + e);
    };
    expect_bad("tok_short.bin", bytes.substr(0, 500), "500");
    std::string bad_magic = bytes;
    bad_magic[0] = 1;
    expect_bad("tok_magic.bin", bad_magic, "magic");
    expect_bad("tok_trunc.bin", bytes.substr(0, bytes.size() - 5), "truncated");
    expect_bad("tok_trail.bin", bytes + "zz", "trailing");
    std::string bad_eot = bytes;
    bad_eot[12] = 1;
    bad_eot[13] = 1;  // EOT 257 (0x101) in a vocab of 257
    expect_bad("tok_eot.bin", bad_eot, "257");
    expect_bad("tok_missing.bin", std::string(), "1024");
    {
        Tokenizer k;
        std::string e;
        t.check(!k.load(dir + "/does_not_exist.bin", &e) && contains(e, "does_not_exist.bin"),
                "missing tokenizer file: " + e);
    }

    // printable: text and complete UTF-8 pass, the rest is escaped.
    t.check(Tokenizer::printable("Hello, world!\n\tok") == "Hello, world!\n\tok", "printable keeps text");
    t.check(Tokenizer::printable(std::string("a\0b", 3)) == "a\\x00b", "printable escapes NUL");
    t.check(Tokenizer::printable("\x1b[31m") == "\\x1b[31m", "printable escapes ESC");
    t.check(Tokenizer::printable("\x7f") == "\\x7f", "printable escapes DEL");
    t.check(Tokenizer::printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
            "printable keeps UTF-8");
    t.check(Tokenizer::printable("x\xc3") == "x\\xc3", "printable escapes a cut UTF-8 lead byte");
    t.check(Tokenizer::printable("\xa9y") == "\\xa9y", "printable escapes a lone continuation byte");
    t.check(Tokenizer::printable("\xc2\x85") == "\\xc2\\x85", "printable escapes C1 controls");
    t.check(Tokenizer::printable("\xc0\xaf") == "\\xc0\\xaf", "printable escapes overlong forms");
    t.check(Tokenizer::printable("\xed\xa0\x80") == "\\xed\\xa0\\x80", "printable escapes surrogates");
}

std::vector<uint16_t> read_u16_payload(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<uint16_t> out;
    for (size_t i = 1024; i + 1 < bytes.size(); i += 2)
        out.push_back((uint16_t)((unsigned char)bytes[i] | ((unsigned char)bytes[i + 1] << 8)));
    return out;
}

void test_tiny(Tally& t, const std::string& tiny) {
    const std::string train = tiny + "/tiny_train_000001.bin";
    const std::string val = tiny + "/tiny_val_000000.bin";
    if (!fs::exists(train) || !fs::exists(val)) {
        t.check(false, "make_tiny output not found in '" + tiny + "' (run: make_tiny " + tiny +
                           ", or pass its directory as the argument)");
        return;
    }
    std::string err;
    for (const std::string& path : {train, val}) {
        DataLoader dl;
        const int T = 64;
        const bool ok = dl.open(path, T, 257, &err);
        t.check(ok, "tiny shard opens: " + err);
        if (!ok) continue;
        // Read everything through the loader: it checks every id < 257.
        const int rows = (int)dl.rows_per_epoch();
        std::vector<int> in((size_t)rows * T), tg((size_t)rows * T);
        t.check(dl.read_rows(0, rows, in.data(), tg.data(), &err), "all tiny rows read with ids < 257: " + err);
        // And independently of the loader.
        std::vector<uint16_t> raw = read_u16_payload(path);
        uint16_t mx = 0;
        size_t eots = 0;
        for (uint16_t v : raw) {
            mx = std::max(mx, v);
            eots += (v == 256);
        }
        t.check(raw.size() == dl.total_tokens() && mx < 257, "raw ids < 257, max " + std::to_string(mx));
        t.check(!raw.empty() && raw[0] == 256 && eots > 50, "documents start with EOT (" + std::to_string(eots) + ")");
        bool ascii = true;
        for (uint16_t v : raw) ascii = ascii && (v == 256 || v == '\n' || (v >= 32 && v < 127));
        t.check(ascii, "tiny text is printable ASCII");
    }
    DataLoader a, b;
    const bool ok = a.open(train, 64, 257, &err) && b.open(val, 64, 257, &err);
    t.check(ok && a.total_tokens() >= 950000 && a.total_tokens() <= 1050000,
            "train is about 1,000,000 tokens: " + std::to_string(a.total_tokens()));
    t.check(ok && b.total_tokens() >= 45000 && b.total_tokens() <= 55000,
            "val is about 50,000 tokens: " + std::to_string(b.total_tokens()));
    if (ok) {
        std::vector<int> x(1000), y(1000);
        t.check(a.read_tokens(0, 1000, x.data(), &err) && b.read_tokens(0, 1000, y.data(), &err) && x != y,
                "val text differs from train text");
    }
    Tokenizer tok, ref;
    ref.init_bytes();
    bool same = tok.load(tiny + "/tokenizer.bin", &err);
    for (int id = 0; same && id < 257; ++id) same = tok.decode(id) == ref.decode(id);
    t.check(same && tok.eot() == 256, "tiny tokenizer.bin is the byte tokenizer: " + err);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string tiny = argc > 1 ? argv[1] : "data/tiny";
    Tally t;
    std::string tmpl = (fs::temp_directory_path() / "test_data_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) {
        std::printf("cannot create a temporary directory\n0 passed, 1 failed\n");
        return 1;
    }
    const std::string dir = buf.data();

    test_stream_formula(t, dir);
    test_uint32_and_mixed(t, dir);
    test_glob_order(t, dir);
    test_many_shards(t, dir);
    test_large_shard(t, dir);
    test_open_errors(t, dir);
    test_bad_token(t, dir);
    test_tokenizer(t, dir);
    test_tiny(t, tiny);

    std::error_code ec;
    fs::remove_all(dir, ec);
    std::printf("%d passed, %d failed\n", t.passed, t.failed);
    return t.failed == 0 ? 0 : 1;
}
