// llmc/tokenizer.cpp: loading and writing llm.c tokenizer files, decoding,
// and escaping of sampled text for the terminal.
#include "tokenizer.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "fileio.h"

namespace {

constexpr int32_t kTokenizerMagic = 20240328;
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * 4;
constexpr int kByteVocab = 257;
constexpr int kByteEot = 256;
constexpr int kGpt2Eot = 50256;  // assumed by version-1 files, which lack the field
constexpr char kEotText[] = "<|endoftext|>";

uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void put_le32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
    p[2] = (unsigned char)((v >> 16) & 0xff);
    p[3] = (unsigned char)((v >> 24) & 0xff);
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

bool read_whole_file(const std::string& path, std::vector<unsigned char>* data, std::string* err) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = "tokenizer " + quoted(path) + ": cannot open: " + std::strerror(errno);
        return false;
    }
    data->clear();
    unsigned char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data->insert(data->end(), buf, buf + n);
    const bool bad = std::ferror(f) != 0;
    std::fclose(f);
    if (bad) {
        *err = "tokenizer " + quoted(path) + ": read error";
        return false;
    }
    return true;
}

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the valid UTF-8 character at s[i] (2..4), or 0 if the bytes there
// are not one. Rejects overlong forms, surrogates and code points > U+10FFFF.
size_t utf8_len(const std::string& s, size_t i) {
    const size_t n = s.size();
    const unsigned char c = (unsigned char)s[i];
    auto at = [&](size_t k) { return (unsigned char)s[i + k]; };
    if (c >= 0xC2 && c <= 0xDF) return (i + 1 < n && is_cont(at(1))) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (i + 2 >= n || !is_cont(at(1)) || !is_cont(at(2))) return 0;
        if (c == 0xE0 && at(1) < 0xA0) return 0;  // overlong
        if (c == 0xED && at(1) > 0x9F) return 0;  // surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (i + 3 >= n || !is_cont(at(1)) || !is_cont(at(2)) || !is_cont(at(3))) return 0;
        if (c == 0xF0 && at(1) < 0x90) return 0;  // overlong
        if (c == 0xF4 && at(1) > 0x8F) return 0;  // above U+10FFFF
        return 4;
    }
    return 0;
}

void append_hex(std::string* out, unsigned char c) {
    const char* digits = "0123456789abcdef";
    out->push_back('\\');
    out->push_back('x');
    out->push_back(digits[c >> 4]);
    out->push_back(digits[c & 15]);
}

}  // namespace

bool Tokenizer::load(const std::string& path, std::string* err) {
    std::vector<unsigned char> data;
    if (!read_whole_file(path, &data, err)) return false;
    const std::string where = "tokenizer " + quoted(path) + ": ";
    if (data.size() < kHeaderBytes) {
        *err = where + "short header: file has " + std::to_string(data.size()) + " bytes, a header needs " +
               std::to_string(kHeaderBytes);
        return false;
    }
    const int32_t magic = (int32_t)le32(&data[0]);
    const int32_t version = (int32_t)le32(&data[4]);
    const int32_t vocab = (int32_t)le32(&data[8]);
    if (magic != kTokenizerMagic) {
        *err = where + "bad magic " + std::to_string(magic) + " (expected " + std::to_string(kTokenizerMagic) + ")";
        return false;
    }
    if (version != 1 && version != 2) {
        *err = where + "unsupported version " + std::to_string(version) + " (expected 1 or 2)";
        return false;
    }
    if (vocab <= 0) {
        *err = where + "bad vocab size " + std::to_string(vocab);
        return false;
    }
    int32_t eot = kGpt2Eot;
    if (version == 2) eot = (int32_t)le32(&data[12]);
    if (eot < 0 || eot >= vocab) {
        *err = where + "EOT id " + std::to_string(eot) + (version == 1 ? " (assumed by version 1)" : "") +
               " is outside the vocab of " + std::to_string(vocab);
        return false;
    }
    std::vector<std::string> tokens;
    tokens.reserve((size_t)vocab);
    size_t p = kHeaderBytes;
    for (int32_t i = 0; i < vocab; ++i) {
        if (p >= data.size()) {
            *err = where + "truncated: ends at token " + std::to_string(i) + " of " + std::to_string(vocab);
            return false;
        }
        const size_t len = data[p++];
        if (len == 0) {
            *err = where + "token " + std::to_string(i) + " has length 0 (byte " + std::to_string(p - 1) + ")";
            return false;
        }
        if (p + len > data.size()) {
            *err = where + "truncated: token " + std::to_string(i) + " needs " + std::to_string(len) +
                   " bytes, the file has " + std::to_string(data.size() - p) + " left";
            return false;
        }
        tokens.emplace_back(reinterpret_cast<const char*>(&data[p]), len);
        p += len;
    }
    if (p != data.size()) {
        *err = where + "trailing bytes: " + std::to_string(data.size() - p) + " after the last of " +
               std::to_string(vocab) + " tokens";
        return false;
    }
    tokens_ = std::move(tokens);
    eot_ = eot;
    return true;
}

void Tokenizer::init_bytes() {
    tokens_.clear();
    for (int b = 0; b < 256; ++b) tokens_.emplace_back(1, (char)b);
    tokens_.emplace_back(kEotText);
    eot_ = kByteEot;
}

std::string Tokenizer::decode(int id) const {
    if (id >= 0 && id == eot_) return kEotText;
    if (id < 0 || id >= (int)tokens_.size()) return "<?>";
    return tokens_[(size_t)id];
}

std::string Tokenizer::printable(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
            out.push_back((char)c);
            ++i;
            continue;
        }
        const size_t len = (c >= 0x80) ? utf8_len(s, i) : 0;
        // U+0080..U+009F (C2 80..C2 9F) are C1 control codes: escape them too.
        const bool c1 = len == 2 && c == 0xC2 && (unsigned char)s[i + 1] <= 0x9F;
        if (len > 0 && !c1) {
            out.append(s, i, len);
            i += len;
        } else {
            append_hex(&out, c);
            ++i;
        }
    }
    return out;
}

bool write_byte_tokenizer(const std::string& path, std::string* err) {
    std::vector<unsigned char> data(kHeaderBytes, 0);
    put_le32(&data[0], (uint32_t)kTokenizerMagic);
    put_le32(&data[4], 2);
    put_le32(&data[8], (uint32_t)kByteVocab);
    put_le32(&data[12], (uint32_t)kByteEot);
    for (int b = 0; b < 256; ++b) {
        data.push_back(1);
        data.push_back((unsigned char)b);
    }
    const size_t eot_len = std::strlen(kEotText);
    data.push_back((unsigned char)eot_len);
    data.insert(data.end(), kEotText, kEotText + eot_len);
    // Through a temporary file renamed into place: a reader never sees half
    // a tokenizer.
    AtomicWriter w;
    std::string why;
    if (!w.open(path, &why) || !w.write(data.data(), data.size()) || !w.commit(&why)) {
        *err = "tokenizer " + quoted(path) + ": " + (why.empty() ? std::string("write failed") : why);
        return false;
    }
    return true;
}
