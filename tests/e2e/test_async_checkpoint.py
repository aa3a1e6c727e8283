#!/usr/bin/python3
# tests/e2e/test_async_checkpoint.py: --async-checkpoint (llmc/io/checkpoint_async.h)
# on the CPU, in one process and under mpirun -np 2:
#   - the files are the synchronous writer's, byte for byte (every shard,
#     the index, DONE), at every checkpoint step, in one process, at dp=2
#     ZeRO-1 and at tp=2; the memory line's async_checkpoint_host equals
#     the payload of the rank's shard (read from the file's own tables);
#   - a resume from an asynchronous checkpoint continues bit for bit like
#     the uninterrupted run (losses and the final checkpoint's bytes);
#   - with the writer slowed (LLMC_TEST_CHECKPOINT_DELAY_MS), steps finish
#     while the write is in flight, the end of the run waits for it, and so
#     does a SIGTERM stop; a run killed (SIGKILL) mid-write leaves no DONE
#     for that checkpoint, and the resume takes the previous complete one;
#   - a shard that cannot be written ends the run on every rank with one
#     line naming the file (rank 1's shard failing, at np=2), no hang.
# No timing is compared: the delay only makes "in flight" last.
# Last line: "N passed, N failed".
import glob
import os
import re
import signal
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, copy_checkpoint, metrics, run_suite, train, write_shard

L, C, NH, V, T = 4, 32, 4, 97, 16
MODEL = f"L={L},C={C},NH={NH},V={V},Vp={V},T=64"
check = Checks()
DATA = None
ASYNC = ["--async-checkpoint", "1"]


def base(steps):
    return ["-e", MODEL, "-i", DATA, "-j", "", "-t", str(T), "-x", str(steps), "-s", "0", "--dtype", "fp64",
            "-d", "128", "-l", "3e-3", "-u", "2", "-q", "0.2"]


def ckpt_files(d, step):
    """{name: bytes} of the checkpoint of `step` in d (its directory and DONE)."""
    cdir = os.path.join(d, f"ckpt_{step:08d}")
    files = {n: open(os.path.join(cdir, n), "rb").read() for n in sorted(os.listdir(cdir))}
    done = os.path.join(d, f"DONE_{step:08d}")
    if os.path.exists(done):
        files["DONE"] = open(done, "rb").read()
    return files


def payload_bytes(path):
    """The payload of a shard file, from its header and piece tables: the
    file less the header, the tables and the checksum trailer."""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    nw, no = h[6] | (h[7] << 32), h[8] | (h[9] << 32)
    return len(raw) - 1024 - 32 * (nw + no) - 16 - 8 * (nw + 2 * no)


def errors(err):
    return [l for l in err.splitlines() if l.startswith("train_gpt")]


def test_identical(tmp):
    for np_, extra in ((0, ["-b", "4"]), (2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "--tp", "2"])):
        what = f"np={np_} {' '.join(extra)}"
        sync, asyn = os.path.join(tmp, f"sync_{np_}{extra[-1]}"), os.path.join(tmp, f"async_{np_}{extra[-1]}")
        rc1, _, err1 = train(np_, base(6) + extra + ["-n", "2", "-o", sync])
        rc2, out2, err2 = train(np_, base(6) + extra + ASYNC + ["-n", "2", "-o", asyn])
        if not check(rc1 == 0 and rc2 == 0, f"{what}: {err1[-300:]} {err2[-300:]}"):
            continue
        for step in (2, 4, 6):
            a, b = ckpt_files(sync, step), ckpt_files(asyn, step)
            same = a == b and "DONE" in b and any(n.startswith("shard_") for n in b)
            check(same, f"{what}: checkpoint {step} differs: sync {sorted(a)}, async {sorted(b)}, differing "
                        f"{[n for n in a if a.get(n) != b.get(n)]}")
        print(f"  {what}: checkpoints 2, 4, 6 byte-identical to the synchronous ones")
        losses = [[m["loss"] for m in metrics(x)] for x in (sync, asyn)]
        check(losses[0] == losses[1], f"{what}: losses differ between the synchronous and the asynchronous run")
        # async_checkpoint_host of each rank's memory line = its shard's payload.
        host = {int(r): int(n) for r, n in re.findall(r"memory\[(\d+)\] start:.* async_checkpoint_host=(\d+)", out2)}
        want = {r: payload_bytes(os.path.join(asyn, "ckpt_00000006", f"shard_{r:05d}.bin")) for r in range(max(np_, 1))}
        check(host == want, f"{what}: async_checkpoint_host {host}, the shards' payloads {want}")
        check("async_checkpoint_host" not in train(np_, base(1) + extra + ["-o", sync + "_1"])[1],
              f"{what}: async_checkpoint_host without --async-checkpoint")


def test_resume(tmp):
    full, saved, resumed = (os.path.join(tmp, n) for n in ("r_full", "r_saved", "r_resumed"))
    rc1, _, err1 = train(0, base(8) + ["-b", "4", "-n", "4", "-o", full])
    rc2, _, err2 = train(0, base(8) + ["-b", "4", "-n", "4", "-o", saved] + ASYNC)
    if not check(rc1 == 0 and rc2 == 0, f"resume runs: {err1[-300:]} {err2[-300:]}"):
        return
    copy_checkpoint(saved, resumed, 4)
    rc, out, err = train(0, base(8) + ["-b", "4", "-n", "4", "-y", "1", "-o", resumed] + ASYNC)
    if not check(rc == 0, f"resume from the asynchronous checkpoint: {err[-300:]}"):
        return
    got, want = [m["loss"] for m in metrics(resumed)], [m["loss"] for m in metrics(full)][4:]
    check(got == want, f"resumed losses {got} != uninterrupted {want}")
    check(ckpt_files(resumed, 8) == ckpt_files(full, 8), "the resumed run's step-8 checkpoint differs from the "
                                                         "uninterrupted run's")
    print(f"  resumed at step 4 from an asynchronous checkpoint: {len(got)} losses and checkpoint 8 bit-identical")


def start(args, delay_ms):
    env = dict(ENV, LLMC_TEST_CHECKPOINT_DELAY_MS=str(delay_ms))
    return subprocess.Popen([TRAIN] + args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def read_until(p, pattern, lines):
    """Reads p's stdout into lines until a line matches pattern; the match, or None at EOF."""
    for line in p.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return line
    return None


def test_in_flight(tmp):
    # Steps go on while the (slowed) write is in flight; the run's end waits.
    d = os.path.join(tmp, "flight")
    env = dict(ENV, LLMC_TEST_CHECKPOINT_DELAY_MS="3000")
    p = subprocess.run([TRAIN] + base(12) + ["-b", "4", "-n", "4", "-o", d] + ASYNC, cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    if not check(p.returncode == 0, f"delayed run: {p.stderr[-300:]}"):
        return
    lines = p.stdout.splitlines()
    snap = next((i for i, l in enumerate(lines) if "ckpt_00000004 snapshot" in l), None)
    done = next((i for i, l in enumerate(lines) if "ckpt_00000004 complete" in l), None)
    between = [l for l in lines[snap + 1:done] if l.startswith("step")] if snap is not None and done else []
    check(len(between) >= 2, f"steps while checkpoint 4 was written: {between} (snapshot at line {snap}, "
                             f"complete at {done})")
    check(all(os.path.exists(os.path.join(d, f"DONE_{s:08d}")) for s in (4, 8, 12)),
          f"the end of the run waits for the last write: {sorted(os.listdir(d))}")
    print(f"  {len(between)} steps finished while checkpoint 4 was being written")
    # SIGTERM mid-write: the stop writes its checkpoint and waits for both.
    d = os.path.join(tmp, "term")
    p = start(base(40) + ["-b", "4", "-n", "3", "-o", d] + ASYNC, 2000)
    lines = []
    hit = read_until(p, r"^step +4/", lines)
    if hit:
        p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    lines += out.splitlines()
    stopped = [int(s) for s in re.findall(r"stopped by signal 15 after step (\d+)", "".join(lines))]
    ok = hit and p.returncode == 128 + 15 and stopped and os.path.exists(os.path.join(d, "DONE_00000003")) and \
        os.path.exists(os.path.join(d, f"DONE_{stopped[0]:08d}"))
    check(ok, f"SIGTERM while a write is in flight: rc {p.returncode}, {sorted(os.listdir(d))}, {err[-300:]}")


def test_killed(tmp):
    d = os.path.join(tmp, "killed")
    rc, _, err = train(0, base(4) + ["-b", "4", "-n", "2", "-o", d] + ASYNC)
    if not check(rc == 0, f"first run: {err[-300:]}"):
        return
    # Resumed with a writer that never finishes in time: killed mid-write.
    p = start(base(20) + ["-b", "4", "-n", "2", "-y", "1", "-o", d] + ASYNC, 600000)
    lines = []
    hit = read_until(p, r"ckpt_00000006 snapshot", lines) and read_until(p, r"^step +7/", lines)
    p.kill()
    p.communicate(timeout=60)
    if not check(hit, f"the resumed run never reached step 7 with checkpoint 6 in flight: {lines[-5:]}"):
        return
    left = sorted(os.listdir(d))
    check("DONE_00000006" not in left and "ckpt_00000006" in left and "DONE_00000004" in left,
          f"after SIGKILL mid-write: {left}")
    check(glob.glob(os.path.join(d, "ckpt_00000006", "*.tmp.*")) != [],
          f"the killed write left its temporary file: {os.listdir(os.path.join(d, 'ckpt_00000006'))}")
    rc, out, err = train(0, base(6) + ["-b", "4", "-n", "0", "-y", "1", "-o", d] + ASYNC)
    first = [m["step"] for m in metrics(d)]
    check(rc == 0 and "removed" in out and not os.path.exists(os.path.join(d, "ckpt_00000006", "index.json")) and
          first == list(range(1, 7)), f"resume after the kill: rc {rc}, steps {first}, {err[-300:]}")
    print("  killed mid-write: checkpoint 6 torn (no DONE), the resume took checkpoint 4")


def test_unwritable(tmp):
    for np_ in (0, 2):
        d = os.path.join(tmp, f"unwritable_{np_}")
        rank = 1 if np_ else 0
        # A directory where the shard file must go: the rename onto it fails
        # (root writes anywhere, so permissions would not stop it). The file
        # inside keeps the start-up cleaning from removing it.
        blocker = os.path.join(d, "ckpt_00000002", f"shard_{rank:05d}.bin")
        os.makedirs(blocker)
        open(os.path.join(blocker, "keep"), "w").close()
        rc, out, err = train(np_, base(6) + ["-b", "4", "-n", "2", "-o", d] + ASYNC, timeout=300)
        errs = errors(err)
        check(rc != 0 and len(errs) == max(np_, 1) and all(f"shard_{rank:05d}.bin" in e for e in errs),
              f"np={np_}: unwritable shard: rc {rc}, error lines {errs}")
        check(not os.path.exists(os.path.join(d, "DONE_00000002")), f"np={np_}: DONE of a failed checkpoint")
        print(f"  np={np_}: {errs[0] if errs else '(no error line)'}")


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(13).integers(0, V, 40000))
    test_identical(tmp)
    test_resume(tmp)
    test_in_flight(tmp)
    test_killed(tmp)
    test_unwritable(tmp)


def main():
    run_suite(check, "llmc_async_ckpt_", suite)


if __name__ == "__main__":
    main()
