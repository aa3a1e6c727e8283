#!/usr/bin/python3
# scripts/benchmark_moe.py: what the mixture of experts costs against a dense
# model of the same active width, and what expert parallelism moves. Runs
# scripts/benchmark.py twice in fresh processes, alternating for --rounds
# rounds: the Mixtral model (arch=mixtral, E experts of width F, K per token)
# and the Llama model whose MLP has the width K·F (the same multiply-adds per
# token), and prints tokens/s of each (medians), their ratio, and with
# --ep N the bytes the expert all-to-all moved per step (the trainer's
# traffic report, groups named ep*) beside the
# estimate for an even routing: 4 exchanges (dispatch and combine, forward
# and backward) x L layers x the step's tokens per rank x K x C x the
# element size x (ep-1)/ep.
# Figures only: nothing here passes or fails. Also prints "figure NAME VALUE
# UNIT" lines like scripts/benchmark.py.
#   usage: scripts/benchmark_moe.py [--L 4 --C 128 --NH 4 --NKV 2 --F 128 --E 8 --K 2 --V 257 --T 256]
#                                   [--B 8] [--steps 12] [--rounds 2] [--np 1] [--ep 1] [--threads 1] [-- EXTRA...]
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^benchmark: .*? tokens/s=(\d+).*? bytes_moved/step=(\d+) (\{.*?\}) ", re.M)


def run(a, spec, extra):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--np", str(a.np), "--steps", str(a.steps),
           "--warmup", "2", "--", "-e", spec, "-b", str(a.B), "-t", str(a.T)] + extra
    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"benchmark_moe.py: {' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()[-400:]}")
    return int(m.group(1)), json.loads(m.group(3))


def main():
    ap = argparse.ArgumentParser(description="Mixture of experts against the dense model of the same active width.")
    for k, v in (("L", 4), ("C", 128), ("NH", 4), ("NKV", 2), ("F", 128), ("E", 8), ("K", 2), ("V", 257), ("T", 256),
                 ("B", 8), ("steps", 12), ("rounds", 2), ("np", 1), ("ep", 1), ("threads", 1)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more train_gpt flags for both runs")
    a = ap.parse_args()
    extra = [x for x in a.extra if x != "--"]
    shape = f"L={a.L},C={a.C},NH={a.NH},NKV={a.NKV},V={a.V},T={a.T}"
    moe = f"arch=mixtral,{shape},F={a.F},E={a.E},K={a.K}"
    dense = f"arch=llama,{shape},F={a.K * a.F}"
    moe_extra = extra + (["--ep", str(a.ep)] if a.ep > 1 else [])
    runs = {"moe": [], "dense": []}
    comm = {}
    for _ in range(a.rounds):
        tps, comm = run(a, moe, moe_extra)
        runs["moe"].append(tps)
        runs["dense"].append(run(a, dense, extra)[0])
    tm, td = statistics.median(runs["moe"]), statistics.median(runs["dense"])
    print(f"mixture of experts E={a.E} K={a.K} F={a.F} against dense F={a.K * a.F} ({shape}, B={a.B}, np={a.np}, "
          f"ep={a.ep}, {a.threads or 'all'} thread(s) per rank, {a.rounds} rounds of {a.steps} steps)")
    print(f"  moe:   tokens/s {tm:>9.0f}  (rounds {runs['moe']})")
    print(f"  dense: tokens/s {td:>9.0f}  (rounds {runs['dense']})")
    print(f"  moe / dense: {tm / td:.3f}")
    print(f"figure moe_tokens_per_s {tm:.0f} tok/s")
    print(f"figure dense_tokens_per_s {td:.0f} tok/s")
    print(f"figure moe_over_dense {tm / td:.4f} x")
    ep_bytes = sum(v for k, v in comm.items() if k.startswith("ep"))
    if a.ep > 1:
        dp = a.np  # the ep ranks are data-parallel ranks: each holds B rows of T tokens per micro-step
        elem = 2 if "bf16" in extra else 8 if "fp64" in extra else 4
        estimate = 4 * a.L * a.B * a.T * a.K * a.C * elem * (a.ep - 1) / a.ep
        print(f"  expert all-to-all: {ep_bytes} bytes/step per rank (groups {sorted(k for k in comm if k.startswith('ep'))}); "
              f"even-routing estimate {estimate:.0f} (np={dp})")
        print(f"figure moe_all_to_all_bytes_per_step {ep_bytes} B")
        print(f"figure moe_all_to_all_estimate {estimate:.0f} B")


if __name__ == "__main__":
    main()
