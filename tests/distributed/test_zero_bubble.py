#!/usr/bin/python3
# tests/distributed/test_zero_bubble.py: the zero-bubble pipeline schedules
# (--pp-schedule zb-h1 and zbv, llmc/parallel/pipeline_schedule.h: each
# backward split into B, the input's gradient, and W, the weights',
# GPT::BackwardPart; ZBV over two chunks per stage placed in a V) on the CPU
# under mpirun, against independent truths:
#   - equivalence: pp 2 and 4, pp 2 x dp 2 with ZeRO 0 and 1, pp 2 x cp 2
#     (ring and all-to-all), pp 2 x tp 2 with and without sp, pp 2 x tp 2
#     (sp) x dp 2 ZeRO 1, pp 2 with recompute full and selective, pp 2 x tp 2
#     (sp) with recompute gelu, pp 2 x dp 2 ZeRO 2 (and full recompute) and
#     3 (selective recompute), pp 2 x tp 2 (sp) x dp 2 ZeRO 3 (W takes the
#     norms' weight gradients) for GPT-2; pp 2, pp 2 x dp 2 ZeRO 1 and pp 2 x tp 2
#     (sp) for Llama; pp 2 for Qwen2 (q, k, v biases); pp 2, pp 2 x ep 2,
#     pp 2 x tp 2, pp 2 with selective recompute, pp 2 x ep 2 and pp 2 x
#     dp 2 ZeRO 2 with full recompute for Mixtral (its experts' and
#     router's weight gradients in W; under full recompute from the rows and
#     row groups B kept); with --fp8 1 pp 2,
#     pp 2 x tp 2 (sp), pp 2 x cp 2 and delayed scaling (W at the amaxes B
#     took); zbv: pp 2 and 4, pp 2 x dp 2 ZeRO 1, 2 and 3 (full recompute), pp 2 x tp 2 (sp), pp 2 x
#     cp 2, pp 2 with recompute full, Llama pp 2 (untied head) and pp 2 x
#     tp 2 (sp), Mixtral pp 2, pp 2 x ep 2 and full recompute, --fp8 1 pp 2: 10 steps of
#     losses and the final weights equal one process (fp64 <= 1e-10; fp32
#     pp 2 <= 1e-5);
#   - bit for bit: zb-h1 and 1F1B in the same layout (pp 2; x dp 2 ZeRO 1
#     and 2; x tp 2 with sp) give the same losses and the same checkpoint bytes (the gradients accumulate in the same
#     micro-batch order, B's norms and W's products alike);
#   - checkpoints: saved under 1F1B, resumed under zb-h1 (pp 2 and pp 4)
#     and zbv (pp 2), and saved under zb-h1 and zbv, resumed in one
#     process, with the uninterrupted run's losses;
#   - the planner: --plan eval's memory line equals the run's (zb-h1 holds
#     the W's waiting micro-batches and their output gradients; the last
#     stage's head one micro-batch's logits, its F to B; stage 0 one
#     micro-batch's output gradients, its B to W), its bubble
#     is below 1F1B's, and a search with --pp 4 fixed names --pp-schedule
#     zb-h1 in its launch line where its cost model says it wins; zbv the
#     same (memory; bubble below zb-h1's; a search with --pp 3 --vpp 2);
#   - errors: zb-h1 with --vpp,
#     one stage, an unknown schedule, 1f1b with --vpp and interleaved
#     without it; zbv with --vpp 3, one stage, blocks that do not
#     split into 2pp chunks: one line naming the flag, every rank exits.
# The schedule itself (order, slots, the bubble on a cost model) is checked
# in tests/unit/test_pipeline_schedule.cpp, the split backward against the
# whole one in tests/unit/test_split_backward.cpp.
# Last line: "N passed, N failed".
import filecmp
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, equivalence, metrics, plan_memory, refusals, resume_check, run_suite, train, write_shard

L, C, NH, V, T = 4, 32, 4, 97, 16
GPT = f"L={L},C={C},NH={NH},V={V},Vp={V},T=64"
LLAMA = f"arch=llama,L={L},C={C},NH={NH},NKV=2,F=48,V={V},T=64"
QWEN = f"arch=qwen2,L={L},C={C},NH={NH},NKV=2,F=48,V={V},T=64"
MIX = f"arch=mixtral,L={L},C=48,NH={NH},NKV=2,F=40,E=4,K=2,V={V},T=64,aux=0.05"
GPT8 = f"L=8,C={C},NH={NH},V={V},Vp={V},T=64"
ZB = ["--pp-schedule", "zb-h1"]
ZV = ["--pp-schedule", "zbv"]
check = Checks()
DATA = None


def base(dtype, steps=10, model=GPT):
    return ["-e", model, "-i", DATA, "-j", "", "-t", str(T), "-x", str(steps), "-s", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5", "-d", "256"]


def test_equivalence(tmp):
    pp = ["-b", "2", "--pp"]
    equivalence(check, tmp, "fp64", base("fp64"), ["-b", "16"], [
        (2, pp + ["2"] + ZB), (4, pp + ["4"] + ZB), (4, pp + ["2", "-z", "0"] + ZB), (4, pp + ["2", "-z", "1"] + ZB),
        (4, pp + ["2", "--cp", "2"] + ZB), (4, pp + ["2", "--cp", "2", "--cp-impl", "a2a"] + ZB),
        (4, pp + ["2", "--tp", "2"] + ZB), (4, pp + ["2", "--tp", "2", "--sp", "1"] + ZB),
        (8, pp + ["2", "--tp", "2", "--sp", "1", "-z", "1"] + ZB), (2, pp + ["2", "-r", "full"] + ZB),
        (4, pp + ["2", "-z", "2"] + ZB), (4, pp + ["2", "-z", "3", "-r", "selective"] + ZB),
        (4, pp + ["2", "-z", "2", "-r", "full"] + ZB),
        (8, pp + ["2", "--tp", "2", "--sp", "1", "-z", "3"] + ZB),
        (2, pp + ["2", "-r", "selective"] + ZB), (4, pp + ["2", "--tp", "2", "--sp", "1", "-r", "gelu"] + ZB)])
    equivalence(check, tmp, "fp64", base("fp64", model=LLAMA), ["-b", "16"],
                [(2, pp + ["2"] + ZB), (4, pp + ["2", "-z", "1"] + ZB), (4, pp + ["2", "--tp", "2", "--sp", "1"] + ZB)])
    equivalence(check, tmp, "fp64", base("fp64", model=QWEN), ["-b", "16"], [(2, pp + ["2"] + ZB)])
    # (A Mixtral's load-balancing loss pools each micro-batch's routing: one
    # process runs the same micro-batches of 2 rows.)
    equivalence(check, tmp, "fp64", base("fp64", model=MIX), ["-b", "2"],
                [(2, pp + ["2"] + ZB), (4, pp + ["2", "--ep", "2"] + ZB), (4, pp + ["2", "--tp", "2"] + ZB),
                 (2, pp + ["2", "-r", "selective"] + ZB), (4, pp + ["2", "--ep", "2", "-r", "full"] + ZB),
                 (4, pp + ["2", "-z", "2", "-r", "full"] + ZB)])
    equivalence(check, tmp, "fp32", base("fp32"), ["-b", "16"], [(2, pp + ["2"] + ZB)])
    # --fp8 1 (each micro-batch's own amaxes: one process runs the same
    # micro-batches), current and delayed scaling.
    equivalence(check, tmp, "fp64", base("fp64") + ["--fp8", "1"], ["-b", "2"],
                [(2, pp + ["2"] + ZB), (4, pp + ["2", "--tp", "2", "--sp", "1"] + ZB), (4, pp + ["2", "--cp", "2"] + ZB)])
    equivalence(check, tmp, "fp64", base("fp64") + ["--fp8", "1", "--fp8-history", "2"], ["-b", "2"],
                [(2, pp + ["2"] + ZB)])
    # ZBV: stage 0 holds the first and the last chunk (one copy of the tied
    # embeddings), the turn of the V is a copy on the last stage.
    equivalence(check, tmp, "fp64", base("fp64"), ["-b", "16"], [
        (2, pp + ["2"] + ZV), (4, pp + ["2", "-z", "1"] + ZV), (4, pp + ["2", "--tp", "2", "--sp", "1"] + ZV),
        (4, pp + ["2", "--cp", "2"] + ZV), (2, pp + ["2", "-r", "full"] + ZV), (4, pp + ["2", "-z", "2"] + ZV),
        (4, pp + ["2", "-z", "3", "-r", "full"] + ZV)])
    equivalence(check, tmp, "fp64", base("fp64", model=GPT8), ["-b", "16"], [(4, pp + ["4"] + ZV)])
    equivalence(check, tmp, "fp64", base("fp64", model=LLAMA), ["-b", "16"],
                [(2, pp + ["2"] + ZV), (4, pp + ["2", "--tp", "2", "--sp", "1"] + ZV)])
    equivalence(check, tmp, "fp64", base("fp64", model=MIX), ["-b", "2"],
                [(2, pp + ["2"] + ZV), (4, pp + ["2", "--ep", "2"] + ZV), (2, pp + ["2", "-r", "full"] + ZV)])
    equivalence(check, tmp, "fp64", base("fp64") + ["--fp8", "1"], ["-b", "2"], [(2, pp + ["2"] + ZV)])


def test_bitwise(tmp):
    """zb-h1 against 1F1B in the same layout: the same bytes."""
    for np_, extra in ((2, ["--pp", "2"]), (4, ["--pp", "2", "-z", "1"]), (4, ["--pp", "2", "--tp", "2", "--sp", "1"]),
                       (4, ["--pp", "2", "-z", "2"])):
        runs = []
        for sched in ("1f1b", "zb-h1"):
            d = os.path.join(tmp, f"bits_{np_}_{sched}")
            rc, out, err = train(np_, base("fp32", 6) + ["-b", "2", "-n", "6", "-o", d, "--pp-schedule", sched] + extra)
            if check(rc == 0, f"{sched} {extra}: {err[-300:]}"):
                runs.append(d)
        if len(runs) != 2:
            continue
        same_loss = [m["loss"] for m in metrics(runs[0])] == [m["loss"] for m in metrics(runs[1])]
        ck = [os.path.join(r, "ckpt_00000006") for r in runs]
        files = sorted(f for f in os.listdir(ck[0]) if f.endswith(".bin"))
        same_bytes = bool(files) and all(filecmp.cmp(os.path.join(ck[0], f), os.path.join(ck[1], f), shallow=False)
                                         for f in files)
        check(same_loss and same_bytes, f"{extra} fp32: zb-h1 equals 1F1B bit for bit (losses {same_loss}, "
              f"checkpoint shards {same_bytes})")
        print(f"  {' '.join(extra)} fp32: zb-h1 and 1f1b: losses equal {same_loss}, {len(files)} checkpoint "
              f"shards equal {same_bytes}")


def test_checkpoints(tmp):
    resume_check(check, tmp, base("fp64"), ["-b", "16"], (2, ["-b", "2", "--pp", "2"]),
                 ((2, ["-b", "2", "--pp", "2"] + ZB), (4, ["-b", "2", "--pp", "4"] + ZB), (2, ["-b", "2", "--pp", "2"] + ZV)))
    for name, sched in (("from_zb", ZB), ("from_zbv", ZV)):
        back = os.path.join(tmp, name)
        os.makedirs(back)
        resume_check(check, back, base("fp64"), ["-b", "16"], (2, ["-b", "2", "--pp", "2"] + sched), ((0, ["-b", "16"]),))


def test_planner(tmp):
    for sched in ("zb-h1", "zbv"):
        run_b, plan_b, err = plan_memory(2, base("fp32", 1) + ["-b", "2", "--pp", "2", "--pp-schedule", sched])
        ok = run_b is not None and run_b == plan_b
        check(ok, f"{sched} pp 2: the plan's bytes {plan_b} equal the run's {run_b} {err}")
        if ok:
            print(f"  plan eval --pp 2 --pp-schedule {sched}: {plan_b} bytes on rank 0, as the run")
    # The head's logits live from its forward to its B: the last stage, one
    # micro-batch between them under zb-h1 (B right after F) though W's keep
    # pp slots, holds one micro-batch of logits. Whole head less --head-chunk R:
    # N·V logits against R·V logits, N·C input gradient and the V·C weight
    # gradient's accumulator (fp32, activations and scratch).
    acts = {}
    for chunk in ("0", "8"):
        rc, out, err = train(2, base("fp32", 1) + ["-b", "2", "--pp", "2", "--head-chunk", chunk] + ZB)
        mo = re.search(r"memory\[1\] start: .* activations=(\d+)", out)
        acts[chunk] = int(mo.group(1)) if rc == 0 and mo else None
    if check(None not in acts.values(), f"zb-h1 pp 2 runs: {acts}"):
        N, R, held = 2 * T, 8, 1
        want = 4 * (held * N * V - R * V - held * N * C - V * C)
        got = acts["0"] - acts["8"]
        check(got == want, f"zb-h1's last stage holds {held} micro-batch of logits: whole head less chunked {got} "
              f"bytes, formula {want}")
    # Stage 0 of pp 2 holds two micro-batches under both schedules; under
    # zb-h1 its W follows its B, so it keeps one micro-batch's output
    # gradients for W (QKV 3C, the projection C, fc 4C, fcproj C per token,
    # L/2 blocks), not one per slot.
    stage0 = {}
    for sched in ("1f1b", "zb-h1"):
        rc, out, err = train(2, base("fp32", 1) + ["-b", "2", "--pp", "2", "--pp-schedule", sched])
        mo = re.search(r"memory\[0\] start: .* activations=(\d+)", out)
        stage0[sched] = int(mo.group(1)) if rc == 0 and mo else None
    if check(None not in stage0.values(), f"pp 2 runs: {stage0}"):
        want = 1 * (L // 2) * 9 * (2 * T) * C * 4
        got = stage0["zb-h1"] - stage0["1f1b"]
        check(got == want, f"zb-h1's stage 0 keeps one micro-batch of output gradients for W: {got} bytes more than "
              f"1F1B, formula {want}")
    # The bubble on an H100 profile: zb-h1's below 1F1B's (pp 4); ZBV's
    # (d12's 12 blocks in 6 chunks: pp 3) half of zb-h1's and under it.
    b4 = planned_bubbles(4, ("1f1b", "zb-h1"))
    if len(b4) == 2:
        check(b4["zb-h1"] < b4["1f1b"], f"the planned bubble, pp 4: {b4}")
    b3 = planned_bubbles(3, ("1f1b", "zb-h1", "zbv"))
    if len(b3) == 3:
        check(b3["zbv"] < b3["zb-h1"] < b3["1f1b"], f"the planned bubble, pp 3: {b3}")
    # A search picks the zero-bubble schedule its cost model prefers, and
    # names it: zb-h1 with --pp 4, zbv with two chunks per stage (--vpp 2).
    for world, fixed, want in ((8, ["--pp", "4"], "zb-h1"), (6, ["--pp", "3", "--vpp", "2"], "zbv")):
        rc, out, err = train(0, ["--plan", "search", "-e", "d12", "--world", str(world), "--tp", "1", "-t", "1024",
                                 "-d", str(world * 4 * 1024), "--hardware", "h100-sxm", "-r", "none", "-z", "1"] + fixed)
        launch = re.search(r"launch: (.*)", out)
        check(rc == 0 and launch and f"--pp-schedule {want}" in launch.group(1) and "--vpp" not in launch.group(1),
              f"a search with {' '.join(fixed)} picks {want} and names it: {launch and launch.group(1)} {err[-300:]}")


def planned_bubbles(pp, schedules):
    """--plan eval's bubble (ms) of d12 over pp stages of 2 dp ranks on an H100 profile, per schedule."""
    got = {}
    for sched in schedules:
        rc, out, err = train(0, ["--plan", "eval", "-e", "d12", "--world", str(2 * pp), "--pp", str(pp), "-b", "4",
                                 "-t", "1024", "-d", str(32 * pp * 1024 * 2), "--hardware", "h100-sxm",
                                 "--pp-schedule", sched])
        mo = re.search(r"bubble ([0-9.]+)", out)
        if check(rc == 0 and mo, f"plan eval --pp {pp} --pp-schedule {sched}: {err[-300:]} {out[-300:]}"):
            got[sched] = float(mo.group(1))
    print(f"  planned bubble, d12 pp {pp} on h100-sxm: {got} ms")
    return got


def test_errors():
    refusals(check, [(2, GPT, ["--pp", "2", "--vpp", "2"] + ZB, ("--pp-schedule", "--vpp")),
                     (1, GPT, ZB, ("--pp-schedule", "--pp > 1")),
                     (2, GPT, ["--pp", "2", "--pp-schedule", "zbx"], "--pp-schedule"),
                     (2, GPT, ["--pp", "2", "--vpp", "2", "--pp-schedule", "1f1b"], "--pp-schedule"),
                     (2, GPT, ["--pp", "2", "--pp-schedule", "interleaved"], "--pp-schedule"),
                     (2, GPT, ["--pp", "2", "--vpp", "3"] + ZV, "--vpp"),
                     (1, GPT, ZV, ("--pp-schedule", "--pp > 1")),
                     (2, GPT.replace("L=4", "L=6"), ["--pp", "2"] + ZV, ("--pp-schedule", "4 model chunks"))],
             lambda model: ["-e", model, "-i", DATA, "-j", "", "-t", str(T), "-x", "1", "-s", "0", "-b", "2", "-d",
                            "256"])


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(13).integers(0, V, 40000))
    test_errors()
    test_bitwise(tmp)
    test_planner(tmp)
    test_equivalence(tmp)
    test_checkpoints(tmp)


def main():
    run_suite(check, "llmc_zb_", suite)


if __name__ == "__main__":
    main()
