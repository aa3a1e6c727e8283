// llmc/io/pretokenize.cpp: UTF-8, Unicode classes from the generated table,
// the GPT-2 and Llama 3 split patterns matched by hand, and the byte-level
// alphabet (llmc/io/pretokenize.h).
//
// Each pattern is an alternation tried in order at the current position, the
// first alternative that matches wins (leftmost-first, as Oniguruma, Rust's
// fancy-regex and PCRE match), and the next match starts where it ended. The
// matchers below follow each alternative's greedy match and its backtracking
// by hand; tests/reference/test_tokenize.py compares them with `tokenizers`.
#include "llmc/io/pretokenize.h"

#include <algorithm>

namespace {

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Unicode White_Space: what \s matches in Oniguruma (U+0009-000D, U+0085
// and the Zs, Zl, Zp categories) and in Rust's regex. Not Python's
// str.isspace, which adds U+001C-001F.
bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

const char kGpt2Regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char kLlama3Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// One pattern's matcher over code points [0, n).
struct Matcher {
    const std::vector<uint32_t>& c;
    size_t n;
    CharClass at(size_t k) const { return char_class(c[k]); }
    bool is(size_t k, CharClass cl) const { return k < n && at(k) == cl; }
    bool newline(size_t k) const { return k < n && (c[k] == '\r' || c[k] == '\n'); }
    // A letter of the contractions: case-sensitive for GPT-2; under (?i) for
    // Llama 3, with Unicode simple case folding (U+017F LONG S folds to s).
    bool letter_is(size_t k, char lower, bool fold) const {
        if (k >= n) return false;
        if (c[k] == (uint32_t)lower) return true;
        if (!fold) return false;
        return c[k] == (uint32_t)(lower - 'a' + 'A') || (lower == 's' && c[k] == 0x17F);
    }
    // 's|'t|'re|'ve|'m|'ll|'d at i: its end, or i.
    size_t contraction(size_t i, bool fold) const {
        if (c[i] != '\'') return i;
        for (char x : {'s', 't'})
            if (letter_is(i + 1, x, fold)) return i + 2;
        for (const char* two : {"re", "ve"})
            if (letter_is(i + 1, two[0], fold) && letter_is(i + 2, two[1], fold)) return i + 3;
        if (letter_is(i + 1, 'm', fold)) return i + 2;
        if (letter_is(i + 1, 'l', fold) && letter_is(i + 2, 'l', fold)) return i + 3;
        if (letter_is(i + 1, 'd', fold)) return i + 2;
        return i;
    }
    size_t run(size_t j, CharClass cl) const {
        while (is(j, cl)) j++;
        return j;
    }
    // ` ?X+` for the class X: its end, or i.
    size_t space_then_run(size_t i, CharClass cl) const {
        const size_t j = (c[i] == ' ' && is(i + 1, cl)) ? i + 1 : i;
        return is(j, cl) ? run(j, cl) : i;
    }
    // \s+(?!\S)|\s+ at a white-space character i: the whole run when it ends
    // the text or is one character, else the run less its last character
    // (which then starts the next match, as ` ?X+` or alone).
    size_t spaces(size_t i) const {
        const size_t j = run(i, CharClass::space);
        return (j == n || j - i == 1) ? j : j - 1;
    }
    size_t gpt2(size_t i) const {
        size_t j = contraction(i, false);
        if (j > i) return j;
        for (CharClass cl : {CharClass::letter, CharClass::number, CharClass::other})
            if ((j = space_then_run(i, cl)) > i) return j;
        return spaces(i);
    }
    size_t llama3(size_t i) const {
        size_t j = contraction(i, true);
        if (j > i) return j;
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (!is(i, CharClass::letter) && !is(i, CharClass::number) && !newline(i) && is(i + 1, CharClass::letter))
            return run(i + 1, CharClass::letter);
        if (is(i, CharClass::letter)) return run(i, CharClass::letter);
        if (is(i, CharClass::number)) return std::min(run(i, CharClass::number), i + 3);  // \p{N}{1,3}
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        if ((j = space_then_run(i, CharClass::other)) > i) {
            while (newline(j)) j++;
            return j;
        }
        // \s*[\r\n]+: the white-space run up to and with its last \r or \n.
        const size_t e = run(i, CharClass::space);
        for (size_t k = e; k > i; k--)
            if (newline(k - 1)) return k;
        return spaces(i);
    }
};

}  // namespace

CharClass char_class(uint32_t cp) {
    if (is_white_space(cp)) return CharClass::space;
    const UnicodeRange* end = kUnicodeRanges + kUnicodeRangeCount;
    const UnicodeRange* r =
        std::upper_bound(kUnicodeRanges, end, cp, [](uint32_t v, const UnicodeRange& x) { return v < x.first; });
    if (r == kUnicodeRanges || cp > (r - 1)->last) return CharClass::other;
    return (r - 1)->cls == 1 ? CharClass::letter : CharClass::number;
}

size_t utf8_len(const std::string& s, size_t i) {
    const size_t n = s.size();
    const unsigned char c = (unsigned char)s[i];
    auto at = [&](size_t k) { return (unsigned char)s[i + k]; };
    if (c < 0x80) return 1;
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

bool utf8_decode(const std::string& s, std::vector<uint32_t>* cps, size_t* bad) {
    cps->clear();
    for (size_t i = 0; i < s.size();) {
        const size_t len = utf8_len(s, i);
        if (len == 0) {
            *bad = i;
            return false;
        }
        const unsigned char c = (unsigned char)s[i];
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
        cps->push_back(cp);
        i += len;
    }
    return true;
}

void utf8_append(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back((char)cp);
    } else if (cp < 0x800) {
        out->push_back((char)(0xC0 | (cp >> 6)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | (cp >> 12)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | (cp >> 18)));
        out->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

bool split_pattern_of(const std::string& regex, SplitPattern* p) {
    if (regex == kGpt2Regex) *p = SplitPattern::gpt2;
    else if (regex == kLlama3Regex) *p = SplitPattern::llama3;
    else return false;
    return true;
}

void split_text(SplitPattern p, const std::string& text, std::vector<std::string>* pieces) {
    std::vector<uint32_t> cps;
    size_t bad = 0;
    utf8_decode(text, &cps, &bad);
    const Matcher m{cps, cps.size()};
    for (size_t i = 0; i < cps.size();) {
        size_t j = p == SplitPattern::gpt2 ? m.gpt2(i) : m.llama3(i);
        if (j <= i) j = i + 1;  // unreachable: both patterns match every character
        std::string piece;
        for (size_t k = i; k < j; k++) utf8_append(&piece, cps[k]);
        pieces->push_back(std::move(piece));
        i = j;
    }
}

std::string byte_level_text(const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) utf8_append(&out, byte_level_cp(c));
    return out;
}

uint32_t byte_level_cp(unsigned char b) {
    auto direct = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
    if (direct(b)) return b;
    uint32_t k = 256;  // the bytes before b that are not printable come first
    for (int x = 0; x < b; x++)
        if (!direct(x)) k++;
    return k;
}
