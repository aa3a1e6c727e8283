#!/usr/bin/python3
# tests/e2e/test_audit.py: the robustness audit of train_gpt as a regression
# suite. It feeds the trainer a broad set of bad inputs and faults (flags,
# token shards, model files and -e specs, tokenizers, damaged checkpoints,
# output paths that cannot be written, ranks that disagree, die, stall or are
# signalled, bad steps) and sorts each outcome into one class:
#   ok       the behaviour README.md documents: for an error, a non-zero exit
#            on every rank after one line `train_gpt: error: ...` naming the
#            flag, file or value; for a fault meant to be survived, the
#            documented recovery;
#   crash    a signal, a core dump, a traceback, "terminate called", an
#            uncaught exception;
#   hang     still running at the case's time limit (its process group is
#            killed then);
#   silent   exit 0 (or trained on) where it should have refused or warned;
#   unclear  refused, but the message does not name the culprit, or takes
#            several lines, or is a bare "out of memory".
# One line per case (`CLASS  CASE  detail`), the cases not ok again as
# `FAIL CLASS CASE detail`, a count per class, and last "N passed, N failed"
# (passed = ok); the exit status is 1 if any failed. The machinery (runs,
# time limits, classes, the bad files) is in audit_harness.py.
# Every run gets a hard limit (60 s in one process, 90 s under mpirun) far
# above what it needs, so a busy machine slows the suite down but does not
# make it fail; no other timing is asserted.
import json
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import audit_harness as h  # noqa: E402
from audit_harness import (ENV, SMALL, TRAIN, adam_nan, classify_error, error_lines, expect_error,  # noqa: E402
                           expect_survive, header, model_header, param_count, record, refuse_or_warn, run, shard,
                           signal_rank, swap, tokenizer, write)

# ---- the cases ----------------------------------------------------------------------------------

def flag_cases(base):
    def bad(name, extra, needles):
        expect_error("flag " + name, base + extra, needles)
    bad("unknown long", ["--bogus"], "--bogus")
    bad("unknown short", ["-Q", "1"], "-Q")
    bad("missing value -b", ["-b"], ["-b", "--batch-size"])
    bad("missing value --lr", ["--lr"], ["-l", "--lr"])
    bad("-b abc", ["-b", "abc"], ["-b", "--batch-size"])
    bad("-t 3.5", ["-t", "3.5"], ["-t", "--seq-len"])
    bad("-l abc", ["-l", "abc"], ["-l", "--lr"])
    bad("--seed x", ["--seed", "x"], "--seed")
    bad("-x 1e99 overflow", ["-x", "99999999999999999999"], ["-x", "--max-steps"])
    for flag, long, vals in (("-b", "--batch-size", ("0", "-4")), ("-t", "--seq-len", ("-32",)),
                             ("-x", "--max-steps", ("0", "-5")), ("-d", "--total-batch", ("0", "-5")),
                             ("-y", "--resume", ("-5", "2")), ("--sp", "--sp", ("2", "-1")),
                             ("-a", "--overfit", ("2", "-1")), ("--tp", "--tp", ("0", "-2")),
                             ("--cp", "--cp", ("0", "-2")), ("--cp-a2a", "--cp-a2a", ("-1",)),
                             ("--pp", "--pp", ("0", "-1")),
                             ("--vpp", "--vpp", ("0",)), ("-z", "--zero", ("4", "-1")),
                             ("-g", "--gen-tokens", ("-1",)), ("-m", "--val-steps", ("-3",)),
                             ("--val-tokens", "--val-tokens", ("0", "-5")),
                             ("--max-skips", "--max-skips", ("-1",)), ("--skip-spikes", "--skip-spikes", ("-1",)),
                             ("--grad-clip", "--grad-clip", ("-1",)), ("--head-chunk", "--head-chunk", ("-4",)),
                             ("--collective-timeout", "--collective-timeout", ("-1",)),
                             ("--memory-budget", "--memory-budget", ("-1",)), ("-u", "--warmup", ("-1",)),
                             ("-c", "--weight-decay", ("-1",)), ("-q", "--final-lr-frac", ("2", "-1")),
                             ("-v", "--val-every", ("-1",)), ("-n", "--checkpoint-every", ("-1",)),
                             ("--keep-checkpoints", "--keep-checkpoints", ("-1",)), ("--eps", "--eps", ("0",))):
        for v in vals:
            bad(f"{flag} {v}", [flag, v], [f"flag {flag}:", f"{flag} {v}", long + " ", long + ":"])
    bad("--lr nan", ["--lr", "nan"], ["-l", "--lr"])
    bad("--beta1 1.5", ["--beta1", "1.5"], "--beta1")
    bad("--beta2 -0.5", ["--beta2", "-0.5"], "--beta2")
    bad("--tp 2 on 1 rank", ["--tp", "2"], "--tp")
    bad("--cp 2 on 1 rank", ["--cp", "2"], "--cp")
    bad("--pp 2 on 1 rank", ["--pp", "2"], "--pp")
    bad("-d not a multiple", ["-d", "100"], ["-d", "--total-batch"])
    bad("-t past maxT", ["-t", "128"], ["-t", "--seq-len"])
    bad("-o -a (flag as value)", ["-o", "-a"], ["-o", "--output-dir"])
    bad("--dtype fp16", ["--dtype", "fp16"], "--dtype")
    bad("--device gpu", ["--device", "gpu"], "--device")
    bad("--comm gloo", ["--comm", "gloo"], "--comm")
    bad("--comm nccl on cpu", ["--comm", "nccl"], "--comm")
    bad("-r bogus", ["-r", "bogus"], ["-r", "--recompute"])
    bad("--plan bogus", ["--plan", "bogus"], "--plan")
    bad("--vpp 2 without --pp", ["--vpp", "2"], "--vpp")
    bad("--sp 1 without --tp", ["--sp", "1"], "--sp")
    bad("--cp-a2a 2 without --cp-impl hybrid", ["--cp-a2a", "2"], "--cp-a2a")
    bad("--cp-impl hybrid on 1 rank", ["--cp-impl", "hybrid", "--cp-a2a", "2"], "--cp-a2a")
    bad("--memory-budget 1 MiB", ["--memory-budget", "1"], "--memory-budget")
    # The memory check's line (README: "out of memory: rank R would hold ...") for an absurd batch.
    bad("-b 1000000", ["-b", "1000000"], ["-b", "out of memory: rank 0 would hold"])
    refuse_or_warn("flag -n 2 without -o", run(base + ["-n", "2"]), "-n 2")
    # Layouts checked by the planner without launching ranks: degrees that do
    # not divide the world or the model, and degrees whose product overflows.
    plan = base + ["--plan", "eval"]
    expect_error("plan tp 4 > NH 2", plan + ["--world", "4", "--tp", "4"], "--tp")
    expect_error("plan tp 3 not dividing world 4", plan + ["--world", "4", "--tp", "3"], "--tp")
    expect_error("plan cp 3: 2cp does not divide T", plan + ["--world", "3", "--cp", "3"], "--cp")
    expect_error("plan pp 4 > L 2", plan + ["--world", "4", "--pp", "4"], "--pp")
    expect_error("plan world 2^24 tp*cp overflow", plan + ["--world", "16777216", "--tp", "65536", "--cp", "65536"],
                 ["--tp", "--cp", "--world"])
    expect_error("plan --world -1", plan + ["--world", "-1"], "--world")
    expect_error("plan --hardware missing", plan + ["--hardware", "/nonexistent/hw.json"], "hw.json")
    expect_error("plan --hardware not JSON", plan + ["--hardware", base[base.index("-i") + 1]], "--hardware")
    expect_error("plan --gpus-per-node -1", plan + ["--gpus-per-node", "-1"], "--gpus-per-node")
    expect_error("plan --plan-top 0", base + ["--plan", "search", "--plan-top", "0"], "--plan-top")


def data_cases(tmp, base):
    d = os.path.join(tmp, "data")
    os.makedirs(d)
    good = [i % 250 for i in range(3000)]
    p = lambda n: os.path.join(d, n)  # noqa: E731
    fifo = p("fifo.bin")
    os.mkfifo(fifo)
    os.makedirs(p("adir.bin"))
    cases = [
        ("missing file", p("nope.bin"), "nope.bin"),
        ("empty glob", p("nothing_*.bin"), "nothing_"),
        ("bad magic", shard(p("magic.bin"), good, magic=1234), "magic.bin"),
        ("wrong version", shard(p("version.bin"), good, version=2), "version.bin"),
        ("truncated", shard(p("trunc.bin"), good, count=4000), "trunc.bin"),
        ("trailing bytes", shard(p("trail.bin"), good, extra=b"\x01\x00\x02\x00"), "trail.bin"),
        ("odd trailing byte", shard(p("odd.bin"), good, extra=b"\x01"), "odd.bin"),
        ("zero count", shard(p("zero.bin"), [], count=0), "zero.bin"),
        ("negative count", shard(p("neg.bin"), good, count=-5), "neg.bin"),
        ("header only, short", write(p("short.bin"), header(20240520, 1)[:600]), "short.bin"),
        ("a directory", p("adir.bin"), "adir.bin"),
        ("a FIFO", fifo, "fifo.bin"),
        ("id past V early", shard(p("id_early.bin"), [7] * 100 + [300] + good), "id_early.bin"),
        ("id past V late", shard(p("id_late.bin"), good[:2950] + [257] + good[:2049]), "id_late.bin"),
        ("id 65535", shard(p("id_max.bin"), good + [65535]), "id_max.bin"),
        ("too few tokens for T+1", shard(p("few.bin"), good[:20]), "few.bin"),
        ("exactly T tokens", shard(p("T.bin"), good[:32]), "T.bin"),
        ("uint32 shard, wrong version", shard(p("u32.bin"), good, magic=20240801, version=1, fmt="I"), "u32.bin"),
        ("uint32 id past V", shard(p("u32id.bin"), good + [70000], magic=20240801, version=7, fmt="I"), "u32id.bin"),
    ]
    for name, path, needle in cases:
        expect_error("data -i " + name, swap(base, "-i", path), needle)
    ok_shard = shard(p("ok.bin"), good)
    glob_dir = os.path.join(d, "mixed")
    os.makedirs(glob_dir)
    shutil.copy(ok_shard, os.path.join(glob_dir, "s_000.bin"))
    shard(os.path.join(glob_dir, "s_001.bin"), good, magic=99)
    expect_error("data -i glob with one bad shard", base + ["-i", os.path.join(glob_dir, "s_*.bin")], "s_001.bin")
    expect_error("data -j missing", base + ["-j", p("noval.bin"), "-v", "1"], "noval.bin")
    expect_error("data -j bad magic", base + ["-j", p("magic.bin"), "-v", "1"], "magic.bin")


def model_cases(tmp, base):
    d = os.path.join(tmp, "models")
    os.makedirs(d)
    p = lambda n: os.path.join(d, n)  # noqa: E731
    P = param_count(2, 32, 384, 64)
    payload = struct.pack(f"<{P}f", *([0.01] * P))
    nan_payload = bytearray(payload)
    nan_payload[400:404] = struct.pack("<f", float("nan"))
    os.makedirs(p("hf_empty"))
    os.makedirs(p("hf_badjson"))
    write(p("hf_badjson/config.json"), b"{not json")
    os.makedirs(p("hf_noweights"))
    write(p("hf_noweights/config.json"), json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2,
                                                     "vocab_size": 257, "n_positions": 64}).encode())
    files = [
        ("missing path", p("missing.bin"), "missing.bin"),
        ("header only", write(p("hdr.bin"), model_header()), "hdr.bin"),
        ("truncated", write(p("trunc.bin"), model_header() + payload[:len(payload) // 2]), "trunc.bin"),
        ("trailing bytes", write(p("trail.bin"), model_header() + payload + b"\0" * 8), "trail.bin"),
        ("bad magic", write(p("magic.bin"), model_header(magic=7) + payload), "magic.bin"),
        ("wrong version", write(p("ver.bin"), model_header(version=4) + payload), "ver.bin"),
        ("NaN weight", write(p("nan.bin"), model_header() + bytes(nan_payload)), "nan.bin"),
        ("C not divisible by NH", write(p("cnh.bin"), model_header(NH=3) + payload), "cnh.bin"),
        ("Vp < V", write(p("vp.bin"), model_header(Vp=200) + payload), "vp.bin"),
        ("negative L", write(p("negl.bin"), model_header(L=-2) + payload), "negl.bin"),
        ("empty file", write(p("empty.bin"), b""), "empty.bin"),
        ("HF dir without config", p("hf_empty"), "config.json"),
        ("HF dir, config not JSON", p("hf_badjson"), "config.json"),
        ("HF dir without weights", p("hf_noweights"), "safetensors"),
    ]
    for name, path, needle in files:
        expect_error("model -e " + name, swap(base, "-e", path), needle)
    for spec, needle in (("L=2,C=30,NH=4,V=257,T=64", "-e"), ("L=0,C=32,NH=2,V=257,T=64", "-e"),
                         ("L=2,C=0,NH=2,V=257,T=64", "-e"), ("L=2,C=32,NH=0,V=257,T=64", "-e"),
                         ("L=2,C=32,NH=2,V=0,T=64", "-e"), ("L=2,C=32,NH=2,V=-5,T=64", "-e"),
                         ("L=2,C=32,NH=2,V=257,T=0", "-e"), ("L=two,C=32,NH=2,V=257,T=64", "-e"),
                         ("L=2,C=32,NH=2,V=257,T=64,Q=3", "-e"), ("L=2,C=32,NH=2,V=257,T=64,Vp=100", "-e"),
                         ("L=100000000,C=32,NH=2,V=257,T=64", "-e"), ("L=2,C=1000000000,NH=2,V=257,T=64", "-e"),
                         ("L=2,C=32,NH=2,V=2000000000,T=64", "-e"), ("arch=bogus,L=2,C=32,NH=2,V=257,T=64", "-e"),
                         ("d0", "-e"), ("d-12", "-e"), ("", "-e")):
        expect_error(f"model -e '{spec[:36]}'", swap(base, "-e", spec), needle)


def tokenizer_cases(tmp, base):
    d = os.path.join(tmp, "tok")
    os.makedirs(os.path.join(d, "adir"))
    s = base + ["-s", "1", "-g", "4", "-x", "1"]
    for name, path, needle in (("missing", os.path.join(d, "missing.bin"), "missing.bin"),
                               ("a directory", os.path.join(d, "adir"), "adir"),
                               ("truncated", tokenizer(os.path.join(d, "trunc.bin"), cut=1100), "trunc.bin"),
                               ("bad magic", tokenizer(os.path.join(d, "magic.bin"), magic=5), "magic.bin"),
                               ("json not JSON", write(os.path.join(d, "tokenizer.json"), b"{oops"),
                                "tokenizer.json")):
        expect_error("tokenizer " + name, s + ["--tokenizer", path], needle)


def checkpoint_cases(tmp, base):
    src = os.path.join(tmp, "ckpt_src")
    args = base + ["-x", "4", "-n", "2"]
    r = run(args + ["-o", src])
    if r.rc != 0:
        record("unclear", "checkpoint: source run", f"the run that makes the checkpoint failed: {r.err[-200:]!r}")
        return
    resume = args + ["-x", "6", "-y", "1"]

    def damaged(name, damage):
        d = os.path.join(tmp, "ck_" + re.sub(r"\W+", "_", name))
        shutil.copytree(src, d)
        damage(os.path.join(d, "ckpt_00000004"), d)
        return d

    def flip(path, at):
        data = bytearray(open(path, "rb").read())
        data[at] ^= 0x10
        write(path, bytes(data))

    def edit_index(field, value):
        def f(c, _):
            j = json.load(open(os.path.join(c, "index.json")))
            (j["run"] if field in j.get("run", {}) else j)[field] = value
            json.dump(j, open(os.path.join(c, "index.json"), "w"))
        return f

    sh = "shard_00000.bin"
    cases = [
        ("flipped byte in shard", lambda c, _: flip(os.path.join(c, sh), 1024 + 3000), sh),
        ("flipped byte in shard header", lambda c, _: flip(os.path.join(c, sh), 8), sh),  # its rank field
        ("flipped byte in piece table", lambda c, _: flip(os.path.join(c, sh), 1024 + 8), sh),
        ("flipped byte in checksums", lambda c, _: flip(os.path.join(c, sh), os.path.getsize(os.path.join(c, sh)) - 3),
         sh),
        ("truncated shard", lambda c, _: os.truncate(os.path.join(c, sh), 5000), sh),
        ("missing shard", lambda c, _: os.remove(os.path.join(c, sh)), sh),
        ("missing index", lambda c, _: os.remove(os.path.join(c, "index.json")), "index.json"),
        ("index not JSON", lambda c, _: write(os.path.join(c, "index.json"), b"{\"step\": 4,"), "index.json"),
        ("index rows_consumed -1", edit_index("rows_consumed", -1), "rows_consumed"),
        ("index step 99", edit_index("step", 99), "index.json"),
        ("NaN in Adam m, sums broken", lambda c, _: adam_nan(os.path.join(c, sh), fix_sums=False), sh),
        ("NaN in Adam m, sums fixed", lambda c, _: adam_nan(os.path.join(c, sh), fix_sums=True), "Adam"),
        ("DONE without its dir", lambda c, _: shutil.rmtree(c), "ckpt_00000004"),
    ]
    # The newest checkpoint (step 4) damaged: -y 1 falls back to step 2 with a
    # warning naming what failed (or, were there none older, refuses).
    for name, damage, needle in cases:
        refuse_or_warn("checkpoint " + name, run(resume + ["-o", damaged(name, damage)]), needle)
    old = os.path.join(tmp, "ck_oldformat")
    os.makedirs(old)
    for n in ("DONE_00000002", "state_00000002.bin"):
        write(os.path.join(old, n), header(20241122, 1, 2))
    expect_error("checkpoint earlier one-file format", resume + ["-o", old], "state_00000002.bin")
    empty = os.path.join(tmp, "ck_empty")
    os.makedirs(empty)
    refuse_or_warn("checkpoint -y 1, none in -o", run(resume + ["-o", empty]), "ck_empty")
    expect_error("checkpoint -y 1 without -o", resume, ["-y", "-o"])
    expect_error("checkpoint resume other -e", [a if a != "L=2,C=32,NH=2,V=257,T=64" else "L=2,C=64,NH=2,V=257,T=64"
                                               for a in resume] + ["-o", damaged("other_e", lambda c, _: None)], "-e")
    # A resume that changes the schedule, the batch, T or the data: must warn
    # (README) or refuse, never be silent.
    other = shard(os.path.join(tmp, "other.bin"), [(i * 7) % 250 for i in range(3000)])
    for name, argv, needle in (("-t 16", resume + ["-t", "16"], "-t 16"), ("-i other", swap(resume, "-i", other), "-i"),
                               ("-x 8", swap(resume, "-x", "8"), "-x"), ("-d 256", resume + ["-d", "256"], "-d")):
        refuse_or_warn(f"checkpoint resume with {name}", run(argv + ["-o", damaged("resume" + name, lambda c, _: None)]),
                       needle)


def output_cases(tmp, base):
    blocker = write(os.path.join(tmp, "a_regular_file"), b"x")
    under = os.path.join(blocker, "sub", "x")
    os.makedirs(os.path.join(tmp, "out_dir_exists"))
    for name, extra, needle in (("--export-model under a file", ["--export-model", under + ".bin"], "a_regular_file"),
                                ("--export-model is a directory", ["--export-model", os.path.join(tmp, "out_dir_exists")],
                                 "out_dir_exists"),
                                ("--export-hf under a file", ["--export-hf", under], "a_regular_file"),
                                ("--trace under a file", ["--trace", under + ".json"], "a_regular_file"),
                                ("--trace is a directory", ["--trace", os.path.join(tmp, "out_dir_exists")],
                                 "out_dir_exists"),
                                ("-o under a file", ["-o", under], "a_regular_file"),
                                ("--calibrate under a file", ["--calibrate", under + ".json"], "a_regular_file"),
                                ("-o is a file", ["-o", blocker], "a_regular_file")):
        r = run(base + extra)
        # Refused before the first step: no step line on stdout.
        if r.rc not in (0, None) and re.search(r"^step\s+\d", r.out, re.M) and not r.hung:
            record("unclear", "output " + name, "refused only after training: " + (error_lines(r) or [""])[0][:150])
        else:
            classify_error("output " + name, r, needle)
    expect_error("output --plan-json under a file", base + ["--plan", "eval", "--plan-json", under + ".jsonl"],
                 "a_regular_file")


def multirank_cases(tmp, base):
    other = shard(os.path.join(tmp, "other_rank.bin"), [(i * 3) % 250 for i in range(3000)])
    mp = lambda name, ranks, needles: expect_error("mpi " + name, None, needles, ranks=ranks)  # noqa: E731
    mp("ranks given different -b", [base, swap(base, "-b", "2")], "-b")
    mp("ranks given different -x", [base, swap(base, "-x", "3")], ["-x", "--max-steps"])
    mp("same flags, different -i files", [base, swap(base, "-i", other)], ["-i", "other_rank.bin", "data"])
    mp("one rank --help", [base, ["--help"]], ["--help", "flags"])
    mp("one rank --plan eval", [base, base + ["--plan", "eval"]], ["--plan", "flags"])
    mp("one rank has an extra flag", [base, base + ["--seed", "5"]], "--seed")
    expect_error("mpi --tp 2 with NH=3", swap(base, "-e", "L=2,C=48,NH=3,V=257,T=64") + ["--tp", "2"], "--tp", np_=2)
    expect_error("mpi --pp 4 on 2 ranks", base + ["--pp", "4"], "--pp", np_=2)
    expect_error("mpi --cp 2 with T=30", swap(base, "-t", "30") + ["--cp", "2"], ["--cp", "-t"], np_=2)
    expect_error("mpi bad token id, -z 1", swap(base, "-i", shard(os.path.join(tmp, "mpi_badid.bin"),
                                                                   [5] * 500 + [999] + [5] * 2000)) + ["-z", "1"],
                 "mpi_badid.bin", np_=2)
    long_run = swap(base, "-x", "5000")  # far more than it gets to run before the signal
    # SIGKILL to rank 1 mid-run: the job must end on its own, non-zero.
    r = signal_rank(long_run, os.path.join(tmp, "mpi_kill"), [signal.SIGKILL], np_=2)
    expect_survive("mpi SIGKILL rank 1 mid-run", r, lambda r: r.delivered == 1 and r.rc not in (0, None),
                   f"the job ending non-zero ({r.rc}, {r.after:.1f} s after the kill)", killed=True)
    # SIGTERM to rank 1 with -o: every rank ends the step, one checkpoint, 128 + 15; then -y 1 resumes.
    out = os.path.join(tmp, "mpi_term")
    r = signal_rank(long_run, out, [signal.SIGTERM], np_=2)
    done = sorted(f for f in os.listdir(out) if f.startswith("DONE_")) if os.path.isdir(out) else []
    expect_survive("mpi SIGTERM rank 1 with -o", r, lambda r: r.rc == 143 and len(done) == 1 and
                   "stopped by signal 15" in r.out, f"exit 143 and one checkpoint (got {r.rc}, {done})")
    if done:
        step = int(done[0][5:])
        r = run(swap(base, "-x", str(step + 3)) + ["-o", out, "-y", "1"], np_=2)
        n = len(open(os.path.join(out, "metrics.jsonl")).readlines()) if r.rc == 0 else 0
        expect_survive("mpi resume after SIGTERM", r, lambda r: r.rc == 0 and n == step + 3,
                       f"{step + 3} steps in metrics.jsonl (got {n})")
    env = dict(ENV, LLMC_TEST_STALL_RANK="1:5")
    r = run(long_run + ["--collective-timeout", "3"], np_=2, env=env)
    line = next((l for l in error_lines(r) if "collective" in l), "")
    expect_survive("mpi stalled rank, --collective-timeout 3", r,
                   lambda r: r.rc not in (0, None) and re.search(r"timed out: .+ on group \w+", line),
                   "a line naming the collective and its group")


def signal_cases(tmp, base):
    long_run = swap(base, "-x", "5000")  # far more than it gets to run before the signal
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        out = os.path.join(tmp, "sig_" + sig.name)
        r = signal_rank(long_run, out, [sig])
        done = [f for f in os.listdir(out) if f.startswith("DONE_")] if os.path.isdir(out) else []
        expect_survive(f"signal {sig.name} with -o", r, lambda r: r.rc == 128 + sig and len(done) == 1 and
                       f"stopped by signal {int(sig)}" in r.out, f"exit {128 + sig} and a checkpoint (got {r.rc})")
    # A second signal ends the run at once, even while the first waits on a
    # checkpoint write held back for two minutes by the test hook (the step-1
    # checkpoint is held, so the step-2 one blocks the run): "at once" is
    # well inside those two minutes.
    env = dict(ENV, LLMC_TEST_CHECKPOINT_DELAY_MS="120000")
    r = signal_rank(long_run + ["-n", "1", "--async-checkpoint", "1"], os.path.join(tmp, "sig_twice"),
                    [signal.SIGTERM, signal.SIGTERM], env=env, steps=2)
    expect_survive("signal SIGTERM twice", r, lambda r: r.delivered == 2 and r.rc == 143 and r.after < 30,
                   f"exit 143 at once after the second signal (got {r.rc}, {r.delivered} signals delivered, "
                   f"{r.after:.1f} s after the last)")


def bad_step_cases(tmp, base):
    env = dict(ENV, LLMC_TEST_NAN_STEP="2")
    for name, np_, extra in (("one process", 0, []), ("dp2 ZeRO-2", 2, ["-z", "2"])):
        out = os.path.join(tmp, "nan_" + str(np_))
        r = run(base + extra + ["-o", out], np_=np_, env=env)
        m = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))] if r.rc == 0 else []
        expect_survive(f"bad step NaN gradient, {name}", r,
                       lambda r: len(m) == 4 and m[2].get("skipped") is True and m[3].get("loss") is not None,
                       "step 2 skipped, training goes on")
    expect_error("bad step NaN, --max-skips 0", base + ["--max-skips", "0", "-o", os.path.join(tmp, "nan_stop")],
                 "--max-skips", env=env)


def main():
    if not os.path.exists(TRAIN):
        print("train_gpt is not built (run make)\n0 passed, 1 failed")
        sys.exit(1)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="llmc_audit_")
    try:
        h.write_rank_shell(tmp)
        good = shard(os.path.join(tmp, "good.bin"), [i % 250 for i in range(3000)])
        base = SMALL + ["-i", good, "-j", "", "-x", "4"]
        flag_cases(base)
        data_cases(tmp, base)
        model_cases(tmp, base)
        tokenizer_cases(tmp, base)
        checkpoint_cases(tmp, base)
        output_cases(tmp, base)
        signal_cases(tmp, base)
        bad_step_cases(tmp, base)
        if shutil.which("mpirun"):
            multirank_cases(tmp, base)
        else:
            print("(mpirun not found: the multi-rank cases skipped)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    classes = [c for c, _ in h.results]
    for c, line in h.results:
        if c != "ok":
            print("FAIL " + line)
    counts = {c: classes.count(c) for c in ("ok", "crash", "hang", "silent", "unclear")}
    print("  ".join(f"{c}: {n}" for c, n in counts.items()) + f"  ({len(classes)} cases, {time.time() - t0:.0f} s)")
    failed = len(classes) - counts["ok"]
    print(f"{counts['ok']} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
