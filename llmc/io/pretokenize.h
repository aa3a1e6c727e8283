// llmc/io/pretokenize.h: the text side of BPE encoding: UTF-8, the Unicode
// classes of the split patterns, the two split patterns this encoder knows
// (GPT-2's and Llama 3's, matched by hand, exactly as the regex engines of
// `tokenizers` and tiktoken match them), and GPT-2's byte-level alphabet.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// The generated table (llmc/io/unicode_table.cpp, scripts/gen_unicode_table.py).
struct UnicodeRange {
    uint32_t first, last;
    uint8_t cls;  // 1 letter (\p{L}), 2 number (\p{N})
};
extern const UnicodeRange kUnicodeRanges[];
extern const size_t kUnicodeRangeCount;
extern const char kUnicodeTableVersion[];

enum class CharClass { letter, number, space, other };
// \p{L}, \p{N}, \s (Unicode White_Space, as Oniguruma's and Rust regex's \s),
// or none of them.
CharClass char_class(uint32_t cp);

// Length of the valid UTF-8 character at s[i] (1..4), or 0 if the bytes there
// are not one (overlong forms, surrogates and code points > U+10FFFF too).
size_t utf8_len(const std::string& s, size_t i);
// The code points of s; false at the first invalid byte, *bad its offset.
bool utf8_decode(const std::string& s, std::vector<uint32_t>* cps, size_t* bad);
void utf8_append(std::string* out, uint32_t cp);

// A split pattern of a tokenizer.json (Split pre-tokenizer, Isolated) or of
// the ByteLevel pre-tokenizer (GPT-2's, its use_regex).
enum class SplitPattern { gpt2, llama3 };
// The pattern as tokenizer.json spells it; false when it is neither.
bool split_pattern_of(const std::string& regex, SplitPattern* p);
// Appends text's matches of the pattern, in order, to *pieces (every code
// point lands in one piece: the patterns match everything). text must be
// valid UTF-8.
void split_text(SplitPattern p, const std::string& text, std::vector<std::string>* pieces);

// GPT-2's byte-level alphabet: byte b is written as the code point
// byte_level_cp(b) (printable Latin-1 bytes as themselves, the others as
// 256, 257, ... in byte order), so every byte string is printable text.
uint32_t byte_level_cp(unsigned char b);
// Bytes written in that alphabet, as UTF-8.
std::string byte_level_text(const std::string& bytes);
