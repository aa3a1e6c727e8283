#!/usr/bin/env python3
# scripts/benchmark_busy.py: the default run on a quiet machine and beside
# busy loops (processes that spin on the CPU for the whole time, as
# `stress -c N` would), with train_gpt's OpenMP wait policy (a short spin,
# then sleep: llmc/run/startup.h) and with the others one could choose: the
# OpenMP runtime's default (GOMP_SPINCOUNT=300000), OMP_WAIT_POLICY=passive
# and one thread. Each time is the best of --repeat runs of `train_gpt
# -x STEPS -v 0 -s 0` (the embedded data and model) from the repository
# root. Prints a table and "figure" lines: each setting's quiet and busy
# seconds and busy / quiet (the slowdown a shared machine costs), and
# busy_over_quiet for train_gpt's default. A benchmark: it asserts nothing.
#   usage: scripts/benchmark_busy.py [--steps 60] [--busy 1] [--repeat 2]
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train_gpt")
SETTINGS = [  # name, environment
    ("train_gpt", {}),
    ("runtime_default", {"GOMP_SPINCOUNT": "300000"}),
    ("passive", {"OMP_WAIT_POLICY": "passive"}),
    ("one_thread", {"OMP_NUM_THREADS": "1"}),
]


def timed(env, steps, repeat):
    """The best wall time of `repeat` runs, in seconds (None if a run failed)."""
    best = None
    for _ in range(repeat):
        e = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS",
                                                              "LLMC_SPINCOUNT_SET")}
        e.update(env)
        t0 = time.monotonic()
        p = subprocess.run([TRAIN, "-x", str(steps), "-v", "0", "-s", "0"], cwd=ROOT, env=e, capture_output=True)
        dt = time.monotonic() - t0
        if p.returncode != 0:
            print(f"  failed: {p.stderr.decode()[-300:]}", file=sys.stderr)
            return None
        best = dt if best is None else min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--busy", type=int, default=1, help="busy loops beside the busy runs")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(TRAIN):
        sys.exit("train_gpt is not built (make)")
    quiet = {name: timed(env, a.steps, a.repeat) for name, env in SETTINGS}
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        busy = {name: timed(env, a.steps, a.repeat) for name, env in SETTINGS}
    finally:
        for p in loops:
            p.kill()
    print(f"default run, {a.steps} steps, {os.cpu_count()} cores; busy: {a.busy} busy loop(s) beside it")
    print(f"{'setting':<16} {'quiet s':>8} {'busy s':>8} {'busy/quiet':>10}")
    for name, _ in SETTINGS:
        q, b = quiet[name], busy[name]
        r = b / q if q and b else None
        print(f"{name:<16} {q or 0:8.2f} {b or 0:8.2f} {r or 0:10.2f}")
        if q and b:
            print(f"figure busy_{name}_quiet_s {q:.3f} s")
            print(f"figure busy_{name}_busy_s {b:.3f} s")
            print(f"figure busy_{name}_over_quiet {r:.3f} ratio")
    q, b = quiet["train_gpt"], busy["train_gpt"]
    if q and b:
        print(f"figure busy_over_quiet {b / q:.3f} ratio")


if __name__ == "__main__":
    main()
