#!/usr/bin/python3
# tests/distributed/test_sync_free.py: the step whose loss, gradient norm,
# clipping and skip decision stay on the device (--sync-free 1), under mpirun
# on the CPU, against the step that reads them on the host (--sync-free 0):
#   - every layout (one process with accumulation, dp with ZeRO 0-3, tp with
#     sp, cp ring and all-to-all, pp and interleaved pp, tp x dp; GPT-2 and
#     Llama; fp64, fp32 and the bf16 backend) gives the same metrics.jsonl
#     figures (loss, grad_norm, val_loss, skipped) and byte-identical
#     checkpoint shards: the device runs the host's arithmetic
#     (llmc/backend/step_figures.h) and its reductions in the host's order;
#   - bad steps: a NaN gradient (LLMC_TEST_NAN_STEP, rank 0's, after the
#     reductions) is skipped under dp with ZeRO 0-3, tp and pp, and
#     --skip-spikes skips the same steps, with the same running mean after;
#   - a resume continues the uninterrupted run bit for bit (the running mean
#     of --skip-spikes comes back from the checkpoint to the device);
#   - with recorded regions (LLMC_CPU_GRAPH=1) the same figures;
#   - the host reads once per step: LLMC_TEST_HOST_READS counts every call
#     that brings a value to the host; a sync-free step queues one late
#     download (its figures, behind its work) on every rank and waits for it
#     while the next step is queued; the host-read step reads its losses
#     and the norm's sum of squares as they come;
#   - with --sync-free the next step is queued before a step is reported
#     when nothing in between reads the model: the reports come in order,
#     validation, samples and checkpoints where due, and a stop signal ends
#     the run after the queued step, with a checkpoint to resume from;
#   - Mixtral (its routing statistics, load-balancing loss, loads and
#     routing bias on the device, the experts' products sized there): the
#     same figures (aux_loss and moe_maxvio too) and shards in one process,
#     dp with ZeRO 0-3, tp with sp, cp and tp x dp, in fp64, fp32 and bf16,
#     with --moe-balance bias, a skipped step and a resume; one read per
#     step; expert and pipeline parallelism refused in one line naming
#     --sync-free and the flag.
# Last line: "N passed, N failed".
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, copy_checkpoint, refusals, run_suite, shards_equal, train, write_shard

GPT = "L=4,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=4,C=32,NH=4,NKV=2,F=48,V=97,T=64"
MIX = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0.05"
check = Checks()
DATA = None
STEPS = 8


def base(dtype, model=GPT, steps=STEPS):
    return ["-e", model, "-i", DATA, "-j", DATA, "--val-tokens", "256", "-v", "4", "-t", "16", "-x", str(steps),
            "-s", "0", "--dtype", dtype, "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5",
            "-n", str(steps)]


def figures(d):
    keys = ("step", "loss", "grad_norm", "val_loss", "skipped", "skips", "aux_loss", "moe_maxvio")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [{k: m.get(k) for k in keys} for m in map(json.loads, f)]


def pair(tmp, name, np_, args, env=None, steps=STEPS):
    """Runs args with --sync-free 0 and 1; checks equal figures and shards. Returns the two outputs."""
    outs = []
    for sf in (0, 1):
        d = os.path.join(tmp, f"{name}_sf{sf}")
        rc, out, err = train(np_, args + ["--sync-free", str(sf), "-o", d], env=env)
        if not check(rc == 0, f"{name} --sync-free {sf}: {err[-400:]}"):
            return None
        outs.append((d, out))
    (d0, o0), (d1, o1) = outs
    f0, f1 = figures(d0), figures(d1)
    same = f0 == f1 and len(f0) == steps
    check(same, f"{name}: figures differ: {next(((a, b) for a, b in zip(f0, f1) if a != b), (len(f0), len(f1)))}")
    check(shards_equal(d0, d1, steps), f"{name}: the final checkpoint's shards differ")
    skipped = [m["step"] for m in f1 if m["skipped"]]
    print(f"  {name}: {len(f1)} steps equal{' (skipped ' + str(skipped) + ')' if skipped else ''}, final loss "
          f"{f1[-1]['loss']}")
    return o0, o1


def test_layouts(tmp):
    for dtype in ("fp64", "fp32"):
        a = base(dtype) + ["-d", "256"]
        for np_, extra in [(0, ["-b", "4"]), (2, ["-b", "8", "-z", "0"]), (2, ["-b", "4", "-z", "1"]),
                           (2, ["-b", "8", "-z", "2"]), (4, ["-b", "4", "-z", "3"]),
                           (2, ["-b", "8", "--tp", "2", "--sp", "1"]), (2, ["-b", "8", "--cp", "2"]),
                           (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]), (2, ["-b", "4", "--pp", "2"]),
                           (4, ["-b", "2", "--pp", "2", "--vpp", "2"]), (4, ["-b", "4", "--tp", "2", "-z", "1"])]:
            if dtype == "fp32" and np_ == 4:
                continue  # the four-rank mixes once, in fp64
            pair(tmp, f"{dtype}_np{np_}_" + "".join(extra).replace("-", ""), np_, a + extra)
    pair(tmp, "llama_fp64_tp2_z1", 4, base("fp64", LLAMA) + ["-d", "256", "-b", "8", "--tp", "2", "-z", "1"])
    pair(tmp, "bf16_np0", 0, base("bf16") + ["-d", "256", "-b", "8"])
    pair(tmp, "bf16_np2_z1", 2, base("bf16") + ["-d", "256", "-b", "8", "-z", "1"])


def test_mixtral(tmp):
    a = base("fp64", MIX) + ["-d", "256"]
    for np_, extra in [(0, ["-b", "4"]), (2, ["-b", "8", "-z", "0"]), (2, ["-b", "4", "-z", "1"]),
                       (2, ["-b", "8", "-z", "3"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"]),
                       (2, ["-b", "8", "--cp", "2"]), (4, ["-b", "4", "--tp", "2", "-z", "1"])]:
        pair(tmp, f"mix_fp64_np{np_}_" + "".join(extra).replace("-", ""), np_, a + extra)
    pair(tmp, "mix_fp32_np2_z2", 2, base("fp32", MIX) + ["-d", "256", "-b", "8", "-z", "2"])
    pair(tmp, "mix_bf16_np0", 0, base("bf16", MIX) + ["-d", "256", "-b", "8"])
    # The routing bias moved on the device (not on a skipped step), and back
    # in the checkpoint for a resume.
    bias = ["--moe-balance", "bias", "--moe-bias-rate", "0.01", "--max-skips", "100"]
    r = pair(tmp, "mix_bias_nan_np2_z1", 2, a + bias + ["-b", "4", "-z", "1"], env={"LLMC_TEST_NAN_STEP": "3"})
    if r:
        check(all("step     4: update skipped" in o for o in r), "mixtral bias: step 4 not skipped")
    full, saved, d = (os.path.join(tmp, f"mix_rs_{x}") for x in ("full", "saved", "resumed"))
    rs = a + bias + ["-b", "8", "--tp", "2", "--sync-free", "1"]
    ok = train(2, rs + ["-o", full])[0] == 0
    ok = ok and train(2, rs[:rs.index("-n") + 1] + ["4"] + rs[rs.index("-n") + 2:] + ["-o", saved])[0] == 0
    if check(ok, "mixtral resume: the runs"):
        copy_checkpoint(saved, d, 4)
        rc, out, err = train(2, rs + ["-y", "1", "-o", d])
        if check(rc == 0, f"mixtral resume: {err[-300:]}"):
            check(figures(full)[4:] == figures(d) and shards_equal(full, d, STEPS),
                  "mixtral resume (bias, tp 2): the resumed run differs from the uninterrupted one")
            print("  mixtral resumed at step 4 (tp 2, --moe-balance bias): equal to the uninterrupted run")


def test_bad_steps(tmp):
    a = base("fp64") + ["-d", "256", "--max-skips", "100"]
    # The poisoned gradient (rank 0, after the reductions) in every data-
    # parallel stage, tensor and pipeline parallel: every rank skips step 4.
    for np_, extra in [(0, ["-b", "8"]), (2, ["-b", "8", "-z", "0"]), (2, ["-b", "8", "-z", "1"]),
                       (2, ["-b", "8", "-z", "2"]), (2, ["-b", "8", "-z", "3"]), (2, ["-b", "4", "--pp", "2"]),
                       (2, ["-b", "8", "--tp", "2"])]:
        r = pair(tmp, f"nan_np{np_}_" + "".join(extra).replace("-", ""), np_, a + extra,
                 env={"LLMC_TEST_NAN_STEP": "3"})
        if r:
            check(all("step     4: update skipped (the gradient norm is not finite)" in o for o in r),
                  f"nan np{np_} {' '.join(extra)}: step 4 not skipped")
    r = pair(tmp, "spikes", 2, a + ["-b", "8", "-z", "2", "--skip-spikes", "0.99"], steps=STEPS)
    if r:
        check(re.search(r"update skipped \(a loss spike", r[1]) is not None, "spikes: nothing was skipped")


def test_resume(tmp):
    a = base("fp64") + ["-d", "256", "-b", "8", "--skip-spikes", "0.999", "--max-skips", "100", "--sync-free", "1"]
    full = os.path.join(tmp, "rs_full")
    rc, out, err = train(2, a + ["-z", "1", "-o", full])
    saved = os.path.join(tmp, "rs_saved")
    rc2, out2, err2 = train(2, a[:a.index("-n") + 1] + ["4"] + a[a.index("-n") + 2:] + ["-z", "1", "-o", saved])
    if not check(rc == 0 and rc2 == 0, f"resume runs: {err[-300:]} {err2[-300:]}"):
        return
    d = os.path.join(tmp, "rs_resumed")
    copy_checkpoint(saved, d, 4)
    rc, out, err = train(2, a + ["-z", "1", "-y", "1", "-o", d])
    if check(rc == 0, f"resume: {err[-300:]}"):
        f_full, f_res = figures(full)[4:], figures(d)
        check(f_full == f_res, f"resumed figures differ: {f_full[:2]} / {f_res[:2]}")
        check(shards_equal(full, d, STEPS), "resumed: the final shards differ")
        print(f"  resumed at step 4 (2 ranks, ZeRO 1, --skip-spikes): {len(f_res)} steps equal the uninterrupted run")


def test_regions(tmp):
    pair(tmp, "cpu_graph_np2_z1", 2, base("fp32") + ["-d", "256", "-b", "4", "-z", "1"], env={"LLMC_CPU_GRAPH": "1"})


def test_host_reads(tmp):
    for np_, model, extra in [(0, GPT, ["-b", "4"]), (2, GPT, ["-b", "4", "-z", "1"]), (2, GPT, ["-b", "4", "--pp", "2"]),
                              (0, MIX, ["-b", "4"]), (2, MIX, ["-b", "4", "--tp", "2", "--moe-balance", "bias"])]:
        r = pair(tmp, f"reads_np{np_}_{model[:8]}", np_, base("fp32", model, steps=4) + ["-d", "256"] + extra,
                 env={"LLMC_TEST_HOST_READS": "1"}, steps=4)
        if not r:
            continue
        reads = [re.findall(r"host reads\[(\d+)\] step (\d+): (.*)", o) for o in r]
        ranks = max(1, np_)
        sync_free = reads[1]
        check(len(sync_free) == 4 * ranks and all(x[2] == "download_late 1" for x in sync_free),
              f"np{np_}: a sync-free step reads more than its figures: {sorted(set(x[2] for x in sync_free))}")
        check(len(reads[0]) == 4 * ranks and all("sum_squares" in x[2] for x in reads[0]),
              f"np{np_}: the host-read step's reads are not counted: {sorted(set(x[2] for x in reads[0]))}")
        print(f"  np{np_} {' '.join(extra)}: host reads per step: --sync-free 0: "
              f"{sorted(set(x[2] for x in reads[0]))}; --sync-free 1: {sorted(set(x[2] for x in sync_free))}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(5).integers(0, 97, 40000))
    refusals(check, [(2, MIX, ["--sync-free", "1", "--ep", "2"], "--ep 2 or --sync-free"),
                     (2, MIX, ["--sync-free", "1", "--pp", "2"], "--pp 2 or --sync-free")],
             lambda model: ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", "2", "-s", "0"])
    test_host_reads(tmp)
    test_mixtral(tmp)
    test_layouts(tmp)
    test_bad_steps(tmp)
    test_resume(tmp)
    test_regions(tmp)


def main():
    run_suite(check, "llmc_syncfree_", suite)


if __name__ == "__main__":
    main()
