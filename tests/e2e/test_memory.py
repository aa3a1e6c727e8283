#!/usr/bin/python3
# tests/e2e/test_memory.py: memory at scale and the rough edges a new user meets,
# on the CPU (one process and under mpirun), against independent truths:
#   - recompute: --recompute gelu, selective and full train the same model as
#     none (fp64 losses and final weights <= 1e-10), in one process and under
#     tp=2 sp, cp=2, pp=2 x ZeRO-3 and dp=2 x tp=2; the per-block activation
#     bytes of the memory line equal the formula of each mode (elements of
#     B·T·C: 16, 12, 11, 1, plus the statistics the mode keeps);
#   - --head-chunk: the LM head in chunks of 24 rows (not dividing the 64
#     or 128 rows of a micro-batch) trains the same model as the unchunked
#     head (fp64 losses and final weights <= 1e-10) in one process and under
#     tp=2, tp=2 sp, cp=2, pp=2 (four micro-batches) and dp=2 x ZeRO-3;
#     validation losses and samples (chunks of 5 rows cutting the sampling
#     pass's 16, under tp=2 sp, cp=2 and pp=2 too) equal the unchunked
#     run's; the activations of the memory line shrink by exactly the
#     logits rows dropped, less the input-gradient slot and the weight-
#     gradient accumulator;
#   - checkpoints: sharded (one file per rank, every element in exactly one,
#     read back here by an independent reader); saved at dp=2 x tp=2 ZeRO-1,
#     resumed at pp=2 x ZeRO-3 and in one process with the uninterrupted
#     run's losses; the final model file exported tensor by tensor equals
#     the checkpoint's weights; --keep-checkpoints K leaves the newest K;
#     leftovers of a killed run (temporary files, a checkpoint without DONE)
#     are removed at start; a resume that changes -x or -d warns, one that
#     names another model with -e stops;
#   - checkpoint fallback: a truncated newest checkpoint, or one whose
#     checksum fails as it loads, makes -y 1 resume from the newest sound
#     one with a warning naming both (nothing deleted), and the run goes on
#     as the uninterrupted one, bit for bit; --resume-from picks one by name
#     or step; a missing, malformed or damaged name, or every checkpoint
#     damaged, is refused in one line;
#   - memory checked before allocation: a model that cannot fit stops within
#     seconds with one line naming what it needs and the free memory (or
#     --memory-budget), before allocating it;
#   - rough edges: odd -t without cp; -d 0 or too large, --eps 0; ranks
#     given different flags (also one rank given --help, --plan or
#     --calibrate) or the same flags naming different files; a --tokenizer
#     that does not exist, claims 2^31 tokens, or has fewer than the model; --export-model, --export-hf, --trace paths that
#     cannot be written (refused before the first step); a FIFO as -i; a
#     metrics.jsonl that cannot be written; -n
#     without -o and -y 1 without a checkpoint warn on stderr; bare on/off
#     flags; a model file without the .bin suffix; a model file of NaN; CPU
#     threads shared by the ranks of a node.
# Last line: "N passed, N failed".
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, equivalence, metrics, read_checkpoint, rel, run_suite, train, write_shard

L, C, NH, V, T = 4, 32, 4, 97, 16
MODEL = f"L={L},C={C},NH={NH},V={V},Vp={V},T=64"
check = Checks()
DATA = None


def base(dtype="fp64", steps=6):
    return ["-e", MODEL, "-i", DATA, "-j", "", "-t", str(T), "-x", str(steps), "-s", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "2", "-q", "0.2", "--grad-clip", "0.5"]


def errors(err):
    return [l for l in err.splitlines() if l.startswith("train_gpt")]


def test_recompute(tmp):
    # Every mode against none, in one process and under the parallel modes.
    for mode in ("gelu", "selective", "full"):
        r = ["-r", mode]
        equivalence(check, os.path.join(tmp, mode), "fp64", base() + ["-d", "256"], ["-b", "16"],
                    [(0, ["-b", "16"] + r), (4, ["-b", "8", "--tp", "2", "--sp", "1", "--cp", "2"] + r),
                     (4, ["-b", "4", "--pp", "2", "-z", "3"] + r), (4, ["-b", "8", "--tp", "2"] + r)], steps=6)
    # Per-block activation bytes (fp32, one process, N = B·T tokens).
    B, es = 4, 4
    N = B * T
    stats = {"none": (4 + NH) * N, "gelu": (4 + NH) * N, "selective": 4 * N, "full": 0}
    elems = {"none": 16, "gelu": 12, "selective": 11, "full": 1}
    got = {}
    for mode in elems:
        rc, out, err = train(0, base("fp32", 1) + ["-b", str(B), "-r", mode])
        m = re.search(r"memory\[0\] start: .* layer_activations=(\d+)", out)
        if not check(rc == 0 and m, f"-r {mode}: {err[-300:]}"):
            continue
        got[mode] = int(m.group(1))
        want = (elems[mode] * N * C + stats[mode]) * es
        check(got[mode] == want, f"-r {mode}: {got[mode]} bytes per block, formula {want}")
    print(f"  per-block activation bytes (B={B}, T={T}, C={C}): {got} = formula")


def test_head_chunk(tmp):
    h = ["--head-chunk", "24"]
    equivalence(check, os.path.join(tmp, "head_chunk"), "fp64", base() + ["-d", "256"], ["-b", "16"],
                [(0, ["-b", "4"] + h), (2, ["-b", "8", "--tp", "2"] + h), (2, ["-b", "8", "--tp", "2", "--sp", "1"] + h),
                 (2, ["-b", "8", "--cp", "2"] + h), (2, ["-b", "4", "--pp", "2"] + h), (2, ["-b", "4", "-z", "3"] + h)],
                steps=6)
    # Validation and samples: the sampling pass (one row of 16 tokens)
    # computes only the chunk of 5 rows that holds the position it reads.
    look = base(steps=3) + ["-j", DATA, "-v", "3", "-m", "2", "-s", "3", "-g", "15", "-d", "256"]

    def seen(np_, extra):
        rc, out, err = train(np_, look + extra)
        out = re.sub(r"^memory\[\d+\] .*\n", "", out, flags=re.M)  # other ranks' lines may land inside a sample
        return rc, re.findall(r"---- sample ----\n(.*?)\n-{16}", out, re.S) + re.findall(r"val loss \S+", out), err

    # (Validation splits its micro-batches over the dp ranks: each layout
    # against itself unchunked.)
    for np_, extra in ((0, ["-b", "16"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"]), (2, ["-b", "8", "--cp", "2"]),
                       (2, ["-b", "4", "--pp", "2"])):
        rc, ref, err = seen(np_, extra)
        if not check(rc == 0 and "---- sample" not in "".join(ref) and len(ref) >= 2 and ref[-1].startswith("val"),
                     f"{' '.join(extra)}: samples and val losses {ref}: {err[-300:]}"):
            continue
        rc, got, err = seen(np_, extra + ["--head-chunk", "5"])
        check(rc == 0 and got == ref, f"--head-chunk 5 {' '.join(extra)}: samples and val losses {got} != {ref} "
                                      f"{err[-300:]}")
    print(f"  --head-chunk 5: samples and val losses equal the unchunked runs' in 4 layouts")
    # The memory line (fp32, one process, N = 64 rows): the logits shrink
    # from N to 24 rows; the head input's gradient (N x C) and the weight
    # gradient's accumulator (V x C) are added.
    acts = {}
    for extra in ([], h):
        rc, out, err = train(0, base("fp32", 1) + ["-b", "4"] + extra)
        m = re.search(r"memory\[0\] start: .* activations=(\d+)", out)
        if check(rc == 0 and m, f"memory line {extra}: {err[-300:]}"):
            acts[len(extra)] = int(m.group(1))
    if len(acts) == 2:
        want = acts[0] - (64 - 24) * V * 4 + 64 * C * 4 + V * C * 4
        check(acts[2] == want, f"--head-chunk 24: activations {acts[2]} bytes, want {want}")
        print(f"  --head-chunk 24 memory line (V=97): activations {acts[0]} -> {acts[2]} bytes")
    # At d12's sizes (B=64, T=1024, bf16 on the H100 profile) the planner's
    # line (equal to the trainer's, tests/e2e/test_planner.py) drops 64K - 8K
    # rows of logits.
    acts = {}
    for extra in ([], ["--head-chunk", "8192"]):
        p = subprocess.run([TRAIN, "--plan", "eval", "-e", "d12", "-b", "64", "-t", "1024", "--world", "1",
                            "--hardware", "h100-sxm"] + extra,
                           cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
        m = re.search(r"memory\[0\] plan: .* activations=(\d+)", p.stdout)
        if check(p.returncode == 0 and m, f"--plan eval d12 {extra}: {p.stderr[-300:]}"):
            acts[len(extra)] = int(m.group(1))
    if len(acts) == 2:
        N, Vp, C2 = 64 * 1024, 50304, 768
        want = acts[0] - (N - 8192) * Vp * 2 + N * C2 * 2 + Vp * C2 * 2
        check(acts[2] == want, f"d12 --head-chunk 8192: activations {acts[2]} bytes, want {want}")
        print(f"  d12 B=64 T=1024 --head-chunk 8192: activations {acts[0] / 2**30:.2f} -> {acts[2] / 2**30:.2f} GiB")


def test_checkpoints(tmp):
    args = base() + ["-d", "256", "-x", "10"]
    full = os.path.join(tmp, "ck_full")
    rc, out, err = train(0, args + ["-b", "16", "-o", full])
    full_l = [m["loss"] for m in metrics(full)]
    src = os.path.join(tmp, "ck_src")
    rc, out, err = train(4, args + ["-b", "8", "--tp", "2", "-z", "1", "-n", "5", "-o", src])
    if not check(rc == 0, f"dp=2 x tp=2 save: {err[-300:]}"):
        return
    shards = sorted(os.listdir(os.path.join(src, "ckpt_00000005")))
    check(shards == ["index.json"] + [f"shard_{r:05d}.bin" for r in range(4)], f"checkpoint files {shards}")
    # Every element in exactly one shard (the reader asserts it), and the
    # exported llm.c model file holds the checkpoint's weights.
    w, _, _, (L_, C_, Vp, T_) = read_checkpoint(src, 10)
    with open(os.path.join(src, "model_00000010.bin"), "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        exported = np.frombuffer(f.read(), dtype="<f4").astype(np.float64)  # version 3: fp32
    check(h[0] == 20240326 and h[1] == 3 and len(exported) == len(w) and rel(exported, w) < 1e-7,
          f"exported model differs from the checkpoint: {rel(exported, w) if len(exported) == len(w) else 'sizes'}")
    # Resumed in other layouts.
    for np_, extra in ((4, ["-b", "4", "--pp", "2", "-z", "3"]), (0, ["-b", "16"])):
        d = os.path.join(tmp, f"ck_resume_{np_}")
        os.makedirs(d)
        shutil.copytree(os.path.join(src, "ckpt_00000005"), os.path.join(d, "ckpt_00000005"))
        shutil.copy(os.path.join(src, "DONE_00000005"), d)
        rc, out, err = train(np_, args + ["-y", "1", "-o", d] + extra)
        if not check(rc == 0, f"resume {extra}: {err[-300:]}"):
            continue
        r = rel([m["loss"] for m in metrics(d)], full_l[5:])
        print(f"  saved at dp=2 x tp=2 ZeRO-1 (4 shards), resumed at {' '.join(extra)}: losses rel {r:.2e}")
        check(r <= 1e-10, f"resume {extra}: rel err {r:.3e}")
        check("continuing at" in out, f"resume {extra}: no line about the layout change")
    # Changed -x and -d warn; another model stops.
    d = os.path.join(tmp, "ck_change")
    shutil.copytree(src, d)
    rc, out, err = train(0, base() + ["-d", "512", "-x", "12", "-b", "16", "-y", "1", "-o", d])
    check(rc == 0 and "warning: resuming with -x 12" in err and "warning: resuming with -d 512" in err,
          f"resume with other -x, -d: rc={rc} {err[-400:]!r}")
    rc, out, err = train(0, base() + ["-e", "L=2,C=32,NH=4,V=97,Vp=97,T=64", "-d", "256", "-b", "16", "-y", "1",
                                      "-o", d])
    e = errors(err)
    check(rc != 0 and len(e) == 1 and "flag -e" in e[0], f"resume with another -e: rc={rc} {err[-300:]!r}")
    # --keep-checkpoints, and what a killed run leaves.
    d = os.path.join(tmp, "ck_keep")
    os.makedirs(d)
    stale = [os.path.join(d, "metrics.jsonl.tmp.99999"), os.path.join(d, "ckpt_00000099")]
    open(stale[0], "w").write("x")
    os.makedirs(stale[1])
    open(os.path.join(stale[1], "shard_00000.bin.tmp.99999"), "w").write("x")
    rc, out, err = train(0, base() + ["-d", "256", "-b", "16", "-x", "8", "-n", "2", "--keep-checkpoints", "2",
                                      "-o", d])
    left = sorted(n for n in os.listdir(d) if n.startswith(("ckpt_", "DONE_")))
    check(rc == 0 and left == ["DONE_00000006", "DONE_00000008", "ckpt_00000006", "ckpt_00000008"],
          f"--keep-checkpoints 2 left {left}")
    check(not any(os.path.exists(p) for p in stale) and "leftover" in out, "leftovers of a killed run not removed")


def test_memory_check(tmp):
    # A model whose parameters alone exceed this machine's memory: one line,
    # fast, nothing allocated.
    t0 = time.time()
    rc, out, err = train(0, ["-e", "L=100000,C=64,NH=4,V=97,T=64", "-i", DATA, "-j", "", "-t", "16", "-x", "1"])
    e = errors(err)
    check(rc != 0 and len(e) == 1 and "out of memory" in e[0] and "free memory" in e[0] and time.time() - t0 < 30,
          f"huge model: rc={rc} {err[-300:]!r} after {time.time() - t0:.1f} s")
    if e:
        print(f"  {e[0][:160]}...")
    rc, out, err = train(2, base("fp32", 1) + ["-b", "16", "--memory-budget", "1"])
    e = errors(err)
    check(rc != 0 and len(e) == 1 and "--memory-budget 1.0 MiB" in e[0], f"budget: rc={rc} {err[-300:]!r}")


def test_rough_edges(tmp):
    # Odd T without cp trains.
    rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "-t", "31"])
    check(rc == 0 and "step     1/1" in out, f"-t 31: rc={rc} {err[-200:]!r}")
    for extra, flag in ((["-d", "1000000000000000"], "-d"), (["-d", "0"], "-d"), (["--eps", "0"], "--eps")):
        rc, out, err = train(0, base("fp32", 1) + ["-b", "2"] + extra)
        e = errors(err)
        check(rc != 0 and len(e) == 1 and f"flag {flag}" in e[0], f"{extra}: rc={rc} {err[-200:]!r}")
    # Ranks given different flags: one line naming the flag, no hang.
    cmd = ["mpirun", "-np", "1", TRAIN] + base("fp32", 2) + [":", "-np", "1", TRAIN] + base("fp32", 3)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV)
    e = errors(p.stderr)
    check(p.returncode != 0 and len(e) == 1 and "--max-steps" in e[0] and "different flags" in e[0],
          f"different flags: rc={p.returncode} {p.stderr[-300:]!r}")
    # A tokenizer the user names must exist (a missing path or a directory
    # once fell back to byte-level samples without a word).
    for tok in ("/nonexistent/tokenizer.bin", tmp):
        rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "--tokenizer", tok])
        e = errors(err)
        check(rc != 0 and len(e) == 1 and "--tokenizer" in e[0], f"--tokenizer {tok}: rc={rc} {err[-200:]!r}")
    # A FIFO given as a data shard: refused at once (open() once waited for a
    # writer forever).
    fifo = os.path.join(tmp, "fifo.bin")
    os.mkfifo(fifo)
    try:
        rc, out, err = train(0, [a if a != DATA else fifo for a in base("fp32", 1)], timeout=30)
        e = errors(err)
        check(rc != 0 and len(e) == 1 and "fifo.bin" in e[0] and "not a regular file" in e[0],
              f"a FIFO as -i: rc={rc} {err[-200:]!r}")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO as -i: hung")
    # Outputs written only at the end are checked before the first step.
    for flag, path in (("--export-model", "/nonexistent/dir/model.bin"), ("--trace", tmp),
                       ("--export-hf", "/etc/passwd/hf"), ("--trace", "/nonexistent/t.json")):
        rc, out, err = train(0, base("fp32", 1) + ["-b", "2", flag, path])
        e = errors(err)
        check(rc != 0 and len(e) == 1 and flag in e[0] and "step" not in out,
              f"{flag} {path}: rc={rc} {err[-200:]!r}")
    # A tokenizer header claiming 2^31-1 tokens: refused as truncated (once a
    # bare "out of memory"); one of fewer tokens than the model's vocabulary:
    # a warning that samples print those ids as <?>.
    for ntok, name in ((2 ** 31 - 1, "huge_tok.bin"), (50, "small_tok.bin")):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<4i", 20240328, 2, ntok, 0) + bytes(4 * 252))
            f.write(b"".join(bytes([1, 65 + i % 26]) for i in range(50)))
        rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "-s", "1", "--tokenizer", path])
        e = errors(err)
        if ntok > 50:
            check(rc != 0 and len(e) == 1 and name in e[0] and "truncated" in e[0], f"{name}: rc={rc} {err[-200:]!r}")
        else:
            check(rc == 0 and any("warning" in x and "<?>" in x for x in e), f"{name}: rc={rc} {err[-200:]!r}")
    # The same flags naming different files (a relative -i from two working
    # directories, shards of different lengths): one line naming -i, no
    # training on other data, no hang at the shorter epoch's end.
    dirs = [os.path.join(tmp, f"wd{k}") for k in (0, 1)]
    for k, d in enumerate(dirs):
        os.makedirs(d, exist_ok=True)
        write_shard(os.path.join(d, "shard.bin"), np.random.default_rng(7 + k).integers(0, 97, 3000 + 1000 * k))
    args = [a if a != DATA else "shard.bin" for a in base("fp32", 2)]
    cmd = ["mpirun", "-np", "1", "-wdir", dirs[0], TRAIN] + args + [":", "-np", "1", "-wdir", dirs[1], TRAIN] + args
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV)
        e = errors(p.stderr)
        check(p.returncode != 0 and len(e) == 1 and "flag -i 'shard.bin'" in e[0] and "other data" in e[0],
              f"ranks reading different files: rc={p.returncode} {p.stderr[-300:]!r}")
    except subprocess.TimeoutExpired:
        check(False, "ranks reading different files: hung")
    # One rank given --help, --plan or --calibrate while the other trains
    # (those modes are chosen after the ranks compare their flags): the same
    # one line, no hang.
    for odd, flag in ((["--help"], "--help"), (["--plan", "eval"], "--plan"), (["--calibrate", "x.json"], "--calibrate")):
        cmd = ["mpirun", "-np", "1", TRAIN] + base("fp32", 2) + [":", "-np", "1", TRAIN] + base("fp32", 2) + odd
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV)
        except subprocess.TimeoutExpired:
            check(False, f"one rank given {flag}: hung")
            continue
        e = errors(p.stderr)
        check(p.returncode != 0 and len(e) == 1 and flag in e[0] and "different flags" in e[0],
              f"one rank given {flag}: rc={p.returncode} {p.stderr[-300:]!r}")
    # metrics.jsonl that cannot be written (a full disk).
    d = os.path.join(tmp, "full_disk")
    os.makedirs(d)
    os.symlink("/dev/full", os.path.join(d, "metrics.jsonl"))
    rc, out, err = train(0, base("fp32", 2) + ["-b", "2", "-o", d])
    e = errors(err)
    check(rc != 0 and len(e) == 1 and "metrics.jsonl" in e[0], f"metrics on a full disk: rc={rc} {err[-200:]!r}")
    # Warnings on stderr.
    rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "-n", "1"])
    check(rc == 0 and "warning: -n 1 without -o" in err, f"-n without -o: {err[-200:]!r}")
    rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "-y", "1", "-o", os.path.join(tmp, "fresh")])
    check(rc == 0 and "warning: -y 1: no complete checkpoint" in err, f"-y 1 without a checkpoint: {err[-200:]!r}")
    # Bare on/off flags mean 1.
    one = os.path.join(tmp, "bare_1")
    bare = os.path.join(tmp, "bare")
    r1 = train(2, base() + ["-b", "8", "-d", "256", "--tp", "2", "--sp", "1", "-r", "1", "-o", one])
    r2 = train(2, base() + ["-b", "8", "-d", "256", "--tp", "2", "--sp", "-r", "-o", bare])
    ok = r1[0] == 0 and r2[0] == 0 and [m["loss"] for m in metrics(one)] == [m["loss"] for m in metrics(bare)]
    check(ok and "(sequence parallel)" in r2[1] and re.search(r"\| recompute +\| gelu", r2[1]),
          f"bare --sp and -r: {r2[2][-300:]!r}")
    rc, out, err = train(0, base("fp32", 1) + ["-b", "2", "-a", "-y", "-o", os.path.join(tmp, "bare_ay")])
    check(rc == 0 and re.search(r"\| overfit +\| 1 ", out) and re.search(r"\| resume +\| 1 ", out), "bare -a -y")
    # A model file without .bin, and one full of NaN.
    src = os.path.join(tmp, "bare_ay", "model_00000001.bin")
    plain = os.path.join(tmp, "mymodel")
    shutil.copy(src, plain)
    rc, out, err = train(0, base("fp32", 1)[2:] + ["-e", plain, "-b", "2"])
    check(rc == 0 and "step     1/1" in out, f"-e without .bin: rc={rc} {err[-200:]!r}")
    nan = os.path.join(tmp, "nan.bin")
    with open(src, "rb") as f:
        head, body = f.read(1024), bytearray(f.read())
    body[4 * 1000:4 * 1001] = struct.pack("<f", float("nan"))
    with open(nan, "wb") as f:
        f.write(head + bytes(body))
    rc, out, err = train(0, base("fp32", 1)[2:] + ["-e", nan, "-b", "2"])
    e = errors(err)
    check(rc != 0 and len(e) == 1 and "nan.bin" in e[0] and "wte" in e[0] and "NaN" in e[0],
          f"NaN model: rc={rc} {err[-200:]!r}")
    # Threads: the node's cores shared by its ranks unless OMP_NUM_THREADS is set.
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    cores = os.cpu_count()
    p = subprocess.run(["mpirun", "-np", "2", TRAIN] + base("fp32", 1) + ["-b", "2"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env)
    want = f"{max(1, cores // 2)} ({cores} cores / 2 rank(s) on this node"
    check(p.returncode == 0 and want in p.stdout, f"threads per rank: want '{want}' in the settings: {p.stderr[-200:]!r}")
    rc, out, err = train(2, base("fp32", 1) + ["-b", "2"])
    check(rc == 0 and "1 (OMP_NUM_THREADS)" in out, "threads per rank with OMP_NUM_THREADS")


def test_checkpoint_fallback(tmp):
    """A damaged newest checkpoint: -y 1 falls back to the newest sound one (one line naming both, nothing
    deleted) and continues the uninterrupted run bit for bit; --resume-from picks one; bad names refused."""
    small = ["-e", "L=2,C=32,NH=2,V=257,T=64", "-b", "4", "-t", "32", "--device", "cpu", "-v", "0", "-s", "0"]
    args = small + ["--dtype", "fp64", "-d", "256", "-n", "2"]
    full, part = os.path.join(tmp, "fb_full"), os.path.join(tmp, "fb_part")
    rc, _, err = train(0, args + ["-x", "8", "-o", full])
    rc2, _, err2 = train(0, args + ["-x", "6", "-o", part])
    if not check(rc == 0 and rc2 == 0, f"fallback runs: {err[-300:]} {err2[-300:]}"):
        return
    shard = os.path.join(part, "ckpt_00000006", "shard_00000.bin")
    with open(shard, "r+b") as f:
        f.truncate(100000)
    flipped = os.path.join(tmp, "fb_flipped")
    shutil.copytree(part, flipped)
    rc, out, err = train(0, args + ["-x", "8", "-y", "1", "-o", part])
    line = next((l for l in err.splitlines() if l.startswith("train_gpt: warning: -y 1:")), "")
    check(rc == 0 and "ckpt_00000006 fails its check" in line and "size 100000 bytes" in line and
          "resuming from" in line and "ckpt_00000004" in line, f"fallback line: {line!r} rc={rc} {err[-300:]!r}")
    check([m["loss"] for m in metrics(full)] == [m["loss"] for m in metrics(part)],
          "after the fallback the losses equal the uninterrupted run's")
    # A payload byte flipped (sizes right, a checksum wrong: found as it loads).
    sh = os.path.join(flipped, "ckpt_00000004", "shard_00000.bin")
    data = bytearray(open(sh, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(sh, "wb").write(bytes(data))
    shutil.rmtree(os.path.join(flipped, "ckpt_00000006"))
    os.remove(os.path.join(flipped, "DONE_00000006"))
    rc, out, err = train(0, args + ["-x", "8", "-y", "1", "-o", flipped])
    line = next((l for l in err.splitlines() if l.startswith("train_gpt: warning: -y 1:")), "")
    check(rc == 0 and "ckpt_00000004 fails as it loads" in line and "ckpt_00000002" in line,
          f"fallback past a checksum: {line!r} rc={rc} {err[-300:]!r}")
    check([m["loss"] for m in metrics(full)] == [m["loss"] for m in metrics(flipped)],
          "after the checksum fallback the losses equal the uninterrupted run's")
    # --resume-from: an older one by name or step, then training on to the same end.
    for name in ("ckpt_00000002", "4"):
        d = os.path.join(tmp, "fb_named_" + name)
        shutil.copytree(part, d)
        rc, out, err = train(0, args + ["-x", "8", "--resume-from", name, "-o", d])
        check(rc == 0 and [m["loss"] for m in metrics(full)] == [m["loss"] for m in metrics(d)],
              f"--resume-from {name}: rc={rc} {err[-300:]!r}")
    for name, want in (("ckpt_00000003", "no complete checkpoint of step 3"), ("banana", "is not ckpt_SSSSSSSS"),
                       ("6", "fails its check")):
        d = os.path.join(tmp, "fb_bad_" + name)
        shutil.copytree(part, d)
        with open(os.path.join(d, "ckpt_00000006", "shard_00000.bin"), "r+b") as f:
            f.truncate(100000)
        rc, out, err = train(0, args + ["-x", "8", "--resume-from", name, "-o", d])
        lines = [l for l in err.splitlines() if l.startswith("train_gpt: error")]
        check(rc != 0 and len(lines) == 1 and "--resume-from" in lines[0] and want in lines[0],
              f"--resume-from {name}: rc={rc} {lines}")
    # Every checkpoint damaged: -y 1 refuses naming them.
    d = os.path.join(tmp, "fb_all_bad")
    shutil.copytree(part, d)
    for c in glob.glob(os.path.join(d, "ckpt_*", "shard_00000.bin")):
        with open(c, "r+b") as f:
            f.truncate(1000)
    rc, out, err = train(0, args + ["-x", "8", "-y", "1", "-o", d])
    lines = [l for l in err.splitlines() if l.startswith("train_gpt: error")]
    check(rc != 0 and len(lines) == 1 and "no checkpoint in" in lines[0] and "passes its check" in lines[0],
          f"every checkpoint damaged: rc={rc} {lines}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(13).integers(0, V, 40000))
    test_rough_edges(tmp)
    test_memory_check(tmp)
    test_checkpoints(tmp)
    test_checkpoint_fallback(tmp)
    test_recompute(tmp)
    test_head_chunk(tmp)


def main():
    run_suite(check, "llmc_memory_", suite)


if __name__ == "__main__":
    main()
