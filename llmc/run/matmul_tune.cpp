// llmc/run/matmul_tune.cpp: --matmul-tune 1 in a run (matmul_tune.h).
#include "llmc/run/matmul_tune.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"

// ---- the texts and the agreement ----------------------------------------------------------
namespace {

std::vector<std::string> split_tabs(const std::string& line) {
    std::vector<std::string> out;
    size_t a = 0;
    for (;;) {
        size_t b = line.find('\t', a);
        out.push_back(line.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) return out;
        a = b + 1;
    }
}

std::string num(double x) {
    if (std::isinf(x)) return "inf";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", x);
    return buf;
}

// A time (ms, >= 0 or inf) or a count (a whole number >= lo) from text.
bool parse_ms(const std::string& s, double* x) {
    char* end = nullptr;
    *x = std::strtod(s.c_str(), &end);
    return !s.empty() && *end == '\0' && !std::isnan(*x) && *x >= 0;
}
bool parse_count(const std::string& s, int lo, int* x) {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    *x = (int)v;
    return !s.empty() && *end == '\0' && v >= lo && v < (1L << 30);
}

bool fail(std::string* err, int line, const std::string& why) {
    *err = "line " + std::to_string(line) + ": " + why;
    return false;
}

}  // namespace

std::string format_matmul_trials(const std::vector<MatmulTrial>& trials) {
    std::string out;
    for (const MatmulTrial& t : trials) {
        out += t.shape;
        for (size_t i = 0; i < t.ids.size(); i++) out += "\t" + t.ids[i] + "\t" + num(t.ms[i]);
        out += "\n";
    }
    return out;
}

bool parse_matmul_trials(const std::string& text, std::vector<MatmulTrial>* trials, std::string* err) {
    trials->clear();
    std::istringstream in(text);
    std::string line;
    for (int n = 1; std::getline(in, line); n++) {
        std::vector<std::string> f = split_tabs(line);
        if (f.size() < 3 || f.size() % 2 == 0 || f[0].empty())
            return fail(err, n, "expected a shape, then pairs of an algorithm and its time");
        MatmulTrial t;
        t.shape = f[0];
        for (size_t i = 1; i < f.size(); i += 2) {
            double ms;
            if (f[i].empty() || !parse_ms(f[i + 1], &ms)) return fail(err, n, "bad algorithm or time '" + f[i + 1] + "'");
            t.ids.push_back(f[i]);
            t.ms.push_back(ms);
        }
        trials->push_back(std::move(t));
    }
    return true;
}

std::vector<MatmulDecision> agree_matmul_choices(const std::vector<std::vector<MatmulTrial>>& per_rank) {
    // The shapes in order of first appearance, each with the trials of the
    // ranks that ran it (in rank order).
    std::vector<std::string> order;
    std::map<std::string, std::vector<const MatmulTrial*>> by_shape;
    for (const auto& trials : per_rank)
        for (const MatmulTrial& t : trials) {
            auto& v = by_shape[t.shape];
            if (v.empty()) order.push_back(t.shape);
            v.push_back(&t);
        }
    std::vector<MatmulDecision> out;
    for (const std::string& shape : order) {
        const std::vector<const MatmulTrial*>& ts = by_shape[shape];
        const MatmulTrial& first = *ts[0];
        MatmulDecision d;
        d.shape = shape;
        d.candidates = (int)first.ids.size();
        d.ranks = (int)ts.size();
        bool found = false;
        double first_sum = NAN;
        for (size_t c = 0; c < first.ids.size(); c++) {
            // The candidate's time summed over the ranks; out if one rank
            // lacks it or could not run it.
            double sum = 0;
            for (const MatmulTrial* t : ts) {
                double ms = INFINITY;
                for (size_t j = 0; j < t->ids.size(); j++)
                    if (t->ids[j] == first.ids[c]) ms = t->ms[j];
                sum += ms;
            }
            if (c == 0) first_sum = sum;
            if (std::isinf(sum)) continue;
            if (!found || sum < d.ms) d.ms = sum, d.id = first.ids[c], found = true;
        }
        if (!found) continue;
        d.ms /= d.ranks;
        d.first_ms = first_sum / d.ranks;
        d.first_id = first.ids[0];
        out.push_back(d);
    }
    return out;
}

std::string format_matmul_choices(const std::string& scope, const std::vector<MatmulDecision>& decisions) {
    std::string out = "# matmul algorithms for: " + scope + "\n";
    for (const MatmulDecision& d : decisions)
        out += d.shape + "\t" + d.id + "\t" + num(d.ms) + "\t" + d.first_id + "\t" + num(d.first_ms) + "\t" +
               std::to_string(d.candidates) + "\t" + std::to_string(d.ranks) + "\n";
    return out;
}

bool parse_matmul_choices(const std::string& text, std::string* scope, std::vector<MatmulDecision>* decisions,
                          std::string* err) {
    static const std::string head = "# matmul algorithms for: ";
    decisions->clear();
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line.compare(0, head.size(), head) != 0)
        return fail(err, 1, "expected '" + head + "SCOPE'");
    *scope = line.substr(head.size());
    for (int n = 2; std::getline(in, line); n++) {
        std::vector<std::string> f = split_tabs(line);
        MatmulDecision d;
        if (f.size() != 7 || f[0].empty() || f[1].empty() || f[3].empty())
            return fail(err, n, "expected shape, algorithm, ms, untuned algorithm, its ms, candidates, ranks");
        d.shape = f[0], d.id = f[1], d.first_id = f[3];
        if (!parse_ms(f[2], &d.ms) || !parse_ms(f[4], &d.first_ms) || !parse_count(f[5], 1, &d.candidates) ||
            !parse_count(f[6], 1, &d.ranks))
            return fail(err, n, "bad number in '" + line + "'");
        decisions->push_back(d);
    }
    return true;
}

MatmulChoices choices_of(const std::vector<MatmulDecision>& decisions) {
    MatmulChoices c;
    for (const MatmulDecision& d : decisions) c[d.shape] = d.id;
    return c;
}

std::string describe_matmul_decision(const MatmulDecision& d) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.4f ms (untuned %.4f ms, x%.3f; %d candidate%s, %d rank%s)", d.ms, d.first_ms,
                  d.ms > 0 && std::isfinite(d.first_ms) ? d.first_ms / d.ms : 1.0, d.candidates,
                  d.candidates == 1 ? "" : "s", d.ranks, d.ranks == 1 ? "" : "s");
    return d.shape + ": " + (d.id == d.first_id ? "untuned " + d.id : d.id) + ", " + buf;
}

// ---- the run ------------------------------------------------------------------------------
constexpr int kCandidates = 8;  // of cuBLASLt's heuristic, per shape

std::string matmul_tuning_file(const std::string& output_dir) {
    return output_dir.empty() ? "" : output_dir + "/matmul_tuning.txt";
}

void MatmulTuning::start(Backend& be, bool flag, const std::string& output_dir, bool main_rank) {
    if (!flag) return;
    scope = be.matmul_scope();
    if (scope.empty()) {
        if (main_rank)
            std::printf("matmul tuning: the %s backend has one algorithm per product: nothing to time\n", be.name());
        return;
    }
    pending = true;
    file = matmul_tuning_file(output_dir);
    std::string text;
    if (main_rank && !file.empty()) read_text(file, &text);  // "" when there is none
    dist_broadcast(&text);
    if (text.empty()) return;
    // An earlier run's choices: taken when they hold for this device and
    // library; otherwise (or unreadable) the shapes are timed again and the
    // file rewritten. It is a cache: nothing in it is needed to train.
    std::string saved_scope, err;
    std::vector<MatmulDecision> saved;
    if (!parse_matmul_choices(text, &saved_scope, &saved, &err)) {
        if (main_rank)
            std::fprintf(stderr, "train_gpt: warning: %s: %s; timing the products again\n", file.c_str(),
                         err.c_str());
        return;
    }
    if (saved_scope != scope) {
        if (main_rank)
            std::printf("matmul tuning: %s holds timings on %s, this run is on %s: timing again\n", file.c_str(),
                        saved_scope.c_str(), scope.c_str());
        return;
    }
    decisions = saved;
    be.choose_matmul_algorithms(choices_of(decisions));
    if (main_rank)
        std::printf("matmul tuning: %zu shapes' algorithms from %s (shapes not in it are timed after the first "
                    "step)\n", decisions.size(), file.c_str());
}

void MatmulTuning::tune(Backend& be, bool main_rank) {
    pending = false;
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<MatmulTrial> mine = be.time_matmul_candidates(kCandidates);
    const double own_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<std::string> all = dist_gather_strings(format_matmul_trials(mine));
    std::string text;
    if (main_rank) {
        std::vector<std::vector<MatmulTrial>> per_rank(all.size());
        std::string err;
        for (size_t r = 0; r < all.size(); r++)
            if (!parse_matmul_trials(all[r], &per_rank[r], &err))
                dist_abort("matmul tuning: rank " + std::to_string(r) + "'s timings: " + err);
        text = format_matmul_choices(scope, agree_matmul_choices(per_rank));
    }
    dist_broadcast(&text);
    std::string sc, err;
    std::vector<MatmulDecision> fresh;
    if (!parse_matmul_choices(text, &sc, &fresh, &err)) dist_abort("matmul tuning: rank 0's choices: " + err);
    be.choose_matmul_algorithms(choices_of(fresh));
    if (!main_rank || fresh.empty()) return;
    // The log: each shape's choice, then one line for all (one call of each
    // shape, timed; a step calls most of them once per layer).
    double ms = 0, first_ms = 0;
    int changed = 0;
    for (const MatmulDecision& d : fresh) {
        std::printf("matmul tuning: %s\n", describe_matmul_decision(d).c_str());
        ms += d.ms, first_ms += d.first_ms, changed += d.id != d.first_id;
    }
    std::printf("matmul tuning: %zu shapes timed (up to %d candidates each, %.2f s on rank 0), %d changed: one call "
                "of each takes %.3f ms, %.3f ms untuned (x%.3f)\n",
                fresh.size(), kCandidates, own_s, changed, ms, first_ms, ms > 0 ? first_ms / ms : 1.0);
    std::fflush(stdout);
    decisions.insert(decisions.end(), fresh.begin(), fresh.end());
    if (file.empty()) return;
    AtomicWriter w;
    const std::string out = format_matmul_choices(scope, decisions);
    if (!w.open(file, &err) || !w.write(out.data(), out.size()) || !w.commit(&err))
        std::fprintf(stderr, "train_gpt: warning: %s: %s (the choices hold for this run only)\n", file.c_str(),
                     err.c_str());
    else
        std::printf("matmul tuning: choices kept in %s\n", file.c_str());
    std::fflush(stdout);
}
