#!/usr/bin/env python3
# scripts/gpu/optimizer_dtype.py: AdamW's moments in bf16 on a device
# (--optimizer-dtype bf16, docs/design.md section 2.4) against fp32 moments:
# the default model on the embedded data, the same seed and batches, three
# runs of --steps steps (fp32 m/v; bf16 rounded to nearest; bf16 rounded
# stochastically). Checks, each a PASS or FAIL line:
#   - every run finishes with finite losses;
#   - each bf16 run's losses stay within 1% of the fp32-moment run's at every
#     step (tests/distributed/test_optimizer_dtype.py shows the same on the CPU);
#   - the memory line's optimizer bytes halve.
# Prints "figure" lines (the largest relative loss difference, the final
# losses, the optimizer bytes) and ends with "N passed, N failed".
# Run by scripts/gpu/check.sh's test step; on its own, from any directory:
#   usage: scripts/gpu/optimizer_dtype.py --out DIR [--steps 60] [--device cuda] [--dtype bf16]
# (--device cpu --dtype fp32 with few steps checks this script without a GPU.)
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402  (tests/lib/checks.py)
RUNS = (("fp32", []), ("bf16_nearest", ["--optimizer-dtype", "bf16"]),
        ("bf16_stochastic", ["--optimizer-dtype", "bf16", "--optimizer-rounding", "stochastic"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    a = ap.parse_args()
    check = Checks(show_pass=True)
    losses, opt_bytes = {}, {}
    for name, extra in RUNS:
        d = os.path.join(a.out, f"optimizer_{name}")
        cmd = [os.path.join(ROOT, "train_gpt"), "-x", str(a.steps), "-s", "0", "-v", "0", "--device", a.device,
               "--dtype", a.dtype, "-o", d] + extra
        print("  $ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        try:
            with open(os.path.join(d, "metrics.jsonl")) as f:
                ls = [json.loads(x)["loss"] for x in f if '"loss"' in x]
        except OSError:
            ls = []
        m = re.search(r"memory\[0\] start:.* optimizer=(\d+)", p.stdout)
        ok = p.returncode == 0 and len(ls) == a.steps and all(x == x and abs(x) < 1e30 for x in ls) and m
        check(bool(ok), f"{name}: {len(ls)} steps, rc {p.returncode}" + ("" if ok else f": {p.stderr[-300:]!r}"))
        if ok:
            losses[name], opt_bytes[name] = ls, int(m.group(1))
            print(f"figure optimizer_{name}_final_loss {ls[-1]:.6f} nats")
            print(f"figure optimizer_{name}_bytes {opt_bytes[name]} B")
    ref = losses.get("fp32")
    for name in ("bf16_nearest", "bf16_stochastic"):
        if ref is None or name not in losses:
            continue
        r = max(abs(x - y) / abs(y) for x, y in zip(losses[name], ref))
        print(f"figure optimizer_{name}_loss_rel {r:.6e} rel")
        check(r <= 0.01, f"{name}: losses within {100 * r:.3f}% of fp32 moments (at most 1%)")
        check(2 * opt_bytes[name] == opt_bytes["fp32"],
              f"{name}: optimizer bytes {opt_bytes[name]}, half of fp32's {opt_bytes['fp32']}")
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
