#!/usr/bin/python3
# tests/e2e/test_defaults.py: defaults that fit the model and the data.
#   - sequence length: with no -t a run trains on the model's context
#     (capped at 4096), the same run as one that names that -t, and says so;
#     run_config.json holds the T it used;
#   - validation size: --val-tokens gives the same validation loss for any
#     -b (a last micro-batch shorter than B) and layout (dp2, cp2, pp2), the
#     loss of the same rows counted with -m; more rows than the files hold
#     warn that they wrap;
#   - the shards' tokenizer: the tokenizer file beside the -i shards is the
#     run's tokenizer when none is named, and a --tokenizer that differs from
#     it warns naming the first token that differs (a copy does not);
#   - the embedded dataset missing (a run outside the tree, or after `make
#     train_gpt` alone): the error says that `make` builds it; a missing
#     file the user named gets no such hint;
#   - OpenMP's wait: without OMP_WAIT_POLICY or GOMP_SPINCOUNT the run
#     starts itself again with a short spin (GOMP_SPINCOUNT=1000, the
#     process's own environment shows it) and says so; the user's setting
#     is kept and named (one process and under mpirun); started again, the
#     process keeps its name (train_gpt, not "exe", for ps and pkill);
#   - the planner with no -t/-d plans the model's whole context (no cap:
#     planning long context is its point) and a published global batch, and
#     says which.
# The truths are the runs with the flags given explicitly (one process),
# and the files the test writes.
# Last line: "N passed, N failed".
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from testlib import Checks, run_suite  # noqa: E402

TRAIN = os.path.join(ROOT, "train_gpt")
MODEL = ["-e", "L=2,C=32,NH=2,V=257,T=64", "--device", "cpu", "-s", "0"]
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
c = Checks()


def run(args, np=1):
    cmd = ([TRAIN] if np == 1 else ["mpirun", "-np", str(np), TRAIN]) + args
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=MPI_ENV)
    return p.returncode, p.stdout, p.stderr


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_seq_len(tmp):
    a, b = os.path.join(tmp, "t_default"), os.path.join(tmp, "t_named")
    rc, out, err = run(MODEL + ["-b", "2", "-x", "3", "-v", "0", "-o", a])
    c(rc == 0, f"run without -t failed: {err}")
    c("T=64 (64 per rank)" in out and "no -t, so the model's context (maxT 64)" in out,
            "the run without -t does not say it took the model's context 64")
    with open(os.path.join(a, "run_config.json")) as f:
        c(json.load(f)["resolved"].get("seq-len") == 64, "run_config.json does not hold the T the run used")
    rc, out, err = run(MODEL + ["-b", "2", "-x", "3", "-v", "0", "-t", "64", "-o", b])
    c(rc == 0 and [m["loss"] for m in metrics(a)] == [m["loss"] for m in metrics(b)],
            "the run without -t is not the run with -t 64")
    # A long-context model: the default is capped.
    rc, out, err = run(["-e", "L=1,C=16,NH=2,V=257,T=8192", "-b", "1", "-x", "1", "-v", "0", "-s", "0"])
    c(rc == 0 and "T=4096 (4096 per rank)" in out and "maxT 8192, capped" in out,
            f"a maxT=8192 model does not default to T=4096: {err}{out[-400:]}")


def val_loss(args, np=1):
    rc, out, err = run(MODEL + ["-t", "32", "-x", "1", "-v", "1", "-l", "0", "--dtype", "fp64"] + args, np)
    lines = [ln for ln in out.splitlines() if ln.startswith("val loss")]
    if rc != 0 or not lines:
        print(f"run {args} np {np} failed: {err[-300:]}")
        return None
    return float(lines[-1].split()[2]), out, err


def test_val_tokens(tmp):
    # 100 tokens = 4 rows of 32: B = 3 leaves a micro-batch of one row.
    ref = val_loss(["-b", "4", "-m", "1"])
    c(ref is not None, "the -m run failed")
    if ref is None:
        return
    c("validation: 4 rows of T=32 (128 tokens)" in ref[1], "the settings do not show the validation rows")
    for args, np in ((["-b", "3"], 1), (["-b", "1"], 1), (["-b", "5"], 1), (["-b", "3"], 2),
                     (["-b", "3", "--cp", "2"], 2), (["-b", "2", "--pp", "2", "-d", "128"], 2)):
        got = val_loss(args + ["--val-tokens", "100"], np)
        c(got is not None and abs(got[0] - ref[0]) < 1e-6,
                f"--val-tokens 100 with {args} on {np} rank(s): {got and got[0]} against -b 4 -m 1: {ref[0]}")
    # More rows than the validation file holds: a warning, and the run goes on.
    val_tokens = (os.path.getsize(os.path.join(ROOT, "data/tiny/tiny_val_000000.bin")) - 1024) // 2
    got = val_loss(["-b", "8", "--val-tokens", str(val_tokens + 64)])
    c(got is not None and "the rows wrap" in got[2], "validation past the file's rows does not warn")
    got = val_loss(["-b", "8", "--val-tokens", str(val_tokens // 2)])
    c(got is not None and "wrap" not in got[2], "validation within the file's rows warns")


def write_tokenizer(path, tokens, eot):
    # llm.c's tokenizer file: 256 int32 header (magic, version 2, count, eot), then length-prefixed bytes.
    h = [0] * 256
    h[0], h[1], h[2], h[3] = 20240328, 2, len(tokens), eot
    with open(path, "wb") as f:
        f.write(struct.pack("<256I", *h))
        for t in tokens:
            f.write(bytes([len(t)]) + t)


def test_shards_tokenizer(tmp):
    d = os.path.join(tmp, "data")
    os.makedirs(d)
    for name in ("tiny_train_000001.bin", "tiny_val_000000.bin"):
        shutil.copy(os.path.join(ROOT, "data/tiny", name), d)
    tokens = [bytes([i]) for i in range(256)] + [b"<|endoftext|>"]
    write_tokenizer(os.path.join(d, "tokenizer.bin"), tokens, 256)
    shutil.copy(os.path.join(d, "tokenizer.bin"), os.path.join(tmp, "copy.bin"))
    other = list(tokens)
    other[65] = b"Z"
    write_tokenizer(os.path.join(tmp, "other.bin"), other, 256)
    data = ["-i", os.path.join(d, "tiny_train_*.bin"), "-j", os.path.join(d, "tiny_val_*.bin")]
    base = MODEL + data + ["-t", "32", "-b", "2", "-x", "1", "-v", "0"]
    rc, out, err = run(base)
    c(rc == 0 and os.path.join(d, "tokenizer.bin") in out and "tokenized with" not in err,
            f"the shards' tokenizer is not the default, or warns against itself: {err}")
    rc, out, err = run(base + ["--tokenizer", os.path.join(tmp, "copy.bin")])
    c(rc == 0 and "tokenized with" not in err, f"a copy of the shards' tokenizer warns: {err}")
    rc, out, err = run(base + ["--tokenizer", os.path.join(tmp, "other.bin")])
    c(rc == 0 and "tokenized with" in err and "token 65 is 'A' against 'Z'" in err,
            f"a tokenizer that differs from the shards' does not warn naming token 65: {err}")
    # The embedded data's own tokenizer is found the same way (no warning on the default run).
    rc, out, err = run(MODEL + ["-t", "32", "-b", "2", "-x", "1", "-v", "0"])
    c(rc == 0 and "data/tiny/tokenizer.bin" in out and "warning" not in err, f"default data: {err}")


def test_plan_defaults():
    rc, out, err = run(["--plan", "search", "-e", "d12", "--world", "8", "--plan-top", "1"])
    c(rc == 0 and "plan: -t 1024 (no -t: the model's context)" in out and "-d 524288 (no -d:" in out,
            f"the d12 plan does not say it took T=1024 and 524288 tokens: {err}{out[:400]}")
    rc, out, err = run(["--plan", "search", "-e", "arch=llama,L=32,C=4096,NH=32,NKV=8,F=14336,V=128256,T=8192",
                        "--world", "64", "--plan-top", "1"])
    c(rc == 0 and "plan: -t 8192 (no -t: the model's context)" in out and
            "-d 2097152 (no -d:" in out, f"the 8B plan's defaults: {err}{out[:400]}")


def test_missing_data(tmp):
    cwd = os.path.join(tmp, "elsewhere")  # no data/tiny here
    os.makedirs(cwd, exist_ok=True)
    p = subprocess.run([TRAIN] + MODEL + ["-x", "1"], cwd=cwd, capture_output=True, text=True, timeout=120)
    c(p.returncode != 0 and "no file matches 'data/tiny/tiny_train_*.bin'" in p.stderr and "`make` builds it" in p.stderr
      and p.stderr.count("\n") == 1, f"the missing embedded dataset without the hint: rc {p.returncode}: {p.stderr[:300]}")
    p = subprocess.run([TRAIN] + MODEL + ["-x", "1", "-i", "mine_*.bin"], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    c(p.returncode != 0 and "no file matches 'mine_*.bin'" in p.stderr and "make" not in p.stderr,
      f"a missing file the user named: {p.stderr[:300]}")


def test_openmp_wait():
    base = {k: v for k, v in MPI_ENV.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LLMC_SPINCOUNT_SET")}
    args = [TRAIN] + MODEL + ["-x", "1", "-v", "0", "-b", "2", "-t", "16"]
    for np_ in (1, 2):
        launch = [] if np_ == 1 else ["mpirun", "-np", "2"]
        for env, want in (({}, "spin 1000, then sleep (train_gpt's default)"),
                          ({"OMP_WAIT_POLICY": "passive"}, "OMP_WAIT_POLICY=passive"),
                          ({"GOMP_SPINCOUNT": "7"}, "GOMP_SPINCOUNT=7")):
            p = subprocess.run(launch + args, cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env=dict(base, **env))
            row = [l for l in p.stdout.splitlines() if "OpenMP waits" in l]
            c(p.returncode == 0 and len(row) == 1 and want in row[0],
                    f"np={np_} {env}: the settings' OpenMP waits row {row}, want {want!r}: {p.stderr[-200:]}")
    # Started again, the process keeps its name (ps, top, pkill): not "exe".
    p = subprocess.Popen([TRAIN] + MODEL + ["-x", "100000", "-v", "0", "-b", "2", "-t", "16"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=base)
    try:
        for line in p.stdout:
            if "OpenMP waits" in line:  # printed after the restart
                break
        with open(f"/proc/{p.pid}/comm") as f:
            name = f.read().strip()
        c(name == "train_gpt", f"the restarted process is named {name!r}, as its file (train_gpt)")
    finally:
        p.kill()
        p.wait()


def suite(tmp):
    test_missing_data(tmp)
    test_openmp_wait()
    test_seq_len(tmp)
    test_val_tokens(tmp)
    test_shards_tokenizer(tmp)
    test_plan_defaults()


def main():
    run_suite(c, "llmc_defaults_", suite)


if __name__ == "__main__":
    main()
