// llmc/io/tokenizer.cpp: loading and writing llm.c tokenizer files, reading
// Hugging Face tokenizer.json (with nlohmann-json), decoding, and escaping of
// sampled text for the terminal.
#include "llmc/io/tokenizer.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "llmc/base/fileio.h"
#include "llmc/io/bpe.h"
#include "llmc/io/pretokenize.h"

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

// s as valid UTF-8: each ill-formed sequence, its maximal subpart (the
// longest start of a well-formed sequence, at least one byte), becomes one
// U+FFFD (the Unicode Standard's practice, and Python's errors="replace").
std::string utf8_lossy(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    const size_t n = s.size();
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            out.push_back((char)c);
            i++;
            continue;
        }
        // The sequence's length and its second byte's range (the rest: 80..BF).
        int len = 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) len = 3, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
        else if (c == 0xED) len = 3, hi = 0x9F;
        else if (c == 0xF0) len = 4, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) len = 4, hi = 0x8F;
        size_t k = 1;
        while (len > 0 && (int)k < len && i + k < n) {
            const unsigned char d = (unsigned char)s[i + k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
            k++;
        }
        if (len > 0 && (int)k == len) {
            out.append(s, i, k);
        } else {
            out += "\xEF\xBF\xBD";  // U+FFFD
        }
        i += k;
    }
    return out;
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
    {
        size_t i = 0;
        while (i < data.size() && std::isspace(data[i])) i++;
        const bool json_name = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
        if (json_name || (i < data.size() && data[i] == '{')) return load_json(path, err);
    }
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
    // Every token takes at least its length byte: a header claiming more
    // tokens than the file has bytes is corrupt, and is refused before
    // anything is sized from it (a claim of 2^31 tokens was a bare
    // "out of memory").
    if ((size_t)vocab > data.size() - kHeaderBytes) {
        *err = where + "truncated: the header says " + std::to_string(vocab) + " tokens, the file has room for at most " +
               std::to_string(data.size() - kHeaderBytes);
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
    byte_token_.clear();
    strip_start_ = 0;
    eot_ = eot;
    eot_text_ = kEotText;
    set_encoder_from_bytes(where);
    return true;
}

void Tokenizer::set_encoder_from_bytes(const std::string& where) {
    auto e = std::make_shared<BpeEncoder>();
    std::string why;
    bpe_ = e->from_token_bytes(tokens_, eot_, &why) ? e : nullptr;
    no_encode_ = bpe_ ? "" : where + why;
}

namespace {

// GPT-2's byte-level table, code point -> byte (llmc/io/pretokenize.h).
std::map<uint32_t, unsigned char> unicode_to_byte() {
    std::map<uint32_t, unsigned char> m;
    for (int b = 0; b < 256; b++) m[byte_level_cp((unsigned char)b)] = (unsigned char)b;
    return m;
}

// The code points of UTF-8 text (invalid bytes as U+FFFD).
std::vector<uint32_t> code_points(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = (unsigned char)s[i];
        const size_t len = utf8_len(s, i);
        if (len == 0) {
            out.push_back(0xFFFD);
            i++;
            continue;
        }
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
        out.push_back(cp);
        i += len;
    }
    return out;
}

// The leading spaces a decoder's Strip step takes off the whole text: a
// Strip of " " after a Fuse step of the same Sequence (SentencePiece-style
// Llama files: Replace, ByteFallback, Fuse, Strip(" ", 1, 0)); 0 without.
int fused_strip_start(const nlohmann::json& d) {
    if (!d.is_object() || d.value("type", "") != "Sequence" || !d.contains("decoders") || !d["decoders"].is_array())
        return 0;
    bool fused = false;
    for (const nlohmann::json& x : d["decoders"]) {
        if (!x.is_object()) continue;
        const std::string t = x.value("type", "");
        if (t == "Fuse") fused = true;
        if (t == "Strip" && fused && x.value("content", "") == " " && x.contains("start") &&
            x["start"].is_number_integer())
            return (int)x["start"].get<long long>();
    }
    return 0;
}

// Whether a pre-tokenizer or decoder (possibly a Sequence of them) is or
// holds a ByteLevel step.
bool has_byte_level(const nlohmann::json& j) {
    if (!j.is_object()) return false;
    if (j.contains("type") && j["type"] == "ByteLevel") return true;
    for (const char* key : {"pretokenizers", "decoders"})
        if (j.contains(key) && j[key].is_array())
            for (const auto& x : j[key])
                if (has_byte_level(x)) return true;
    return false;
}

// transformers' LlamaTokenizerFast rebuilds the post-processor from
// tokenizer_config.json (beside the tokenizer.json): its bos_token first when
// add_bos_token (default true), its eos_token last when add_eos_token
// (default false). Other classes keep the tokenizer.json's post-processor,
// as transformers does; so does a file with no tokenizer_config.json.
bool llama_specials(const std::string& path, BpeEncoder* e, std::string* why) {
    using json = nlohmann::json;
    const size_t slash = path.find_last_of('/');
    const std::string name = (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/tokenizer_config.json";
    std::vector<unsigned char> data;
    std::string err;
    if (file_size(name) < 0 || !read_whole_file(name, &data, &err)) return true;
    const json c = json::parse(data.begin(), data.end(), nullptr, false);
    if (!c.is_object() || !c.contains("tokenizer_class") || !c["tokenizer_class"].is_string()) return true;
    const std::string cls = c["tokenizer_class"].get<std::string>();
    if (cls != "LlamaTokenizer" && cls != "LlamaTokenizerFast") return true;
    std::vector<int> ids[2];
    const char* keys[2][3] = {{"add_bos_token", "bos_token", "<s>"}, {"add_eos_token", "eos_token", "</s>"}};
    for (int k = 0; k < 2; k++) {
        const bool on = c.contains(keys[k][0]) && c[keys[k][0]].is_boolean() ? c[keys[k][0]].get<bool>() : k == 0;
        if (!on) continue;
        json v = c.contains(keys[k][1]) ? c[keys[k][1]] : json(keys[k][2]);
        if (v.is_object()) v = v.contains("content") ? v["content"] : json();
        const int id = v.is_string() ? e->token_id(v.get<std::string>()) : -1;
        if (id < 0) {
            *why = quoted(name) + ": " + keys[k][0] + " is true but " + keys[k][1] + " " + v.dump() + " is not a token";
            return false;
        }
        ids[k].push_back(id);
    }
    e->set_template(ids[0], ids[1]);
    return true;
}

}  // namespace

bool Tokenizer::load_json(const std::string& path, std::string* err) {
    using json = nlohmann::json;
    const std::string where = "tokenizer " + quoted(path) + ": ";
    std::vector<unsigned char> data;
    if (!read_whole_file(path, &data, err)) return false;
    json j;
    try {
        j = json::parse(data.begin(), data.end());
    } catch (const json::exception& e) {
        std::string m = e.what();
        for (char& ch : m)
            if (ch == '\n') ch = ' ';
        *err = where + "not valid JSON (" + m + ")";
        return false;
    }
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object() || !j["model"].contains("vocab")) {
        *err = where + "not a Hugging Face tokenizer.json (no model.vocab)";
        return false;
    }
    const bool byte_level = has_byte_level(j.value("decoder", json())) || has_byte_level(j.value("pre_tokenizer", json()));
    const bool byte_fallback = j["model"].value("byte_fallback", false);
    const std::map<uint32_t, unsigned char> to_byte = unicode_to_byte();
    // A vocabulary entry's bytes.
    auto token_bytes = [&](const std::string& t) {
        if (byte_level) {
            std::string out;
            for (uint32_t cp : code_points(t)) {
                auto it = to_byte.find(cp);
                if (it == to_byte.end()) return t;  // not byte-level text after all: as it is
                out.push_back((char)it->second);
            }
            return out;
        }
        if (byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>')
            return std::string(1, (char)std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
        std::string out;  // SentencePiece: U+2581 (E2 96 81) is a space
        for (size_t i = 0; i < t.size(); i++) {
            if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
                out.push_back(' ');
                i += 2;
            } else {
                out.push_back(t[i]);
            }
        }
        return out;
    };
    std::map<int, std::string> by_id;
    std::set<int> byte_ids;  // the byte-fallback tokens' ids
    auto is_byte_token = [&](const std::string& t) {
        return !byte_level && byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
    };
    const json& vocab = j["model"]["vocab"];
    if (vocab.is_object()) {
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            if (!it.value().is_number_integer() || it.value().get<long long>() < 0 ||
                it.value().get<long long>() >= (1LL << 30)) {
                *err = where + "model.vocab: token " + json(it.key()).dump() + " has id " + it.value().dump();
                return false;
            }
            by_id[it.value().get<int>()] = token_bytes(it.key());
            if (is_byte_token(it.key())) byte_ids.insert(it.value().get<int>());
        }
    } else if (vocab.is_array()) {  // Unigram: [[token, score], ...], id = index
        for (size_t i = 0; i < vocab.size(); i++) {
            if (!vocab[i].is_array() || vocab[i].empty() || !vocab[i][0].is_string()) {
                *err = where + "model.vocab[" + std::to_string(i) + "] is not [token, score]";
                return false;
            }
            by_id[(int)i] = token_bytes(vocab[i][0].get<std::string>());
            if (is_byte_token(vocab[i][0].get<std::string>())) byte_ids.insert((int)i);
        }
    } else {
        *err = where + "model.vocab is neither an object nor an array";
        return false;
    }
    std::map<std::string, int> added;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const json& a : j["added_tokens"]) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<long long>() < 0 ||
                a["id"].get<long long>() >= (1LL << 30) || !a.contains("content") || !a["content"].is_string()) {
                *err = where + "added_tokens: bad entry " + a.dump();
                return false;
            }
            by_id[a["id"].get<int>()] = a["content"].get<std::string>();  // literal text, not byte-mapped
            byte_ids.erase(a["id"].get<int>());
            added[a["content"].get<std::string>()] = a["id"].get<int>();
        }
    }
    if (by_id.empty()) {
        *err = where + "empty vocabulary";
        return false;
    }
    // The ids index a table: a vocabulary's ids run from 0 with few gaps, so
    // an id far past the count of tokens is a damaged file, not a table of a
    // billion entries to allocate.
    const long long max_id = by_id.rbegin()->first, limit = 4 * (long long)by_id.size() + 65536;
    if (max_id >= limit) {
        *err = where + "token id " + std::to_string(max_id) + " is far past the " + std::to_string(by_id.size()) +
               " tokens (ids must stay below " + std::to_string(limit) + ")";
        return false;
    }
    std::vector<std::string> tokens((size_t)max_id + 1);
    for (auto& kv : by_id) tokens[(size_t)kv.first] = std::move(kv.second);
    int eot = 0;
    for (const char* name : {"<|endoftext|>", "<|begin_of_text|>", "<s>"}) {
        auto it = added.find(name);
        if (it != added.end()) {
            eot = it->second;
            break;
        }
        if (vocab.is_object() && vocab.contains(name)) {
            eot = vocab[name].get<int>();
            break;
        }
    }
    tokens_ = std::move(tokens);
    byte_token_.assign(tokens_.size(), 0);
    for (int id : byte_ids) byte_token_[(size_t)id] = 1;
    strip_start_ = fused_strip_start(j.value("decoder", json()));
    eot_ = eot;
    eot_text_ = tokens_[(size_t)eot];
    // The encoder: what this file's normalizer, pre-tokenizer, merges and
    // post-processor do, if all of it is implemented; else why not (a
    // tokenizer that only decodes samples still loads).
    auto e = std::make_shared<BpeEncoder>();
    std::string why;
    try {
        if (!e->from_json(j, &why) || !llama_specials(path, e.get(), &why)) e = nullptr;
    } catch (const json::exception& x) {
        why = std::string("an encoding field has an unexpected type (") + x.what() + ")";
        e = nullptr;
    }
    bpe_ = e;
    no_encode_ = bpe_ ? "" : where + why;
    return true;
}

void Tokenizer::init_bytes() {
    tokens_.clear();
    byte_token_.clear();
    strip_start_ = 0;
    for (int b = 0; b < 256; ++b) tokens_.emplace_back(1, (char)b);
    tokens_.emplace_back(kEotText);
    eot_ = kByteEot;
    eot_text_ = kEotText;
    set_encoder_from_bytes("byte-level tokenizer: ");
}

std::string Tokenizer::decode(int id) const {
    if (id >= 0 && id == eot_) return eot_text_;
    if (id < 0 || id >= (int)tokens_.size()) return "<?>";
    return tokens_[(size_t)id];
}

std::string Tokenizer::decode_text(const std::vector<int>& ids) const {
    std::string out, run;  // run: the byte-fallback tokens' bytes since the last other token
    auto flush = [&] {
        if (run.empty()) return;
        const std::string ok = utf8_lossy(run);
        if (ok == run) out += run;
        else
            for (size_t i = 0; i < run.size(); i++) out += "\xEF\xBF\xBD";  // one U+FFFD per byte
        run.clear();
    };
    for (int id : ids) {
        const bool byte = id >= 0 && id < (int)byte_token_.size() && byte_token_[(size_t)id] && id != eot_;
        if (byte) {
            run += tokens_[(size_t)id];
            continue;
        }
        flush();
        out += decode(id);
    }
    flush();
    out = utf8_lossy(out);
    size_t cut = 0;
    while ((int)cut < strip_start_ && cut < out.size() && out[cut] == ' ') cut++;
    return out.substr(cut);
}

bool Tokenizer::can_encode() const { return bpe_ != nullptr; }

bool Tokenizer::encode(const std::string& text, std::vector<int>* ids, std::string* err, bool with_special) const {
    if (!bpe_) {
        *err = no_encode_.empty() ? std::string("no tokenizer loaded") : no_encode_;
        return false;
    }
    return bpe_->encode(text, with_special, ids, err);
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
