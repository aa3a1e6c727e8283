#!/usr/bin/python3
# tests/distributed/test_graphs.py: the step's recorded regions (CUDA graphs
# on a GPU; docs/design.md section 2.9) through the trainer, on the CPU with
# LLMC_CPU_GRAPH=1 (the recording backend that emulates graph capture and
# refuses any op a graph could not hold). The truth is the same run without
# regions: for each layout, 6 fp64 steps with gradient accumulation,
# validation and a text sample give exactly the same losses (==, not a
# tolerance: a replay runs the same calls) and the same final weights, and
# the run reports how many regions it recorded and replayed:
#   - regions: one process (GPT-2 with --head-chunk and full recompute,
#     Llama), dp=2 with ZeRO 0 and 1 (forwards and the backwards of earlier
#     micro-steps: the last starts the gradient reduction), pp=2 (1F1B) and
#     pp=2 vpp=2;
#   - none, by design (their collectives run inside the passes): ZeRO-2,
#     tp=2 with sp, cp=2; they say so and train as without the switch.
# Last line: "N passed, N failed".
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, metrics, read_checkpoint, run_suite, write_shard

import numpy as np

check = Checks()
STEPS = 6
GPT2 = "L=4,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=4,C=32,NH=4,NKV=2,F=48,V=97,T=64"


def run(np_, args, graphs):
    cmd = ([TRAIN] if np_ == 0 else ["mpirun", "-np", str(np_), TRAIN]) + args
    env = dict(ENV, LLMC_CPU_GRAPH="1" if graphs else "0")
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout, p.stderr


def compare(tmp, name, np_, args, want_regions):
    outs = {}
    for graphs in (False, True):
        d = os.path.join(tmp, f"{name.replace(' ', '_')}_{int(graphs)}")
        rc, out, err = run(np_, args + ["-o", d, "-n", str(STEPS)], graphs)
        if not check(rc == 0, f"{name} graphs={graphs}: exit {rc}: {err[-400:]}"):
            return
        outs[graphs] = (metrics(d), read_checkpoint(d, STEPS)[0], out)
    (m0, w0, _), (m1, w1, out) = outs[False], outs[True]
    losses0 = [(m["step"], m["loss"], m.get("val_loss")) for m in m0]
    losses1 = [(m["step"], m["loss"], m.get("val_loss")) for m in m1]
    check(losses0 == losses1, f"{name}: losses with regions equal those without")
    check(np.array_equal(w0, w1), f"{name}: final weights with regions equal those without")
    samples = [re.findall(r"---- sample ----\n(.*?)\n----", o, re.S) for o in (outs[False][2], out)]
    check(samples[0] == samples[1] and samples[0], f"{name}: the same text samples")
    m = re.search(r"step graphs: (\d+) recorded, (\d+) replays", out)
    if not check(m is not None, f"{name}: no 'step graphs' line"):
        return
    rec, rep = int(m.group(1)), int(m.group(2))
    print(f"  {name}: {rec} recorded, {rep} replays; losses and weights identical")
    if want_regions:
        check(rec > 0 and rep >= 2 * STEPS, f"{name}: {rec} recorded, {rep} replays (want regions replayed)")
    else:
        check(rec == 0 and "communicate inside" in out, f"{name}: {rec} recorded: want none, and the reason said")


def body(tmp):
    data = os.path.join(tmp, "train.bin")
    write_shard(data, np.random.default_rng(3).integers(0, 97, 20000))
    # 256 tokens per step: micro-batches of 4 rows of 16 tokens (several per step in every layout).
    common = ["-i", data, "-j", data, "-t", "16", "-b", "4", "-d", "256", "-x", str(STEPS), "-v", "3", "-m", "2",
              "-s", "3", "-g", "4", "--dtype", "fp64", "-l", "3e-3", "-u", "2"]
    gpt2, llama = ["-e", GPT2] + common, ["-e", LLAMA] + common
    compare(tmp, "one process", 0, gpt2, True)
    compare(tmp, "one process head-chunk full recompute", 0, gpt2 + ["--head-chunk", "24", "-r", "full"], True)
    compare(tmp, "llama one process", 0, llama, True)
    compare(tmp, "dp2 zero0", 2, gpt2, True)
    compare(tmp, "dp2 zero1", 2, gpt2 + ["-z", "1"], True)
    compare(tmp, "pp2", 2, gpt2 + ["--pp", "2"], True)
    compare(tmp, "pp2 vpp2", 2, gpt2 + ["--pp", "2", "--vpp", "2"], True)
    compare(tmp, "dp2 zero2", 2, gpt2 + ["-z", "2"], False)
    compare(tmp, "tp2 sp", 2, gpt2 + ["--tp", "2", "--sp", "1"], False)
    compare(tmp, "cp2", 2, gpt2 + ["--cp", "2"], False)


if __name__ == "__main__":
    run_suite(check, "llmc_graphs_", body)
