#!/usr/bin/env python3
# scripts/gpu/sync_free.py: the step without host synchronisation
# (--sync-free 1, docs/design.md section 2.10) against the host-read step on a
# device: d12's shape on the embedded data (L=12, C=768, NH=12, V=257,
# T=1024), the same seed and batches, runs alternated A B A B so drift
# affects both. Checks, each a PASS or FAIL line:
#   - every run finishes with finite losses;
#   - the sync-free runs' losses stay within 1e-3 (relative) of the host-read
#     runs' at every step (on the CPU they are equal bit for bit,
#     tests/distributed/test_sync_free.py; a GPU sums the loss and the norm's
#     partials in another order, so the last bits differ and bf16 carries
#     them on);
#   - the settings line names the flag.
# Prints "figure" lines: each variant's median tokens/s over the steps after
# the first --skip, and sync_free_step_over_base (their ratio). Ends with
# "N passed, N failed".
# Run by scripts/gpu/check.sh's test step; on its own, from any directory:
#   usage: scripts/gpu/sync_free.py --out DIR [--steps 40] [--skip 10] [-b 16]
#              [--device cuda] [--dtype bf16] [--model M] [-t T]
# (--device cpu --dtype fp32 --model L=2,C=32,NH=2,V=257,T=64 -t 64 checks
# this script without a GPU.)
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402  (tests/lib/checks.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("-b", type=int, default=16)
    ap.add_argument("-t", type=int, default=1024)
    ap.add_argument("--model", default="L=12,C=768,NH=12,V=257,T=1024")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    a = ap.parse_args()
    check = Checks(show_pass=True)
    losses, speed = {0: [], 1: []}, {0: [], 1: []}
    for rep in range(2):
        for sf in (0, 1):
            d = os.path.join(a.out, f"sync_free_{sf}_{rep}")
            cmd = [os.path.join(ROOT, "train_gpt"), "-e", a.model, "-t", str(a.t), "-b", str(a.b), "-x",
                   str(a.steps), "-s", "0", "-v", "0", "--device", a.device, "--dtype", a.dtype, "--sync-free", str(sf),
                   "-o", d]
            print("  $ " + " ".join(cmd), flush=True)
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
            try:
                with open(os.path.join(d, "metrics.jsonl")) as f:
                    ms = [json.loads(x) for x in f if '"loss"' in x]
            except OSError:
                ms = []
            ls = [m["loss"] for m in ms]
            ok = p.returncode == 0 and len(ls) == a.steps and all(x == x and abs(x) < 1e30 for x in ls)
            check(ok, f"--sync-free {sf} (run {rep + 1}): {len(ls)} steps, rc {p.returncode}" +
                  ("" if ok else f": {p.stderr[-300:]!r}"))
            if not ok:
                continue
            if sf == 1 and rep == 0:
                check(re.search(r"\| sync-free\s+\| 1\s", p.stdout) is not None, "the settings table shows the flag")
            losses[sf].append(ls)
            speed[sf] += [m["tokens_per_s"] for m in ms[a.skip:]]
    if losses[0] and losses[1]:
        r = max(abs(x - y) / abs(y) for x, y in zip(losses[1][0], losses[0][0]))
        print(f"figure sync_free_loss_rel {r:.6e} rel")
        check(r <= 1e-3, f"sync-free losses within {r:.2e} of the host-read step's (at most 1e-3)")
    if speed[0] and speed[1]:
        s0, s1 = statistics.median(speed[0]), statistics.median(speed[1])
        print(f"figure sync_free_base_tokens_per_s {s0:.0f} tokens/s")
        print(f"figure sync_free_tokens_per_s {s1:.0f} tokens/s")
        print(f"figure sync_free_step_over_base {s1 / s0:.4f} ratio")
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
