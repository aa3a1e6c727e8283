#!/usr/bin/python3
# tests/distributed/test_dist.py: data parallel and ZeRO on the CPU, under mpirun, each
# checked against an independent truth:
#   - equivalence: dp in {2, 4} x ZeRO 0-3, with and without gradient
#     accumulation, with micro-batches unlike the single run's, on a model
#     whose parameter count dp does not divide: 10 steps of losses and the
#     final weights equal those of one process on the same global batch
#     (relative error <= 1e-10 in fp64, <= 1e-5 in fp32);
#   - gradients: one step with beta1 = beta2 = 0 and no clipping, so Adam's
#     m equals the gradient: every gradient tensor, gathered from the shards
#     into the checkpoint, equals the single-process gradient;
#   - checkpoints: saved at dp=4 ZeRO-3, resumed at dp=2 ZeRO-1 and in one
#     process, the run goes on with the uninterrupted run's losses; resumed
#     with the same layout it continues bit for bit;
#   - memory: model-state bytes per rank against docs/design.md section
#     6 (fp32 shapes) for every stage and dp in {1, 2, 4}, within padding;
#   - traffic: counted bytes per step against the traffic column (stage 0:
#     all-reduce 2P, stages 1-2: 2P, stage 3: 3P = 1.5x, times (N-1)/N);
#   - failures: bad flags and a bad token id met by one rank end the whole
#     job with one message, no hang.
# Last line: "N passed, N failed".
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, copy_checkpoint, metrics, param_count, read_checkpoint, rel, run_suite, train, write_shard

# An odd model: P = 22,599 (L=2, C=27, NH=3, V=Vp=97, maxT=64) and every
# unit's size are odd, so no dp > 1 divides them and every unit is padded.
ODD = "L=2,C=27,NH=3,V=97,Vp=97,T=64"
DATA = None  # a shard of token ids < 97, made in main()
check = Checks()


def base(dtype, steps=10):
    return ["-e", ODD, "-i", DATA, "-j", "", "-t", "16", "-x", str(steps), "-s", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def tensor_sizes(L, C, Vp, T):
    """(name, elements) of every tensor kind in model-file order."""
    per = [("ln1w", C), ("ln1b", C), ("qkvw", 3 * C * C), ("qkvb", 3 * C), ("attprojw", C * C), ("attprojb", C),
           ("ln2w", C), ("ln2b", C), ("fcw", 4 * C * C), ("fcb", 4 * C), ("fcprojw", 4 * C * C), ("fcprojb", C)]
    return [("wte", Vp * C), ("wpe", T * C)] + [(n, L * k) for n, k in per] + [("lnfw", C), ("lnfb", C)]


def test_equivalence(tmp, dtype, layouts):
    tol = 1e-10 if dtype == "fp64" else 1e-5
    ref = os.path.join(tmp, f"single_{dtype}")
    rc, out, err = train(0, base(dtype) + ["-b", "16", "-d", "512", "-n", "10", "-o", ref])
    check(rc == 0, f"single {dtype}: {err}")
    ref_losses = [m["loss"] for m in metrics(ref)]
    ref_w = read_checkpoint(ref, 10)[0]
    for np_, zero, B in layouts:
        d = os.path.join(tmp, f"dp{np_}_z{zero}_b{B}_{dtype}")
        rc, out, err = train(np_, base(dtype) + ["-b", str(B), "-d", "512", "-z", str(zero), "-n", "10", "-o", d])
        accum = 512 // (16 * B * np_)
        what = f"{dtype} dp={np_} zero={zero} B={B} (accumulation {accum})"
        if not check(rc == 0, f"{what}: {err[-500:]}"):
            continue
        losses = [m["loss"] for m in metrics(d)]
        w = read_checkpoint(d, 10)[0]
        lr, wr = rel(losses, ref_losses), rel(w, ref_w)
        print(f"  {what}: losses rel {lr:.2e}, final weights rel {wr:.2e}")
        check(len(losses) == 10 and lr <= tol, f"{what}: losses rel err {lr:.3e} > {tol}")
        check(wr <= tol, f"{what}: final weights rel err {wr:.3e} > {tol}")


def test_gradients(tmp):
    one = ["-x", "1", "--beta1", "0", "--beta2", "0", "--grad-clip", "0", "-n", "1", "-d", "256"]
    ref = os.path.join(tmp, "grad_single")
    rc, out, err = train(0, base("fp64", 1) + one + ["-b", "16", "-o", ref])
    check(rc == 0, f"grad single: {err}")
    _, g_ref, _, (L, C, Vp, T) = read_checkpoint(ref, 1)
    for np_, zero in ((2, 2), (4, 3), (4, 1)):
        d = os.path.join(tmp, f"grad_dp{np_}_z{zero}")
        rc, out, err = train(np_, base("fp64", 1) + one + ["-b", "4", "-z", str(zero), "-o", d])
        if not check(rc == 0, f"grad dp={np_} zero={zero}: {err[-300:]}"):
            continue
        _, g, _, _ = read_checkpoint(d, 1)
        off, worst = 0, 0.0
        for name, n in tensor_sizes(L, C, Vp, T):
            r = rel(g[off:off + n], g_ref[off:off + n])
            worst = max(worst, r)
            check(r <= 1e-10, f"gradient {name} at dp={np_} zero={zero}: rel err {r:.3e}")
            off += n
        print(f"  gradients dp={np_} zero={zero}: worst tensor rel err {worst:.2e}")


def test_checkpoints(tmp):
    args = base("fp64") + ["-d", "512"]
    full = os.path.join(tmp, "ck_full")
    rc, out, err = train(0, args + ["-b", "16", "-o", full])
    full_losses = [m["loss"] for m in metrics(full)]
    src = os.path.join(tmp, "ck_dp4z3")
    rc, out, err = train(4, args + ["-b", "4", "-z", "3", "-n", "5", "-o", src])
    check(rc == 0, f"dp4 zero3 save: {err[-300:]}")
    for np_, zero, B in ((2, 1, 8), (0, 0, 16), (4, 3, 4)):
        d = os.path.join(tmp, f"ck_resume_{np_}_{zero}")
        copy_checkpoint(src, d, 5)
        with open(os.path.join(src, "metrics.jsonl")) as f, open(os.path.join(d, "metrics.jsonl"), "w") as g:
            g.writelines(f.readlines()[:5])
        rc, out, err = train(np_, args + ["-b", str(B), "-z", str(zero), "-y", "1", "-o", d])
        if not check(rc == 0, f"resume at dp={np_} zero={zero}: {err[-300:]}"):
            continue
        losses = [m["loss"] for m in metrics(d)]
        r = rel(losses[5:], full_losses[5:])
        print(f"  saved at dp=4 zero=3, resumed at dp={max(np_, 1)} zero={zero}: losses rel {r:.2e}")
        check(len(losses) == 10 and r <= 1e-10, f"resume at dp={np_} zero={zero}: rel err {r:.3e}")
        if (np_, zero) == (4, 3):  # same layout: bit for bit
            src_all = os.path.join(tmp, "ck_dp4z3_all")
            rc, out, err = train(4, args + ["-b", "4", "-z", "3", "-o", src_all])
            check(losses == [m["loss"] for m in metrics(src_all)], "same-layout resume is not bit for bit")


MEM = re.compile(r"memory\[(\d+)\] start: params=(\d+) grads=(\d+) master=(\d+) optimizer=(\d+) "
                 r"activations=(\d+) comm=(\d+)")


def test_memory_and_traffic(tmp):
    L, C, V, T = 2, 27, 97, 64
    P = param_count(L, C, V, 97, T)
    check(P == 22599, f"the odd model has {P} parameters")
    units = L + 2
    bytes_per_step = {}
    for np_ in (1, 2, 4):
        for zero in (0, 1, 2, 3):
            rc, out, err = train(np_ if np_ > 1 else 0,
                                 base("fp32", 2) + ["-b", "4", "-d", str(64 * np_), "-z", str(zero),
                                                    "-o", os.path.join(tmp, f"mem_{np_}_{zero}")])
            if not check(rc == 0, f"memory run dp={np_} zero={zero}: {err[-300:]}"):
                continue
            rows = [tuple(int(x) for x in m.groups()) for m in MEM.finditer(out)]
            check(len(rows) == np_, f"memory lines {len(rows)} for dp={np_}")
            # fp32 shapes of section 6: 4-byte params and grads, no master, 8 bytes of Adam state.
            N = np_
            want = {0: 16 * P, 1: 8 * P + 8 * P / N, 2: 4 * P + 12 * P / N, 3: 16 * P / N}[zero]
            pad = units * N * 16  # at most N-1 padding elements per unit, 16 bytes each
            for r in rows:
                state = r[1] + r[2] + r[3] + r[4]
                check(abs(state - want) <= pad,
                      f"dp={N} zero={zero} rank {r[0]}: model state {state} bytes, formula {want:.0f} (+-{pad})")
            if np_ > 1:
                m = metrics(os.path.join(tmp, f"mem_{np_}_{zero}"))[-1]["comm"]
                bytes_per_step[(np_, zero)] = {k: v["bytes"] for k, v in m.items()}
            print(f"  dp={N} zero={zero}: model state {rows[0][1] + rows[0][2] + rows[0][3] + rows[0][4]} bytes/rank "
                  f"(formula {want:.0f}), comm buffers {rows[0][6]}")
    for np_ in (2, 4):
        unit = P * (np_ - 1) / np_ * 4  # P elements' ring bytes
        tol = 4 * units * 4 * 2
        c0, c1, c2, c3 = (bytes_per_step.get((np_, z), {}) for z in range(4))
        check(set(c0) == {"dp_all-reduce"} and abs(c0["dp_all-reduce"] - 2 * unit) <= tol,
              f"dp={np_} zero=0 traffic {c0} vs all-reduce {2 * unit:.0f}")
        for z, c in ((1, c1), (2, c2)):
            check(set(c) == {"dp_reduce-scatter", "dp_all-gather"} and abs(c["dp_reduce-scatter"] - unit) <= tol
                  and abs(c["dp_all-gather"] - unit) <= tol, f"dp={np_} zero={z} traffic {c} vs {unit:.0f} each")
        check(set(c3) == {"dp_reduce-scatter", "dp_all-gather"} and abs(c3["dp_reduce-scatter"] - unit) <= tol
              and abs(c3["dp_all-gather"] - 2 * unit) <= 2 * tol, f"dp={np_} zero=3 traffic {c3}")
        if c1 and c3:
            ratio = sum(c3.values()) / sum(c1.values())
            print(f"  dp={np_}: bytes/step zero0 {sum(c0.values())} zero1 {sum(c1.values())} "
                  f"zero2 {sum(c2.values())} zero3 {sum(c3.values())} (zero3/zero1 = {ratio:.4f})")
            check(abs(ratio - 1.5) < 1e-3, f"dp={np_}: zero3/zero1 traffic ratio {ratio}")


def test_failures(tmp):
    rc, out, err = train(2, base("fp32", 2) + ["-b", "4", "-d", "100"], timeout=60)
    lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
    check(rc != 0 and len(lines) == 1 and "-d" in lines[0], f"bad -d under mpirun: rc={rc} {err[-300:]!r}")
    rc, out, err = train(2, base("fp32", 2) + ["-b", "4", "--bogus", "1"], timeout=60)
    check(rc != 0 and err.count("--bogus") == 1, f"unknown flag under mpirun: rc={rc} {err[-300:]!r}")
    # A bad token id in the second of two shards, away from the first and
    # last 256 tokens that every rank reads to compare its data: the ranks
    # share the up-front id check (shard i is read by rank i), so rank 1
    # alone finds it, and its line ends both ranks before the first step.
    d = os.path.join(tmp, "badtok")
    os.makedirs(d, exist_ok=True)
    write_shard(os.path.join(d, "bad_0.bin"), np.arange(5000) % 90)
    toks = np.arange(5000) % 90
    toks[2500] = 120
    write_shard(os.path.join(d, "bad_rank1.bin"), toks)
    rc, out, err = train(2, base("fp32", 5) + ["-i", os.path.join(d, "bad_*.bin"), "-b", "4", "-z", "2"], timeout=60)
    lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
    check(rc != 0 and len(lines) == 1 and "bad_rank1.bin" in lines[0] and "offset 2500" in lines[0]
          and "step" not in out, f"bad token seen by rank 1: rc={rc} {err[-400:]!r}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(5).integers(0, 97, 40000))
    layouts = [(np_, z, B) for np_ in (2, 4) for z in (0, 1, 2, 3) for B in (4, 32 // np_)]  # with and without accumulation
    test_equivalence(tmp, "fp64", layouts)
    test_equivalence(tmp, "fp32", [(2, z, 4) for z in (0, 1, 2, 3)] + [(4, 3, 8)])
    test_gradients(tmp)
    test_checkpoints(tmp)
    test_memory_and_traffic(tmp)
    test_failures(tmp)


def main():
    run_suite(check, "llmc_dist_", suite)


if __name__ == "__main__":
    main()
