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
#     tp=2 with sp, cp=2; they say so and train as without the switch;
#   - the whole step as one region (llmc/run/step_graph.h: --sync-free 1,
#     one process, a dense model): the first step plain, the second
#     recorded, the rest replayed, with the same metrics, samples and
#     checkpoint bytes as the run without regions, over gradient
#     accumulation, a warmup and cosine schedule (the learning rate and
#     Adam's t on the device), bf16 moments rounded stochastically (the
#     rounding key from the device's step count), the document mask,
#     Llama with --head-chunk, Mixtral with the load-balancing loss and
#     with the routing bias (both kept on the device), a NaN-poisoned step
#     (run plainly, skipped), and a resume; a run that cannot have it says
#     why.
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
MIXTRAL = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0.05"


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


def ckpt_bytes(d, step):
    cdir = os.path.join(d, f"ckpt_{step:08d}")
    return {n: open(os.path.join(cdir, n), "rb").read() for n in sorted(os.listdir(cdir))}


def figures(d):
    """metrics.jsonl without the timings."""
    drop = ("ms", "tokens_per_s", "mfu", "eta_s", "elapsed_s")
    return [{k: v for k, v in m.items() if k not in drop} for m in metrics(d)]


def whole_step(tmp, name, args, want, env_extra=None, resume_at=0):
    """The whole step as one region (want: (recorded, replays, plain)) or
    not (want: the reason's words), against the same run without regions.
    With resume_at, the run with regions stops there and resumes (-y 1)."""
    outs = {}
    # The host-read step (no --sync-free) too: the truth for what the
    # device keeps (the schedule, Adam's t, the rounding key).
    host_read = [a for i, a in enumerate(args) if a != "--sync-free" and (i == 0 or args[i - 1] != "--sync-free")]
    for graphs in (None, False, True):
        d = os.path.join(tmp, f"whole_{name.replace(' ', '_')}_{graphs}")
        env = dict(ENV, LLMC_CPU_GRAPH="1" if graphs else "0", **(env_extra or {}))
        runs = [((host_read if graphs is None else args) + ["-o", d, "-n", str(STEPS)], {})]
        if graphs and resume_at:
            # Killed at the start of step resume_at + 1 (the checkpoint of
            # resume_at written), then resumed: the schedule is the whole run's.
            crash = {"LLMC_TEST_CRASH": f"{resume_at + 1}:0:{d}_crashed"}
            runs = [(args + ["-o", d, "-n", str(resume_at)], crash), (args + ["-o", d, "-n", str(resume_at), "-y", "1"], {})]
        out = ""
        for a, e in runs:
            p = subprocess.run([TRAIN] + a, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(env, **e))
            if e:
                check(p.returncode != 0, f"whole step, {name}: the first run was killed")
                continue
            if not check(p.returncode == 0, f"whole step, {name}, graphs={graphs}: exit {p.returncode}: {p.stderr[-400:]}"):
                return
            out = p.stdout
        outs[graphs] = (d, out)
    (dh, _), (d0, out0), (d1, out1) = outs[None], outs[False], outs[True]
    f0, f1 = figures(d0), figures(d1)
    check(len(f0) == STEPS and f0 == f1, f"whole step, {name}: metrics (loss, norm, lr, skips, val) identical")
    check(ckpt_bytes(d0, STEPS) == ckpt_bytes(d1, STEPS), f"whole step, {name}: checkpoint files byte-identical")
    if host_read != args:
        check(figures(dh) == f1 and ckpt_bytes(dh, STEPS) == ckpt_bytes(d1, STEPS),
              f"whole step, {name}: metrics and checkpoint files equal the host-read step's")
    # (a resumed run prints the samples after its resume)
    samples = [re.findall(r"---- sample ----\n(.*?)\n----", o, re.S) for o in (out0, out1)]
    check(samples[1] and samples[0][-len(samples[1]):] == samples[1], f"whole step, {name}: the same text samples")
    m = re.search(r"whole step as one graph: (\d+) recorded, (\d+) replays, (\d+) steps run without", out1)
    if isinstance(want, tuple):
        got = tuple(int(g) for g in m.groups()) if m else None
        check(got == want, f"whole step, {name}: (recorded, replays, plain) {got}, want {want}")
        print(f"  whole step, {name}: {got}; metrics and checkpoints identical")
    else:
        m = re.search(r"whole step as one graph: no \((.*)\)", out1)
        check(m is not None and want in m.group(1), f"whole step, {name}: says why not: {m and m.group(1)!r}")


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

    # The whole step as one region: 4 micro-batches a step; -u 2 warms up,
    # then a cosine to 0 (the lr changes every step).
    sf = ["--sync-free", "1"]
    whole_step(tmp, "gpt-2 fp64", gpt2 + sf, (1, STEPS - 2, 1))
    whole_step(tmp, "gpt-2 bf16 moments stochastic", gpt2[:-6] + ["--dtype", "fp32", "-l", "3e-3", "-u", "2"] + sf +
               ["--optimizer-dtype", "bf16", "--optimizer-rounding", "stochastic"], (1, STEPS - 2, 1))
    whole_step(tmp, "bf16 backend", gpt2[:-6] + ["--dtype", "bf16", "-l", "3e-3", "-u", "2"] + sf, (1, STEPS - 2, 1))
    whole_step(tmp, "llama head-chunk document mask", llama + sf + ["--head-chunk", "24", "--document-mask", "1",
               "--eot-token", "5"], (1, STEPS - 2, 1))
    # Mixtral: its routing figures on the device (the experts' products take
    # their row counts there), the load-balancing loss and the routing bias.
    mix = ["-e", MIXTRAL] + common
    whole_step(tmp, "mixtral aux", mix + sf, (1, STEPS - 2, 1))
    whole_step(tmp, "mixtral bias", mix + sf + ["--moe-balance", "bias", "--moe-bias-rate", "0.01"], (1, STEPS - 2, 1))
    whole_step(tmp, "nan at step 3", gpt2 + sf, (1, STEPS - 3, 2), {"LLMC_TEST_NAN_STEP": "3"})
    whole_step(tmp, "resume at 3", gpt2 + sf, (1, STEPS - 5, 1), resume_at=3)
    whole_step(tmp, "host-read step", gpt2, "--sync-free 0")
    compare_dp = gpt2 + sf
    d = os.path.join(tmp, "whole_dp2")
    p = subprocess.run(["mpirun", "-np", "2", TRAIN] + compare_dp + ["-o", d], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(ENV, LLMC_CPU_GRAPH="1"))
    check(p.returncode == 0 and "whole step as one graph: no (the step communicates" in p.stdout,
          f"whole step, dp2: says why not (exit {p.returncode})")


if __name__ == "__main__":
    run_suite(check, "llmc_graphs_", body)
