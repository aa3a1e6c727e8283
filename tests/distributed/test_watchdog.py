#!/usr/bin/python3
# tests/distributed/test_watchdog.py: the collective watchdog of the MPI
# transport (--collective-timeout; llmc/comm/comm_mpi.h) through the trainer,
# under mpirun with 2 and 4 ranks:
#   - hangs: in each layout (dp, tp, pp and mixes) one rank stalls before one
#     of its collectives (LLMC_TEST_STALL_RANK=R:K); with
#     --collective-timeout 3 the job must end by itself (a subprocess limit
#     of 60 s turns a hang into a failure, not a stuck suite), exit non-zero,
#     and print "collective timed out" lines that name the collective, its
#     group and, among the ranks that did not arrive or wait in no
#     collective, the stalled rank;
#   - start-up: a rank stalled before one of the world's start-up
#     collectives (LLMC_TEST_STALL_SETUP=R:K: the agreements of the setup
#     checks, the flags shared) ends the job the same way, with a line
#     naming the collective's number, the flag and the stalled rank;
#   - no cost in results: the same run with the watchdog on and off gives
#     exactly the same losses (==: the watchdog only changes how waits poll);
#   - agreement: ranks given different --collective-timeout values are
#     refused with one line naming the flag, as are a negative value and a
#     malformed LLMC_TEST_STALL_RANK.
# Times are only bounded from above, generously: the machine may be busy.
# Last line: "N passed, N failed".
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, metrics, run_suite, write_shard

import numpy as np

check = Checks()
MODEL = "L=4,C=32,NH=4,V=97,Vp=97,T=32"
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "broadcast", "host all-reduce", "send-recv", "pipeline send",
         "pipeline recv")
GROUPS = ("world", "dp", "tp", "cp", "dpcp", "pp", "embed")
LIMIT = 60  # seconds a run may take before it counts as hung


def launch(cmd, env):
    """(returncode, stdout, stderr); None for the return code when the run
    outlived LIMIT (then the whole process group is killed)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=LIMIT)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err


def train(np_, args, extra_env=None):
    return launch(["mpirun", "-np", str(np_), TRAIN] + args, dict(ENV, **(extra_env or {})))


def ranks_named(line):
    """The world ranks a timeout line names: those that did not arrive and
    those waiting in no collective."""
    named = set()
    for part in re.findall(r"(?:did not arrive|in no collective[^:]*): ([^;]*)", line):
        named |= {int(x) for x in re.findall(r"(?:^|, )(\d+)", part)}
    return named


def stalled_lines(args, name, np_, hook, rank, k, fired, needle):
    """Runs with the stall hook `hook`=rank:k; the job must end by itself,
    non-zero, the hook's own line (`fired`) printed: the lines holding
    `needle`, or None when a check failed."""
    rc, out, err = train(np_, args + ["--collective-timeout", "3"], {hook: f"{rank}:{k}"})
    if not check(rc is not None, f"{name}: the job ended by itself (within {LIMIT} s)"):
        return None
    check(rc != 0, f"{name}: exit status {rc}, non-zero")
    check(fired in err, f"{name}: the stall hook fired: {err[-300:]}")
    lines = [l for l in err.splitlines() if needle in l]
    return lines if check(lines, f"{name}: a '{needle}' line: {err[-600:]}") else None


def stall(common, name, np_, layout, rank, k):
    lines = stalled_lines(common + layout, name, np_, "LLMC_TEST_STALL_RANK", rank, k,
                          f"rank {rank} stalls before its collective {k}", "collective timed out")
    if not lines:
        return
    for l in lines:
        m = re.search(r"collective timed out: (.*?) on group (\w+)", l)
        check(m is not None and m.group(1) in KINDS and m.group(2) in GROUPS,
              f"{name}: the line names the collective and its group: {l}")
        check("--collective-timeout 3" in l, f"{name}: the line names the flag and its value: {l}")
    named = [ranks_named(l) for l in lines]
    check(any(rank in n for n in named), f"{name}: a line names the stalled rank {rank}: {lines}")
    print(f"  {name}: {lines[0].split('error ')[-1][:220]}")


def stall_setup(common, name, np_, rank, k):
    """A rank stalled before its k-th start-up collective (setup checks'
    agreements, shared flags): the others' start-up watchdog ends the job."""
    lines = stalled_lines(common, name, np_, "LLMC_TEST_STALL_SETUP", rank, k,
                          f"rank {rank} stalls before its start-up collective {k}", "start-up collective timed out")
    if not lines:
        return
    for l in lines:
        check(f"start-up collective {k})" in l and "--collective-timeout 3" in l,
              f"{name}: the line names the collective's number and the flag: {l}")
        m = re.search(r"ranks that did not arrive: ([\d, ]+)", l)
        check(m is not None and {int(x) for x in m.group(1).split(", ")} == {rank},
              f"{name}: the line names rank {rank} alone: {l}")
    print(f"  {name}: {lines[0].split('error ')[-1][:200]}")


def same_losses(tmp, common, name, np_, layout):
    losses = {}
    for t in ("0", "300"):
        d = os.path.join(tmp, f"{name.replace(' ', '_')}_{t}")
        rc, out, err = train(np_, common + layout + ["--collective-timeout", t, "-o", d])
        if not check(rc == 0, f"{name} --collective-timeout {t}: exit {rc}: {err[-400:]}"):
            return
        losses[t] = [(m["step"], m["loss"]) for m in metrics(d)]
    check(losses["0"] == losses["300"] and len(losses["0"]) > 0,
          f"{name}: losses with the watchdog on equal those with it off: {losses}")


def refused(name, cmd, env, needle):
    rc, out, err = launch(cmd, env)
    lines = [l for l in err.splitlines() if l.startswith("train_gpt: error")]
    check(rc is not None and rc != 0 and len(lines) >= 1 and needle in lines[0],
          f"{name}: refused with a line naming {needle!r} (exit {rc}): {err[-400:]}")


def body(tmp):
    data = os.path.join(tmp, "train.bin")
    write_shard(data, np.random.default_rng(5).integers(0, 97, 20000))
    common = ["-i", data, "--val-data=", "-e", MODEL, "-t", "32", "-b", "2", "-d", "512", "-x", "4", "-l", "3e-3",
              "-u", "1", "--dtype", "fp64"]
    # Hangs: K is past set-up, in the first steps.
    stall(common, "np2 dp2", 2, [], 1, 6)
    stall(common, "np2 tp2", 2, ["--tp", "2"], 0, 9)
    stall(common, "np2 pp2", 2, ["--pp", "2"], 1, 4)
    stall(common, "np4 dp4 zero1", 4, ["-z", "1"], 2, 5)
    stall(common, "np4 tp2 dp2", 4, ["--tp", "2"], 3, 7)
    stall(common, "np4 pp2 dp2", 4, ["--pp", "2"], 1, 5)
    stall(common, "np4 pp4", 4, ["--pp", "4"], 2, 6)
    # Start-up: the first collective (the flags parsed) and a later setup check.
    stall_setup(common, "start-up np2 first", 2, 1, 1)
    stall_setup(common, "start-up np4 sixth", 4, 2, 6)
    # The watchdog changes no result.
    same_losses(tmp, common, "np2 dp2", 2, [])
    same_losses(tmp, common, "np2 pp2", 2, ["--pp", "2"])
    same_losses(tmp, common, "np4 tp2 dp2", 4, ["--tp", "2"])
    # Ranks must agree on the flag; values and the hook are checked.
    refused("different timeouts",
            ["mpirun", "-np", "1", TRAIN] + common + ["--collective-timeout", "3", ":", "-np", "1", TRAIN] + common +
            ["--collective-timeout", "5"], ENV, "--collective-timeout")
    refused("a negative timeout", ["mpirun", "-np", "2", TRAIN] + common + ["--collective-timeout", "-1"], ENV,
            "collective-timeout")
    refused("a malformed stall hook", ["mpirun", "-np", "2", TRAIN] + common, dict(ENV, LLMC_TEST_STALL_RANK="1"),
            "LLMC_TEST_STALL_RANK=1")
    refused("a malformed start-up stall hook", ["mpirun", "-np", "2", TRAIN] + common,
            dict(ENV, LLMC_TEST_STALL_SETUP="x"), "LLMC_TEST_STALL_SETUP=x")


if __name__ == "__main__":
    run_suite(check, "llmc_watchdog_", body)
