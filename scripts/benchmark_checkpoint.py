#!/usr/bin/python3
# scripts/benchmark_checkpoint.py: what a checkpoint costs the step it falls
# on, synchronous against --async-checkpoint. Runs train_gpt twice on the
# same model and random tokens (made here), a checkpoint every --every
# steps, and prints for each mode the median step time, the step time of the
# checkpoint steps (the step's own time plus the main thread's time in the
# checkpoint, from the "checkpoint: ... in X ms" / "snapshot in X ms" line),
# the shard bytes and the run's wall time. Figures only: nothing here passes
# or fails (the machine may be busy).
#   usage: scripts/benchmark_checkpoint.py [--np N] [--steps 9] [--every 3] [-- TRAIN_GPT_ARGS...]
#   e.g.   scripts/benchmark_checkpoint.py -- -e L=8,C=512,NH=8,V=8192,T=64 -b 4 -t 64
import argparse
import array
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"^step +(\d+)/\d+ \| .*? \| ([\d.]+) ms \|", re.M)
CKPT = re.compile(r"^checkpoint: \S+ckpt_(\d+) (?:in|snapshot in) ([\d.]+) ms", re.M)


def write_tokens(path, n, vocab):
    """An llm.c uint16 token shard of n random tokens below vocab."""
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, n
    rng = random.Random(7)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(array.array("H", (rng.randrange(vocab) for _ in range(n))).tobytes())


def run(np_, args, out):
    cmd = ([] if np_ <= 1 else ["mpirun", "-np", str(np_)]) + [os.path.join(ROOT, "train_gpt")] + args + ["-o", out]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"benchmark_checkpoint: train_gpt failed: {p.stderr.strip()[-400:]}")
    steps = {int(s): float(ms) for s, ms in STEP.findall(p.stdout)}
    ckpt = {int(s): float(ms) for s, ms in CKPT.findall(p.stdout)}
    shard = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs if f.startswith("shard_"))
    shard //= max(1, len(ckpt))  # per checkpoint
    return steps, ckpt, shard, wall


def main():
    ap = argparse.ArgumentParser(description="Step time of a checkpoint step, synchronous vs asynchronous.")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun when > 1)")
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--every", type=int, default=3, help="checkpoint every N steps")
    ap.add_argument("rest", nargs="*", help="train_gpt arguments (after --)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="llmc_bench_ckpt_")
    try:
        model = a.rest or ["-e", "L=8,C=512,NH=8,V=8192,T=64", "-b", "4", "-t", "64"]
        data = os.path.join(tmp, "tokens.bin")
        write_tokens(data, 200000, 8192)
        args = ["-i", data, "-j", "", "-s", "0", "-x", str(a.steps), "-n", str(a.every)] + model
        print(f"train_gpt {' '.join(model)}, np={a.np}, {a.steps} steps, a checkpoint every {a.every}")
        for name, extra in (("sync", []), ("async", ["--async-checkpoint", "1"])):
            steps, ckpt, shard, wall = run(a.np, args + extra, os.path.join(tmp, name))
            plain = statistics.median(ms for s, ms in steps.items() if s not in ckpt)
            # The last checkpoint is followed by the run's end, which waits for it.
            at = [s for s in sorted(ckpt) if s < a.steps]
            costs = [steps[s] + ckpt[s] for s in at]
            print(f"{name:5s}: plain step {plain:8.1f} ms (median) | checkpoint steps "
                  + ", ".join(f"{s}: {c:.1f} ms ({ckpt[s]:.1f} in the checkpoint)" for s, c in zip(at, costs))
                  + f" | shards {shard / 2**20:.1f} MiB per checkpoint | run {wall:.1f} s")
            print(f"figure checkpoint_step_ms_{name} {statistics.median(costs) if costs else 0:.1f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
