#!/usr/bin/env python3
# scripts/gpu/fp8_loss.py: FP8 training (--fp8 1, docs/fp8.md) against bf16
# over 300 steps of the same data from the same weights: for each model, two
# runs that differ only in --fp8, on the embedded text (data/tiny, the
# byte-level vocabulary V=257, so the loss has something to learn), the
# learning rate warmed up over 20 steps and then constant (-q 1), as
# scripts/gpu/curve.py. Models:
#   d12      GPT-2 d12's body: L=12, C=768, NH=12, T=1024, B=8;
#   qwen2.5_1.5b Qwen2.5-1.5B's body (L=28, C=1536, NH=12, NKV=2, F=8960),
#            T=1024, B=8, its embeddings and head at V=257.
# (On a CPU the baseline is fp32, the figures keep their names.)
# Figures: fp8_<model>_loss_rel_diff_<steps> = |loss_fp8 - loss_bf16| /
# loss_bf16 at the last step; the mean of the last 20 steps' losses of each;
# fp8_<model>_final_loss and bf16_<model>_final_loss. Checks: both runs
# finish and fall, and the difference is within 1% (docs/fp8.md's goal).
# Runs are skipped, not started, when --deadline would cut them. Ends with
# "N passed, N failed". Run by scripts/gpu/check.sh's fp8 step; on its own:
#   usage: scripts/gpu/fp8_loss.py --out DIR [--models d12,qwen2.5_1.5b] [--fp8-history N]
#              [--steps 300] [-b 8] [--deadline SECONDS] [--device cuda]
# (--device cpu with tiny --steps and --models small checks this script on
# a machine without a GPU; the CPU emulates FP8 exactly.)
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from curve import ROOT, finish, launch, metrics  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

MODELS = {
    "d12": "L=12,C=768,NH=12,V=257,T=1024",
    "qwen2.5_1.5b": "arch=qwen2,L=28,C=1536,NH=12,NKV=2,F=8960,V=257,T=1024,theta=1000000,tied=1",
    "small": "L=2,C=64,NH=4,V=257,T=1024",  # the script's check on a CPU
}
# Seconds one run is assumed to take at most on an H100 (startup included):
# a run is not started with less time than this left.
ASSUMED = {"d12": 25, "qwen2.5_1.5b": 80, "small": 60}


def main():
    ap = argparse.ArgumentParser(description="--fp8 1 against bf16 over 300 steps of the same data.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="d12,qwen2.5_1.5b")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("-b", type=int, default=8, help="rows of T tokens per step")
    ap.add_argument("-t", type=int, default=1024)
    ap.add_argument("--deadline", type=float, default=300, help="seconds from start for everything")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--fp8-history", type=int, default=0, help="the FP8 runs' --fp8-history (0: current scaling)")
    a = ap.parse_args()
    start = time.time()
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(ROOT, "data", "tiny")
    check = Checks(show_pass=True)
    left = lambda: a.deadline - (time.time() - start)  # noqa: E731
    dtype = ["--dtype", "bf16"] if a.device == "cuda" else ["--dtype", "fp32"]
    for name in a.models.split(","):
        if name not in MODELS:
            check(False, f"--models: {name} is not one of {', '.join(MODELS)}")
            continue
        common = ["-e", MODELS[name], "-i", os.path.join(data, "tiny_train_*.bin"), "-j", "", "-t", str(a.t),
                  "-b", str(a.b), "-d", str(a.b * a.t), "-l", "3e-4", "-u", "20", "-q", "1", "-s", "0", "-v", "0",
                  "--seed", "1337", "-x", str(a.steps), "--device", a.device] + dtype
        runs = {}
        for f8 in ("0", "1"):
            if left() < ASSUMED[name]:
                print(f"  {name} --fp8 {f8}: skipped, {left():.0f} s left of the deadline", flush=True)
                break
            d = os.path.join(a.out, f"{name}_fp8_{f8}")
            f8_args = ["--fp8", f8] + (["--fp8-history", str(a.fp8_history)] if f8 == "1" and a.fp8_history else [])
            rc = finish(launch(common + f8_args, d, d + ".log"), d, left())
            m = metrics(d)
            ok = rc == 0 and len(m) == a.steps
            check(ok, f"{name} --fp8 {f8}: {len(m)} of {a.steps} steps (rc={rc})")
            if ok:
                runs[f8] = [r["loss"] for r in m]
        if len(runs) < 2:
            continue
        bf, f8 = runs["0"], runs["1"]
        diff = abs(f8[-1] - bf[-1]) / bf[-1]
        k = min(20, a.steps)
        tail_bf, tail_f8 = sum(bf[-k:]) / k, sum(f8[-k:]) / k
        print(f"  {name}: loss at step {a.steps} {dtype[1]} {bf[-1]:.4f}, fp8 {f8[-1]:.4f} (rel {diff:.2e}); "
              f"mean of the last {k}: {tail_bf:.4f}, {tail_f8:.4f}", flush=True)
        print(f"figure fp8_{name}_loss_rel_diff_{a.steps} {diff:.6e} rel")
        print(f"figure fp8_{name}_tail_loss_rel_diff_{a.steps} {abs(tail_f8 - tail_bf) / tail_bf:.6e} rel")
        print(f"figure bf16_{name}_final_loss {bf[-1]:.6f} nats")
        print(f"figure fp8_{name}_final_loss {f8[-1]:.6f} nats")
        check(bf[-1] < bf[0] and f8[-1] < f8[0], f"{name}: both losses fall ({bf[0]:.3f} -> {bf[-1]:.3f}, "
                                                 f"{f8[0]:.3f} -> {f8[-1]:.3f})")
        check(diff <= 0.01, f"{name}: the FP8 loss at step {a.steps} within 1% of bf16's ({diff:.2e})")
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
