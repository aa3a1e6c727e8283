#!/usr/bin/env python3
# scripts/benchmark_busy.py: the default run on a quiet machine and beside
# busy loops (processes that spin on the CPU for the whole time, as
# `stress -c N` would). train_gpt's default: its threads follow the load
# (llmc/run/cpu_threads.h: fewer while other processes take its CPUs) and
# OpenMP's waits spin briefly, then sleep (llmc/run/startup.h). Beside it
# the settings one could choose instead: the thread count fixed at the
# cores (OMP_NUM_THREADS), the OpenMP runtime's default wait
# (GOMP_SPINCOUNT=300000), OMP_WAIT_POLICY=passive and one thread. Each
# time is the best of --repeat runs of `train_gpt -x STEPS -v 0 -s 0` (the
# embedded data and model) from the repository root; the quiet and busy
# runs alternate, so a machine whose speed drifts meets both alike. Prints
# a table and "figure" lines: each setting's quiet and busy seconds, busy /
# its own quiet, and busy / train_gpt's quiet (what the setting costs a
# user on a shared machine); busy_over_quiet for train_gpt's default. A
# benchmark: it asserts nothing.
#   usage: scripts/benchmark_busy.py [--steps 60] [--busy 1] [--repeat 3]
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train_gpt")
CORES = len(os.sched_getaffinity(0))
SETTINGS = [  # name, environment
    ("train_gpt", {}),
    ("fixed_threads", {"OMP_NUM_THREADS": str(CORES)}),
    ("runtime_default", {"GOMP_SPINCOUNT": "300000"}),
    ("passive", {"OMP_WAIT_POLICY": "passive"}),
    ("one_thread", {"OMP_NUM_THREADS": "1"}),
]


def timed(env, steps):
    """The wall time of one run, in seconds (None if it failed)."""
    e = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS",
                                                          "LLMC_SPINCOUNT_SET")}
    e.update(env)
    t0 = time.monotonic()
    p = subprocess.run([TRAIN, "-x", str(steps), "-v", "0", "-s", "0"], cwd=ROOT, env=e, capture_output=True)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        print(f"  failed: {p.stderr.decode()[-300:]}", file=sys.stderr)
        return None
    return dt


def best(a, b):
    return b if a is None else a if b is None else min(a, b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--busy", type=int, default=1, help="busy loops beside the busy runs")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(TRAIN):
        sys.exit("train_gpt is not built (make)")
    quiet = {name: None for name, _ in SETTINGS}
    busy = dict(quiet)
    for _ in range(a.repeat):
        for name, env in SETTINGS:
            quiet[name] = best(quiet[name], timed(env, a.steps))
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            for name, env in SETTINGS:
                busy[name] = best(busy[name], timed(env, a.steps))
        finally:
            for p in loops:
                p.kill()
                p.wait()
    print(f"default run, {a.steps} steps, {CORES} cores; busy: {a.busy} busy loop(s) beside it; best of {a.repeat}")
    print(f"{'setting':<16} {'quiet s':>8} {'busy s':>8} {'busy/quiet':>10} {'busy/ours':>10}")
    ours = quiet["train_gpt"]
    for name, _ in SETTINGS:
        q, b = quiet[name], busy[name]
        r = b / q if q and b else None
        o = b / ours if ours and b else None
        print(f"{name:<16} {q or 0:8.2f} {b or 0:8.2f} {r or 0:10.2f} {o or 0:10.2f}")
        if q and b:
            print(f"figure busy_{name}_quiet_s {q:.3f} s")
            print(f"figure busy_{name}_busy_s {b:.3f} s")
            print(f"figure busy_{name}_over_quiet {r:.3f} ratio")
        if o:
            print(f"figure busy_{name}_over_train_gpt_quiet {o:.3f} ratio")
    q, b = quiet["train_gpt"], busy["train_gpt"]
    if q and b:
        print(f"figure busy_over_quiet {b / q:.3f} ratio")


if __name__ == "__main__":
    main()
