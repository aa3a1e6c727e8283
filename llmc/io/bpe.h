// llmc/io/bpe.h: BpeEncoder, text -> token ids by byte-pair encoding, as the
// `tokenizers` library encodes with a tokenizer.json, or as tiktoken encodes
// GPT-2 with an llm.c tokenizer file (which holds no merges).
//
// What it does, in the order `tokenizers` does it:
//   1. added tokens (<|endoftext|>, <s>, ...) found in the text whole,
//      leftmost-longest, become their ids; the text between them goes on;
//   2. the normalizer: Prepend and string Replace steps (SentencePiece
//      style: " " -> U+2581, U+2581 first);
//   3. the pre-tokenizer: ByteLevel (its GPT-2 split and the byte-level
//      alphabet), Split with GPT-2's or Llama 3's pattern (Isolated),
//      Metaspace, or a Sequence of them;
//   4. the BPE model on each piece: characters (byte fallback <0xNN>, unk),
//      then the merge of lowest rank, leftmost first, until none applies;
//   5. the post-processor's special tokens around the ids (TemplateProcessing,
//      e.g. Llama's <s>), when asked for.
// Anything else in a tokenizer.json (another model type, normalizer or
// pattern) is refused by from_json with the reason, rather than encoded
// approximately.
#pragma once
#include <climits>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "llmc/io/pretokenize.h"

class BpeEncoder {
public:
    // From a parsed tokenizer.json; false with *why (one line) when it holds
    // something this encoder does not implement exactly.
    bool from_json(const nlohmann::json& j, std::string* why);
    // From an llm.c tokenizer file's tokens (ids -> bytes, no merges), as
    // tiktoken encodes GPT-2: see bpe.cpp. eot is left out (special tokens are
    // not made from text). false with *why when a byte has no token.
    bool from_token_bytes(const std::vector<std::string>& tokens, int eot, std::string* why);

    // The special tokens the post-processor puts around the text's ids
    // (transformers' add_bos_token / add_eos_token for Llama replace them).
    void set_template(std::vector<int> prefix, std::vector<int> suffix);
    // The id of a vocabulary entry or added token with this text, or -1.
    int token_id(const std::string& text) const;

    // text (UTF-8) -> ids; with_special adds the post-processor's tokens, as
    // tokenizers' encode and transformers' tokenizer(text) do by default.
    // false with *err when the text is not valid UTF-8.
    bool encode(const std::string& text, bool with_special, std::vector<int>* ids, std::string* err) const;

private:
    struct Norm {  // a normalizer step: prepend `a` (to non-empty text), or replace every `a` by `b`
        bool prepend;
        std::string a, b;
    };
    struct Pre {  // a pre-tokenizer step
        enum Kind { split, byte_level, metaspace } kind;
        SplitPattern pattern = SplitPattern::gpt2;  // split; byte_level with use_regex
        bool use_regex = true, add_prefix_space = false;
        std::string replacement;  // metaspace
        int prepend = 2;          // metaspace: 0 never, 1 first, 2 always
        bool ms_split = true;
    };
    struct Piece {
        std::string text;
        bool first;  // starts the whole text (Metaspace's prepend_scheme "first")
    };
    bool pre_step(const nlohmann::json& p, std::string* why);
    void pre_tokenize(const Pre& s, const Piece& in, std::vector<Piece>* out) const;
    void encode_segment(const std::string& seg, bool first, std::vector<int>* ids) const;
    void word(const std::string& w, std::vector<int>* ids) const;
    void word_by_id_rank(const std::string& w, std::vector<int>* ids) const;

    std::vector<Norm> norm_;
    std::vector<Pre> pre_;
    std::unordered_map<std::string, int> vocab_;
    std::unordered_map<uint64_t, std::pair<int, int>> merges_;  // (left id, right id) -> (rank, merged id)
    bool id_rank_ = false;  // an llm.c file: the rank of a merge is the merged token's id
    bool byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
    int unk_ = -1;
    // Added tokens: matched on the raw text first (normalized == false),
    // then on what is left (normalized == true; only without a normalizer).
    std::vector<std::pair<std::string, int>> raw_added_, norm_added_;
    std::vector<int> prefix_, suffix_;
};

// The tiktoken rule, which an llm.c tokenizer's ids follow (a merge's rank
// is the id of the token it makes): w's bytes merged, each time the
// adjacent pair whose concatenation is the token of lowest id in ids (a
// map from a token's bytes to its id; only ids below `below` count), until
// no pair is one; the parts left. The encoder (BpeEncoder, an llm.c file)
// and the export of such a tokenizer's merges (tokenizer_export.cpp) both.
template <class Map>
std::vector<std::string> merge_by_id_rank(const std::string& w, const Map& ids, int below = INT_MAX) {
    std::vector<std::string> parts;
    for (char c : w) parts.emplace_back(1, c);
    for (;;) {
        int best = INT_MAX, at = -1;
        for (size_t k = 0; k + 1 < parts.size(); k++) {
            auto it = ids.find(parts[k] + parts[k + 1]);
            if (it != ids.end() && it->second < below && it->second < best) best = it->second, at = (int)k;
        }
        if (at < 0) return parts;
        parts[(size_t)at] += parts[(size_t)at + 1];
        parts.erase(parts.begin() + at + 1);
    }
}
