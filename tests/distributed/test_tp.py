#!/usr/bin/python3
# tests/distributed/test_tp.py: tensor parallel and sequence parallel on the CPU, under
# mpirun, against independent truths:
#   - equivalence: tp in {2, 4} with and without sp; tp=2 x dp=2 with ZeRO
#     0, 1, 3; tp=2 sp x dp=2 ZeRO-2: 10 steps of losses and the final
#     weights (gathered into the checkpoint) equal one process, fp64 <= 1e-10
#     and fp32 <= 1e-5, on a vocabulary (V = Vp = 97) that tp does not divide;
#   - replicas: LayerNorm, wpe and row-parallel-bias replicas agree on every
#     rank of a tp group (the trainer checks and prints it);
#   - checkpoints: saved at tp=2, resumed at tp=1 and at tp=4 with the same
#     losses as the uninterrupted run;
#   - traffic per step, from the counted bytes: tp = 4 all-reduces of B·T·C
#     per layer plus the embedding, LM head and three cross-entropy ones;
#     sp = the matching all-gathers and reduce-scatters (section 4);
#   - activation bytes per layer per rank fall as section 4 predicts: with
#     tp the attention/MLP parts divide by t, with sp everything does;
#   - errors: heads not divisible by tp, T not divisible by tp under sp, tp
#     larger than the world: one line, every rank exits.
# Last line: "N passed, N failed".
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, copy_checkpoint, equivalence, metrics, rel, run_suite, train, write_shard

L, C, NH, V, T = 2, 32, 4, 97, 16
MODEL = f"L={L},C={C},NH={NH},V={V},Vp={V},T=64"  # Vp = 97: no tp in {2, 4} divides it
DATA = None
check = Checks()


def base(dtype, steps=10):
    return ["-e", MODEL, "-i", DATA, "-j", "", "-t", str(T), "-x", str(steps), "-s", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def test_equivalence(tmp, dtype, layouts):
    equivalence(check, tmp, dtype, base(dtype) + ["-b", "8", "-d", "256"], ["-b", "16", "-d", "256"], layouts)


def test_checkpoints(tmp):
    args = base("fp64") + ["-d", "256"]
    full = os.path.join(tmp, "ck_full")
    train(0, args + ["-b", "16", "-o", full])
    full_l = [m["loss"] for m in metrics(full)]
    src = os.path.join(tmp, "ck_tp2")
    rc, out, err = train(2, args + ["-b", "16", "--tp", "2", "--sp", "1", "-n", "5", "-o", src])
    check(rc == 0, f"tp=2 save: {err[-300:]}")
    for np_, extra in ((0, []), (4, ["--tp", "4"]), (4, ["--tp", "2", "-z", "1", "-b", "8"])):
        d = os.path.join(tmp, f"ck_resume_{np_}_{len(extra)}")
        copy_checkpoint(src, d, 5)
        rc, out, err = train(np_, args + ["-b", "16", "-y", "1", "-o", d] + extra)
        if not check(rc == 0, f"resume {extra}: {err[-300:]}"):
            continue
        r = rel([m["loss"] for m in metrics(d)], full_l[5:])
        print(f"  saved at tp=2 sp, resumed at {' '.join(extra) or 'one process'}: losses rel {r:.2e}")
        check(r <= 1e-10, f"resume {extra}: rel err {r:.3e}")


MEM = re.compile(r"memory\[(\d+)\] start: .* layer_activations=(\d+)")


def ring(n, g, kind):
    """Bytes a rank sends for n elements of the full buffer (llmc/comm/comm.h)."""
    return 2 * n * (g - 1) // g if kind == "all-reduce" else n * (g - 1) // g


def test_traffic_and_memory(tmp):
    B, N, esize = 8, 8 * T, 4  # fp32
    layer_bytes = {}
    for t, sp in ((1, 0), (2, 0), (4, 0), (2, 1), (4, 1)):
        d = os.path.join(tmp, f"traffic_{t}_{sp}")
        extra = ["--tp", str(t), "--sp", str(sp)] if t > 1 else []
        rc, out, err = train(t if t > 1 else 0, base("fp32", 2) + ["-b", str(B), "-d", str(B * T), "-o", d] + extra)
        if not check(rc == 0, f"traffic tp={t} sp={sp}: {err[-300:]}"):
            continue
        rows = [int(m.group(2)) for m in MEM.finditer(out)]
        layer_bytes[(t, sp)] = rows[0]
        check(len(set(rows)) == 1, f"tp={t} sp={sp}: ranks differ in activation bytes {rows}")
        # What one block keeps for backward, in elements of N·C: LayerNorm
        # inputs/outputs and residuals (ln1, residual2, ln2, residual3: 4),
        # qkv 3/t, attention output 1/t, fc and GELU outputs 8/t; plus per-row
        # statistics (4 LayerNorm, NH/t attention).
        Ns = N // t if sp else N
        want = esize * (4 * Ns * C + 12 * N * C // t + 4 * Ns + N * NH // t)
        check(rows[0] == want, f"tp={t} sp={sp}: layer activations {rows[0]} bytes, formula {want}")
        if t == 1:
            continue
        comm = metrics(d)[-1].get("comm", {})
        nc, stat = N * C * esize, N * esize
        if not sp:
            # per layer: f bwd x2 + g fwd x2 = 4 all-reduces; embedding g, LM head f bwd; cross-entropy 3
            ar_calls = (4 * L + 2) * [nc] + 3 * [stat]
            want_c = {"tp_all-reduce": sum(ring(n, t, "all-reduce") for n in ar_calls)}
            per_layer = (comm.get("tp_all-reduce", {}).get("bytes", 0) - sum(ring(n, t, "all-reduce") for n in 2 * [nc] + 3 * [stat])) / L
            print(f"  tp={t}: tp bytes/step {comm}; per layer {per_layer:.0f} = 4 all-reduces of B*T*C "
                  f"({4 * ring(nc, t, 'all-reduce')})")
            check(per_layer == 4 * ring(nc, t, "all-reduce"), f"tp={t}: per-layer traffic {per_layer}")
        else:
            # per layer: f fwd AG x2, g fwd RS x2; bwd: g AG x2, f RS x2, and the
            # LayerNorm outputs gathered again x2 (kept as 1/t of the tokens).
            # Outside the blocks: embedding g RS fwd + AG bwd; LM head f AG fwd,
            # AG again + RS bwd. LayerNorm gradients summed: 4C per block + 2C.
            ag = (6 * L + 3) * [nc]
            rs = (4 * L + 2) * [nc]
            ar = 3 * [stat] + L * [4 * C * esize] + [2 * C * esize]
            want_c = {"tp_all-gather": sum(ring(n, t, "ag") for n in ag),
                      "tp_reduce-scatter": sum(ring(n, t, "rs") for n in rs),
                      "tp_all-reduce": sum(ring(n, t, "all-reduce") for n in ar)}
            print(f"  tp={t} sp: tp bytes/step {comm}")
        got = {k: v["bytes"] for k, v in comm.items() if k.startswith("tp_")}
        check(got == want_c, f"tp={t} sp={sp}: traffic {got} vs {want_c}")
    if len(layer_bytes) == 5:
        base_b = layer_bytes[(1, 0)]
        print("  activation bytes per layer per rank: "
              + ", ".join(f"tp={t}{' sp' if sp else ''}: {b} ({b / base_b:.3f})" for (t, sp), b in layer_bytes.items()))
        check(layer_bytes[(4, 1)] * 4 == base_b, "sp does not divide activations by tp")


def test_errors(tmp):
    cases = [(3, ["--tp", "3"], "--tp"),                      # 4 heads do not divide by 3
             (2, ["--tp", "4"], "--tp"),                      # larger than the world
             (4, ["--tp", "4", "--sp", "1", "-t", "18", "-d", "144", "-b", "8"], "--sp"),  # T=18 % 4
             (2, ["--sp", "1"], "--sp")]                      # sp without tp
    for np_, extra, flag in cases:
        rc, out, err = train(np_, base("fp32", 2) + ["-b", "8"] + extra, timeout=60)
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        check(rc != 0 and len(lines) == 1 and flag in lines[0], f"{extra}: rc={rc} {err[-300:]!r}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(7).integers(0, V, 40000))
    layouts = [(2, ["--tp", "2"]), (2, ["--tp", "2", "--sp", "1"]), (4, ["--tp", "4"]),
               (4, ["--tp", "4", "--sp", "1"]), (4, ["--tp", "2", "-z", "0"]), (4, ["--tp", "2", "-z", "1"]),
               (4, ["--tp", "2", "-z", "3"]), (4, ["--tp", "2", "--sp", "1", "-z", "2"])]
    test_equivalence(tmp, "fp64", layouts)
    test_equivalence(tmp, "fp32", [(2, ["--tp", "2", "--sp", "1"]), (4, ["--tp", "2", "-z", "3"])])
    test_checkpoints(tmp)
    test_traffic_and_memory(tmp)
    test_errors(tmp)


def main():
    run_suite(check, "llmc_tp_", suite)


if __name__ == "__main__":
    main()
