// llmc/run/signals.cpp: see signals.h.
#include "llmc/run/signals.h"

#include <signal.h>
#include <unistd.h>

#include <initializer_list>

static volatile sig_atomic_t g_signal = 0;

// Async-signal-safe: stores the number, or on a second signal leaves at once.
static void on_signal(int sig) {
    if (g_signal) _exit(128 + sig);
    g_signal = sig;
}

void install_stop_signals() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a system call in flight goes on; the step ends normally
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return (int)g_signal; }
