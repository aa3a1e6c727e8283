// llmc/io/bpe.cpp: BpeEncoder (llmc/io/bpe.h): reading the encoding parts of a
// tokenizer.json, the tiktoken rule for llm.c files, and the encoding itself.
#include "llmc/io/bpe.h"

#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>

using json = nlohmann::json;

namespace {

uint64_t pair_key(int a, int b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

std::string replace_all(const std::string& s, const std::string& a, const std::string& b) {
    if (a.empty()) return s;
    std::string out;
    size_t i = 0;
    for (size_t k; (k = s.find(a, i)) != std::string::npos; i = k + a.size()) out.append(s, i, k - i).append(b);
    return out.append(s, i, std::string::npos);
}

// A one-line rendering of a JSON value for messages.
std::string brief(const json& v) {
    std::string s = v.dump();
    return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

std::string type_of(const json& v) { return v.is_object() ? v.value("type", std::string("?")) : brief(v); }

// Cuts segs at the added tokens (leftmost-longest, as tokenizers' Aho-Corasick
// matcher): each segment is (text, added id or -1, starts the text).
struct Seg {
    std::string text;
    int id;
    bool first;
};
std::vector<Seg> cut_added(const std::vector<Seg>& segs, const std::vector<std::pair<std::string, int>>& added) {
    if (added.empty()) return segs;
    std::vector<Seg> out;
    for (const Seg& s : segs) {
        if (s.id >= 0) {
            out.push_back(s);
            continue;
        }
        size_t from = 0, i = 0;
        while (i < s.text.size()) {
            const std::pair<std::string, int>* best = nullptr;
            for (const auto& a : added)
                if (!a.first.empty() && s.text.compare(i, a.first.size(), a.first) == 0 &&
                    (!best || a.first.size() > best->first.size()))
                    best = &a;
            if (!best) {
                i++;
                continue;
            }
            if (i > from) out.push_back({s.text.substr(from, i - from), -1, s.first && from == 0});
            out.push_back({best->first, best->second, false});
            i += best->first.size();
            from = i;
        }
        if (from < s.text.size()) out.push_back({s.text.substr(from), -1, s.first && from == 0});
    }
    return out;
}

}  // namespace

bool BpeEncoder::pre_step(const json& p, std::string* why) {
    const std::string type = type_of(p);
    Pre s;
    if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
        for (const json& x : p["pretokenizers"])
            if (!pre_step(x, why)) return false;
        return true;
    } else if (type == "ByteLevel") {
        s.kind = Pre::byte_level;
        s.add_prefix_space = p.value("add_prefix_space", false);
        s.use_regex = p.value("use_regex", true);
    } else if (type == "Split") {
        s.kind = Pre::split;
        const json pat = p.value("pattern", json());
        const std::string regex = pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()
                                      ? pat["Regex"].get<std::string>() : std::string();
        if (!split_pattern_of(regex, &s.pattern)) {
            *why = "split pattern " + (regex.empty() ? brief(pat) : brief(json(regex))) + " is not one this encoder implements exactly (GPT-2's and Llama 3's are)";
            return false;
        }
        if (p.value("behavior", std::string()) != "Isolated" || p.value("invert", false)) {
            *why = "Split pre-tokenizer with behavior " + brief(p.value("behavior", json())) + ", invert " +
                   brief(p.value("invert", json())) + " (only Isolated, not inverted, is implemented)";
            return false;
        }
    } else if (type == "Metaspace") {
        s.kind = Pre::metaspace;
        s.replacement = p.value("replacement", std::string("\xE2\x96\x81"));
        const std::string scheme = p.contains("prepend_scheme") ? p.value("prepend_scheme", std::string())
                                   : p.value("add_prefix_space", true) ? "always" : "never";
        s.prepend = scheme == "never" ? 0 : scheme == "first" ? 1 : scheme == "always" ? 2 : -1;
        s.ms_split = p.value("split", true);
        std::vector<uint32_t> cps;
        size_t bad;
        if (s.prepend < 0 || !utf8_decode(s.replacement, &cps, &bad) || cps.size() != 1) {
            *why = "Metaspace pre-tokenizer " + brief(p) + " (prepend_scheme never, first or always; one replacement character)";
            return false;
        }
    } else {
        *why = "pre-tokenizer " + type + " is not implemented (ByteLevel, Split, Metaspace and Sequence are)";
        return false;
    }
    pre_.push_back(s);
    return true;
}

bool BpeEncoder::from_json(const json& j, std::string* why) {
    const json& m = j["model"];
    if (m.value("type", std::string("BPE")) != "BPE" || !m.contains("merges") || !m["vocab"].is_object()) {
        *why = "model " + type_of(m) + " is not a BPE model with merges (only BPE encodes)";
        return false;
    }
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
        const json v = m.value(key, json());
        if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
            *why = std::string("model.") + key + " " + brief(v) + " is not implemented";
            return false;
        }
    }
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) vocab_[it.key()] = it.value().get<int>();
    byte_fallback_ = m.value("byte_fallback", false);
    ignore_merges_ = m.value("ignore_merges", false);
    fuse_unk_ = m.value("fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) unk_ = token_id(m["unk_token"].get<std::string>());
    const json& merges = m["merges"];
    for (size_t r = 0; r < merges.size(); r++) {
        // "a b" (tokenizers before 0.20) or ["a", "b"].
        std::string a, b;
        if (merges[r].is_string()) {
            const std::string s = merges[r].get<std::string>();
            const size_t sp = s.find(' ');
            if (sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos) a = s.substr(0, sp), b = s.substr(sp + 1);
        } else if (merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() && merges[r][1].is_string()) {
            a = merges[r][0].get<std::string>(), b = merges[r][1].get<std::string>();
        }
        const int ia = token_id(a), ib = token_id(b), iab = token_id(a + b);
        if (a.empty() || ia < 0 || ib < 0 || iab < 0) {
            *why = "model.merges[" + std::to_string(r) + "] " + brief(merges[r]) + " is not two tokens whose join is a token";
            return false;
        }
        merges_.emplace(pair_key(ia, ib), std::make_pair((int)r, iab));  // the first of duplicates wins, as in tokenizers
    }
    const json norm = j.value("normalizer", json());
    const json steps = norm.is_object() && type_of(norm) == "Sequence" ? norm.value("normalizers", json::array())
                       : norm.is_null() ? json::array() : json::array({norm});
    for (const json& n : steps) {
        const std::string t = type_of(n);
        if (t == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
            norm_.push_back({true, n["prepend"].get<std::string>(), ""});
        } else if (t == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
                   n["pattern"].contains("String") && n["pattern"]["String"].is_string() && n.contains("content") &&
                   n["content"].is_string()) {
            norm_.push_back({false, n["pattern"]["String"].get<std::string>(), n["content"].get<std::string>()});
        } else {
            *why = "normalizer " + brief(n) + " is not implemented (Prepend and string Replace are)";
            return false;
        }
    }
    const json pre = j.value("pre_tokenizer", json());
    if (!pre.is_null() && !pre_step(pre, why)) return false;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const json& a : j["added_tokens"]) {
            for (const char* key : {"single_word", "lstrip", "rstrip"})
                if (a.value(key, false)) {
                    *why = "added token " + brief(a["content"]) + " has " + key + " (not implemented)";
                    return false;
                }
            const bool normalized = a.value("normalized", !a.value("special", false));
            if (normalized && !norm_.empty()) {
                *why = "added token " + brief(a["content"]) + " is matched after the normalizer (not implemented)";
                return false;
            }
            (normalized ? norm_added_ : raw_added_).emplace_back(a["content"].get<std::string>(), a["id"].get<int>());
        }
    }
    const json post = j.value("post_processor", json());
    const json posts = post.is_object() && type_of(post) == "Sequence" ? post.value("processors", json::array())
                       : post.is_null() ? json::array() : json::array({post});
    for (const json& p : posts) {
        const std::string t = type_of(p);
        if (t == "ByteLevel") continue;  // offsets only
        bool ok = t == "TemplateProcessing" && p.contains("single") && p["single"].is_array();
        bool seen_a = false;
        for (const json& item : ok ? p["single"] : json::array()) {
            if (item.contains("Sequence")) {
                seen_a = true;
                continue;
            }
            const std::string name = item.contains("SpecialToken") ? item["SpecialToken"].value("id", std::string()) : "";
            const json& st = p.value("special_tokens", json::object());
            if (name.empty() || !st.contains(name) || !st[name].contains("ids")) {
                ok = false;
                break;
            }
            for (const json& id : st[name]["ids"]) (seen_a ? suffix_ : prefix_).push_back(id.get<int>());
        }
        if (!ok) {
            *why = "post-processor " + brief(p) + " is not implemented (TemplateProcessing and ByteLevel are)";
            return false;
        }
    }
    return true;
}

// llm.c tokenizer files hold ids -> bytes and no merges. GPT-2's vocabulary
// is in merge order: ids 0-255 are the single bytes and the token made by
// merge r has id 256 + r, so the rank of a merge is the id of the token it
// makes. That is how tiktoken encodes GPT-2: within each piece of the GPT-2
// split, repeatedly merge the adjacent pair whose concatenation is a token
// with the lowest id. A byte-level vocabulary (257 tokens) has no longer
// tokens and encodes each byte as itself. The file does not say which
// pattern split its text: GPT-2's is assumed (llm.c's files are GPT-2's or
// byte-level).
bool BpeEncoder::from_token_bytes(const std::vector<std::string>& tokens, int eot, std::string* why) {
    id_rank_ = true;
    Pre gpt2;
    gpt2.kind = Pre::split;
    pre_.push_back(gpt2);
    for (size_t i = 0; i < tokens.size(); i++)
        if ((int)i != eot) vocab_.emplace(tokens[i], (int)i);  // the lowest id of a duplicate
    for (int b = 0; b < 256; b++)
        if (!vocab_.count(std::string(1, (char)b))) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "0x%02x", b);
            *why = std::string("byte ") + hex + " has no token of its own (a BPE vocabulary in llm.c's format has all 256)";
            return false;
        }
    return true;
}

void BpeEncoder::set_template(std::vector<int> prefix, std::vector<int> suffix) {
    prefix_ = std::move(prefix);
    suffix_ = std::move(suffix);
}

int BpeEncoder::token_id(const std::string& text) const {
    for (const auto* list : {&raw_added_, &norm_added_})
        for (const auto& a : *list)
            if (a.first == text) return a.second;
    auto it = vocab_.find(text);
    return it == vocab_.end() ? -1 : it->second;
}

bool BpeEncoder::encode(const std::string& text, bool with_special, std::vector<int>* ids, std::string* err) const {
    std::vector<uint32_t> cps;
    size_t bad = 0;
    if (!utf8_decode(text, &cps, &bad)) {
        *err = "the text is not valid UTF-8 (byte " + std::to_string(bad) + ")";
        return false;
    }
    ids->clear();
    if (with_special) *ids = prefix_;
    if (!text.empty()) {
        for (const Seg& s : cut_added(cut_added({{text, -1, true}}, raw_added_), norm_added_)) {
            if (s.id >= 0) ids->push_back(s.id);
            else encode_segment(s.text, s.first, ids);
        }
    }
    if (with_special) ids->insert(ids->end(), suffix_.begin(), suffix_.end());
    return true;
}

void BpeEncoder::encode_segment(const std::string& seg, bool first, std::vector<int>* ids) const {
    std::string t = seg;
    for (const Norm& n : norm_) t = n.prepend ? (t.empty() ? t : n.a + t) : replace_all(t, n.a, n.b);
    std::vector<Piece> pieces{{t, first}}, next;
    for (const Pre& s : pre_) {
        next.clear();
        for (const Piece& p : pieces) pre_tokenize(s, p, &next);
        pieces.swap(next);
    }
    for (const Piece& p : pieces) {
        if (p.text.empty()) continue;
        if (id_rank_) word_by_id_rank(p.text, ids);
        else word(p.text, ids);
    }
}

void BpeEncoder::pre_tokenize(const Pre& s, const Piece& in, std::vector<Piece>* out) const {
    std::string t = in.text;
    std::vector<std::string> parts;
    if (s.kind == Pre::split) {
        split_text(s.pattern, t, &parts);
    } else if (s.kind == Pre::byte_level) {
        if (s.add_prefix_space && (t.empty() || t[0] != ' ')) t = " " + t;
        if (s.use_regex) split_text(SplitPattern::gpt2, t, &parts);
        else parts.push_back(t);
        for (std::string& p : parts) p = byte_level_text(p);  // bytes -> the byte-level alphabet
    } else {
        // Metaspace: spaces become the replacement, which starts the text
        // (always, or only where the text starts) and, with split, every
        // piece: each replacement starts a new one (MergedWithNext).
        const std::string& r = s.replacement;
        t = replace_all(t, " ", r);
        if ((s.prepend == 2 || (s.prepend == 1 && in.first)) && t.compare(0, r.size(), r) != 0) t = r + t;
        if (!s.ms_split) {
            parts.push_back(t);
        } else {
            size_t from = 0;
            for (size_t i = 1; i + r.size() <= t.size(); i++)
                if (t.compare(i, r.size(), r) == 0) {
                    parts.push_back(t.substr(from, i - from));
                    from = i;
                }
            parts.push_back(t.substr(from));
        }
    }
    for (size_t i = 0; i < parts.size(); i++)
        if (!parts[i].empty()) out->push_back({parts[i], in.first && i == 0});
}

// One piece through the BPE model, as tokenizers' BPE::merge_word: each
// character its token, else its bytes' <0xNN> tokens (byte_fallback), else
// unk (consecutive ones fused with fuse_unk; none without an unk token);
// then, while some adjacent pair has a merge, the lowest rank, leftmost.
void BpeEncoder::word(const std::string& w, std::vector<int>* ids) const {
    if (ignore_merges_) {
        auto it = vocab_.find(w);
        if (it != vocab_.end()) {
            ids->push_back(it->second);
            return;
        }
    }
    std::vector<int> sym;
    int pending_unk = -1;  // an unk not yet added (fuse_unk joins the next)
    for (size_t i = 0; i < w.size();) {
        const size_t len = utf8_len(w, i);
        const std::string ch = w.substr(i, len);
        i += len;
        auto it = vocab_.find(ch);
        if (it != vocab_.end()) {
            if (pending_unk >= 0) sym.push_back(pending_unk);
            pending_unk = -1;
            sym.push_back(it->second);
            continue;
        }
        if (byte_fallback_) {
            std::vector<int> bytes;
            for (unsigned char c : ch) {
                char name[8];
                std::snprintf(name, sizeof(name), "<0x%02X>", c);
                auto b = vocab_.find(name);
                if (b == vocab_.end()) break;
                bytes.push_back(b->second);
            }
            if (bytes.size() == ch.size()) {  // as tokenizers: a pending unk is not flushed here
                sym.insert(sym.end(), bytes.begin(), bytes.end());
                continue;
            }
        }
        if (unk_ >= 0) {
            if (pending_unk >= 0 && !fuse_unk_) sym.push_back(pending_unk);
            pending_unk = unk_;
        }
    }
    if (pending_unk >= 0) sym.push_back(pending_unk);
    for (;;) {
        int best = INT_MAX, at = -1, made = -1;
        for (size_t k = 0; k + 1 < sym.size(); k++) {
            auto it = merges_.find(pair_key(sym[k], sym[k + 1]));
            if (it != merges_.end() && it->second.first < best) best = it->second.first, at = (int)k, made = it->second.second;
        }
        if (at < 0) break;
        sym[(size_t)at] = made;
        sym.erase(sym.begin() + at + 1);
    }
    ids->insert(ids->end(), sym.begin(), sym.end());
}

// The tiktoken rule (from_token_bytes): merge the adjacent pair whose
// concatenation is the token of lowest id, leftmost first, until none is.
void BpeEncoder::word_by_id_rank(const std::string& w, std::vector<int>* ids) const {
    for (const std::string& p : merge_by_id_rank(w, vocab_)) ids->push_back(vocab_.at(p));
}
