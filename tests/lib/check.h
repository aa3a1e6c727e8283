// tests/lib/check.h: the CHECK macro of the C++ unit tests. Each failed check
// prints its file, line and message; the program ends with check_summary(),
// which prints "N passed, N failed" and gives the exit status.
#pragma once
#include <cstdio>

static int g_pass = 0, g_fail = 0;
#define CHECK(cond, ...)                                     \
    do {                                                     \
        if (cond) {                                          \
            g_pass++;                                        \
        } else {                                             \
            g_fail++;                                        \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);                        \
            std::printf("\n");                               \
        }                                                    \
    } while (0)

static inline int check_summary() {
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
