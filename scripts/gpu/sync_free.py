#!/usr/bin/env python3
# scripts/gpu/sync_free.py: the step without host synchronisation
# (--sync-free 1, docs/design.md section 2.10), alone and as one CUDA graph,
# against the host-read step on a device: d12's shape on the embedded data (L=12, C=768, NH=12, V=257,
# T=1024), the same seed and batches, runs alternated A B A B so drift
# affects both. Checks, each a PASS or FAIL line:
#   - every run finishes with finite losses;
#   - the sync-free runs' losses stay within 1e-3 (relative) of the host-read
#     runs' at every step (on the CPU they are equal bit for bit,
#     tests/distributed/test_sync_free.py; a GPU sums the loss and the norm's
#     partials in another order, so the last bits differ and bf16 carries
#     them on);
#   - the settings line names the flag;
#   - the whole step as one CUDA graph (--sync-free 1 with LLMC_CUDA_GRAPH=1,
#     llmc/run/step_graph.h; on the CPU its emulation, LLMC_CPU_GRAPH=1)
#     says it recorded once and replayed every step after the second, and
#     its losses stay within 1e-3 of the host-read runs' too.
# Prints "figure" lines: each variant's median tokens/s over the steps after
# the first --skip, sync_free_step_over_base (their ratio),
# whole_step_graph_over_base and whole_step_graph_over_sync_free, and
# cuda_graph_replays (the whole step's replays in a run). Ends with
# "N passed, N failed".
# Run by scripts/gpu/check.sh's test step; on its own, from any directory:
#   usage: scripts/gpu/sync_free.py --out DIR [--steps 40] [--skip 10] [-b 16]
#              [--device cuda] [--dtype bf16] [--model M] [-t T] [--prefix P]
# (--prefix mixtral_ with a Mixtral --model: its routing kept on the device
# and the experts' grouped products, the figures named mixtral_...)
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
    ap.add_argument("--prefix", default="", help="put before every figure's name (another model's run)")
    a = ap.parse_args()
    check = Checks(show_pass=True)
    # The variants: the host-read step, the sync-free step, and the sync-free
    # step as one recorded region (a CUDA graph; the CPU's emulation off a GPU).
    graph_env = {"LLMC_CUDA_GRAPH": "1"} if a.device == "cuda" else {"LLMC_CPU_GRAPH": "1"}
    variants = [(0, 0, {}), (1, 1, {}), (2, 1, graph_env)]
    losses, speed = {v: [] for v, _, _ in variants}, {v: [] for v, _, _ in variants}
    replays = None
    for rep in range(2):
        for v, sf, env in variants:
            d = os.path.join(a.out, f"{a.prefix}sync_free_{v}_{rep}")
            cmd = [os.path.join(ROOT, "train_gpt"), "-e", a.model, "-t", str(a.t), "-b", str(a.b), "-x",
                   str(a.steps), "-s", "0", "-v", "0", "--device", a.device, "--dtype", a.dtype, "--sync-free", str(sf),
                   "-o", d]
            print("  $ " + " ".join(f"{k}={x}" for k, x in env.items()) + (" " if env else "") + " ".join(cmd),
                  flush=True)
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, **env))
            try:
                with open(os.path.join(d, "metrics.jsonl")) as f:
                    ms = [json.loads(x) for x in f if '"loss"' in x]
            except OSError:
                ms = []
            ls = [m["loss"] for m in ms]
            ok = p.returncode == 0 and len(ls) == a.steps and all(x == x and abs(x) < 1e30 for x in ls)
            name = "--sync-free 1 as one graph" if v == 2 else f"--sync-free {sf}"
            check(ok, f"{name} (run {rep + 1}): {len(ls)} steps, rc {p.returncode}" +
                  ("" if ok else f": {p.stderr[-300:]!r}"))
            if not ok:
                continue
            if v == 1 and rep == 0:
                check(re.search(r"\| sync-free\s+\| 1\s", p.stdout) is not None, "the settings table shows the flag")
            if v == 2 and rep == 0:
                m = re.search(r"whole step as one graph: (\d+) recorded, (\d+) replays, (\d+) steps run without",
                              p.stdout)
                got = tuple(int(g) for g in m.groups()) if m else None
                check(got == (1, a.steps - 2, 1), f"the whole step recorded once, replayed {a.steps - 2} times, "
                      f"the first run plainly: {got or 'no line'}")
                replays = got[1] if got else None
            losses[v].append(ls)
            speed[v] += [m["tokens_per_s"] for m in ms[a.skip:]]
    for v, what in ((1, "sync-free"), (2, "whole-step graph")):
        if losses[0] and losses[v]:
            r = max(abs(x - y) / abs(y) for x, y in zip(losses[v][0], losses[0][0]))
            print(f"figure {a.prefix}{'sync_free_loss_rel' if v == 1 else 'whole_step_graph_loss_rel'} {r:.6e} rel")
            check(r <= 1e-3, f"{what} losses within {r:.2e} of the host-read step's (at most 1e-3)")
    med = {v: statistics.median(speed[v]) for v in speed if speed[v]}
    if 0 in med and 1 in med:
        print(f"figure {a.prefix}sync_free_base_tokens_per_s {med[0]:.0f} tokens/s")
        print(f"figure {a.prefix}sync_free_tokens_per_s {med[1]:.0f} tokens/s")
        print(f"figure {a.prefix}sync_free_step_over_base {med[1] / med[0]:.4f} ratio")
    if 2 in med:
        print(f"figure {a.prefix}whole_step_graph_tokens_per_s {med[2]:.0f} tokens/s")
        if 0 in med:
            print(f"figure {a.prefix}whole_step_graph_over_base {med[2] / med[0]:.4f} ratio")
        if 1 in med:
            print(f"figure {a.prefix}whole_step_graph_over_sync_free {med[2] / med[1]:.4f} ratio")
    if replays is not None:
        print(f"figure {a.prefix}cuda_graph_replays {replays} replays")
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
