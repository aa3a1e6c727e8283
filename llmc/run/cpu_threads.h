// llmc/run/cpu_threads.h: a rank's CPU threads on a machine other
// processes use too. Between steps the rank reads how much of the CPUs it
// may run on went to other processes (/proc/stat against its own time in
// /proc/self/stat) and runs as many OpenMP threads as there are CPUs left
// for it, from one up to the count choose_threads gave (llmc/run/startup.h).
// Why: a thread whose CPU another process also wants runs at half speed or
// less, and every parallel loop waits for its slowest thread, so beside one
// busy process on 2 cores two threads take longer than one alone. The
// thread count changes no bit of a run: the CPU backend's loops and its
// matrix products (llmc/backend/cpu_gemm.h) split their work by its shape,
// not by the threads. OMP_NUM_THREADS from the user turns this off.
#pragma once
#include <sched.h>

#include <string>

// The threads to run with: `cpus` CPUs this rank may run on, of which
// `others` (in CPUs) went to other processes over the last window, shared
// by `ranks` ranks of this job (each counted as using its share); at least
// one, at most `max_threads`. A pure function (tests/unit/test_cpu_threads).
int threads_for_load(int max_threads, int cpus, double others, int ranks);

class CpuThreads {
public:
    // max_threads: choose_threads' count. Off (no reading, no change) when
    // the user set OMP_NUM_THREADS, with one thread, or where /proc/stat
    // cannot be read. ranks: this job's ranks sharing these CPUs.
    void start(int max_threads, int ranks);
    bool active() const { return active_; }
    // After a step: once a window of at least kWindowSeconds has passed,
    // judge it; the thread count changes when two windows in a row ask for
    // the same other count. Returns the line to print when it changed, else "".
    std::string after_step();
    int threads() const { return threads_; }
    int changes() const { return changes_; }
    // For the settings table: what the threads follow.
    std::string text() const;
    static constexpr double kWindowSeconds = 0.5;

private:
    bool read(unsigned long long* busy, unsigned long long* all, unsigned long long* mine) const;
    bool active_ = false;
    int max_ = 1, ranks_ = 1, cpus_ = 1, threads_ = 1, pending_ = 0, changes_ = 0, windows_ = 0;
    unsigned long long busy0_ = 0, all0_ = 0, mine0_ = 0;  // the window's start
    double start_ = 0;                                     // its time, in seconds
    std::string why_off_;
    cpu_set_t cpus_set_{};  // the CPUs this rank may run on: the "cpuN" lines of /proc/stat that count
};
