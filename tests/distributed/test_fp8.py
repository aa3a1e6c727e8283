#!/usr/bin/python3
# tests/distributed/test_fp8.py: --fp8 1 (docs/fp8.md) in every layout on
# the CPU, whose backends emulate the FP8 operands exactly. A tensor's amax
# is its whole tensor's in every layout (a max over the ranks holding its
# pieces), so every layout rounds every value as one process does and trains
# the same model: losses and final weights against one process with the same
# micro-batches (fp64, relative error <= 1e-10) for GPT-2 in dp with ZeRO
# 0-3, tp with and without sp, cp (ring and all-to-all), pp 1F1B and
# interleaved, tp x dp and cp x tp; Llama in tp x dp and cp; Mixtral (its
# experts stay in the compute type) in dp and ep. Also: FP8 changes the
# losses (the rounding is on) but little; a resume continues bit for bit
# (current scaling keeps no state); the bf16 backend trains with it; the
# planner's memory line equals the run's (one process, tp 2); delayed
# scaling (--fp8-history) in the layouts and in checkpoints (a resume, also
# in another layout); and a
# run that quantised without the group max (LLMC_TEST_FP8_LOCAL_AMAX=1,
# each rank's own pieces) differs under tp, so the check can fail. Last
# line: "N passed, N failed".
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import (Checks, copy_checkpoint, equivalence, metrics, read_checkpoint, refusals, rel, run_suite,
                     shards_equal, train, write_shard)

check = Checks()
GPT = "L=4,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=64"
MIX = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0.05"
DATA = None
STEPS = 6


def base(model=GPT, dtype="fp64"):
    return ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", str(STEPS), "-s", "0", "--dtype", dtype, "-c", "0.1",
            "-l", "3e-3", "-u", "2", "-q", "0.2", "--grad-clip", "1", "--fp8", "1"]


def test_layouts(tmp):
    single = ["-b", "4", "-d", "256"]  # micro-batches of 4 rows: the same ones in every layout below
    equivalence(check, os.path.join(tmp, "gpt"), "fp64", base() + ["-d", "256"], single, [
        (2, ["-b", "4", "-z", "0"]), (2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "-z", "2"]),
        (4, ["-b", "4", "-z", "3"]), (2, ["-b", "4", "--tp", "2"]), (2, ["-b", "4", "--tp", "2", "--sp", "1"]),
        (2, ["-b", "4", "--cp", "2"]), (2, ["-b", "4", "--cp", "2", "--cp-impl", "a2a"]),
        (2, ["-b", "4", "--pp", "2"]), (4, ["-b", "4", "--pp", "2", "--vpp", "2"]),
        (4, ["-b", "4", "--tp", "2", "-z", "1"]), (4, ["-b", "4", "--cp", "2", "--tp", "2", "--sp", "1"])], steps=STEPS)
    equivalence(check, os.path.join(tmp, "llama"), "fp64", base(LLAMA) + ["-d", "256"], single,
                [(4, ["-b", "4", "--tp", "2", "-z", "1"]), (2, ["-b", "4", "--cp", "2"])], steps=STEPS)
    equivalence(check, os.path.join(tmp, "mix"), "fp64", base(MIX) + ["-d", "256"], single,
                [(2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "--ep", "2"]), (2, ["-b", "4", "--tp", "2"])],
                steps=STEPS)


def test_effect_and_resume(tmp):
    # The rounding is on: the losses move, a little.
    runs = {}
    for f in ("0", "1"):
        d = os.path.join(tmp, f"effect_{f}")
        rc, out, err = train(0, base()[:-2] + ["--fp8", f, "-b", "4", "-d", "256", "-n", str(STEPS), "-o", d])
        if check(rc == 0, f"--fp8 {f}: {err[-300:]}"):
            runs[f] = [m["loss"] for m in metrics(d)]
    if len(runs) == 2:
        r = rel(runs["1"], runs["0"])
        check(1e-8 < r < 1e-2, f"--fp8 1 moves the losses by {r:.2e} (want between 1e-8 and 1e-2)")
        print(f"  --fp8 1 against --fp8 0: losses rel {r:.2e}")
    # A resume continues bit for bit (no state to carry).
    full, saved, d = (os.path.join(tmp, f"rs_{x}") for x in ("full", "saved", "resumed"))
    a = base() + ["-b", "4", "-d", "256"]
    ok = train(2, a + ["-z", "1", "-n", str(STEPS), "-o", full])[0] == 0
    ok = ok and train(2, a + ["-z", "1", "-n", "3", "-x", "3", "-o", saved])[0] == 0
    if check(ok, "resume: the runs"):
        copy_checkpoint(saved, d, 3)
        rc, out, err = train(2, a + ["-z", "1", "-n", str(STEPS), "-y", "1", "-o", d])
        if check(rc == 0, f"resume: {err[-300:]}"):
            same = [m["loss"] for m in metrics(full)][3:] == [m["loss"] for m in metrics(d)]
            check(same and shards_equal(full, d, STEPS), "resume at step 3: differs from the uninterrupted run")
            print("  resumed at step 3 (dp 2, ZeRO 1): equal to the uninterrupted run")
    # The bf16 backend: finite losses, near the fp64 run's.
    d = os.path.join(tmp, "bf16")
    rc, out, err = train(0, base(dtype="bf16") + ["-b", "4", "-d", "256", "-o", d])
    if check(rc == 0, f"bf16: {err[-300:]}") and "1" in runs:
        r = rel([m["loss"] for m in metrics(d)], runs["1"])
        check(r < 1e-2, f"bf16 --fp8 1: losses rel {r:.2e} of fp64's")
        print(f"  bf16 backend --fp8 1: losses rel {r:.2e} of the fp64 run's")


def test_delayed(tmp):
    """--fp8-history N: each operand scaled by the largest amax of its last N
    steps, the steps' amaxes maxed over the dp x cp ranks: every layout the
    same as one process; the history rides in checkpoints (a resume, also in
    another layout, continues the run)."""
    import json
    hist = ["--fp8-history", "3"]
    equivalence(check, os.path.join(tmp, "delayed"), "fp64", base() + hist + ["-d", "256"], ["-b", "4", "-d", "256"], [
        (2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "--tp", "2", "--sp", "1"]), (2, ["-b", "4", "--cp", "2"]),
        (2, ["-b", "4", "--pp", "2"]), (4, ["-b", "4", "--tp", "2", "-z", "1"])], steps=STEPS)
    runs = {}
    for h in ("0", "3"):
        d = os.path.join(tmp, f"delayed_{h}")
        rc, out, err = train(0, base() + ["--fp8-history", h, "-b", "4", "-d", "256", "-n", str(STEPS), "-o", d])
        if check(rc == 0, f"--fp8-history {h}: {err[-300:]}"):
            runs[h] = read_checkpoint(d, STEPS)[0]
    if len(runs) == 2:
        r = rel(runs["3"], runs["0"])
        check(r > 1e-9, f"delayed scaling differs from current scaling ({r:.2e})")
        print(f"  --fp8-history 3 against current scaling: final weights rel {r:.2e}")
    full, saved = os.path.join(tmp, "dl_full"), os.path.join(tmp, "dl_saved")
    a = base() + hist + ["-b", "4", "-d", "256"]
    ok = train(2, a + ["-z", "1", "-n", str(STEPS), "-o", full])[0] == 0
    ok = ok and train(2, a + ["-z", "1", "-n", "3", "-x", "3", "-o", saved])[0] == 0
    if not check(ok, "delayed resume: the runs"):
        return
    with open(os.path.join(saved, "ckpt_00000003", "index.json")) as f:
        h = json.load(f).get("fp8_amax_history", [])
    check(len(h) == 4 * 12 * 3 and max(h) > 0, f"the checkpoint holds the amax history ({len(h)} values)")
    full_l = [m["loss"] for m in metrics(full)][3:]
    for np_, extra, exact in [(2, ["-z", "1"], True), (2, ["--tp", "2"], False)]:
        d = os.path.join(tmp, "dl_resumed_" + "".join(extra).replace("-", ""))
        copy_checkpoint(saved, d, 3)
        rc, out, err = train(np_, a + extra + ["-n", str(STEPS), "-y", "1", "-o", d])
        if not check(rc == 0, f"delayed resume {' '.join(extra)}: {err[-300:]}"):
            continue
        got = [m["loss"] for m in metrics(d)]
        if exact:
            check(got == full_l and shards_equal(full, d, STEPS), "delayed resume (same layout): not bit for bit")
        else:
            check(rel(got, full_l) <= 1e-10, f"delayed resume in tp 2: losses rel {rel(got, full_l):.2e}")
        print(f"  delayed scaling resumed at step 3 ({' '.join(extra)}): losses rel {rel(got, full_l):.2e}")


def test_local_amax_differs(tmp):
    """Without the group max (each rank scaling by its own piece) tp differs:
    the layouts' agreement above comes from the max, not by chance."""
    outs = []
    for env in ({}, {"LLMC_TEST_FP8_LOCAL_AMAX": "1"}):
        d = os.path.join(tmp, f"local_{len(env)}")
        rc, out, err = train(2, base() + ["-b", "4", "-d", "256", "--tp", "2", "-n", str(STEPS), "-o", d], env=env)
        if check(rc == 0, f"local amax run: {err[-300:]}"):
            outs.append(read_checkpoint(d, STEPS)[0])
    if len(outs) == 2:
        r = rel(outs[1], outs[0])
        check(r > 1e-9, f"tp 2 with each rank's own amax differs from the group max's ({r:.2e})")
        print(f"  tp 2, each rank's own amax: final weights rel {r:.2e} from the group max's")


def test_plan_memory(tmp):
    """The planner builds the same model on its measuring backend: its memory
    line equals the run's, FP8 operand copies included."""
    import re
    for np_, extra in [(0, []), (2, ["--tp", "2"])]:
        a = base() + ["-b", "4", "-d", "256", "-x", "1"] + extra
        rc, out, err = train(np_, a)
        run_b = re.search(r"memory\[0\] start: .* bytes=(\d+)", out)
        rc2, out2, err2 = train(0, a + ["--plan", "eval"] + (["--world", str(np_)] if np_ else []))
        plan_b = re.search(r"memory\[0\] plan: .* bytes=(\d+)", out2)
        ok = rc == 0 and rc2 == 0 and run_b and plan_b and run_b.group(1) == plan_b.group(1)
        check(ok, f"--fp8 1 {' '.join(extra)}: the plan's bytes {plan_b and plan_b.group(1)} equal the run's "
              f"{run_b and run_b.group(1)}")
        if ok:
            print(f"  plan eval --fp8 1 {' '.join(extra) or '(one process)'}: {plan_b.group(1)} bytes, as the run")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(9).integers(0, 97, 40000))
    refusals(check, [(0, GPT, ["--fp8", "2"], "--fp8"), (0, GPT, ["--fp8", "0", "--fp8-history", "3"],
                                                                  "--fp8-history")],
             lambda model: ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", "2", "-s", "0"])
    test_effect_and_resume(tmp)
    test_plan_memory(tmp)
    test_layouts(tmp)
    test_delayed(tmp)
    test_local_amax_differs(tmp)


def main():
    run_suite(check, "llmc_fp8_", suite)


if __name__ == "__main__":
    main()
