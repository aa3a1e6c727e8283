// llmc/run/signals.h: stopping a run cleanly on a signal. SIGTERM, SIGINT
// and SIGUSR1 (what Slurm and users send before a kill) only set a flag; at
// the end of each step every rank learns whether any rank got one (a max
// over the world, so one signalled rank is enough), and then all of them
// write a checkpoint (with -o) and exit with 128 + the signal's number. A
// second signal on the same rank exits at once.
#pragma once

// Installs the handlers (once, at start).
void install_stop_signals();
// The signal this process received (0: none).
int stop_signal();
