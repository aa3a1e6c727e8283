// llmc/io/tokenizer_export.cpp: a tokenizer.json for an llm.c tokenizer
// (llmc/io/tokenizer_export.h).
#include "llmc/io/tokenizer_export.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "llmc/io/bpe.h"
#include "llmc/io/pretokenize.h"
#include "llmc/io/tokenizer.h"

bool tokenizer_json_of(const Tokenizer& tok, std::string* text, std::string* why) {
    using ojson = nlohmann::ordered_json;
    const int V = tok.vocab_size(), eot = tok.eot();
    std::map<std::string, int> id_of;  // a token's bytes -> its id
    for (int i = 0; i < V; i++) {
        if (i == eot) continue;
        const std::string b = tok.decode(i);
        if (b.empty() || !id_of.emplace(b, i).second) {
            *why = b.empty() ? "token " + std::to_string(i) + " has no bytes"
                             : "tokens " + std::to_string(id_of[b]) + " and " + std::to_string(i) + " have the same bytes";
            return false;
        }
    }
    for (int b = 0; b < 256; b++)
        if (!id_of.count(std::string(1, (char)b))) {
            *why = "byte " + std::to_string(b) + " has no token of its own";
            return false;
        }
    // Token i's merge: the tiktoken rule on its bytes over the tokens below i
    // ends in two parts (the merge), or it is no BPE token.
    std::vector<std::pair<int, std::pair<std::string, std::string>>> merges;  // (id, (left, right))
    for (const auto& kv : id_of) {
        const std::string& t = kv.first;
        const int id = kv.second;
        if (t.size() < 2) continue;
        const std::vector<std::string> parts = merge_by_id_rank(t, id_of, id);
        if (parts.size() != 2) {
            *why = "token " + std::to_string(id) + " is not made by one merge of lower tokens (the tiktoken rule leaves " +
                   std::to_string(parts.size()) + " parts)";
            return false;
        }
        merges.push_back({id, {parts[0], parts[1]}});
    }
    std::sort(merges.begin(), merges.end());  // in rank order: the id of the token each makes
    ojson vocab = ojson::object(), merge_list = ojson::array();
    std::vector<std::pair<int, std::string>> by_id;
    for (const auto& kv : id_of) by_id.push_back({kv.second, kv.first});
    std::sort(by_id.begin(), by_id.end());
    for (const auto& e : by_id) vocab[byte_level_text(e.second)] = e.first;
    for (const auto& m : merges) merge_list.push_back(byte_level_text(m.second.first) + " " + byte_level_text(m.second.second));
    ojson j;
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    j["added_tokens"] = ojson::array();
    if (eot >= 0 && eot < V) {
        const std::string eot_text = tok.decode(eot);
        vocab[eot_text] = eot;
        j["added_tokens"].push_back({{"id", eot}, {"content", eot_text}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", true}, {"special", true}});
    }
    const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                              {"use_regex", true}};
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level;
    j["post_processor"] = byte_level;
    j["decoder"] = byte_level;
    j["model"] = {{"type", "BPE"},          {"dropout", nullptr},          {"unk_token", nullptr},
                  {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                  {"byte_fallback", false}, {"ignore_merges", false},    {"vocab", vocab},
                  {"merges", merge_list}};
    *text = j.dump(2) + "\n";
    return true;
}
