// llmc/run/metrics.cpp: see metrics.h.
#include "llmc/run/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

bool MetricsLog::open(const std::string& path, int keep_before_step, std::string* err) {
    std::vector<std::string> keep;
    if (keep_before_step >= 0) {
        std::ifstream in(path);
        std::string line;
        while (std::getline(in, line)) {
            int s = -1;
            if (std::sscanf(line.c_str(), "{\"step\": %d", &s) == 1 && s < keep_before_step) keep.push_back(line);
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
    std::fprintf(f_,
                 "{\"step\": %d, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens\": %llu, \"ms\": %.3f, "
                 "\"tokens_per_s\": %.1f",
                 m.step, m.loss, m.lr, m.grad_norm, m.tokens, m.ms, m.tokens_per_s);
    if (m.mfu > 0) std::fprintf(f_, ", \"mfu\": %.4f", m.mfu);
    if (m.val_loss >= 0) std::fprintf(f_, ", \"val_loss\": %.17g", m.val_loss);
    if (m.comm_json.size() > 2) std::fprintf(f_, ", \"comm\": %s", m.comm_json.c_str());
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
