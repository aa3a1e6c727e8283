// llmc/run/metrics.cpp: see metrics.h.
#include "llmc/run/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

bool MetricsLog::open(const std::string& path, int keep_before_step, std::string* err) {
    std::vector<std::string> keep;
    if (keep_before_step >= 0) {
        std::ifstream in(path);
        std::string line;
        while (std::getline(in, line)) {
            int s = -1;
            if (std::sscanf(line.c_str(), "{\"step\": %d", &s) == 1 && s <= keep_before_step) keep.push_back(line);
        }
    }
    path_ = path;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) {
        *err = "cannot write " + path + ": " + std::strerror(errno);
        return false;
    }
    for (const std::string& l : keep) std::fprintf(f_, "%s\n", l.c_str());
    if (std::fflush(f_) != 0 || std::ferror(f_)) {
        *err = "cannot write " + path + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

bool MetricsLog::write(const StepMetrics& m, std::string* err) {
    if (!f_) return true;
    // JSON has no NaN or Infinity: a non-finite loss or norm (a bad step) is null.
    auto num = [](double x) {
        char b[32];
        if (std::isfinite(x)) std::snprintf(b, sizeof b, "%.17g", x);
        else std::snprintf(b, sizeof b, "null");
        return std::string(b);
    };
    std::fprintf(f_, "{\"step\": %d, \"loss\": %s, \"lr\": %.17g, \"grad_norm\": %s, \"tokens\": %llu, \"ms\": %.3f, "
                     "\"tokens_per_s\": %.1f",
                 m.step + 1, num(m.loss).c_str(), m.lr, num(m.grad_norm).c_str(), m.tokens, m.ms, m.tokens_per_s);
    if (m.aux_loss >= 0) std::fprintf(f_, ", \"aux_loss\": %s", num(m.aux_loss).c_str());
    if (m.moe_maxvio >= 0) std::fprintf(f_, ", \"moe_maxvio\": %s", num(m.moe_maxvio).c_str());
    if (m.skips > 0) std::fprintf(f_, ", \"skipped\": %s, \"skips\": %d", m.skipped ? "true" : "false", m.skips);
    if (m.mfu > 0) std::fprintf(f_, ", \"mfu\": %.4f", m.mfu);
    if (m.val_loss >= 0) std::fprintf(f_, ", \"val_loss\": %.17g", m.val_loss);
    if (m.comm_json.size() > 2) std::fprintf(f_, ", \"comm\": %s", m.comm_json.c_str());
    if (!m.breakdown_json.empty()) std::fprintf(f_, ", \"breakdown_ms\": %s", m.breakdown_json.c_str());
    if (!m.stragglers_json.empty()) std::fprintf(f_, ", %s", m.stragglers_json.c_str());
    std::fprintf(f_, "}\n");
    if (std::fflush(f_) != 0 || std::ferror(f_)) {
        *err = "cannot write " + path_ + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

MetricsLog::~MetricsLog() {
    if (f_) std::fclose(f_);
}
