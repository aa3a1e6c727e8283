// llmc/run/model_source.cpp: what -e, --convert and --tokenizer name
// (llmc/run/model_source.h).
#include "llmc/run/model_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/hf.h"
#include "llmc/io/model_io.h"
#include "llmc/run/startup.h"

std::string shards_tokenizer(const std::string& pattern) {
    const size_t slash = pattern.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : pattern.substr(0, slash);
    for (const char* name : {"tokenizer.json", "tokenizer.bin"})
        if (file_size(dir + "/" + name) > 0) return dir + "/" + name;
    return "";
}

std::string inherit_run_flags(const std::string& root, const ArgParser& parser, TrainConfig& cfg) {
    std::ifstream f(root + "/run_config.json");
    nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (!f || !j.is_object()) return "";
    if (j.contains("resolved") && j["resolved"].is_object()) {  // ArgParser::run_json's record
        nlohmann::json r = j["resolved"];
        j = r;
    }
    std::string took;
    for (auto flag : {std::make_pair("model", &cfg.model), std::make_pair("train-data", &cfg.train_data),
                      std::make_pair("tokenizer", &cfg.tokenizer)}) {
        if (parser.given(flag.first) || !j.contains(flag.first) || !j[flag.first].is_string()) continue;
        *flag.second = j[flag.first].get<std::string>();
        took += std::string(took.empty() ? "" : ", ") + flag.first + " " + *flag.second;
    }
    return took;
}

void setup_tokenizer(const ArgParser& parser, TrainConfig& cfg, Tokenizer* tok) {
    if (!parser.given("tokenizer") && cfg.tokenizer.empty()) {
        if (is_hf_dir(cfg.model) && !hf_tokenizer_path(cfg.model).empty()) cfg.tokenizer = hf_tokenizer_path(cfg.model);
        else cfg.tokenizer = shards_tokenizer(cfg.train_data);
    }
    setup_check(!parser.given("tokenizer") || cfg.tokenizer.empty() || file_size(cfg.tokenizer) >= 0,
                "flag --tokenizer '" + cfg.tokenizer + "': not a readable file (give \"\" for byte-level samples)");
    std::string err;
    if (!cfg.tokenizer.empty()) setup_check(tok->load(cfg.tokenizer, &err), err);
    else tok->init_bytes();
}

void warn_tokenizer_mismatch(const TrainConfig& cfg, const Tokenizer& tok) {
    const std::string made_with = shards_tokenizer(cfg.train_data);
    if (dist_world_rank() != 0 || made_with.empty() || made_with == cfg.tokenizer) return;
    Tokenizer data;
    std::string err;
    if (!data.load(made_with, &err)) {
        std::fprintf(stderr, "train_gpt: warning: cannot compare the shards' tokenizer: %s\n", err.c_str());
        return;
    }
    std::string diff;
    if (data.vocab_size() != tok.vocab_size())
        diff = std::to_string(data.vocab_size()) + " tokens against " + std::to_string(tok.vocab_size());
    else if (data.eot() != tok.eot())
        diff = "end-of-text id " + std::to_string(data.eot()) + " against " + std::to_string(tok.eot());
    else
        for (int i = 0; i < data.vocab_size() && diff.empty(); i++)
            if (data.decode(i) != tok.decode(i))
                diff = "token " + std::to_string(i) + " is '" + Tokenizer::printable(data.decode(i)) + "' against '" +
                       Tokenizer::printable(tok.decode(i)) + "'";
    if (diff.empty()) return;
    const std::string run = cfg.tokenizer.empty() ? "the byte-level tokenizer" : cfg.tokenizer;
    std::fprintf(stderr, "train_gpt: warning: -i '%s' was tokenized with %s, and this run's tokenizer is %s (%s): "
                         "the model would read the ids as other text (give the data made with the model's tokenizer, "
                         "or --tokenizer %s if that one is right)\n",
                 cfg.train_data.c_str(), made_with.c_str(), run.c_str(), diff.c_str(), made_with.c_str());
}

int default_seq_len(const GPTConfig& mc) { return std::min(mc.max_seq_len, kDefaultMaxT); }

bool model_config(const TrainConfig& cfg, GPTConfig* mc, std::string* err) {
    if (is_hf_dir(cfg.model)) return read_hf_config(cfg.model, mc, err);
    if (spec_is_file(cfg.model)) {
        int version;
        return read_model_header(cfg.model, mc, &version, err);
    }
    if (parse_model_spec(cfg.model, mc, err)) return true;
    // No '=' and not dN: the user meant a path, and it is not there.
    const std::string& m = cfg.model;
    const bool descriptor = m.size() > 1 && m[0] == 'd' && m.find_first_not_of("0123456789", 1) == std::string::npos;
    if (m.find('=') == std::string::npos && !descriptor)
        *err = "no such file or directory '" + m +
               "' (a model is an llm.c model file, a Hugging Face directory, dN as d12, or sizes as L=4,C=128,NH=4,V=257)";
    *err = "flag -e: " + *err;
    return false;
}

bool convert_source(const std::string& path, std::string* root, int* step, std::string* model_file,
                    std::string* err) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    struct stat sb;
    model_file->clear();
    *step = -1;
    if (stat(p.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {  // a model file (its header is checked as it loads)
        const size_t s = p.find_last_of('/');
        *root = s == std::string::npos ? "." : p.substr(0, s);
        *model_file = p;
        return true;
    }
    if (stat(p.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        *err = "flag --convert: no such file or directory '" + path + "'";
        return false;
    }
    const size_t slash = p.find_last_of('/');
    const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
    const std::string parent = slash == std::string::npos ? "." : p.substr(0, slash);
    if (base.size() == 13 && base.compare(0, 5, "ckpt_") == 0 &&
        base.find_first_not_of("0123456789", 5) == std::string::npos) {
        *root = parent;
        *step = std::atoi(base.c_str() + 5);
        return true;
    }
    *step = latest_checkpoint(p);
    *root = p;
    if (*step >= 0) return true;
    // No checkpoint (a run without -n): the final weights a GPT-2 run writes
    // beside its metrics, model_SSSSSSSS.bin, the newest.
    std::string newest;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string f = it->path().filename().string();
        if (f.size() == 18 && f.compare(0, 6, "model_") == 0 && f.compare(14, 4, ".bin") == 0 &&
            f.find_first_not_of("0123456789", 6) == 14 && f > newest)
            newest = f;
    }
    if (!newest.empty()) {
        *model_file = p + "/" + newest;
        return true;
    }
    *err = "flag --convert: no complete checkpoint and no model_SSSSSSSS.bin in '" + path +
           "' (give a run's -o directory, one of its ckpt_SSSSSSSS directories, or a model file)";
    return false;
}

int newest_sound_checkpoint(const std::string& dir, bool main, std::string* err) {
    const std::vector<int> all = complete_checkpoints(dir);
    std::string damaged;
    for (int step : all) {
        const std::string why = checkpoint_problem(dir, step);
        if (why.empty()) {
            if (main && !damaged.empty())
                std::fprintf(stderr, "train_gpt: warning: -y 1: %s; resuming from %s instead (nothing was deleted)\n",
                             damaged.c_str(), checkpoint_dir(dir, step).c_str());
            return step;
        }
        damaged += (damaged.empty() ? "" : "; ") + checkpoint_dir(dir, step) + " fails its check (" + why + ")";
    }
    if (!all.empty()) *err = "flag -y: no checkpoint in " + dir + " passes its check: " + damaged;
    return -1;
}

int older_sound_checkpoint(const std::string& dir, int step, const GPTConfig& mc) {
    for (int s : complete_checkpoints(dir)) {
        GPTConfig c;
        std::string err;
        if (s < step && checkpoint_problem(dir, s).empty() && read_checkpoint_config(dir, s, &c, &err) && c == mc)
            return s;
    }
    return -1;
}

bool named_checkpoint(const std::string& dir, const std::string& name, int* step, std::string* err) {
    std::string n = name;
    while (n.size() > 1 && n.back() == '/') n.pop_back();
    const size_t slash = n.find_last_of('/');
    if (slash != std::string::npos) n = n.substr(slash + 1);
    if (n.compare(0, 5, "ckpt_") == 0) n = n.substr(5);
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) {
        *err = "flag --resume-from: '" + name + "' is not ckpt_SSSSSSSS or a step number";
        return false;
    }
    *step = std::atoi(n.c_str());
    const std::vector<int> all = complete_checkpoints(dir);
    if (std::find(all.begin(), all.end(), *step) == all.end()) {
        std::string have;
        for (int s : all) have += (have.empty() ? "" : ", ") + std::to_string(s);
        *err = "flag --resume-from: no complete checkpoint of step " + std::to_string(*step) + " in " + dir +
               (have.empty() ? " (there is none)" : " (complete: steps " + have + ")");
        return false;
    }
    const std::string why = checkpoint_problem(dir, *step);
    if (!why.empty()) {
        *err = "flag --resume-from: " + checkpoint_dir(dir, *step) + " fails its check (" + why + ")";
        return false;
    }
    return true;
}
