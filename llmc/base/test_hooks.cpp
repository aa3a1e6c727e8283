// llmc/base/test_hooks.cpp: the test hooks' values from the environment
// (llmc/base/test_hooks.h).
#include "llmc/base/test_hooks.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace test_hooks {

int nan_step() {
    static const int k = [] {
        const char* e = std::getenv("LLMC_TEST_NAN_STEP");
        return e && *e ? std::atoi(e) : -1;
    }();
    return k;
}

bool stall_rank(int* rank, long* at, std::string* err) {
    *rank = -1;
    *at = 0;
    const char* v = std::getenv("LLMC_TEST_STALL_RANK");
    if (!v || !*v) return true;
    int r = -1, used = 0;
    long k = 0;
    if (std::sscanf(v, "%d:%ld%n", &r, &k, &used) != 2 || v[used] != '\0' || r < 0 || k < 1) {
        *err = std::string("LLMC_TEST_STALL_RANK=") + v +
               ": expected R:K (world rank R >= 0 stalls before its K-th collective, K >= 1)";
        return false;
    }
    *rank = r;
    *at = k;
    return true;
}

int checkpoint_delay_ms() {
    const char* e = std::getenv("LLMC_TEST_CHECKPOINT_DELAY_MS");
    return e && *e ? std::max(0, std::atoi(e)) : 0;
}

bool host_reads() {
    const char* e = std::getenv("LLMC_TEST_HOST_READS");
    return e && *e && std::string(e) != "0";
}

bool matmul_tune() {
    const char* e = std::getenv("LLMC_TEST_MATMUL_TUNE");
    return e && *e && std::string(e) != "0";
}

}  // namespace test_hooks
