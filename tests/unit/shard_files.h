// tests/unit/shard_files.h: what the data tests write their shards with,
// independently of the code under test (llmc/io/dataloader.cpp): the token
// shard format by hand, deliberately broken variants of it, and a tally of
// checks.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

struct Tally {
    int passed = 0;
    int failed = 0;
    void check(bool ok, const std::string& what) {
        if (ok) {
            ++passed;
        } else {
            ++failed;
            std::printf("FAIL: %s\n", what.c_str());
        }
    }
};

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline void put32(std::string* out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out->push_back((char)((v >> (8 * i)) & 0xff));
}

// Options for writing a deliberately broken shard.
struct ShardSpec {
    int32_t magic = 20240520;
    int32_t version = 1;
    int token_bytes = 2;
    int64_t header_count = -1;  // -1: the true count
    int drop_tokens = 0;        // payload tokens left out (truncation)
    int extra_bytes = 0;        // junk appended (trailing bytes)
    int total_bytes = -1;       // >= 0: cut the whole file to this size
};

inline void write_raw(const std::string& path, const std::vector<uint32_t>& tokens, const ShardSpec& spec) {
    std::string data;
    put32(&data, (uint32_t)spec.magic);
    put32(&data, (uint32_t)spec.version);
    put32(&data, (uint32_t)(spec.header_count >= 0 ? spec.header_count : (int64_t)tokens.size()));
    data.resize(1024, '\0');
    const size_t n = tokens.size() - (size_t)spec.drop_tokens;
    for (size_t i = 0; i < n; ++i) {
        for (int b = 0; b < spec.token_bytes; ++b) data.push_back((char)((tokens[i] >> (8 * b)) & 0xff));
    }
    data.append((size_t)spec.extra_bytes, 'x');
    if (spec.total_bytes >= 0) data.resize((size_t)spec.total_bytes);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data.data(), (std::streamsize)data.size());
}

inline void write_u16(const std::string& path, const std::vector<uint32_t>& tokens) { write_raw(path, tokens, ShardSpec{}); }

inline void write_u32(const std::string& path, const std::vector<uint32_t>& tokens) {
    ShardSpec s;
    s.magic = 20240801;
    s.version = 7;
    s.token_bytes = 4;
    write_raw(path, tokens, s);
}

// Tokens base, base+step, ... (distinct and recognisable in failures).
inline std::vector<uint32_t> seq(size_t n, uint32_t base, uint32_t step = 1) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = base + (uint32_t)i * step;
    return v;
}
