#!/usr/bin/python3
# scripts/benchmark_precision.py: fp32 against bf16 mixed precision on the
# CPU (--dtype fp32 / --dtype bf16), the same model and layout, run
# alternately (rounds of one run each) so that load from outside falls on
# both. Prints, per precision, the median tokens/s over the rounds and the
# bytes each rank holds (model state, activations), then the ratios, as
# "figure NAME VALUE UNIT" lines. Figures only: nothing passes or fails.
#   usage: scripts/benchmark_precision.py [--rounds 3] [--np N] [--steps 8] -- TRAIN_GPT_ARGS...
#   e.g.   scripts/benchmark_precision.py -- -e L=6,C=512,NH=8,V=50257,T=256 -b 4 -t 256
# bf16 on the CPU computes in fp32 on widened operands (it exists to check
# the mixed-precision bookkeeping without a GPU); its matrix products use
# AVX-512 BF16 dot products where the CPU has them (the "compute:" line of a
# run says; LLMC_CPU_BF16_DOT=0 in the environment turns them off, so run
# this script with and without it, alternately, to compare the two). With
# widened products expect it slower than fp32. Either way it holds less: its
# parameters, gradients and activations are half the size, its master
# weights and Adam state the same.
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(np_, steps, args):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--np", str(np_), "--steps", str(steps),
           "--warmup", "2", "--"] + args
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    figs = dict(re.findall(r"^figure (\S+) (\S+)", p.stdout, re.M))
    if p.returncode != 0 or "tokens_per_s" not in figs:
        sys.exit(f"benchmark_precision: {' '.join(cmd)} failed:\n{p.stdout[-500:]}{p.stderr[-500:]}")
    return {k: float(v) for k, v in figs.items()}


def main():
    ap = argparse.ArgumentParser(description="fp32 against bf16 on the CPU: tokens/s and bytes held.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train_gpt's flags")
    a = ap.parse_args()
    args = [x for x in a.train_args if x != "--"] + ["--device", "cpu"]
    runs = {"fp32": [], "bf16": []}
    for _ in range(a.rounds):
        for dt in runs:
            runs[dt].append(one_run(a.np, a.steps, args + ["--dtype", dt]))
    med = {}
    for dt, rs in runs.items():
        med[dt] = statistics.median(r["tokens_per_s"] for r in rs)
        state, acts = rs[0]["model_state_bytes_per_rank"], rs[0]["activation_bytes_per_rank"]
        print(f"figure {dt}_tokens_per_s {med[dt]:.0f} tok/s")
        print(f"figure {dt}_model_state_bytes_per_rank {state:.0f} B")
        print(f"figure {dt}_activation_bytes_per_rank {acts:.0f} B")
    print(f"figure bf16_over_fp32_tokens_per_s {med['bf16'] / med['fp32']:.3f} x")
    held = {dt: runs[dt][0]["model_state_bytes_per_rank"] + runs[dt][0]["activation_bytes_per_rank"] for dt in runs}
    print(f"figure bf16_over_fp32_bytes_held {held['bf16'] / held['fp32']:.3f} x")


if __name__ == "__main__":
    main()
