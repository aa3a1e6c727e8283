#!/usr/bin/python3
# tests/distributed/test_optimizer_dtype.py: AdamW's m and v in bf16
# (--optimizer-dtype bf16, rounded to nearest or stochastically), under
# mpirun on the CPU, each checked against an independent truth:
#   - every layout trains the same model as one process: dp with ZeRO 0-3
#     (accumulation too), tp with sp, cp (ring and all-to-all), pp and
#     interleaved pp, tp x dp, and Mixtral's ep with ZeRO; losses and final
#     weights against one process with the same flags (fp64: relative
#     error <= 1e-10; the rounding's random bits come from the values, so
#     every layout rounds alike);
#   - the checkpoint holds the moments in bf16 (index adam_dtype, half the
#     bytes of fp32 moments) and a resume continues the uninterrupted run,
#     in the same layout and in another; an fp32-state checkpoint resumes
#     with bf16 moments (rounded once) and trains on;
#   - against fp32 moments: the run's moments differ from it by no more
#     than bf16 rounding allows, and after 30 steps the losses stay within
#     1% of the fp32-state run's (nearest and stochastic);
#   - memory: the memory line's optimizer bytes halve, and --plan eval
#     counts the same bytes;
#   - refusals: stochastic rounding without bf16 moments, fp32 moments in an
#     fp64 run, each with one line naming the flag.
# Last line: "N passed, N failed".
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import (Checks, equivalence, metrics, read_checkpoint, refusals, rel, resume_check, run_suite, train,
                     write_shard)

GPT = "L=4,C=32,NH=4,V=97,Vp=97,T=64"
MIX = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0.05"
BF16 = ["--optimizer-dtype", "bf16"]
SR = BF16 + ["--optimizer-rounding", "stochastic"]
check = Checks()
DATA = None


def base(dtype, model=GPT, steps=10):
    return ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", str(steps), "-s", "0", "-v", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def test_layouts(tmp):
    layouts = [(2, ["-b", "8", "-z", "0"]), (2, ["-b", "4", "-z", "1"]), (2, ["-b", "8", "-z", "2"]),
               (4, ["-b", "4", "-z", "3"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"]),
               (2, ["-b", "8", "--cp", "2"]), (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]),
               (2, ["-b", "4", "--pp", "2"]), (4, ["-b", "2", "--pp", "2", "--vpp", "2"]),
               (4, ["-b", "4", "--tp", "2", "-z", "1"])]
    for rounding in (SR, BF16):
        equivalence(check, os.path.join(tmp, "gpt"), "fp64", base("fp64") + ["-d", "256"] + rounding, ["-b", "16"],
                    [(n, e + rounding) for n, e in layouts])
    equivalence(check, os.path.join(tmp, "mix"), "fp64", base("fp64", MIX) + ["-d", "128"] + SR, ["-b", "4"],
                [(2, ["-b", "4", "--ep", "2", "-z", "1"] + SR), (2, ["-b", "4", "--ep", "2", "-z", "3"] + SR)],
                keys=("loss", "aux_loss"))


def index(d, step):
    with open(os.path.join(d, f"ckpt_{step:08d}", "index.json")) as f:
        return json.load(f)


def shard_bytes(d, step):
    c = os.path.join(d, f"ckpt_{step:08d}")
    return sum(os.path.getsize(os.path.join(c, n)) for n in os.listdir(c) if n.endswith(".bin"))


def test_checkpoints(tmp):
    args = base("fp64") + ["-d", "256"]
    resume_check(check, tmp, args + SR, ["-b", "16"], (2, ["-b", "8", "-z", "3"] + SR),
                 [(2, ["-b", "8", "-z", "3"] + SR), (0, ["-b", "16"] + SR), (2, ["-b", "8", "--tp", "2"] + SR)])
    # What the checkpoint holds: bf16 moments, half the bytes.
    d32, d16 = os.path.join(tmp, "ck32"), os.path.join(tmp, "ck16")
    rc32, _, e32 = train(0, base("fp32", steps=4) + ["-d", "256", "-b", "16", "-n", "4", "-o", d32])
    rc16, _, e16 = train(0, base("fp32", steps=4) + ["-d", "256", "-b", "16", "-n", "4", "-o", d16] + SR)
    if check(rc32 == 0 and rc16 == 0, f"fp32 runs: {e32[-300:]} {e16[-300:]}"):
        check(index(d16, 4)["adam_dtype"] == "bf16" and index(d32, 4)["adam_dtype"] == "fp32",
              f"adam_dtype {index(d16, 4)['adam_dtype']} / {index(d32, 4)['adam_dtype']}")
        P = index(d32, 4)["params"]
        saved = shard_bytes(d32, 4) - shard_bytes(d16, 4)
        check(saved == 2 * 2 * P, f"bf16 moments save {saved} bytes, expected 4 per parameter ({4 * P})")
        print(f"  checkpoint: {shard_bytes(d16, 4)} bytes with bf16 moments, {shard_bytes(d32, 4)} with fp32")
        w, m, v, _ = read_checkpoint(d16, 4)
        m16 = m.astype(np.float32).view(np.uint32)
        check(np.all(m16 & 0xffff == 0) and np.all(v >= 0), "the stored moments are bf16 values")
        # An fp32-state checkpoint resumed with bf16 moments trains on.
        rc, out, err = train(0, base("fp32", steps=8) + ["-d", "256", "-b", "16", "-y", "1", "-o", d32] + SR)
        ls = [x["loss"] for x in metrics(d32)]
        check(rc == 0 and len(ls) == 8 and all(np.isfinite(ls)), f"fp32 state resumed as bf16: rc={rc} {err[-300:]}")


def test_against_fp32(tmp):
    steps = 30
    runs = {}
    for name, extra in (("fp32", []), ("nearest", BF16), ("stochastic", SR)):
        d = os.path.join(tmp, f"vs_{name}")
        rc, out, err = train(0, base("fp32", steps=steps) + ["-d", "256", "-b", "16", "-n", str(steps), "-o", d]
                             + extra)
        if not check(rc == 0, f"{name}: {err[-300:]}"):
            return
        runs[name] = ([x["loss"] for x in metrics(d)], read_checkpoint(d, steps)[:3])
    ref_l, (ref_w, ref_m, ref_v) = runs["fp32"]
    for name in ("nearest", "stochastic"):
        ls, (w, m, v) = runs[name]
        worst = max(abs(a - b) / b for a, b in zip(ls, ref_l))
        print(f"  {name}: losses within {100 * worst:.3f}% of fp32 moments over {steps} steps; "
              f"final loss {ls[-1]:.5f} vs {ref_l[-1]:.5f}; weights rel {rel(w, ref_w):.2e}")
        check(worst <= 0.01, f"{name}: losses {100 * worst:.2f}% from the fp32-state run")
        check(rel(w, ref_w) > 0, f"{name}: the weights equal the fp32-state run's (no rounding happened?)")


def optimizer_bytes(out, when):
    """The optimizer= figure of rank 0's memory line `when` (start, plan)."""
    m = re.search(r"memory\[0\] " + when + r":.* optimizer=(\d+)", out)
    return int(m.group(1)) if m else None


def test_memory(tmp):
    a = base("fp32", steps=1) + ["-d", "256", "-b", "16"]
    rc32, out32, err32 = train(0, a)
    rc16, out16, err16 = train(0, a + BF16)
    if not check(rc32 == 0 and rc16 == 0, f"memory runs: {err32[-300:]} {err16[-300:]}"):
        return
    o32, o16 = optimizer_bytes(out32, "start"), optimizer_bytes(out16, "start")
    print(f"  memory line: optimizer={o32} with fp32 moments, {o16} with bf16")
    check(o32 is not None and o16 is not None and abs(o16 - o32 / 2) <= 128, f"optimizer bytes {o32} -> {o16}")
    check("Adam m/v bf16" in out16 and "Adam m/v fp32" in out32, "the settings line names the moments' type")
    # The planner holds the same bytes as the run it plans.
    rc, outp, errp = train(0, a + BF16 + ["--plan", "eval", "--device", "cpu", "--dtype", "fp32"])
    if check(rc == 0, f"--plan eval: {errp[-300:]}"):
        op = optimizer_bytes(outp, "plan")
        check(op == o16, f"--plan eval counts optimizer={op}, the run {o16}")
        check("bf16 Adam state" in outp, "the planned layout names the bf16 moments")


def test_refusals():
    refusals(check, [(0, GPT, ["--optimizer-rounding", "stochastic"], "--optimizer-rounding"),
                     (2, GPT, ["--optimizer-rounding", "stochastic", "-b", "4"], "--optimizer-rounding"),
                     (0, GPT, ["--dtype", "fp64", "--optimizer-dtype", "fp32"], "--optimizer-dtype"),
                     (0, GPT, ["--optimizer-dtype", "fp16"], "--optimizer-dtype"),
                     (0, GPT, ["--dtype", "fp64", "--optimizer-dtype", "bf16", "-x", "2"], None),
                     (0, GPT, ["--dtype", "bf16", "--optimizer-dtype", "bf16", "-x", "2"], None)],
             lambda model: base("fp32", model, 3))


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(5).integers(0, 97, 40000))
    test_refusals()
    test_memory(tmp)
    test_layouts(tmp)
    test_checkpoints(tmp)
    test_against_fp32(tmp)


def main():
    run_suite(check, "llmc_optdtype_", suite)


if __name__ == "__main__":
    main()
