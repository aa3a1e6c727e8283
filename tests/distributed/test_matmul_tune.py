#!/usr/bin/python3
# tests/distributed/test_matmul_tune.py: --matmul-tune 1 on the CPU, under
# mpirun, with the backend's stand-in algorithms (the test hook
# LLMC_TEST_MATMUL_TUNE=1: three per product shape, timed by a formula of
# the shape, the algorithm and the rank; the products stay the CPU's):
#   - the ranks agree: each rank prints what it timed; the choice every rank
#     takes for each shape is, recomputed here from those timings, the
#     candidate of least time summed over the ranks that ran the shape (a
#     tie: rank 0's earlier one), the same on every rank, also where the
#     ranks' own fastest differ and where pipeline stages run different
#     shapes; rank 0's log lists each choice, and -o's matmul_tuning.txt
#     holds them;
#   - the timing overwrites its products' outputs: the stand-in sets every
#     output of the first step's products to NaN before the second step (a
#     real timing writes the last call's outputs again), and every layout
#     (one process with accumulation, dp with ZeRO 0-3, tp with sp, cp, pp,
#     Llama, Mixtral with ep, --head-chunk, samples and validation every
#     step) trains bit for bit as without tuning: nothing read after a step
#     is a product's output from before it; and no product's output or
#     operand lives in memory given back before the timing;
#   - a resumed run takes the file's choices and times nothing; a file
#     timed on another device, or malformed (a warning), is timed again;
#     without -o nothing is written; the CPU backend alone (no hook) says
#     it has nothing to time.
# Last line: "N passed, N failed".
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ROOT, Checks, copy_checkpoint, run_suite, shards_equal, train, write_shard

GPT = "L=2,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=97,T=64"
MIX = "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=97,T=64,aux=0.05"
HOOK = {"LLMC_TEST_MATMUL_TUNE": "1"}
SCOPE = "stand-in algorithms (LLMC_TEST_MATMUL_TUNE)"
STEPS = 4
check = Checks()
DATA = None


def base(model=GPT, steps=STEPS):
    return ["-e", model, "-i", DATA, "-j", DATA, "--val-tokens", "256", "-v", "2", "-t", "16", "-x", str(steps),
            "-s", "0", "--dtype", "fp64", "-l", "3e-3", "-u", "2", "-n", str(steps)]


def figures(d):
    keys = ("step", "loss", "grad_norm", "val_loss", "skipped")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [{k: m.get(k) for k in keys} for m in map(json.loads, f)]


def trials_of(out):
    """{rank: {shape: [(id, ms)]}} from the stand-in's lines."""
    per = {}
    for r, line in re.findall(r"stand-in matmul trial\[(\d+)\]: (.*)$", out, re.M):
        f = line.split("\t")
        per.setdefault(int(r), {})[f[0]] = [(f[i], float(f[i + 1])) for i in range(1, len(f), 2)]
    return per


def chosen_of(out):
    """{rank: {shape: id}} from the stand-in's lines."""
    per = {}
    for r, shape, ident in re.findall(r"stand-in matmul chosen\[(\d+)\]: ([^\t\n]*)\t([^\t\n]*)", out, re.M):
        per.setdefault(int(r), {})[shape] = ident
    return per


def expected_choices(trials):
    """The agreement, recomputed: per shape, the candidate with the least
    summed time over the ranks that timed it (a tie: the lowest rank's
    earlier candidate); None when there is none."""
    out = {}
    shapes = []
    for r in sorted(trials):
        shapes += [s for s in trials[r] if s not in shapes]
    for s in shapes:
        ranks = [trials[r][s] for r in sorted(trials) if s in trials[r]]
        best, best_sum = None, float("inf")
        for ident, _ in ranks[0]:
            total = 0.0
            for t in ranks:
                ms = dict(t).get(ident, float("inf"))
                total += ms
            if total < best_sum:
                best, best_sum = ident, total
        out[s] = best
    return out


def test_agreement(tmp):
    for name, np_, extra in [("dp2", 2, ["-b", "8", "-d", "256"]), ("pp2", 2, ["-b", "4", "--pp", "2", "-d", "256"]),
                             ("tp2dp2", 4, ["-b", "8", "--tp", "2", "-d", "256"])]:
        d = os.path.join(tmp, f"agree_{name}")
        rc, out, err = train(np_, base() + extra + ["--matmul-tune", "1", "-o", d], env=HOOK)
        if not check(rc == 0, f"{name}: {err[-400:]}"):
            continue
        trials, chosen = trials_of(err), chosen_of(err)
        want = expected_choices(trials)
        check(sorted(trials) == list(range(np_)) and all(trials[r] for r in trials),
              f"{name}: ranks that timed something: {sorted(trials)}")
        # The ranks' own fastest differ somewhere, so the agreement decided.
        own = {r: {s: min(c, key=lambda x: x[1])[0] for s, c in trials[r].items()} for r in trials}
        differ = [s for s in want if len({own[r][s] for r in own if s in own[r]}) > 1]
        check(len(differ) > 0, f"{name}: the ranks' own fastest agree everywhere: the test decides nothing")
        check(sorted(chosen) == list(range(np_)) and all(chosen[r] == want for r in chosen),
              f"{name}: the choices taken differ from the least summed time: "
              f"{[(r, s, chosen[r].get(s), w) for r in chosen for s, w in want.items() if chosen[r].get(s) != w][:3]}")
        if name == "pp2":
            check(set(trials[0]) != set(trials[1]), "pp2: both stages ran the same shapes: the subset case is not tested")
        logged = re.findall(r"^matmul tuning: (.*): (?:untuned )?(s\d), ", out, re.M)
        check(dict(logged) == want, f"{name}: rank 0's log lines: {logged[:3]}")
        check(re.search(rf"^matmul tuning: {len(want)} shapes timed \(up to 8 candidates each", out, re.M) is not None,
              f"{name}: no summary line")
        try:
            with open(os.path.join(d, "matmul_tuning.txt")) as f:
                lines = f.read().splitlines()
        except OSError as e:
            check(False, f"{name}: {e}")
            continue
        check(lines[0] == f"# matmul algorithms for: {SCOPE}", f"{name}: the file's header: {lines[0]!r}")
        rows = [l.split("\t") for l in lines[1:]]
        check({r[0]: r[1] for r in rows} == want and all(len(r) == 7 and r[3] == "s0" for r in rows),
              f"{name}: the file's choices: {rows[:2]}")
        print(f"  {name}: {len(want)} shapes, the ranks' own fastest differ on {len(differ)}; every rank took the "
              "least summed time")


def test_outputs_dead(tmp):
    """The stand-in sets every product output of step 1 to NaN before step 2:
    the run must equal the untuned one bit for bit."""
    cases = [("np1_accum", 0, base() + ["-b", "4", "-d", "256"]),
             ("dp2_z0", 2, base() + ["-b", "8", "-d", "256", "-z", "0"]),
             ("dp2_z1", 2, base() + ["-b", "4", "-d", "256", "-z", "1"]),
             ("dp2_z2", 2, base() + ["-b", "8", "-d", "256", "-z", "2"]),
             ("dp2_z3", 2, base() + ["-b", "8", "-d", "256", "-z", "3"]),
             ("tp2_sp", 2, base() + ["-b", "8", "-d", "256", "--tp", "2", "--sp", "1"]),
             ("cp2", 2, base() + ["-b", "8", "-d", "256", "--cp", "2"]),
             ("pp2", 2, base() + ["-b", "4", "-d", "256", "--pp", "2"]),
             ("llama_tp2", 2, base(LLAMA) + ["-b", "8", "-d", "256", "--tp", "2"]),
             ("mixtral_ep2", 2, base(MIX) + ["-b", "8", "-d", "256", "--ep", "2"]),
             ("head_chunk", 0, base() + ["-b", "8", "--head-chunk", "32", "-r", "1"]),
             ("val_samples", 0, base() + ["-b", "8", "-v", "1", "-s", "1", "-g", "8"]),
             ("bf16", 0, [a if a != "fp64" else "bf16" for a in base()] + ["-b", "8"])]
    for name, np_, args in cases:
        runs = []
        for tune in (0, 1):
            d = os.path.join(tmp, f"dead_{name}_{tune}")
            rc, out, err = train(np_, args + ["-o", d] + (["--matmul-tune", "1"] if tune else []),
                                 env=HOOK if tune else None)
            if not check(rc == 0, f"{name} tune {tune}: {err[-400:]}"):
                break
            runs.append((d, err))
        if len(runs) < 2:
            continue
        (d0, _), (d1, out) = runs  # out: the tuned run's stderr
        poisoned = [int(x) for x in re.findall(r"stand-in matmul\[\d+\]: \d+ shapes timed, (\d+) output elements", out)]
        check(len(poisoned) == max(1, np_) and all(p > 0 for p in poisoned),
              f"{name}: nothing was overwritten: {poisoned} {[l for l in out.splitlines() if 'shapes timed' in l]}")
        check("a product's output was released" not in out, f"{name}: a product's output lives in released memory")
        check("a product's operand was released" not in out, f"{name}: a product's operand lives in released memory")
        f0, f1 = figures(d0), figures(d1)
        check(f0 == f1 and len(f0) == STEPS,
              f"{name}: tuning changed the run: {next(((a, b) for a, b in zip(f0, f1) if a != b), (len(f0), len(f1)))}")
        check(shards_equal(d0, d1, STEPS), f"{name}: the final checkpoint's shards differ")
    print(f"  {len(cases)} layouts: every product output of step 1 set to NaN before step 2, each run equal to "
          "its untuned one")


def test_file(tmp):
    a = base(steps=6) + ["-b", "8", "-d", "256", "--matmul-tune", "1"]
    a[a.index("-n") + 1] = "2"
    saved = os.path.join(tmp, "file_saved")
    rc, out, err = train(2, a + ["-o", saved], env=HOOK)
    if not check(rc == 0, f"file: first run: {err[-400:]}"):
        return
    path = os.path.join(saved, "matmul_tuning.txt")
    with open(path) as f:
        text = f.read()
    n = len(text.splitlines()) - 1
    # Resumed from step 2 beside the file: its choices, nothing timed.
    d = os.path.join(tmp, "file_resumed")
    copy_checkpoint(saved, d, 2)
    shutil.copy(path, d)
    rc, out, err = train(2, a + ["-o", d, "-y", "1"], env=HOOK)
    if check(rc == 0, f"file: resume: {err[-400:]}"):
        check(f"matmul tuning: {n} shapes' algorithms from {d}/matmul_tuning.txt" in out,
              f"file: resume did not read the file: {out[:600]}")
        timed = re.findall(r"stand-in matmul\[\d+\]: (\d+) shapes timed", err, re.M)
        check(timed == ["0", "0"], f"file: the resumed run timed shapes again: {timed}")
        check(len(re.findall(r"stand-in matmul chosen\[\d+\]: .*\(not run here yet\)$", err, re.M)) == 2 * n,
              "file: the file's choices were not taken at the start")
        check(figures(saved)[2:] == figures(d), "file: the resumed run differs from the uninterrupted one")
    # Another device: timed again, the file rewritten.
    other = os.path.join(tmp, "file_other")
    os.makedirs(other)
    with open(os.path.join(other, "matmul_tuning.txt"), "w") as f:
        f.write(text.replace(SCOPE, "NVIDIA H100 (sm_90), cuBLASLt 130000"))
    rc, out, err = train(2, base() + ["-b", "8", "--matmul-tune", "1", "-o", other], env=HOOK)
    if check(rc == 0, f"file: other scope: {err[-400:]}"):
        check("holds timings on NVIDIA H100 (sm_90), cuBLASLt 130000, this run is on " + SCOPE + ": timing again" in out,
              "file: another device's file was not refused")
        check(re.search(r"stand-in matmul\[0\]: [1-9]\d* shapes timed", err, re.M) is not None,
              "file: nothing timed after another device's file")
        with open(os.path.join(other, "matmul_tuning.txt")) as f:
            check(f.readline().strip() == f"# matmul algorithms for: {SCOPE}", "file: not rewritten for this device")
    # Malformed: one warning, timed again.
    bad = os.path.join(tmp, "file_bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "matmul_tuning.txt"), "w") as f:
        f.write(f"# matmul algorithms for: {SCOPE}\nforward N=1\ts0\n")
    rc, out, err = train(2, base() + ["-b", "8", "--matmul-tune", "1", "-o", bad], env=HOOK)
    if check(rc == 0, f"file: malformed: {err[-400:]}"):
        warn = [l for l in err.splitlines() if l.startswith("train_gpt: warning:")]
        check(len(warn) == 1 and "matmul_tuning.txt: line 2:" in warn[0] and "timing the products again" in warn[0],
              f"file: malformed: {warn}")
    # Without -o: decided, nothing written; without the hook: nothing to time.
    rc, out, err = train(2, base() + ["-b", "8", "--matmul-tune", "1"], env=HOOK)
    check(rc == 0 and "matmul tuning: choices kept" not in out and "shapes timed" in out and
          not os.path.exists(os.path.join(ROOT, "matmul_tuning.txt")), f"file: no -o: {err[-300:]}")
    rc, out, err = train(0, base() + ["-b", "8", "--matmul-tune", "1"])
    check(rc == 0 and "matmul tuning: the cpu backend has one algorithm per product: nothing to time" in out,
          f"no hook: {out[-300:]} {err[-300:]}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(5).integers(0, 97, 40000))
    test_agreement(tmp)
    test_outputs_dead(tmp)
    test_file(tmp)


def main():
    run_suite(check, "llmc_mmtune_", suite)


if __name__ == "__main__":
    main()
