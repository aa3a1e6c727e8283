// llmc/base/test_hooks.cpp: the test hooks' values from the environment
// (llmc/base/test_hooks.h).
#include "llmc/base/test_hooks.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace test_hooks {

const NanHook& nan_hook() {
    static const NanHook h = [] {
        NanHook n;
        const char* e = std::getenv("LLMC_TEST_NAN_STEP");
        if (!e || !*e) return n;
        std::string s(e), where = "grad";
        n.step = std::atoi(s.c_str());
        const size_t a = s.find(':');
        if (a != std::string::npos) {
            n.rank = std::atoi(s.c_str() + a + 1);
            const size_t b = s.find(':', a + 1);
            if (b != std::string::npos) where = s.substr(b + 1);
        }
        n.where = where == "loss" ? NanHook::loss : where == "grad_pre" ? NanHook::grad_pre : NanHook::grad;
        return n;
    }();
    return h;
}

// A stall hook's R:K from variable `var` (rank -1 when unset); `what`: the
// calls K counts, for the error.
static bool stall_hook(const char* var, const char* what, int* rank, long* at, std::string* err) {
    *rank = -1;
    *at = 0;
    const char* v = std::getenv(var);
    if (!v || !*v) return true;
    int r = -1, used = 0;
    long k = 0;
    if (std::sscanf(v, "%d:%ld%n", &r, &k, &used) != 2 || v[used] != '\0' || r < 0 || k < 1) {
        *err = std::string(var) + "=" + v + ": expected R:K (world rank R >= 0 stalls before its K-th " + what +
               ", K >= 1)";
        return false;
    }
    *rank = r;
    *at = k;
    return true;
}

bool stall_rank(int* rank, long* at, std::string* err) {
    return stall_hook("LLMC_TEST_STALL_RANK", "collective", rank, at, err);
}

bool stall_setup(int* rank, long* at, std::string* err) {
    return stall_hook("LLMC_TEST_STALL_SETUP", "start-up collective", rank, at, err);
}

int checkpoint_delay_ms() {
    const char* e = std::getenv("LLMC_TEST_CHECKPOINT_DELAY_MS");
    return e && *e ? std::max(0, std::atoi(e)) : 0;
}

bool fp8_local_amax() {
    const char* e = std::getenv("LLMC_TEST_FP8_LOCAL_AMAX");
    return e && *e && std::string(e) != "0";
}

bool fp8_expert_whole() {
    const char* e = std::getenv("LLMC_TEST_FP8_EXPERT_WHOLE");
    return e && *e && std::string(e) != "0";
}

int fp8_align() {
    const char* e = std::getenv("LLMC_TEST_FP8_ALIGN");
    const int q = e ? std::atoi(e) : 1;
    return q > 1 ? q : 1;
}

bool host_reads() {
    const char* e = std::getenv("LLMC_TEST_HOST_READS");
    return e && *e && std::string(e) != "0";
}

bool crash_now(int step, int rank) {
    const char* e = std::getenv("LLMC_TEST_CRASH");
    if (!e || !*e) return false;
    const std::string s(e);
    const size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    if (b == std::string::npos || std::atoi(s.c_str()) != step || std::atoi(s.c_str() + a + 1) != rank) return false;
    const std::string file = s.substr(b + 1);
    if (FILE* f = std::fopen(file.c_str(), "r")) return std::fclose(f), false;  // it struck already
    if (FILE* f = std::fopen(file.c_str(), "w")) std::fclose(f);
    return true;
}

int slow_rank_ms(int rank) {
    const char* e = std::getenv("LLMC_TEST_SLOW_RANK");
    if (!e || !*e) return 0;
    const char* c = std::strchr(e, ':');
    return c && std::atoi(e) == rank ? std::max(0, std::atoi(c + 1)) : 0;
}

bool matmul_tune() {
    const char* e = std::getenv("LLMC_TEST_MATMUL_TUNE");
    return e && *e && std::string(e) != "0";
}

double cpu_others(int window) {
    const char* e = std::getenv("LLMC_TEST_CPU_OTHERS");
    if (!e || !*e) return -1.0;
    for (const char* c; window > 0 && (c = std::strchr(e, ',')); window--) e = c + 1;
    return std::atof(e);
}

}  // namespace test_hooks
