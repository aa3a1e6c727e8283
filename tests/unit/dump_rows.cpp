// tests/unit/dump_rows.cpp: dump_rows, prints what the C++ DataLoader (and
// Tokenizer) read from files made elsewhere, so tests/unit/test_shards.py can
// compare it with what Python wrote, and the ids the Tokenizer encodes texts
// to, for tests/reference/test_tokenize.py to compare with `tokenizers`.
//
//   dump_rows PATTERN T VOCAB [NROWS]   rows 0..NROWS-1 (default: one epoch
//                                       plus two rows, to cross the wrap)
//   dump_rows --tokenizer PATH          every token of a tokenizer file
//   dump_rows --encode PATH TEXTS       each text of TEXTS (one a line, its
//                                       bytes in hex) encoded by PATH
//   dump_rows --split gpt2|llama3 TEXTS each text cut by that split pattern
//   dump_rows --decode PATH IDS         each line of IDS (I,I,...) decoded by
//                                       PATH as a sequence (decode_text)
//   dump_rows --hf-json PATH OUT        the tokenizer.json an export writes
//                                       for the llm.c file PATH (to OUT)
//
// Output, one item per line:
//   total N / rows R / file PATH / row I in: t... tg: t...
//   vocab V / eot E / token I HEX        (--tokenizer; HEX = the token's bytes)
//   ids I,I,...  or  error: MESSAGE      (--encode, a line per text)
//   pieces HEX,HEX,...                   (--split, a line per text)
//   text HEX                             (--decode, a line per line of ids)
// On an error: "error: MESSAGE" on stdout, exit code 1.
//
// Build (one line): g++ -std=c++17 -O2 -Wall -Wextra -I. tests/unit/dump_rows.cpp llmc/io/dataloader.cpp llmc/io/tokenizer.cpp llmc/io/tokenizer_export.cpp
//          llmc/io/bpe.cpp llmc/io/pretokenize.cpp llmc/io/unicode_table.cpp llmc/base/fileio.cpp -o dump_rows
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/io/dataloader.h"
#include "llmc/io/pretokenize.h"
#include "llmc/io/tokenizer.h"
#include "llmc/io/tokenizer_export.h"

namespace {

int dump_tokenizer(const std::string& path) {
    Tokenizer tok;
    std::string err;
    if (!tok.load(path, &err)) {
        std::printf("error: %s\n", err.c_str());
        return 1;
    }
    std::printf("vocab %d\neot %d\n", tok.vocab_size(), tok.eot());
    for (int i = 0; i < tok.vocab_size(); ++i) {
        std::string hex;
        for (unsigned char c : tok.decode(i)) {
            char b[3];
            std::snprintf(b, sizeof(b), "%02x", c);
            hex += b;
        }
        std::printf("token %d %s\n", i, hex.c_str());
    }
    return 0;
}

// The texts of a file of hex lines, or false.
bool read_hex_lines(const std::string& path, std::vector<std::string>* texts) {
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) {
        std::printf("error: cannot open %s\n", path.c_str());
        return false;
    }
    std::string line;
    for (int ch; (ch = std::fgetc(f)) != EOF;) {
        if (ch != '\n') {
            line.push_back((char)ch);
            continue;
        }
        std::string text;
        for (size_t i = 0; i + 1 < line.size(); i += 2) text.push_back((char)std::stoi(line.substr(i, 2), nullptr, 16));
        texts->push_back(text);
        line.clear();
    }
    std::fclose(f);
    return true;
}

int encode_texts(const std::string& path, const std::string& file) {
    Tokenizer tok;
    std::string err;
    if (!tok.load(path, &err)) {
        std::printf("error: %s\n", err.c_str());
        return 1;
    }
    std::vector<std::string> texts;
    if (!read_hex_lines(file, &texts)) return 1;
    for (const std::string& text : texts) {
        std::vector<int> ids;
        if (!tok.encode(text, &ids, &err)) {
            std::printf("error: %s\n", err.c_str());
            continue;
        }
        std::printf("ids ");
        for (size_t i = 0; i < ids.size(); i++) std::printf(i ? ",%d" : "%d", ids[i]);
        std::printf("\n");
    }
    return 0;
}

int decode_ids(const std::string& path, const std::string& file) {
    Tokenizer tok;
    std::string err;
    if (!tok.load(path, &err)) {
        std::printf("error: %s\n", err.c_str());
        return 1;
    }
    FILE* f = std::fopen(file.c_str(), "r");
    if (!f) {
        std::printf("error: cannot open %s\n", file.c_str());
        return 1;
    }
    std::vector<int> ids;
    std::string num;
    for (int ch; (ch = std::fgetc(f)) != EOF;) {
        if (ch == ',' || ch == '\n') {
            if (!num.empty()) ids.push_back(std::atoi(num.c_str()));
            num.clear();
        } else {
            num.push_back((char)ch);
        }
        if (ch != '\n') continue;
        std::printf("text ");
        for (unsigned char c : tok.decode_text(ids)) std::printf("%02x", c);
        std::printf("\n");
        ids.clear();
    }
    std::fclose(f);
    return 0;
}

int hf_json(const std::string& path, const std::string& out) {
    Tokenizer tok;
    std::string err, text;
    if (!tok.load(path, &err) || !tokenizer_json_of(tok, &text, &err)) {
        std::printf("error: %s\n", err.c_str());
        return 1;
    }
    FILE* f = std::fopen(out.c_str(), "w");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
        std::printf("error: cannot write %s\n", out.c_str());
        return 1;
    }
    return 0;
}

int split_texts(const std::string& name, const std::string& file) {
    std::vector<std::string> texts;
    if (!read_hex_lines(file, &texts)) return 1;
    for (const std::string& text : texts) {
        std::vector<std::string> pieces;
        split_text(name == "gpt2" ? SplitPattern::gpt2 : SplitPattern::llama3, text, &pieces);
        std::printf("pieces ");
        for (size_t i = 0; i < pieces.size(); i++) {
            std::printf(i ? "," : "");
            for (unsigned char c : pieces[i]) std::printf("%02x", c);
        }
        std::printf("\n");
    }
    return 0;
}

int dump_rows(const std::string& pattern, int T, int vocab, long long nrows_arg) {
    DataLoader dl;
    std::string err;
    if (!dl.open(pattern, T, vocab, &err)) {
        std::printf("error: %s\n", err.c_str());
        return 1;
    }
    std::printf("total %zu\nrows %zu\n", dl.total_tokens(), dl.rows_per_epoch());
    for (const std::string& f : dl.files()) std::printf("file %s\n", f.c_str());
    const size_t nrows = nrows_arg >= 0 ? (size_t)nrows_arg : dl.rows_per_epoch() + 2;
    std::vector<int> in((size_t)T), tg((size_t)T);
    for (size_t r = 0; r < nrows; ++r) {
        if (!dl.read_rows(r, 1, in.data(), tg.data(), &err)) {
            std::printf("error: %s\n", err.c_str());
            return 1;
        }
        std::printf("row %zu in:", r);
        for (int v : in) std::printf(" %d", v);
        std::printf(" tg:");
        for (int v : tg) std::printf(" %d", v);
        std::printf("\n");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--tokenizer") return dump_tokenizer(argv[2]);
    if (argc == 4 && std::string(argv[1]) == "--encode") return encode_texts(argv[2], argv[3]);
    if (argc == 4 && std::string(argv[1]) == "--split") return split_texts(argv[2], argv[3]);
    if (argc == 4 && std::string(argv[1]) == "--decode") return decode_ids(argv[2], argv[3]);
    if (argc == 4 && std::string(argv[1]) == "--hf-json") return hf_json(argv[2], argv[3]);
    if (argc != 4 && argc != 5) {
        std::fprintf(stderr, "usage: %s PATTERN T VOCAB [NROWS] | --tokenizer PATH | --encode PATH TEXTS | --split gpt2|llama3 TEXTS | --decode PATH IDS | --hf-json PATH OUT\n", argv[0]);
        return 2;
    }
    const int T = std::atoi(argv[2]);
    const int vocab = std::atoi(argv[3]);
    const long long nrows = argc == 5 ? std::atoll(argv[4]) : -1;
    return dump_rows(argv[1], T, vocab, nrows);
}
