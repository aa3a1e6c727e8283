#!/usr/bin/python3
# tests/distributed/test_fp8.py: --fp8 1 (docs/fp8.md) in every layout on
# the CPU, whose backends emulate the FP8 operands exactly. A tensor's amax
# is its whole tensor's in every layout (a max over the ranks holding its
# pieces), so every layout rounds every value as one process does and trains
# the same model: losses and final weights against one process with the same
# micro-batches (fp64, relative error <= 1e-10) for GPT-2 in dp with ZeRO
# 0-3, tp with and without sp, cp (ring and all-to-all), pp 1F1B and
# interleaved, tp x dp and cp x tp; Llama in tp x dp and cp; Mixtral, its
# experts on FP8 operands block by block (one micro-batch's rows for one
# expert: one tensor), in dp, ep (also with tp, cp, full recompute, and
# under ZB-H1 with ZeRO 2 and ZBV under full recompute), tp, cp and pp, with
# current and delayed scaling; one amax per expert over all its rows (what a product
# taking several ranks' micro-batches would do, LLMC_TEST_FP8_EXPERT_WHOLE)
# differs under ep, so the block scales are what make it equal. Also: FP8 changes the
# losses (the rounding is on) but little; a resume continues bit for bit
# (current scaling keeps no state); the bf16 backend trains with it; the
# planner's memory line equals the run's (one process, tp 2) and it prices
# the FP8 products, their operands' passes and group maxes by formula, and
# refuses a profile without FP8 products, and its eval prints the same plan
# without FP8 beside it (equal to a plan of --fp8 0); widths that a backend's FP8
# products do not take are refused at setup (LLMC_TEST_FP8_ALIGN); delayed
# scaling (--fp8-history) in the layouts and in checkpoints (a resume, also
# in another layout); --fp8-layers (a set of the four layers in FP8) in the
# layouts, the planner and the memory line; and a
# run that quantised without the group max (LLMC_TEST_FP8_LOCAL_AMAX=1,
# each rank's own pieces) differs under tp, so the check can fail. Last
# line: "N passed, N failed".
import json
import os
import sys

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "lib"))
sys.path.insert(0, os.path.join(TESTS, "e2e"))
from test_planner import wave_gemm  # noqa: E402
from testlib import (Checks, copy_checkpoint, equivalence, metrics, plan_memory, read_checkpoint, refusals, rel,
                     run_suite, shards_equal, train, write_shard)

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
                [(2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "--ep", "2"]), (2, ["-b", "4", "--tp", "2"]),
                 (2, ["-b", "4", "--cp", "2"]), (2, ["-b", "4", "--pp", "2"]), (4, ["-b", "4", "--ep", "2", "--tp", "2"]),
                 (4, ["-b", "4", "--ep", "2", "--cp", "2"]), (2, ["-b", "4", "--ep", "2", "-r", "full"]),
                 (4, ["-b", "4", "--ep", "2", "--pp", "2", "--pp-schedule", "zb-h1", "-z", "2"])], steps=STEPS)


def test_experts(tmp):
    """Each block of a Mixtral expert's products (one micro-batch's rows) is
    one tensor with its own amax. With one amax per expert over all its rows
    on the rank (LLMC_TEST_FP8_EXPERT_WHOLE) one process, one block per
    expert, is unchanged, and ep 2, whose experts take both ranks'
    micro-batches, differs from it: the block scales are what make the
    layouts above agree."""
    a = base(MIX) + ["-b", "4", "-d", "256", "-n", str(STEPS)]
    w = {}
    for name, np_, extra, env in [("single", 0, [], {}), ("single_whole", 0, [], {"LLMC_TEST_FP8_EXPERT_WHOLE": "1"}),
                                  ("ep_whole", 2, ["--ep", "2"], {"LLMC_TEST_FP8_EXPERT_WHOLE": "1"})]:
        d = os.path.join(tmp, "experts_" + name)
        rc, out, err = train(np_, a + extra + ["-o", d], env=env)
        if check(rc == 0, f"experts {name}: {err[-300:]}"):
            w[name] = read_checkpoint(d, STEPS)[0]
    if len(w) == 3:
        check(rel(w["single_whole"], w["single"]) == 0, "one process: one block per expert, the same either way")
        r = rel(w["ep_whole"], w["single"])
        check(r > 1e-6, f"ep 2 with one amax per expert over both ranks' rows differs from one process ({r:.2e})")
        print(f"  ep 2, one amax per expert instead of per block: final weights rel {r:.2e} from one process")
    # ZBV (4 layers: two chunks on each of 2 stages) with ep 2 under full
    # recompute: W reads the blocks' amaxes from the layer-slot, with delayed scaling.
    equivalence(check, os.path.join(tmp, "mix_zbv"), "fp64",
                base(MIX.replace("L=2", "L=4")) + ["-d", "256", "--fp8-history", "2"], ["-b", "4"],
                [(4, ["-b", "4", "--pp", "2", "--pp-schedule", "zbv", "--ep", "2", "-r", "full"])], steps=STEPS)


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
    # A Mixtral's experts keep a history each (per layer, expert, product, operand).
    equivalence(check, os.path.join(tmp, "delayed_mix"), "fp64", base(MIX) + hist + ["-d", "256"],
                ["-b", "4", "-d", "256"], [(2, ["-b", "4", "--ep", "2"]), (2, ["-b", "4", "--cp", "2"]),
                                           (4, ["-b", "4", "--ep", "2", "--tp", "2"])], steps=STEPS)
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


def test_layers(tmp):
    """--fp8-layers: the layers it leaves out multiply in the compute type,
    neither measured nor cast (the reference tier checks one process against
    reference_gpt.py and transformers with the same sets). With a set, every
    layout still trains as one process (GPT-2 under delayed scaling, whose
    casts and kept copies are those of the set's layers; a Mixtral's experts'
    down products alone), and the plan's memory equals the run's (fewer
    weights' copies)."""
    hist = ["--fp8-history", "3"]
    equivalence(check, os.path.join(tmp, "layers"), "fp64",
                base() + hist + ["--fp8-layers", "attproj,fcproj", "-d", "256"], ["-b", "4", "-d", "256"],
                [(2, ["-b", "4", "--tp", "2", "--sp", "1"]), (2, ["-b", "4", "--cp", "2"]),
                 (2, ["-b", "4", "--pp", "2", "--pp-schedule", "zb-h1"]), (4, ["-b", "4", "-z", "3"])], steps=STEPS)
    equivalence(check, os.path.join(tmp, "layers_mix"), "fp64", base(MIX) + ["--fp8-layers", "qkv,fcproj", "-d", "256"],
                ["-b", "4", "-d", "256"], [(2, ["-b", "4", "--ep", "2"]), (2, ["-b", "4", "--tp", "2"])], steps=STEPS)
    # A Mixtral's experts left out: the sync-free step, which keeps the routing on the device, runs (and trains
    # the same model as the step that reads it on the host); with them in it is refused (suite()).
    equivalence(check, os.path.join(tmp, "layers_sync_free"), "fp64",
                base(MIX) + ["--fp8-layers", "qkv,attproj", "-d", "256"], ["-b", "4", "-d", "256"],
                [(0, ["-b", "4", "--sync-free", "1"])], steps=STEPS)
    for np_, model, extra in [(0, GPT, ["--fp8-layers", "fc"]), (0, GPT, hist + ["-r", "1", "--fp8-layers", "qkv,fcproj"]),
                              (2, MIX, ["--ep", "2", "--fp8-layers", "attproj,fc"])]:
        run_b, plan_b, err = plan_memory(np_, base(model) + ["-b", "4", "-d", "256", "-x", "1"] + extra)
        check(run_b is not None and run_b == plan_b,
              f"--fp8 1 {' '.join(extra)}: the plan's bytes {plan_b} equal the run's {run_b} {err}")


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
    line equals the run's, FP8 operand copies included (delayed scaling's
    kept transposed copy of fcproj's input, per layer-slot or recomputed; a
    Mixtral's: its experts' block amaxes and histories too)."""
    for np_, model, extra in [(0, GPT, []), (2, GPT, ["--tp", "2"]), (0, GPT, ["--fp8-history", "3"]),
                              (0, GPT, ["--fp8-history", "3", "-r", "1"]), (0, MIX, ["--fp8-history", "3"]),
                              (2, MIX, ["--ep", "2"])]:
        run_b, plan_b, err = plan_memory(np_, base(model) + ["-b", "4", "-d", "256", "-x", "1"] + extra)
        ok = run_b is not None and run_b == plan_b
        check(ok, f"--fp8 1 {' '.join(extra)}: the plan's bytes {plan_b} equal the run's {run_b} {err}")
        if ok:
            print(f"  plan eval --fp8 1 {model.split(',')[0]} {' '.join(extra) or '(one process)'}: {plan_b} bytes, "
                  "as the run")
    # --fp8-weight-copies 0: the four layers' weights' copies (each 256-byte aligned, as they are and
    # transposed) and their amaxes not held; the plan likewise.
    sizes = []
    for copies in ("1", "0"):
        run_b, plan_b, err = plan_memory(0, base(GPT) + ["-b", "4", "-d", "256", "-x", "1", "--fp8-weight-copies",
                                                         copies])
        check(run_b is not None and run_b == plan_b, f"--fp8-weight-copies {copies}: the plan's bytes {plan_b} equal "
              f"the run's {run_b} {err}")
        sizes.append(int(run_b or 0))
    L, C = 4, 32
    want = L * sum(2 * ((o * i + 255) // 256 * 256) for i, o in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))) + L * 4 * 8
    check(sizes[0] - sizes[1] == want, f"--fp8-weight-copies 0 holds {sizes[0] - sizes[1]} bytes less, want {want}")
    print(f"  --fp8-weight-copies 0: {sizes[0] - sizes[1]} bytes less (the copies and their amaxes: {want})")


def plan_row(tmp, name, prof, args, fp8):
    """--plan eval of args on the profile prof (a dict), with --fp8 fp8: its JSON row."""
    path, jp = os.path.join(tmp, name + ".json"), os.path.join(tmp, f"{name}_{fp8}.jsonl")
    with open(path, "w") as f:
        json.dump(dict({"name": name, "attn_flops": 1e30, "launch_s": 0, "intra_bw": 1e30, "intra_lat": 0}, **prof), f)
    rc, out, err = train(0, ["--plan", "eval"] + args + ["--fp8", str(fp8), "--hardware", path, "--plan-json", jp])
    if not check(rc == 0, f"plan {name} --fp8 {fp8}: {err[-300:]}"):
        return None
    with open(jp) as f:
        return json.loads(f.readline())


def test_plan_time(tmp):
    """The planner prices --fp8 1 (llmc/plan/cost_model.cpp), each part
    against its formula written again here: the four linear layers' products
    at the profile's FP8 rate by the wave model (a Mixtral's experts too, its
    router and every model's head at the compute type's), the operands' amax and
    quantisation passes by their bytes (a GPU's FP8 copies and transposes,
    the CPU emulation's copies in the compute type), the group max of an
    amax under tp and cp a collective of one number each; a profile without
    FP8 products refuses the flag."""
    S, tile, rate, rate8, L, B, T = 64, (2, 4), 1e12, 3e12, 2, 64, 16
    g = lambda M, N, K, r: wave_gemm(M, N, K, S, tile, r)  # noqa: E731
    both = lambda M, i, o, r: g(M, o, i, r) + g(M, i, o, r) + g(i, o, M, r)  # noqa: E731
    waves = {"matmul_flops": rate, "fp8_matmul_flops": rate8, "mem_bw": 1e30, "sm_count": S, "gemm_tile_m": tile[0],
             "gemm_tile_n": tile[1]}
    N, C, V = B * T, 8, 16
    flags = ["-t", str(T), "-b", str(B), "-d", str(B * T), "--world", "1"]
    row = plan_row(tmp, "w8", waves, ["-e", f"L={L},C={C},NH=2,V={V},Vp={V},T={T}"] + flags, 1)
    if row:
        block = sum(both(N, i, o, rate8) for i, o in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)))
        want, got = L * block + both(N, C, V, rate), row["breakdown_ms"]["compute"] / 1e3
        check(abs(got / want - 1) < 1e-9, f"FP8 products: planned {got}, formula {want}")
        print(f"  planned FP8 products: {got * 1e6:.4f} us, formula {want * 1e6:.4f} us")
    E, K, F, Ckv = 4, 2, 12, 4
    row = plan_row(tmp, "w8m", waves, ["-e", f"arch=mixtral,L={L},C={C},NH=2,NKV=1,F={F},E={E},K={K},V={V},T={T}"]
                   + flags, 1)
    if row:
        R = N * K // E
        block = (both(N, C, C + 2 * Ckv, rate8) + both(N, C, C, rate8) + both(N, C, E, rate)
                 + E * (both(R, C, 2 * F, rate8) + both(R, F, C, rate8)))
        want, got = L * block + both(N, C, V, rate), row["breakdown_ms"]["compute"] / 1e3
        check(abs(got / want - 1) < 1e-9, f"Mixtral FP8: planned {got}, formula {want} (experts in FP8)")
    # --fp8-layers qkv,fc: attention's projection and the experts' down products at the compute type's rate.
    row = plan_row(tmp, "w8m_layers", waves, ["-e", f"arch=mixtral,L={L},C={C},NH=2,NKV=1,F={F},E={E},K={K},V={V},"
                                              f"T={T}"] + flags + ["--fp8-layers", "qkv,fc"], 1)
    if row:
        block = (both(N, C, C + 2 * Ckv, rate8) + both(N, C, C, rate) + both(N, C, E, rate)
                 + E * (both(R, C, 2 * F, rate8) + both(R, F, C, rate)))
        want, got = L * block + both(N, C, V, rate), row["breakdown_ms"]["compute"] / 1e3
        check(abs(got / want - 1) < 1e-9, f"Mixtral --fp8-layers qkv,fc: planned {got}, formula {want}")
    # The passes: products free, memory at 1 GB/s; the difference --fp8 makes.
    bw, C = 1e9, 32
    model = ["-e", f"L={L},C={C},NH=4,V={V},Vp={V},T={T}"] + flags
    # m micro-batches a step: a weight is measured and quantised (both ways) in the first alone.
    # --fp8-weight-copies 0: every micro-batch's. --fp8-layers: those layers' passes alone.
    names = ("qkv", "attproj", "fc", "fcproj")
    for device, dtype, a, hist, m, copies, layers in (
            ("cuda", "bf16", 2, 0, 1, 1, "all"), ("cuda", "bf16", 2, 2, 1, 1, "all"), ("cpu", "fp32", 4, 0, 1, 1, "all"),
            ("cuda", "bf16", 2, 0, 2, 1, "all"), ("cuda", "bf16", 2, 0, 2, 0, "all"),
            ("cuda", "bf16", 2, 2, 1, 1, "qkv,fcproj"), ("cuda", "bf16", 2, 2, 2, 1, "attproj,fc")):
        prof = {"matmul_flops": 1e30, "fp8_matmul_flops": 1e30, "mem_bw": bw, "device": device, "dtype": dtype}
        run = model + ["--dtype", dtype] + (["-d", str(m * B * T)] if m > 1 else [])
        f8 = (["--fp8-history", str(hist)] if hist else []) + ([] if copies else ["--fp8-weight-copies", "0"])
        f8 += ["--fp8-layers", layers]
        rows = [plan_row(tmp, f"passes_{device}_{hist}_{m}_{copies}_{layers}", prof, run + (f8 if f else []), f)
                for f in (0, 1)]
        if not all(rows):
            continue
        got = (rows[1]["breakdown_ms"]["compute"] - rows[0]["breakdown_ms"]["compute"]) / 1e3 / m
        want = 0
        for k, (i, o) in enumerate(((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))):
            if layers != "all" and names[k] not in layers.split(","):
                continue  # (in the compute type: the same as without --fp8)
            x, w, dy = N * i, o * i / (m if device == "cuda" and copies else 1), N * o
            # The forward reads the input's and the weight's amax, the backward
            # only the output gradient's (the other two are the forward's).
            if device == "cpu":  # amax read, then each operand's rounded copy read and written
                want += 3 * a * (x + w) + a * dy + 2 * a * (x + w + dy)
            else:  # quantised: read, a byte written (backward: dy as it is and transposed, in one pass)
                # The ops that write an operand measure it as they write it: forward the norms
                # QKV's (k 0) and fc's (k 2) inputs, the GELU fcproj's (k 3); backward the GELU
                # fc's dy (k 2), the norms' backward attention's projection's (k 1) and fcproj's (k 3).
                # Delayed scaling: the GELU writes the bytes of fcproj's input (k 3) forward and of fc's
                # dy (k 2) both ways backward, which their quantisers then do not read; fcproj's input
                # also transposed for its weight gradient, which then reads no input, and the GELU
                # does not store its output in bf16 (a·N·4C less of the block's own traffic). The norms
                # write QKV's (k 0) and fc's (k 2) inputs' bytes and transposed copies the same way
                # (their output's store traded for the cast's read of the row: no change there).
                xin, dyin = (0 if hist and k != 1 else a), (0 if hist and k == 2 else a)
                kept = hist and k != 1
                want += a * ((x if k == 1 else 0) + w) + (xin + 1) * x + (a + 1) * w + (a * dy if k == 0 else 0)
                want += (dyin + 2) * dy + (a + 1) * w + (0 if kept else (a + 1) * x)
                want += x if kept else 0
                want -= a * x if hist and k == 3 else 0
        want = L * want / bw
        check(abs(got / want - 1) < 1e-9, f"FP8 passes on {device} (history {hist}, {m} micro-batches, weight "
              f"copies {copies}, layers {layers}): planned {got}, formula {want}")
        print(f"  planned FP8 operand passes ({device}, {dtype}, history {hist}, {m} micro-batches a step, weight "
              f"copies {copies}, layers {layers}): {got * 1e6:.3f} us, formula {want * 1e6:.3f} us")
    # Delayed scaling on a Llama: besides the two casts' reads (fcproj's input, fc's output gradient),
    # the whole backward leaves fc's output gradient out in bf16 (no fc bias): a·N·2F less per block;
    # fcproj's input kept transposed in FP8: its weight gradient's pass (a + 1)·N·F gone, N·F more
    # written forward, where SwiGLU's bf16 output is not stored (a·N·F); and the norms' casts of
    # QKV's and fc's inputs: each a·N·C read forward and (a + 1)·N·C backward gone, N·C written.
    F = 48
    prof = {"matmul_flops": 1e30, "fp8_matmul_flops": 1e30, "mem_bw": bw, "device": "cuda", "dtype": "bf16"}
    llama = ["-e", f"arch=llama,L={L},C={C},NH=4,NKV=2,F={F},V={V},T={T}"] + flags + ["--dtype", "bf16"]
    rows = [plan_row(tmp, f"cast_llama_{h}", prof, llama + ["--fp8-history", str(h)] if h else llama, 1)
            for h in (0, 2)]
    if all(rows):
        got = (rows[0]["breakdown_ms"]["compute"] - rows[1]["breakdown_ms"]["compute"]) / 1e3
        want = L * (2 * (N * F + N * 2 * F + N * 2 * F) + 3 * N * F - N * F + 2 * N * F + 2 * (2 + 3 - 1) * N * C) / bw
        check(abs(got / want - 1) < 1e-9, f"Llama, --fp8-history 2: the casts and the unstored output gradient "
              f"save {got}, formula {want}")
        print(f"  planned Llama delayed-scaling saving: {got * 1e6:.3f} us, formula {want * 1e6:.3f} us")
    # A zero-bubble schedule splits each backward into B and W, each quantising the
    # output gradient its own way: one more read of a·dy per layer on a GPU (pp 2, a
    # block per stage, 2 micro-batches of 32 rows of 16; W also reads no amax).
    prof = {"matmul_flops": 1e30, "fp8_matmul_flops": 1e30, "mem_bw": bw, "device": "cuda", "dtype": "bf16"}
    pp = model[:2] + ["-t", str(T), "-b", "32", "-d", str(64 * T), "--world", "2", "--pp", "2", "--dtype", "bf16"]
    ms = {}
    for sched in ("1f1b", "zb-h1"):
        for f in (0, 1):
            row = plan_row(tmp, f"split_{sched}", prof, pp + ["--pp-schedule", sched], f)
            ms[sched, f] = row["breakdown_ms"]["compute"] / 1e3 if row else None
    if None not in ms.values():
        got = (ms["zb-h1", 1] - ms["zb-h1", 0]) - (ms["1f1b", 1] - ms["1f1b", 0])
        Nm = 32 * T
        want = 2 * sum(2 * Nm * o for o in (3 * C, C, 4 * C, C)) / bw  # 2 micro-batches, one block per stage
        check(abs(got / want - 1) < 1e-9, f"FP8 under zb-h1: the split backward's extra dy read planned {got}, "
              f"formula {want}")
        print(f"  planned FP8 split backward's extra (zb-h1, pp 2): {got * 1e6:.3f} us, formula {want * 1e6:.3f} us")
    # The group max: 4 FP8 layers; tp: 6 maxes forward, 2 backward (the column-parallel
    # layers' output gradients); cp: 4 and 4 (the backward's own: the output gradients).
    # --fp8-layers: tp, each layer's weight and a row-parallel one's input (attproj,
    # fcproj) forward, a column-parallel one's (qkv, fc) output gradient backward;
    # cp, each layer's input and output gradient.
    lat = 1e-6
    prof = {"matmul_flops": 1e30, "fp8_matmul_flops": 1e30, "mem_bw": 1e30, "intra_lat": lat, "gpus_per_node": 8}
    for kind, layers, n_max in (("tp", "all", 8), ("cp", "all", 8), ("tp", "qkv,attproj", 4), ("tp", "attproj", 2),
                                ("tp", "fc", 2), ("cp", "fcproj", 2)):
        args = model[:-2] + ["--world", "2", f"--{kind}", "2"]
        rows = [plan_row(tmp, f"max_{kind}_{layers}", prof, args + (["--fp8-layers", layers] if f else []), f)
                for f in (0, 1)]
        if all(rows):
            got = (rows[1]["breakdown_ms"][kind] - rows[0]["breakdown_ms"][kind]) / 1e3
            want = L * n_max * 2 * lat  # an all-reduce of one number over 2 ranks: 2 latencies
            check(abs(got / want - 1) < 1e-9, f"FP8 group max under {kind} 2 ({layers}): planned {got}, "
                  f"formula {want}")
    rc, out, err = train(0, ["--plan", "eval", "-e", GPT, "--hardware", "a100", "--fp8", "1"])
    lines = [x for x in err.splitlines() if x.startswith("train_gpt")]
    check(rc != 0 and len(lines) == 1 and "--fp8" in lines[0] and "a100" in lines[0],
          f"--fp8 1 on a profile without FP8 products is refused: rc={rc} {err[-300:]!r}")


def test_plan_gain(tmp):
    """--plan eval --fp8 1 prints the same plan without FP8 beside it: its
    tokens/s ratio and each linear layer's time with and without equal two
    separate plans (--fp8 1 and --fp8 0, their JSON rows); --fp8 0 prints
    no such line. Where FP8 pays on another set of the layers than the
    plan's (each layer's time against the compute type's, from the rows), a
    second line names that set and its ratio, that of a plan with
    --fp8-layers set (which then prints no such line); on none: "leave out"."""
    prof = {"matmul_flops": 1e12, "fp8_matmul_flops": 2e12, "mem_bw": 2e10, "device": "cuda", "dtype": "bf16",
            "sm_count": 64, "gemm_tile_m": 2, "gemm_tile_n": 4}
    args = ["-e", "L=2,C=32,NH=4,V=97,Vp=97,T=64", "-t", "16", "-b", "64", "-d", "2048", "--world", "1",
            "--dtype", "bf16"]
    rows = [plan_row(tmp, "gain", prof, args, f) for f in (0, 1)]
    outs = [train(0, ["--plan", "eval"] + args + ["--fp8", str(f), "--hardware", os.path.join(tmp, "gain.json")])[1]
            for f in (0, 1)]
    lines = [x for x in outs[1].splitlines() if x.startswith("plan fp8:")]
    line = lines[:1]
    check(not any(x.startswith("plan fp8:") for x in outs[0].splitlines()), "--fp8 0 prints no FP8 line")
    if not (all(rows) and check(len(lines) == 2, f"--fp8 1 prints the FP8 lines: {outs[1][-400:]!r}")):
        return
    slower = all(rows[1]["classes_ms"][n] >= rows[0]["classes_ms"][n] for n in ("qkv", "attproj", "fc", "fcproj"))
    check(slower and "pays on none" in lines[1] and "leave out --fp8 1" in lines[1],
          f"FP8 slower on every layer: the plan says it pays on none: {lines[1]!r}")
    words = line[0].replace(",", " ").replace("(", " ").replace(")", " ").split()
    ratio = float(words[2].rstrip("x"))
    want = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    check(abs(ratio - want) < 6e-4, f"FP8's ratio printed {ratio}, the two plans' {want:.4f}")
    for name in ("qkv", "attproj", "fc", "fcproj"):
        i = words.index(name)
        got = (float(words[i + 1]), float(words[i + 3]))
        exp = (rows[1]["classes_ms"][name], rows[0]["classes_ms"][name])
        check(all(abs(g - e) < 6e-3 for g, e in zip(got, exp)), f"{name}: printed {got}, the two plans' {exp}")
    print(f"  plan fp8: {ratio}x, the two plans' {want:.4f}")
    # A faster memory: FP8 pays on some layers (the rows say which), not all.
    prof["mem_bw"] = 1e11
    rows = [plan_row(tmp, "gain_bw", prof, args, f) for f in (0, 1)]
    if not all(rows):
        return
    names = ("qkv", "attproj", "fc", "fcproj")
    pays = ",".join(n for n in names if rows[1]["classes_ms"][n] < rows[0]["classes_ms"][n])
    out = train(0, ["--plan", "eval"] + args + ["--fp8", "1", "--hardware", os.path.join(tmp, "gain_bw.json")])[1]
    lines = [x for x in out.splitlines() if x.startswith("plan fp8: FP8 pays on")]
    if not check(pays and pays.count(",") < 3 and len(lines) == 1 and f"--fp8-layers {pays} gives" in lines[0],
                 f"FP8 pays on {pays!r} alone: the plan says so: {lines!r}"):
        return
    got = float(lines[0].split(" gives ")[1].split("x")[0])
    row = plan_row(tmp, "gain_bw", prof, args + ["--fp8-layers", pays], 1)
    out = train(0, ["--plan", "eval"] + args + ["--fp8", "1", "--fp8-layers", pays, "--hardware",
                                                os.path.join(tmp, "gain_bw.json")])[1]
    if row:
        want = row["tokens_per_s"] / rows[0]["tokens_per_s"]
        check(abs(got - want) < 6e-4, f"--fp8-layers {pays}: printed {got}x, its plan's {want:.4f}")
        check("FP8 pays on" not in out and f"fp8 products on {pays}" in out,
              f"the plan of --fp8-layers {pays} says so and suggests nothing more: {out[-400:]!r}")
        print(f"  plan fp8: FP8 pays on {pays}: {got}x, that plan's {want:.4f}")


def test_widths():
    """A backend whose FP8 products take only some widths (cuBLASLt's:
    multiples of 16; the CPU made to claim the same by LLMC_TEST_FP8_ALIGN)
    refuses, before the first step and in one line from every rank, a
    layer width or micro-batch that is not one, naming it."""
    refusals(check, [(0, "L=2,C=32,NH=4,V=97,T=64", ["-b", "4", "-t", "16"], None),
                     (0, "L=2,C=32,NH=4,V=97,T=64", ["-b", "1", "-t", "12"], ("--fp8", "B x T per rank")),
                     (0, "L=2,C=40,NH=4,V=97,T=64", ["-b", "4", "-t", "16"], ("--fp8", "C is 40")),
                     (2, "L=2,C=48,NH=4,V=97,T=64", ["-b", "4", "-t", "16", "--tp", "2"],
                      ("--fp8", "the attention's width on this rank is 24")),
                     (2, "L=2,C=32,NH=4,V=97,T=64", ["-b", "3", "-t", "16", "--cp", "2"],
                      ("--fp8", "B x T per rank")),
                     (0, "arch=mixtral,L=2,C=32,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64", ["-b", "4", "-t", "16"],
                      ("--fp8", "an expert's hidden width on this rank is 40")),
                     (0, "arch=mixtral,L=2,C=32,NH=4,NKV=2,F=48,E=4,K=2,V=97,T=64", ["-b", "4", "-t", "16"], None)],
             lambda model: ["-e", model, "-i", DATA, "-j", "", "-x", "1", "-s", "0", "-v", "0", "--fp8", "1"],
             env={"LLMC_TEST_FP8_ALIGN": "16"})


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(9).integers(0, 97, 40000))
    refusals(check, [(0, GPT, ["--fp8", "2"], "--fp8"), (0, GPT, ["--fp8", "0", "--fp8-history", "3"],
                                                                  "--fp8-history"),
                     (0, GPT, ["--fp8", "0", "--fp8-weight-copies", "0"], "--fp8-weight-copies"),
                     (0, GPT, ["--fp8", "0", "--fp8-layers", "fc"], "--fp8-layers"),
                     (0, GPT, ["--fp8", "1", "--fp8-layers", "fc,mlp"], ("--fp8-layers", "'mlp'")),
                     (0, GPT, ["--fp8", "1", "--fp8-layers", "qkv,qkv"], ("--fp8-layers", "twice")),
                     (0, MIX, ["--fp8", "1", "--sync-free", "1"], ("--sync-free", "--fp8")),
                     (0, MIX, ["--fp8", "1", "--fp8-layers", "qkv,fcproj", "--sync-free", "1"],
                      ("--sync-free", "--fp8-layers"))],
             lambda model: ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", "2", "-s", "0"])
    test_effect_and_resume(tmp)
    test_plan_memory(tmp)
    test_plan_time(tmp)
    test_plan_gain(tmp)
    test_widths()
    test_layouts(tmp)
    test_experts(tmp)
    test_delayed(tmp)
    test_layers(tmp)
    test_local_amax_differs(tmp)


def main():
    run_suite(check, "llmc_fp8_", suite)


if __name__ == "__main__":
    main()
