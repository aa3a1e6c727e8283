// llmc/io/dataloader.cpp: DataLoader: shard discovery and header validation,
// the stream-position arithmetic of rows, and on-demand reads with pread.
#include "llmc/io/dataloader.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/io/checksum.h"

namespace {

constexpr int32_t kMagicU16 = 20240520;
constexpr int32_t kVersionU16 = 1;
constexpr int32_t kMagicU32 = 20240801;
constexpr int32_t kVersionU32 = 7;
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * 4;

// Decoded byte by byte so the file format stays little-endian whatever the
// host is.
uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Reads exactly n bytes at offset, retrying short reads and EINTR. A short
// file here means it changed since open() validated its size.
bool pread_full(int fd, unsigned char* buf, size_t n, size_t offset, const std::string& path,
                std::string* err) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = ::pread(fd, buf + done, n - done, (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *err = "data shard " + quoted(path) + ": read failed at byte " +
                   std::to_string(offset + done) + ": " + std::strerror(errno);
            return false;
        }
        if (r == 0) {
            *err = "data shard " + quoted(path) + ": unexpected end of file at byte " +
                   std::to_string(offset + done) + " (was the file changed after open?)";
            return false;
        }
        done += (size_t)r;
    }
    return true;
}

// (a * b) mod m without overflow: the direct product when it fits, else
// double-and-add. Row numbers can be anything the trainer asks for.
size_t mulmod(size_t a, size_t b, size_t m) {
    a %= m;
    b %= m;
    if (a == 0 || b <= std::numeric_limits<size_t>::max() / a) return (a * b) % m;
    size_t result = 0;
    while (b > 0) {
        if (b & 1) result = (result >= m - a) ? result - (m - a) : result + a;
        a = (a >= m - a) ? a - (m - a) : a + a;
        b >>= 1;
    }
    return result;
}

}  // namespace

DataLoader::~DataLoader() { close(); }

DataLoader::DataLoader(DataLoader&& other) noexcept { *this = std::move(other); }

DataLoader& DataLoader::operator=(DataLoader&& other) noexcept {
    if (this != &other) {
        close();
        shards_ = std::move(other.shards_);
        files_ = std::move(other.files_);
        total_tokens_ = other.total_tokens_;
        T_ = other.T_;
        vocab_size_ = other.vocab_size_;
        doc_start_ = other.doc_start_;
        doc_end_ = other.doc_end_;
        open_fds_ = other.open_fds_;
        use_clock_ = other.use_clock_;
        // The descriptors now belong to this object; leave other empty.
        other.shards_.clear();
        other.files_.clear();
        other.total_tokens_ = 0;
        other.T_ = 0;
        other.vocab_size_ = 0;
        other.open_fds_ = 0;
    }
    return *this;
}

void DataLoader::close_fd(Shard& s) {
    if (s.fd >= 0) {
        ::close(s.fd);
        s.fd = -1;
        --open_fds_;
    }
}

void DataLoader::close() {
    for (Shard& s : shards_) close_fd(s);
    shards_.clear();
    files_.clear();
    total_tokens_ = 0;
    doc_start_ = doc_end_ = -1;
    T_ = 0;
    vocab_size_ = 0;
    open_fds_ = 0;
    bytes_.clear();
    span_.clear();
}

bool DataLoader::ensure_open(size_t idx, std::string* err) {
    Shard& s = shards_[idx];
    s.last_use = ++use_clock_;
    if (s.fd >= 0) return true;
    if (open_fds_ >= kMaxOpenFds) {
        size_t victim = shards_.size();
        for (size_t i = 0; i < shards_.size(); ++i) {
            if (i == idx || shards_[i].fd < 0) continue;
            if (victim == shards_.size() || shards_[i].last_use < shards_[victim].last_use) victim = i;
        }
        if (victim < shards_.size()) close_fd(shards_[victim]);
    }
    int fd;
    do {
        fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        *err = "data shard " + quoted(s.path) + ": cannot open: " + std::strerror(errno);
        return false;
    }
    s.fd = fd;
    ++open_fds_;
    return true;
}

bool DataLoader::open(const std::string& pattern, int T, int vocab_size, std::string* err) {
    close();
    if (pattern.empty()) {
        *err = "data: empty file pattern";
        return false;
    }
    if (T <= 0) {
        *err = "data " + quoted(pattern) + ": sequence length T must be positive, got " + std::to_string(T);
        return false;
    }
    if (vocab_size <= 0) {
        *err = "data " + quoted(pattern) + ": vocab size must be positive, got " + std::to_string(vocab_size);
        return false;
    }

    // Discover the files. glob(3) also answers for a plain path that exists.
    std::vector<std::string> paths;
    {
        glob_t g;
        std::memset(&g, 0, sizeof(g));
        int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
        if (rc == 0) {
            for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
        }
        globfree(&g);
        if (rc == GLOB_NOMATCH) {
            if (has_glob_chars(pattern)) {
                *err = "data: no file matches " + quoted(pattern);
            } else {
                struct stat st;
                int e = (::stat(pattern.c_str(), &st) == 0) ? 0 : errno;
                *err = "data shard " + quoted(pattern) + ": cannot open: " +
                       (e ? std::strerror(e) : "not found");
            }
            return false;
        }
        if (rc != 0) {
            *err = "data: glob failed for " + quoted(pattern) +
                   (rc == GLOB_NOSPACE ? " (out of memory)" : " (read error)");
            return false;
        }
    }
    // Byte order, not the locale's collation, so every machine and every rank
    // sees the same stream.
    std::sort(paths.begin(), paths.end());

    std::vector<Shard> shards;
    size_t total = 0;
    int first_doc_start = -1, first_doc_end = -1;
    bool ok = true;
    for (const std::string& path : paths) {
        const std::string where = "data shard " + quoted(path) + ": ";
        int fd;
        do {
            fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
        } while (fd < 0 && errno == EINTR);
        if (fd < 0) {
            *err = where + "cannot open: " + std::strerror(errno);
            ok = false;
            break;
        }
        Shard s;
        s.path = path;
        s.fd = fd;  // owned by s from here on, closed on every error below
        shards.push_back(s);

        struct stat st;
        if (::fstat(fd, &st) != 0) {
            *err = where + "cannot stat: " + std::strerror(errno);
            ok = false;
            break;
        }
        if (!S_ISREG(st.st_mode)) {
            *err = where + "not a regular file";
            ok = false;
            break;
        }
        const size_t size = (size_t)st.st_size;
        if (size < kHeaderBytes) {
            *err = where + "short header: file has " + std::to_string(size) + " bytes, a header needs " +
                   std::to_string(kHeaderBytes);
            ok = false;
            break;
        }
        unsigned char header[kHeaderBytes];
        if (!pread_full(fd, header, kHeaderBytes, 0, path, err)) {
            ok = false;
            break;
        }
        const int32_t magic = (int32_t)le32(header);
        const int32_t version = (int32_t)le32(header + 4);
        const int32_t count = (int32_t)le32(header + 8);
        size_t token_bytes = 0;
        int32_t want_version = 0;
        if (magic == kMagicU16) {
            token_bytes = 2;
            want_version = kVersionU16;
        } else if (magic == kMagicU32) {
            token_bytes = 4;
            want_version = kVersionU32;
        } else {
            *err = where + "bad magic " + std::to_string(magic) + " (expected " + std::to_string(kMagicU16) +
                   " for uint16 tokens or " + std::to_string(kMagicU32) + " for uint32 tokens)";
            ok = false;
            break;
        }
        if (version != want_version) {
            *err = where + "wrong version " + std::to_string(version) + " for magic " + std::to_string(magic) +
                   " (expected " + std::to_string(want_version) + ")";
            ok = false;
            break;
        }
        if (count <= 0) {
            *err = where + (count == 0 ? std::string("zero tokens in header")
                                       : "negative token count " + std::to_string(count) + " in header");
            ok = false;
            break;
        }
        const size_t expected = kHeaderBytes + (size_t)count * token_bytes;
        if (size != expected) {
            *err = where + (size < expected ? "truncated" : "trailing bytes") + ": file has " +
                   std::to_string(size) + " bytes, expected " + std::to_string(expected) + " for " +
                   std::to_string(count) + " tokens of " + std::to_string(token_bytes) + " bytes";
            ok = false;
            break;
        }
        if (shards.size() == 1) {  // the document tokens the first shard records (0: none)
            const int32_t s = (int32_t)le32(header + 12), e = (int32_t)le32(header + 16);
            first_doc_start = s > 0 ? s - 1 : -1;
            first_doc_end = e > 0 ? e - 1 : -1;
        }
        shards.back().num_tokens = (size_t)count;
        shards.back().token_bytes = token_bytes;
        shards.back().stream_start = total;
        total += (size_t)count;
    }
    if (ok && total < (size_t)T + 1) {
        *err = "data " + quoted(pattern) + ": the stream has " + std::to_string(total) + " tokens in " +
               std::to_string(shards.size()) + " file(s) (first " + quoted(shards.front().path) +
               "), need at least T+1 = " + std::to_string((size_t)T + 1);
        ok = false;
    }
    if (!ok) {
        for (Shard& s : shards)
            if (s.fd >= 0) ::close(s.fd);
        return false;
    }

    // Keep the first descriptors open as the cache; close the rest so a
    // thousand shards don't hold a thousand descriptors.
    shards_ = std::move(shards);
    open_fds_ = 0;
    for (Shard& s : shards_) {
        if (s.fd < 0) continue;
        if (open_fds_ < kMaxOpenFds) {
            ++open_fds_;
        } else {
            ::close(s.fd);
            s.fd = -1;
        }
    }
    files_ = std::move(paths);
    total_tokens_ = total;
    doc_start_ = first_doc_start;
    doc_end_ = first_doc_end;
    T_ = T;
    vocab_size_ = vocab_size;
    return true;
}

size_t DataLoader::shard_at(size_t pos) const {
    // Last shard whose stream_start <= pos.
    auto it = std::upper_bound(shards_.begin(), shards_.end(), pos,
                               [](size_t p, const Shard& s) { return p < s.stream_start; });
    return (size_t)(it - shards_.begin()) - 1;
}

bool DataLoader::read_from_shard(size_t idx, size_t offset, size_t n, int* out, std::string* err) {
    if (!ensure_open(idx, err)) return false;
    const Shard& s = shards_[idx];
    const size_t tb = s.token_bytes;
    const size_t per_chunk = kChunkBytes / tb;
    if (bytes_.size() < std::min(n, per_chunk) * tb) bytes_.resize(std::min(n, per_chunk) * tb);
    size_t done = 0;
    while (done < n) {
        const size_t k = std::min(n - done, per_chunk);
        const size_t tok0 = offset + done;  // token offset within the shard
        if (!pread_full(s.fd, bytes_.data(), k * tb, kHeaderBytes + tok0 * tb, s.path, err)) return false;
        const unsigned char* p = bytes_.data();
        for (size_t i = 0; i < k; ++i) {
            const uint32_t v = (tb == 2) ? ((uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8)) : le32(p + 4 * i);
            if (v >= (uint32_t)vocab_size_) {
                *err = "data shard " + quoted(s.path) + ": token offset " + std::to_string(tok0 + i) + " (byte " +
                       std::to_string(kHeaderBytes + (tok0 + i) * tb) + ") has id " + std::to_string(v) +
                       ", not below the vocab size " + std::to_string(vocab_size_);
                return false;
            }
            out[done + i] = (int)v;
        }
        done += k;
    }
    return true;
}

bool DataLoader::read_tokens(size_t pos, size_t n, int* out, std::string* err) {
    if (!is_open()) {
        *err = "data: read before open";
        return false;
    }
    pos %= total_tokens_;
    size_t done = 0;
    while (done < n) {
        const size_t idx = shard_at(pos);
        const Shard& s = shards_[idx];
        const size_t offset = pos - s.stream_start;
        const size_t k = std::min(n - done, s.num_tokens - offset);
        if (!read_from_shard(idx, offset, k, out + done, err)) return false;
        done += k;
        pos += k;
        if (pos == total_tokens_) pos = 0;  // the wrap
    }
    return true;
}

bool DataLoader::read_rows(size_t first_row, int nrows, int* inputs, int* targets, std::string* err) {
    if (!is_open()) {
        *err = "data: read before open";
        return false;
    }
    if (nrows < 0) {
        *err = "data: negative row count " + std::to_string(nrows);
        return false;
    }
    if (nrows == 0) return true;
    const size_t T = (size_t)T_;
    // Rows first_row.. are consecutive, so together they are one span of
    // nrows*T+1 tokens of the stream: read it once, then split.
    const size_t n = (size_t)nrows * T + 1;
    const size_t start = mulmod(first_row, T, total_tokens_);
    span_.resize(n);
    if (!read_tokens(start, n, span_.data(), err)) return false;
    for (size_t r = 0; r < (size_t)nrows; ++r) {
        std::memcpy(inputs + r * T, span_.data() + r * T, T * sizeof(int));
        std::memcpy(targets + r * T, span_.data() + r * T + 1, T * sizeof(int));
    }
    return true;
}

bool DataLoader::check_ids(size_t part, size_t parts, std::string* err) {
    if (!is_open()) {
        *err = "data: check_ids before open";
        return false;
    }
    std::vector<int> tok;
    for (size_t i = part; i < shards_.size(); i += std::max<size_t>(parts, 1)) {
        const Shard& s = shards_[i];
        if (s.token_bytes == 2 && vocab_size_ >= 65536) continue;
        const size_t chunk = kChunkBytes / s.token_bytes;
        tok.resize(std::min(chunk, s.num_tokens));
        for (size_t off = 0; off < s.num_tokens; off += chunk)  // read_from_shard checks each id
            if (!read_from_shard(i, off, std::min(chunk, s.num_tokens - off), tok.data(), err)) return false;
    }
    return true;
}

bool DataLoader::fingerprint(std::string* out, std::string* err) {
    if (!is_open()) {
        *err = "data: fingerprint before open";
        return false;
    }
    uint64_t h = kFnvStart;
    auto mix = [&](uint64_t v) {  // little-endian bytes, as on every host we build for
        h = fnv1a64(h, &v, sizeof v);
    };
    std::vector<int> tok;
    for (const Shard& s : shards_) {
        mix(s.num_tokens);
        mix(s.token_bytes);
        const size_t n = std::min<size_t>(256, s.num_tokens);
        tok.resize(n);
        for (size_t start : {s.stream_start, s.stream_start + s.num_tokens - n}) {
            if (!read_tokens(start, n, tok.data(), err)) return false;
            for (int t : tok) mix((uint64_t)(uint32_t)t);
        }
    }
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", (unsigned long long)h);
    *out = std::to_string(shards_.size()) + " shard(s), " + std::to_string(total_tokens_) + " tokens, digest " + digest;
    return true;
}

long long DataLoader::count_id(int id, size_t n, std::string* err) {
    n = std::min(n, total_tokens_);
    std::vector<int> buf;
    long long c = 0;
    for (size_t at = 0; at < n;) {
        const size_t k = std::min<size_t>(n - at, 1 << 20);
        buf.resize(k);
        if (!read_tokens(at, k, buf.data(), err)) return -1;
        for (int v : buf) c += v == id;
        at += k;
    }
    return c;
}
