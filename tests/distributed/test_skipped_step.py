#!/usr/bin/python3
# tests/distributed/test_skipped_step.py: a skipped step is a step that never
# happened (docs/design.md section 2.8). Neither the learning-rate schedule
# nor AdamW's step count t advances on a skipped step, so a run whose step K
# is skipped (LLMC_TEST_NAN_STEP=K: rank 0's gradient poisoned after the
# reductions) equals, byte for byte, a run on the same data without step K's
# rows that skips nothing:
#   run A: data D, step K skipped, N steps (N - 1 updates);
#   run B: data D without the rows of step K, nothing skipped; its state
#          after N - 1 steps.
# The two token streams give every other step the same rows (the first
# token of step K + 1 is set equal to the first of step K, the token the
# last row of step K - 1 ends on). Both runs have the same -x, so the same
# schedule. Checked: A's weights, m and v at step N equal B's at step N - 1;
# A's losses and learning rates after K equal B's one step earlier; in
# every layout (one process with accumulation, dp with ZeRO 0-3, tp with
# sp, cp, pp, Llama tp x dp, Mixtral ep), with the host-read step and
# --sync-free 1 (the device's own count of updates), with the skip inside
# the warmup and after it, and with the NaN put on a rank in each place the
# hook offers: a gradient element after the reductions, the same before
# them (the backward and the reductions carry it), the loss before its
# reduction. Byte-equal shards say that no rank updated on the bad step. A
# learning-rate check that counted the skipped step fails.
# Last line: "N passed, N failed".
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, read_checkpoint, run_suite, train, write_shard

GPT = "L=2,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=64"
MIX = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0"
T, D, N = 16, 256, 6  # tokens per row, tokens per step, steps
check = Checks()


def streams(tmp, k):
    """Data A, and A without the tokens of step k's rows."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 97, 40000)
    a[D * (k + 1)] = a[D * k]  # the last row of step k - 1 ends on the same token in both
    b = np.concatenate([a[:D * k], a[D * (k + 1):]])
    pa, pb = os.path.join(tmp, f"a{k}.bin"), os.path.join(tmp, f"b{k}.bin")
    write_shard(pa, a)
    write_shard(pb, b)
    return pa, pb


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run_args(model, extra, val, sync_free):
    return ["-e", model, "-j", val, "--val-tokens", "256", "-v", "0", "-t", str(T), "-d", str(D), "-x", str(N),
            "-s", "0", "--dtype", "fp64", "-l", "3e-3", "-u", "3", "-q", "0.2", "-c", "0.1", "--grad-clip", "0.5",
            "-n", "1", "--sync-free", str(sync_free)] + extra


def case(tmp, name, np_, model, extra, k, data, val, sync_free, hooks):
    """Run B once; then run A with each hook (LLMC_TEST_NAN_STEP's rank and
    place), each against B."""
    args = run_args(model, extra, val, sync_free)
    db = os.path.join(tmp, f"{name}_B")
    rc, out, err = train(np_, args + ["-i", data[1], "-o", db])
    if not check(rc == 0, f"{name}: run B: {err[-400:]}"):
        return
    mb = metrics(db)
    check(not any(m.get("skipped") for m in mb), f"{name}: B skipped a step")
    wb, m_b, v_b, _ = read_checkpoint(db, N - 1)
    for rank, where in hooks:
        what = f"{name}, rank {rank}'s {where}"
        da = os.path.join(tmp, f"{name}_A_{rank}_{where}")
        rc, out, err = train(np_, args + ["-i", data[0], "-o", da], env={"LLMC_TEST_NAN_STEP": f"{k}:{rank}:{where}"})
        if not check(rc == 0, f"{what}: run A: {err[-400:]}"):
            continue
        ma = metrics(da)
        check([m.get("skipped", False) for m in ma] == [i == k for i in range(N)],
              f"{what}: A did not skip exactly step {k + 1}: {[m.get('skipped') for m in ma]}")
        # A's steps after k are B's one step earlier.
        after_a = [(m["loss"], m["lr"]) for m in ma[:k] + ma[k + 1:]]
        after_b = [(m["loss"], m["lr"]) for m in mb[:N - 1]]
        check(after_a == after_b, f"{what}: losses or learning rates differ: "
              f"{next(((i, x, y) for i, (x, y) in enumerate(zip(after_a, after_b)) if x != y), None)}")
        # Byte for byte: no rank updated on the bad step (every rank's shard
        # of the weights and Adam state is B's).
        wa, m_a, v_a, _ = read_checkpoint(da, N)
        check(np.array_equal(wa, wb) and np.array_equal(m_a, m_b) and np.array_equal(v_a, v_b),
              f"{what}: A's weights or Adam state after {N} steps differ from B's after {N - 1}: "
              f"max |dw| {np.max(np.abs(wa - wb)):.3e}, |dm| {np.max(np.abs(m_a - m_b)):.3e}")


def test_layouts(tmp):
    val = os.path.join(tmp, "val.bin")
    data = {k: streams(tmp, k) for k in (1, 4)}
    layouts = [("np1", 0, GPT, ["-b", "8"]), ("dp2_z0", 2, GPT, ["-b", "8", "-z", "0"]),
               ("dp2_z1", 2, GPT, ["-b", "4", "-z", "1"]), ("dp2_z2", 2, GPT, ["-b", "8", "-z", "2"]),
               ("dp2_z3", 2, GPT, ["-b", "8", "-z", "3"]), ("tp2_sp", 2, GPT, ["-b", "16", "--tp", "2", "--sp", "1"]),
               ("cp2", 2, GPT, ["-b", "16", "--cp", "2"]), ("pp2", 2, GPT, ["-b", "4", "--pp", "2"]),
               ("llama_tp2_dp2", 4, LLAMA, ["-b", "8", "--tp", "2", "-z", "1"]),
               ("mixtral_ep2", 2, MIX, ["-b", "8", "--ep", "2", "-z", "1"])]
    for name, np_, model, extra in layouts:
        last = max(np_, 1) - 1  # a rank of the last pipeline stage (it computes the loss)
        hooks = [(0, "grad"), (last, "grad_pre"), (last, "loss")]
        for sf in (0, 1):
            if sf and model == MIX:
                continue  # not sync-free (refused)
            k = 4 if sf == 0 else 1  # after the warmup, and inside it
            case(tmp, f"{name}_sf{sf}_k{k}", np_, model, extra, k, data[k], val, sf, hooks)
    print(f"  {len(layouts)} layouts x (host-read step, skip at step 5; --sync-free 1, skip at step 2 in the "
          "warmup) x a NaN in a gradient after and before the reductions, and in the loss: each run equals "
          "the run without that step's rows")


def test_lr_formula(tmp):
    """The learning rate the run reports after a skip: the schedule at the
    update's number, computed here from the formula (design.md 2.6)."""
    val = os.path.join(tmp, "val.bin")
    a, _ = streams(tmp, 2)
    d = os.path.join(tmp, "lr")
    rc, out, err = train(0, ["-e", GPT, "-i", a, "-j", val, "--val-tokens", "256", "-v", "0", "-t", str(T), "-d",
                             str(D), "-b", "8", "-x", str(N), "-s", "0", "-l", "1e-3", "-u", "2", "-q", "0.1",
                             "-o", d], env={"LLMC_TEST_NAN_STEP": "2"})
    if not check(rc == 0, f"lr: {err[-300:]}"):
        return

    def lr(u, lr0=1e-3, warmup=2, steps=N, frac=0.1):
        if u < warmup:
            return lr0 * (u + 1) / warmup
        ratio = (u - warmup) / (steps - warmup)
        lmin = lr0 * frac
        return lmin + 0.5 * (1 + np.cos(np.pi * ratio)) * (lr0 - lmin)

    got = [m["lr"] for m in metrics(d)]
    want = [lr(0), lr(1), lr(2), lr(2), lr(3), lr(4)]  # step 3 skipped: its update never happened
    check(np.allclose(got, want, rtol=1e-12, atol=0), f"lr after a skip: {got} against {want}")


def suite(tmp):
    write_shard(os.path.join(tmp, "val.bin"), np.random.default_rng(9).integers(0, 97, 4000))
    test_lr_formula(tmp)
    test_layouts(tmp)


def main():
    run_suite(check, "llmc_skipped_", suite)


if __name__ == "__main__":
    main()
