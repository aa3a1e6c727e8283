// llmc/base/args.cpp: see args.h.
#include "llmc/base/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

std::string option_value_string(const Option& o) {
    std::ostringstream s;
    switch (o.kind) {
        case Option::Int: s << *static_cast<int*>(o.target); break;
        case Option::Long: s << *static_cast<long long*>(o.target); break;
        case Option::Double: s << *static_cast<double*>(o.target); break;
        case Option::String: {
            const std::string& v = *static_cast<std::string*>(o.target);
            s << (v.empty() ? "\"\"" : v);
            break;
        }
    }
    return s.str();
}

bool ArgParser::set(const Option& o, const std::string& flag, const std::string& value, std::string* err) {
    auto bad = [&](const std::string& why) {
        *err = "flag " + flag + ": " + why;
        return false;
    };
    if (o.kind == Option::String) {
        // "" for an option whose value is still its default of "" means
        // "not given" (--plan "" as --help shows it), not a bad choice.
        const bool default_empty = value.empty() && static_cast<std::string*>(o.target)->empty();
        if (!o.choices.empty() && !default_empty) {
            bool found = false;
            std::string list;
            for (const std::string& c : o.choices) {
                found |= c == value;
                list += (list.empty() ? "" : "|") + c;
            }
            if (!found) return bad("'" + value + "' is not one of " + list);
        }
        *static_cast<std::string*>(o.target) = value;
        return true;
    }
    if (value.empty()) return bad("missing value");
    char* end = nullptr;
    errno = 0;
    double d = 0;
    long long i = 0;
    if (o.kind == Option::Double) {
        d = std::strtod(value.c_str(), &end);
        if (*end != '\0' || errno == ERANGE || !std::isfinite(d)) return bad("'" + value + "' is not a number");
    } else {
        i = std::strtoll(value.c_str(), &end, 10);
        if (*end != '\0' || errno == ERANGE) return bad("'" + value + "' is not an integer");
        if (o.kind == Option::Int && (i < -2147483647LL || i > 2147483647LL)) return bad("'" + value + "' is out of range");
        d = (double)i;
    }
    if (d < o.min || d > o.max) {
        std::ostringstream r;
        r << "'" << value << "' is outside [" << o.min << ", " << o.max << "]";
        return bad(r.str());
    }
    if (o.kind == Option::Double) *static_cast<double*>(o.target) = d;
    else if (o.kind == Option::Int) *static_cast<int*>(o.target) = (int)i;
    else *static_cast<long long*>(o.target) = i;
    return true;
}

// A word strtod reads whole ("-5", "-1e-3"): a value, not a flag.
// Edit distance (insertions, deletions, substitutions) between two words.
static size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); j++) row[j] = j;
    for (size_t i = 1; i <= a.size(); i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); j++) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

// The known flag closest to an unknown one ("--lrr" -> "--lr"), or "" when
// none is within a third of its length (at least 1, at most 3 edits).
std::string ArgParser::nearest_flag(const std::string& flag) const {
    std::string word = flag.substr(0, flag.find('='));
    while (!word.empty() && word[0] == '-') word.erase(0, 1);
    if (word.empty()) return "";
    for (char& ch : word)
        if (ch == '_') ch = '-';
    // Names other trainers (llm.c, nanoGPT, Megatron, torchtitan) give our flags.
    static const std::pair<const char*, const char*> kOtherNames[] = {
        {"learning-rate", "lr"},          {"max-lr", "lr"},
        {"warmup-steps", "warmup"},       {"warmup-iters", "warmup"},
        {"steps", "max-steps"},           {"train-steps", "max-steps"},
        {"num-steps", "max-steps"},       {"max-iters", "max-steps"},
        {"micro-batch-size", "batch-size"}, {"global-batch-size", "total-batch"},
        {"block-size", "seq-len"},        {"seq-length", "seq-len"},
        {"max-seq-len", "seq-len"},       {"clip-grad", "grad-clip"},
        {"out-dir", "output-dir"},        {"eval-interval", "val-every"},
    };
    for (const auto& [other, ours] : kOtherNames)
        if (word == other)
            for (const Option& o : options_)
                if (o.name == std::string(ours)) return std::string("--") + ours;
    const size_t limit = std::min<size_t>(3, std::max<size_t>(1, word.size() / 3));
    std::string best;
    size_t best_d = limit + 1;
    for (const Option& o : options_) {
        const size_t d = edit_distance(word, o.name);
        if (d < best_d) best_d = d, best = std::string("--") + o.name;
    }
    return best;
}

static bool looks_numeric(const char* w) {
    char* end = nullptr;
    std::strtod(w, &end);
    return end != w && *end == '\0';
}

// --config FILE: a JSON object of flags by long name ({"lr": 3e-4,
// "model": "d12", "sp": true}), set before the command line so that the
// command line overrides it. Numbers, strings and booleans (1/0); an
// unknown name is refused like an unknown flag.
bool ArgParser::apply_config(const std::string& path, std::string* err) {
    std::ifstream in(path);
    if (!in) {
        *err = "flag --config '" + path + "': cannot open";
        return false;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {  // where: line and column of the byte it stopped at
        const size_t at = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
        const size_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
        const size_t nl = text.rfind('\n', at > 0 ? at - 1 : 0);
        const size_t col = (nl == std::string::npos || at == 0) ? at + 1 : at - nl;
        *err = "flag --config '" + path + "': not valid JSON at line " + std::to_string(line) + ", column " +
               std::to_string(col);
        return false;
    }
    if (!j.is_object()) {
        *err = "flag --config '" + path + "': not a JSON object of flags ({\"lr\": 3e-4, ...})";
        return false;
    }
    // A run's run_config.json (run_json): the flags its run was given; the
    // rest resolve again for this run.
    if (j.size() == 2 && j.contains("given") && j.contains("resolved") && j["given"].is_object()) {
        nlohmann::json given = j["given"];
        j = given;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
        std::string name = it.key();
        while (!name.empty() && name[0] == '-') name.erase(0, 1);
        const Option* opt = nullptr;
        for (const Option& o : options_)
            if (name == o.name) opt = &o;
        if (!opt || name == "config") {
            const std::string near = nearest_flag(name);
            *err = "flag --config '" + path + "': unknown flag '" + it.key() + "'" +
                   (near.empty() ? "" : ": did you mean " + near.substr(2) + "?");
            return false;
        }
        const nlohmann::json& v = it.value();
        std::string value;
        if (v.is_string()) value = v.get<std::string>();
        else if (v.is_boolean()) value = v.get<bool>() ? "1" : "0";
        else if (v.is_number_integer()) value = std::to_string(v.get<long long>());
        else if (v.is_number()) value = v.dump();
        else {
            *err = "flag --config '" + path + "': '" + it.key() + "' must be a number, a string or true/false";
            return false;
        }
        if (!set(*opt, "--" + name + " (in " + path + ")", value, err)) return false;
        note_given(*opt);
    }
    return true;
}

// The option's value now, as JSON.
static nlohmann::ordered_json value_json(const Option& o) {
    switch (o.kind) {
        case Option::Int: return *static_cast<int*>(o.target);
        case Option::Long: return *static_cast<long long*>(o.target);
        case Option::Double: return *static_cast<double*>(o.target);
        case Option::String: break;
    }
    return *static_cast<std::string*>(o.target);
}

std::string ArgParser::resolved_json(bool (*keep)(const char* name)) const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const Option& o : options_) {
        if (std::string(o.name) == "config" || (keep && !keep(o.name))) continue;
        j[o.name] = value_json(o);
    }
    return j.dump(2) + "\n";
}

void ArgParser::note_given(const Option& o) {
    given_.push_back(o.name);
    const std::string v = value_json(o).dump();
    for (auto& g : given_values_)
        if (g.first == o.name) return (void)(g.second = v);
    given_values_.push_back({o.name, v});
}

std::string ArgParser::run_json(bool (*keep)(const char* name)) const {
    nlohmann::ordered_json j, given = nlohmann::ordered_json::object();
    for (const Option& o : options_)  // in the table's order
        for (const auto& g : given_values_)
            if (g.first == o.name && std::string(o.name) != "config" && (!keep || keep(o.name)))
                given[o.name] = nlohmann::ordered_json::parse(g.second);
    j["given"] = given;
    j["resolved"] = nlohmann::ordered_json::parse(resolved_json(keep));
    return j.dump(2) + "\n";
}

bool ArgParser::parse(int argc, char** argv, bool* help, std::string* err) {
    *help = false;
    // A config file first (its last --config wins), then every flag over it.
    std::string config;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--config" && i + 1 < argc) config = argv[i + 1];
        else if (a.rfind("--config=", 0) == 0) config = a.substr(9);
    }
    if (!config.empty() && !apply_config(config, err)) return false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            *help = true;
            return true;
        }
        const Option* opt = nullptr;
        std::string value;
        bool has_value = false;
        if (a.size() > 2 && a[0] == '-' && a[1] == '-') {
            std::string name = a.substr(2);
            size_t eq = name.find('=');
            if (eq != std::string::npos) {
                value = name.substr(eq + 1);
                name = name.substr(0, eq);
                has_value = true;
            }
            for (const Option& o : options_)
                if (name == o.name) opt = &o;
        } else if (a.size() == 2 && a[0] == '-') {
            for (const Option& o : options_)
                if (o.letter && a[1] == o.letter) opt = &o;
        }
        if (!opt) {
            const std::string near = nearest_flag(a);
            *err = "unknown flag '" + a + "'" + (near.empty() ? "" : ": did you mean " + near + "?") + " (see --help)";
            return false;
        }
        if (!has_value) {
            // The next word is this flag's value unless it looks like a flag:
            // "-5" is a value of a numeric option (so "-y -5" is refused for
            // its range, not as an unknown flag "-5"), and a string option
            // never takes a word starting with '-' ("-o -x 3" would make a
            // directory named "-x"): such a value is written --name=VALUE.
            const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
            const bool dash = next && next[0] == '-' && next[1] != '\0';
            const bool next_is_flag = !next || (dash && !(opt->kind != Option::String && looks_numeric(next)));
            if (opt->bare && next_is_flag) {
                value = opt->bare;
            } else if (!next) {
                *err = "flag " + a + ": missing value";
                return false;
            } else if (next_is_flag) {
                *err = "flag " + a + ": missing value (the next word, '" + next + "', is a flag; a value starting with '-' is written --" +
                       opt->name + "=VALUE)";
                return false;
            } else {
                value = argv[++i];
            }
        }
        if (!set(*opt, a, value, err)) return false;
        note_given(*opt);
    }
    return true;
}

bool ArgParser::given(const std::string& name) const {
    for (const std::string& g : given_)
        if (g == name) return true;
    return false;
}

std::string ArgParser::usage() const {
    std::ostringstream s;
    s << "usage: " << program_ << " [options]\n" << summary_ << "\n\noptions (default in brackets):\n";
    for (const Option& o : options_) {
        std::string flags = o.letter ? std::string("-") + o.letter + ", " : "    ";
        flags += std::string("--") + o.name;
        s << "  " << flags;
        for (size_t pad = flags.size(); pad < 24; pad++) s << ' ';
        s << ' ' << o.help << " [" << option_value_string(o) << "]";
        if (!o.choices.empty()) {
            s << " {";
            for (size_t k = 0; k < o.choices.size(); k++) s << (k ? "|" : "") << o.choices[k];
            s << "}";
        }
        s << "\n";
    }
    return s.str();
}
