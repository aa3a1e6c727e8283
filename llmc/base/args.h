// llmc/base/args.h: a table-driven command-line parser. Each option is one row
// (short letter, long name, value type, where it is stored, help text,
// allowed range or choices); parsing, validation and the --help text are
// all generated from the same rows, so the usage text cannot drift from
// what the parser accepts. Accepts "-x 5", "--max-steps 5", "--max-steps=5",
// and for on/off options (those with a `bare` value) the flag alone
// ("--sp" means "--sp 1", as users of Megatron-LM expect).
#pragma once
#include <string>
#include <utility>
#include <vector>

struct Option {
    enum Kind { Int, Long, Double, String };
    char letter;           // 0 when the option has only a long name
    const char* name;      // long name, without "--"
    Kind kind;
    void* target;          // int*, long long*, double* or std::string*
    const char* help;
    double min = -1e300, max = 1e300;      // numeric range, inclusive
    std::vector<std::string> choices = {};  // allowed strings (empty: any)
    const char* bare = nullptr;             // value of the flag given alone (null: a value is required)
};

class ArgParser {
  public:
    ArgParser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}
    void add(const Option& o) { options_.push_back(o); }
    // Parses argv into the targets. Returns false with a one-line *err that
    // names the flag and the value; sets *help when -h/--help was given.
    bool parse(int argc, char** argv, bool* help, std::string* err);
    // Usage text: every option with its letter, long name, default (the
    // target's value when this is called) and help.
    std::string usage() const;
    const std::vector<Option>& options() const { return options_; }
    // Whether the command line (or --config's file) set the option (by long name).
    bool given(const std::string& name) const;
    // Every option's value as a JSON object by long name: those keep()
    // accepts (all without it), --config left out.
    std::string resolved_json(bool (*keep)(const char* name) = nullptr) const;
    // A run's record of its flags, {"given": {...}, "resolved": {...}}: the
    // values the command line and --config's file gave (as parsed, before
    // the run resolved anything), and resolved_json's. --config reads such a
    // file's "given" part alone, so the defaults it left open (the total
    // batch, T) resolve again for the world and layout of the new run; a
    // flat object of flags it reads whole.
    std::string run_json(bool (*keep)(const char* name) = nullptr) const;

  private:
    bool set(const Option& o, const std::string& flag, const std::string& value, std::string* err);
    std::string nearest_flag(const std::string& flag) const;
    bool apply_config(const std::string& path, std::string* err);
    std::string program_, summary_;
    std::vector<Option> options_;
    void note_given(const Option& o);
    std::vector<std::string> given_;
    std::vector<std::pair<std::string, std::string>> given_values_;  // name, the value as JSON text when given
};

std::string option_value_string(const Option& o);
