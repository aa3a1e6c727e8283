// llmc/run/cpu_threads.cpp: the thread count that follows other processes'
// use of the rank's CPUs (llmc/run/cpu_threads.h).
#include "llmc/run/cpu_threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "llmc/base/test_hooks.h"

int threads_for_load(int max_threads, int cpus, double others, int ranks) {
    ranks = std::max(1, ranks);
    cpus = std::max(1, cpus);
    const double share = (double)cpus / ranks;
    // The job's other ranks on these CPUs count as using their share; what
    // other processes take beyond that, the job's ranks give up alike.
    const double outside = std::max(0.0, others - (ranks - 1) * share);
    const double left = share - outside / ranks;
    const int n = (int)std::floor(left + 0.5);
    return std::clamp(n, 1, std::max(1, max_threads));
}

static double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void CpuThreads::start(int max_threads, int ranks) {
    active_ = false;
    max_ = threads_ = std::max(1, max_threads);
    const char* env = std::getenv("OMP_NUM_THREADS");
    why_off_ = env && *env ? "no: OMP_NUM_THREADS fixes them" : max_ < 2 ? "no: one thread" : "";
    if (!why_off_.empty()) return;
    why_off_ = "no: /proc/stat cannot be read";
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
    cpus_ = CPU_COUNT(&set);
    cpus_set_ = set;
    // Ranks bound to CPUs of their own (fewer than the node has) share
    // none with this one; unbound, they all run on every CPU.
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    ranks_ = cpus_ < online ? 1 : std::max(1, ranks);
    if (!read(&busy0_, &all0_, &mine0_)) return;
    start_ = seconds_now();
    active_ = true;
}

// /proc/stat's ticks over the rank's CPUs (busy: all but idle and iowait;
// steal counts as busy, the hypervisor's other guests), and this process's
// own (utime + stime of /proc/self/stat, every thread).
bool CpuThreads::read(unsigned long long* busy, unsigned long long* all, unsigned long long* mine) const {
    std::ifstream st("/proc/stat");
    if (!st) return false;
    std::string line;
    *busy = *all = 0;
    int seen = 0;
    while (std::getline(st, line)) {
        if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || !std::isdigit((unsigned char)line[3])) continue;
        std::istringstream in(line.substr(3));
        int cpu = -1;
        unsigned long long v[8] = {};
        in >> cpu;
        for (auto& x : v) in >> x;
        if (!in || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &cpus_set_)) continue;
        const unsigned long long idle = v[3] + v[4];
        const unsigned long long b = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        *busy += b;
        *all += b + idle;
        seen++;
    }
    if (seen == 0) return false;
    std::ifstream self("/proc/self/stat");
    std::string s((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
    const size_t paren = s.rfind(')');  // the name in parentheses may hold spaces
    if (paren == std::string::npos) return false;
    std::istringstream in(s.substr(paren + 2));
    std::string field;
    unsigned long long ut = 0, stime = 0;
    for (int i = 3; i <= 13; i++) in >> field;
    in >> ut >> stime;  // fields 14 and 15
    if (!in) return false;
    *mine = ut + stime;
    return true;
}

std::string CpuThreads::after_step() {
    if (!active_) return "";
    const double now = seconds_now();
    if (now - start_ < kWindowSeconds) return "";
    unsigned long long busy = 0, all = 0, mine = 0;
    if (!read(&busy, &all, &mine)) return "";
    const double ticks = (double)(all - all0_) / cpus_;  // the window in ticks, per CPU
    const double theirs = (double)(busy - busy0_) - (double)(mine - mine0_);
    busy0_ = busy, all0_ = all, mine0_ = mine, start_ = now;
    if (ticks <= 0) return "";
    double others = std::max(0.0, theirs) / ticks;
    const double hook = test_hooks::cpu_others(windows_++);
    if (hook >= 0) others = hook;
    const int want = threads_for_load(max_, cpus_, others, ranks_);
    // Two windows in a row must agree: one busy moment (a compiler, a
    // checkpoint's writer) does not move the threads back and forth.
    if (want == threads_) {
        pending_ = 0;
        return "";
    }
    if (want != pending_) {
        pending_ = want;
        return "";
    }
    pending_ = 0;
    threads_ = want;
    changes_++;
    omp_set_num_threads(threads_);
    char line[200];
    std::snprintf(line, sizeof(line), "threads: %d of %d (other processes used %.1f of the %d CPUs this rank runs on)",
                  threads_, max_, others, cpus_);
    return line;
}

std::string CpuThreads::text() const {
    if (!active_) return why_off_;
    return "yes: fewer while other processes use its " + std::to_string(cpus_) + " CPUs";
}
