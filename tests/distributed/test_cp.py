#!/usr/bin/python3
# tests/distributed/test_cp.py: context parallel (ring attention, zigzag chunks) on the
# CPU under mpirun, against independent truths:
#   - equivalence: cp in {2, 4}; cp=2 x tp=2 with and without sp; cp=2 x
#     dp=2 with ZeRO 1 and 3: 10 steps of losses and the final weights equal
#     one process (fp64 <= 1e-10, fp32 <= 1e-5); the same with --cp-impl
#     a2a (all-to-all to head shards), and a2a under pp=2; --cp-impl hybrid
#     --cp-a2a 2 under cp=4 (two all-to-all groups of 2, a ring of 2), alone,
#     x tp=2 with sp, and for Llama (GQA 4:2);
#   - activation bytes per rank fall N-fold for the same T (layer_activations
#     of the memory report), and the counted point-to-point bytes per step
#     equal, per layer, 2(N-1) K,V block transfers forward plus N-1 K,V and
#     N dK,dV transfers backward; under a2a, (N-1)/N of the QKV rows and
#     outputs per layer forward and twice that backward; under hybrid, the
#     all-to-all's bytes over its group of n and the ring's over cp/n;
#   - memory: at a sequence length whose activations one process cannot hold
#     within --memory-budget, one process stops with an out-of-memory error
#     and cp=4 trains;
#   - validation losses and text samples under cp=2 x tp=2 x sp equal one
#     process's, and its checkpoint resumes in one process;
#   - errors: T not divisible by 2N, cp larger than the world, a2a with cp
#     not dividing the heads; hybrid with --cp-a2a not dividing cp, outside
#     1 < N < cp, missing, or not dividing the heads or key/value heads of a
#     tp rank, and --cp-a2a without hybrid: one line, every rank exits.
# Ring attention itself against full attention: tests/distributed/test_ring_attention.cpp.
# Last line: "N passed, N failed".
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, copy_checkpoint, equivalence, metrics, run_suite, train, write_shard

L, C, NH, V = 2, 32, 4, 97
MODEL = f"L={L},C={C},NH={NH},V={V},Vp={V},T=1024"
LLAMA = f"arch=llama,L={L},C={C},NH=4,NKV=2,F=48,V={V},T=1024,tied=0"
HYBRID = ["--cp-impl", "hybrid", "--cp-a2a", "2"]
check = Checks()
DATA = None


def base(dtype, T=16, steps=10):
    return ["-e", MODEL, "-i", DATA, "-j", "", "-t", str(T), "-x", str(steps), "-s", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def test_equivalence(tmp, dtype, layouts):
    equivalence(check, tmp, dtype, base(dtype) + ["-b", "8", "-d", "256"], ["-b", "8", "-d", "256"], layouts)


MEM = re.compile(r"memory\[0\] start: .* comm=(\d+) layer_activations=(\d+) .*total=([0-9.]+) MiB")


def test_memory_and_traffic(tmp):
    T, B, esize = 64, 2, 4
    acts = {}
    for c in (1, 2, 4):
        d = os.path.join(tmp, f"traffic_{c}")
        rc, out, err = train(c if c > 1 else 0, base("fp32", T, 2) + ["-b", str(B), "-d", str(B * T), "-o", d]
                             + (["--cp", str(c)] if c > 1 else []))
        if not check(rc == 0, f"cp={c}: {err[-300:]}"):
            continue
        acts[c] = int(MEM.search(out).group(2))
        if c == 1:
            continue
        block = B * (T // c) * C * esize  # one K (or V) block of a rank
        p2p = metrics(d)[-1].get("comm", {}).get("cp_send-recv", {}).get("bytes", 0)
        want = L * (2 * (c - 1) * block + 2 * (c - 1) * block + 2 * c * block)
        print(f"  cp={c}: point-to-point bytes/step {p2p} = {L} layers x (fwd {2 * (c - 1)} + bwd "
              f"{2 * (c - 1)} K,V + {2 * c} dK,dV blocks of {block} bytes)")
        check(p2p == want, f"cp={c}: p2p bytes {p2p}, want {want}")
    if len(acts) == 3:
        print(f"  activation bytes per layer per rank: cp=1 {acts[1]}, cp=2 {acts[2]}, cp=4 {acts[4]}")
        check(acts[1] == 2 * acts[2] == 4 * acts[4], f"activations do not fall N-fold: {acts}")
    # All-to-all: each exchange sends (c-1) of its c blocks; per layer the QKV
    # rows (3C) and the output (C) forward, twice both backward.
    for c in (2, 4):
        d = os.path.join(tmp, f"traffic_a2a_{c}")
        rc, out, err = train(c, base("fp32", T, 2) + ["-b", str(B), "-d", str(B * T), "-o", d, "--cp", str(c),
                                                       "--cp-impl", "a2a"])
        if not check(rc == 0, f"cp={c} a2a: {err[-300:]}"):
            continue
        p2p = metrics(d)[-1].get("comm", {}).get("cp_send-recv", {}).get("bytes", 0)
        want = L * 3 * (c - 1) * (B * T // c) * (3 * C + C) // c * esize
        print(f"  cp={c} a2a: point-to-point bytes/step {p2p} = {L} layers x 3 x (c-1)/c x {B * T // c} tokens "
              f"x (3C + C) x {esize} bytes")
        check(p2p == want, f"cp={c} a2a: p2p bytes {p2p}, want {want}")
        check(int(MEM.search(out).group(2)) * c == acts.get(1, -1), f"cp={c} a2a: activations do not fall N-fold")
    # Hybrid cp=4, groups of n=2: the all-to-all's exchanges as above over n
    # ranks (its group), the ring's blocks as above over cp/n ranks (the head
    # layout's block, n times the tokens for 1/n of the heads, is as large);
    # nothing over the whole cp group.
    c, n = 4, 2
    d = os.path.join(tmp, "traffic_hybrid")
    rc, out, err = train(c, base("fp32", T, 2) + ["-b", str(B), "-d", str(B * T), "-o", d, "--cp", str(c)] + HYBRID)
    if check(rc == 0, f"cp={c} hybrid: {err[-300:]}"):
        comm = metrics(d)[-1].get("comm", {})
        got = [comm.get(k, {}).get("bytes", 0) for k in ("cp_a2a_send-recv", "cp_ring_send-recv", "cp_send-recv")]
        r, block = c // n, B * (T // c) * C * esize
        want = [L * 3 * (n - 1) * (B * T // c) * (3 * C + C) // n * esize,
                L * (2 * (r - 1) + 2 * (r - 1) + 2 * r) * block, 0]
        print(f"  cp={c} hybrid a2a {n} x ring {r}: point-to-point bytes/step a2a {got[0]}, ring {got[1]} "
              f"(formulas {want[0]}, {want[1]})")
        check(got == want, f"cp={c} hybrid: p2p bytes (a2a, ring, cp) {got}, want {want}")
        check(int(MEM.search(out).group(2)) * c == acts.get(1, -1), f"cp={c} hybrid: activations do not fall N-fold")
    # A sequence one process cannot hold in 8 MiB; cp=4 can.
    long = base("fp32", 1024, 2) + ["-b", "2", "-d", "2048", "--memory-budget", "8"]
    rc, out, err = train(0, long)
    check(rc != 0 and "out of memory" in err, f"T=1024 in one process under 8 MiB: rc={rc} {err[-300:]!r}")
    rc, out, err = train(4, long + ["--cp", "4"])
    m = MEM.search(out)
    check(rc == 0 and m and float(m.group(3)) <= 8.0, f"T=1024 at cp=4 under 8 MiB: rc={rc} {err[-300:]!r}")
    if m:
        print(f"  T=1024 under an 8 MiB budget: one process out of memory; cp=4 trains holding {m.group(3)} MiB/rank")


def samples(out):
    return [x.split("----------------")[0] for x in out.split("---- sample ----")[1:]]


def test_samples_val_resume(tmp):
    # Validation loss and samples (logit rows assembled from the ranks that
    # hold them) equal one process's; a cp=2 x tp=2 checkpoint resumes in one
    # process with the uninterrupted run's losses.
    args = base("fp64") + ["-b", "8", "-d", "256", "-j", DATA, "-v", "5", "-m", "3", "-s", "5", "-g", "12", "-n", "5"]
    one, many = os.path.join(tmp, "sv_one"), os.path.join(tmp, "sv_many")
    rc1, out1, err1 = train(0, args + ["-o", one])
    rc2, out2, err2 = train(4, args + ["--cp", "2", "--tp", "2", "--sp", "1", "-o", many])
    if not check(rc1 == 0 and rc2 == 0, f"sample/val runs: {err1[-200:]} {err2[-300:]}"):
        return
    v1 = [m["val_loss"] for m in metrics(one) if "val_loss" in m]
    v2 = [m["val_loss"] for m in metrics(many) if "val_loss" in m]
    check(len(v1) == 2 and max(abs(a - b) / a for a, b in zip(v1, v2)) <= 1e-10, f"val losses {v1} vs {v2}")
    check(len(samples(out1)) == 2 and samples(out1) == samples(out2), "samples differ from one process's")
    d = os.path.join(tmp, "sv_resume")
    copy_checkpoint(many, d, 5)
    rc, out, err = train(0, args + ["-y", "1", "-o", d])
    full = [m["loss"] for m in metrics(one)][5:]
    got = [m["loss"] for m in metrics(d)] if rc == 0 else []
    check(len(got) == 5 and max(abs(a - b) / a for a, b in zip(got, full)) <= 1e-10,
          f"cp=2 x tp=2 checkpoint resumed in one process: {got} vs {full}")
    check(samples(out) == samples(out1)[1:], "samples after the resume differ")
    print(f"  cp=2 x tp=2 sp: val losses, {len(samples(out1))} samples and a resume in one process match one process")


def test_errors(tmp):
    for np_, extra, flag in ((2, ["--cp", "2", "-t", "18", "-d", "144"], "--cp"),  # 18 % 4
                             (2, ["--cp", "4"], "--cp"),
                             (4, ["--cp", "4", "--tp", "1", "--cp-impl", "a2a", "-e",
                                  MODEL.replace("NH=4", "NH=2")], "--cp-impl"),
                             (4, ["--cp", "4", "--cp-impl", "hybrid", "--cp-a2a", "3"], "--cp-a2a"),  # 4 % 3
                             (4, ["--cp", "4", "--cp-impl", "hybrid", "--cp-a2a", "4"], "--cp-a2a"),  # N = cp
                             (4, ["--cp", "4", "--cp-impl", "hybrid", "--cp-a2a", "1"], "--cp-a2a"),  # N = 1
                             (4, ["--cp", "4", "--cp-impl", "hybrid"], "--cp-a2a"),  # no N
                             (2, ["--cp", "2", "--cp-a2a", "2"], "--cp-a2a"),  # without hybrid
                             (4, ["--cp", "4", "--cp-impl", "a2a", "--cp-a2a", "2"], "--cp-a2a"),
                             (4, ["--cp", "4"] + HYBRID + ["-e", MODEL.replace("NH=4", "NH=1")], "--cp-a2a"),
                             (4, ["--cp", "2", "--tp", "2"] + HYBRID, "--cp-a2a"),  # 2 % 2 == 0: N = cp
                             (4, ["--cp", "4"] + HYBRID + ["-e", LLAMA.replace("NKV=2", "NKV=1")], "--cp-a2a")):
        rc, out, err = train(np_, base("fp32", 16, 2) + ["-b", "8"] + extra, timeout=60)
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        check(rc != 0 and len(lines) == 1 and flag in lines[0], f"{extra}: rc={rc} {err[-300:]!r}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(9).integers(0, V, 40000))
    layouts = [(2, ["--cp", "2"]), (4, ["--cp", "4"]), (4, ["--cp", "2", "--tp", "2"]),
               (4, ["--cp", "2", "--tp", "2", "--sp", "1"]), (4, ["--cp", "2", "-b", "4", "-z", "1"]),
               (4, ["--cp", "2", "-b", "4", "-z", "3"])]
    a2a = ["--cp-impl", "a2a"]
    layouts += [(2, ["--cp", "2"] + a2a), (4, ["--cp", "4"] + a2a), (4, ["--cp", "2", "--tp", "2", "--sp", "1"] + a2a),
                (4, ["--cp", "2", "-b", "4", "-z", "3"] + a2a), (4, ["--cp", "2", "--pp", "2"] + a2a)]
    layouts += [(4, ["--cp", "4"] + HYBRID), (8, ["--cp", "4", "--tp", "2", "--sp", "1"] + HYBRID)]
    test_equivalence(tmp, "fp64", layouts)
    equivalence(check, tmp, "fp64", base("fp64") + ["-e", LLAMA, "-b", "8", "-d", "256"], ["-b", "8", "-d", "256"],
                [(4, ["--cp", "4"] + HYBRID)])
    test_equivalence(tmp, "fp32", [(2, ["--cp", "2"]), (4, ["--cp", "2", "--tp", "2", "--sp", "1"]),
                                   (2, ["--cp", "2"] + a2a)])
    test_memory_and_traffic(tmp)
    test_samples_val_resume(tmp)
    test_errors(tmp)


def main():
    run_suite(check, "llmc_cp_", suite)


if __name__ == "__main__":
    main()
