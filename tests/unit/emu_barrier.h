// tests/unit/emu_barrier.h: what every emulated GPU of the unit tests
// shares: a barrier for host threads standing in for a block's or a warp's
// CUDA threads (__syncthreads, warp collectives), which stops the test
// with a message instead of hanging it when a kernel deadlocks.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

// A deadlocked kernel stops the test with a message instead of hanging it.
[[noreturn]] inline void emu_hang(const char* what) {
    std::fflush(stdout);
    std::fprintf(stderr, "emulated GPU: %s waited 300 s (a deadlock in the kernel)\n", what);
    std::fflush(stderr);
    std::_Exit(3);
}
constexpr auto kEmuHang = std::chrono::seconds(300);  // generous: a busy machine is slow, a deadlock is forever

class Barrier {
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(mu_);
        const unsigned gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            cv_.notify_all();
        } else if (!cv_.wait_for(lk, kEmuHang, [&] { return gen_ != gen; })) {
            emu_hang("a barrier");
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    unsigned gen_ = 0;
};

