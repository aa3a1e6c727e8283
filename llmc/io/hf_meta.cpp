// llmc/io/hf_meta.cpp: the tokenizer, generation and special-token files of
// an exported Hugging Face directory (see hf_meta.h), with nlohmann-json.
#include "llmc/io/hf_meta.h"

#include <fstream>
#include <sstream>

#include "llmc/base/fileio.h"

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Carried over from the source directory as they are when it has them.
const char* const kHfSideFiles[] = {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                                    "added_tokens.json",     "vocab.json",              "merges.txt",
                                    "tokenizer.model"};
const int kHfSideFileCount = sizeof(kHfSideFiles) / sizeof(kHfSideFiles[0]);

static bool write_text(const std::string& path, const std::string& text, std::string* err) {
    AtomicWriter w;
    if (!w.open(path, err)) return false;
    w.write(text.data(), text.size());  // a failed write makes commit fail
    return w.commit(err);
}

static bool copy_file(const std::string& from, const std::string& to, std::string* err) {
    std::string data;
    if (!read_text(from, &data)) {
        *err = from + ": cannot open";
        return false;
    }
    return write_text(to, data, err);
}

// A JSON file of the source directory, or null when it has none (or it is
// not JSON: the copy then carries it as it is, and nothing is read from it).
static json source_json(const HfExtras& x, const char* name) {
    std::string text;
    if (x.source_dir.empty() || !read_text(x.source_dir + "/" + name, &text)) return nullptr;
    return json::parse(text, nullptr, false);
}

// The source's special token ids (config.json, else generation_config.json).
static json source_ids(const HfExtras& x) {
    json ids = json::object();
    for (const char* file : {"generation_config.json", "config.json"}) {
        const json j = source_json(x, file);
        if (!j.is_object()) continue;
        for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
            if (j.contains(k) && !j[k].is_null()) ids[k] = j[k];
    }
    return ids;
}

void hf_keep_source_fields(ojson& config, const HfExtras& x) {
    const json src = source_json(x, "config.json");
    if (!src.is_object()) return;
    for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout",
                          "output_router_logits", "router_jitter_noise", "initializer_range", "use_cache"})
        if (src.contains(k)) config[k] = src[k];
}

void hf_token_ids(ojson& config, const HfExtras& x) {
    const json ids = source_ids(x);
    if (ids.contains("bos_token_id")) config["bos_token_id"] = ids["bos_token_id"];
    else if (x.eot >= 0) config["bos_token_id"] = x.eot;
    if (ids.contains("eos_token_id")) config["eos_token_id"] = ids["eos_token_id"];
    else if (x.eot >= 0) config["eos_token_id"] = x.eot;
    if (ids.contains("pad_token_id")) config["pad_token_id"] = ids["pad_token_id"];
}

// The text of token id in a tokenizer.json (its added tokens, then its
// vocabulary), or "" when it has none.
static std::string token_text(const std::string& tokenizer_json, int id) {
    std::string text;
    if (id < 0 || !read_text(tokenizer_json, &text)) return "";
    const json j = json::parse(text, nullptr, false);
    if (!j.is_object()) return "";
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const json& t : j["added_tokens"])
            if (t.value("id", -1) == id && t.contains("content")) return t["content"].get<std::string>();
    if (j.contains("model") && j["model"].contains("vocab") && j["model"]["vocab"].is_object())
        for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
            if (it.value().is_number_integer() && it.value().get<int>() == id) return it.key();
    return "";
}

bool hf_write_side_files(const std::string& dir, const HfExtras& x, int max_len, std::string* err) {
    if (!x.tokenizer_json.empty() && !copy_file(x.tokenizer_json, dir + "/tokenizer.json", err)) return false;
    if (x.tokenizer_json.empty() && !x.tokenizer_json_text.empty() &&
        !write_text(dir + "/tokenizer.json", x.tokenizer_json_text, err))
        return false;
    bool have[sizeof(kHfSideFiles) / sizeof(kHfSideFiles[0])] = {};
    for (int i = 0; i < kHfSideFileCount; i++) {
        const std::string from = x.source_dir.empty() ? "" : x.source_dir + "/" + kHfSideFiles[i];
        if (from.empty() || file_size(from) < 0) continue;
        if (!copy_file(from, dir + "/" + kHfSideFiles[i], err)) return false;
        have[i] = true;
    }
    ojson ids;
    hf_token_ids(ids, x);
    if (!have[2]) {  // generation_config.json: the token ids generate() stops and starts on
        ojson g = ids;
        g["transformers_version"] = "4.40.2";
        if (!write_text(dir + "/generation_config.json", g.dump(2) + "\n", err)) return false;
    }
    // A fast tokenizer over tokenizer.json needs its class and special tokens
    // named; without a tokenizer.json there is nothing for them to describe.
    const std::string tok = x.tokenizer_json.empty() && x.tokenizer_json_text.empty() ? "" : dir + "/tokenizer.json";
    // eos may be one id or a list of them (Llama 3): the first names the token.
    const ojson eos = ids.contains("eos_token_id") ? ids["eos_token_id"] : ojson();
    const int eos_id = eos.is_number_integer() ? eos.get<int>()
                       : eos.is_array() && !eos.empty() && eos[0].is_number_integer() ? eos[0].get<int>() : -1;
    const int bos_id = ids.contains("bos_token_id") && ids["bos_token_id"].is_number_integer()
                           ? ids["bos_token_id"].get<int>() : eos_id;
    const std::string eos_text = tok.empty() ? "" : token_text(tok, eos_id);
    const std::string bos_text = tok.empty() ? "" : token_text(tok, bos_id);
    // The source's own tokenizer_config.json names its special tokens (and
    // transformers reads them there when special_tokens_map.json is absent):
    // only a directory with neither gets them written, each from its own id.
    if (have[0] || tok.empty()) return true;
    ojson t;
    t["tokenizer_class"] = "PreTrainedTokenizerFast";
    t["model_max_length"] = max_len;
    t["clean_up_tokenization_spaces"] = false;
    ojson s;
    if (!bos_text.empty()) t["bos_token"] = s["bos_token"] = bos_text;
    if (!eos_text.empty()) t["eos_token"] = s["eos_token"] = eos_text;
    if (!write_text(dir + "/tokenizer_config.json", t.dump(2) + "\n", err)) return false;
    if (!have[1] && !s.empty() && !write_text(dir + "/special_tokens_map.json", s.dump(2) + "\n", err)) return false;
    return true;
}
