// llmc/run/stragglers.cpp: the straggler check (llmc/run/stragglers.h).
#include "llmc/run/stragglers.h"

#include <algorithm>
#include <cstdio>

#include "llmc/comm/comm.h"

double median_without(const std::vector<double>& v, int skip) {
    std::vector<double> r;
    for (size_t i = 0; i < v.size(); i++)
        if ((int)i != skip) r.push_back(v[i]);
    if (r.empty()) return 0;
    std::sort(r.begin(), r.end());
    const size_t n = r.size();
    return n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
}

std::vector<int> straggling_ranks(const std::vector<double>& work_ms, double factor) {
    std::vector<int> slow;
    if (work_ms.size() < 2) return slow;
    for (size_t r = 0; r < work_ms.size(); r++) {
        const double m = median_without(work_ms, (int)r);
        if (m > 0 && work_ms[r] > factor * m && work_ms[r] - m >= kStragglerMinExcessMs) slow.push_back((int)r);
    }
    return slow;
}

std::string StragglerCheck::line() const {
    if (slow.empty()) return "";
    char b[160];
    std::string s = "stragglers over steps " + std::to_string(first_step) + "-" + std::to_string(last_step) +
                    " (work per step: the step less the time spent waiting for peers):";
    for (size_t i = 0; i < slow.size(); i++) {
        const int r = slow[i];
        const double m = median_without(work_ms, r);
        std::snprintf(b, sizeof b, "%s rank %d %.1f ms, %.1fx the other ranks' median %.1f ms", i ? ";" : "", r,
                      work_ms[(size_t)r], work_ms[(size_t)r] / m, m);
        s += b;
    }
    std::snprintf(b, sizeof b, " (--straggler-factor %g)", factor);
    return s + b;
}

std::string StragglerCheck::json() const {
    std::string s = "\"work_ms\": [";
    char b[32];
    for (size_t i = 0; i < work_ms.size(); i++) {
        std::snprintf(b, sizeof b, "%s%.3f", i ? ", " : "", work_ms[i]);
        s += b;
    }
    s += "], \"stragglers\": [";
    for (size_t i = 0; i < slow.size(); i++) s += (i ? ", " : "") + std::to_string(slow[i]);
    return s + "]";
}

bool StragglerWatch::after_step(int step, double now_s, double blocked_s, Comm& world, StragglerCheck* out) {
    if (!on()) return false;
    if (from_ < 0 || step < from_) {  // the first step (or a resumed run's) opens the first window after it
        from_ = step + 1, opened_ = now_s, blocked_from_ = blocked_s;
        return false;
    }
    if ((step + 1) % every_ != 0) return false;
    const int steps = step + 1 - from_;
    const double mine = std::max(0.0, 1000.0 * ((now_s - opened_) - (blocked_s - blocked_from_))) / steps;
    std::vector<double> all((size_t)world.size(), 0.0);
    all[(size_t)world.rank()] = mine;
    world.host_all_reduce_n(all.data(), all.size(), ReduceOp::Sum);
    out->first_step = from_ + 1, out->last_step = step + 1;
    out->work_ms = all;
    out->slow = straggling_ranks(all, factor_);
    out->factor = factor_;
    from_ = step + 1, opened_ = now_s, blocked_from_ = blocked_s;
    return true;
}
