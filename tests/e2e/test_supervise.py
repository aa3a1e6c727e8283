#!/usr/bin/python3
# tests/e2e/test_supervise.py: scripts/supervise.py, the supervisor that runs
# a training command again from its checkpoints when it fails:
#   - a rank killed mid-run (LLMC_TEST_CRASH: rank 1 of 2 kills itself once,
#     at step 6): the job fails, the supervisor starts it again with -y 1,
#     the run resumes from the checkpoint of step 4 and finishes; the final
#     checkpoint equals the uninterrupted run's byte for byte, and
#     restarts.jsonl records the restart (exit status, the 5 steps reported,
#     resumed from 4, 1 step lost);
#   - a fault that strikes at every attempt: the supervisor gives up after
#     --restarts restarts with the job's status, one line per restart;
#   - a setup error (a bad flag: the trainer's exit status 2) is not
#     restarted; a command without -o is refused (exit status 2);
#   - the trainer's setup errors exit with status 2, under mpirun too;
#   - --hostfile: the hosts at fault found in a run's output (mpirun's "on
#     node", the watchdog's ranks placed slot by slot); with a stand-in
#     mpirun for which a rank on nodeB dies at every run, nodeB is dropped
#     after its second fault, and the job finishes with -np 2 on nodeA in
#     the layout the planner chose for 2 ranks (--tp 2 of the command
#     replaced), restarts.jsonl saying so.
# Last line: "N passed, N failed".
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, run_suite, shards_equal, write_shard

SUP = os.path.join(ROOT, "scripts", "supervise.py")
check = Checks()


def supervise(args, env=None, timeout=300):
    p = subprocess.run([sys.executable, SUP] + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=dict(ENV, **(env or {})))
    return p.returncode, p.stdout, p.stderr


def restarts(d):
    try:
        with open(os.path.join(d, "restarts.jsonl")) as f:
            return [json.loads(l) for l in f if l.strip()]
    except OSError:
        return []


def suite(tmp):
    data = os.path.join(tmp, "data.bin")
    write_shard(data, np.random.default_rng(3).integers(0, 97, 40000))
    run = ["mpirun", "-np", "2", TRAIN, "-e", "L=2,C=32,NH=4,V=97,Vp=97,T=64", "-i", data, "-j", "", "-t", "16",
           "-b", "8", "-d", "256", "-x", "8", "-s", "0", "-z", "1", "-n", "2"]
    full = os.path.join(tmp, "full")
    rc, out, err = supervise(["--restarts", "2", "--", *run, "-o", full])
    if not check(rc == 0 and not restarts(full), f"uninterrupted: rc {rc} {err[-300:]}"):
        return
    # A rank dies once, at step 6 (0-based 5): resumed from step 4.
    d = os.path.join(tmp, "crash")
    rc, out, err = supervise(["--restarts", "2", "--backoff", "0.2", "--", *run, "-o", d],
                             env={"LLMC_TEST_CRASH": f"5:1:{tmp}/struck"})
    r = restarts(d)
    check(rc == 0, f"crash once: the supervised job did not finish: rc {rc} {err[-500:]}")
    check(len(r) == 1 and r[0]["exit_status"] not in (0, 2) and r[0]["last_step"] == 5 and
          r[0]["resumed_from"] == 4 and r[0]["steps_lost"] == 1 and r[0]["attempt"] == 1,
          f"crash once: restarts.jsonl {r}")
    check("restart 1 of 2" in err and "from step 4" in err, f"crash once: the supervisor's line: {err[-400:]}")
    check(shards_equal(full, d, 8), "crash once: the final checkpoint differs from the uninterrupted run's")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        steps = [json.loads(l)["step"] for l in f]
    check(steps == list(range(1, 9)), f"crash once: metrics.jsonl's steps {steps}")
    # A fault at every attempt (the hook cannot record that it struck).
    d = os.path.join(tmp, "always")
    rc, out, err = supervise(["--restarts", "2", "--backoff", "0.1", "--", *run, "-o", d],
                             env={"LLMC_TEST_CRASH": f"3:0:{tmp}/no/such/dir/struck"})
    r = restarts(d)
    check(rc not in (0, 2) and len(r) == 2 and [x["attempt"] for x in r] == [1, 2] and
          all(x["resumed_from"] == 2 for x in r) and "after 2 restart(s): giving up" in err,
          f"always: rc {rc}, restarts {r}, {err[-300:]}")
    check(r[1]["backoff_s"] == 2 * r[0]["backoff_s"], f"always: the backoff does not double: {r}")
    # A setup error is not restarted; no -o is refused.
    d = os.path.join(tmp, "bad")
    rc, out, err = supervise(["--restarts", "3", "--", *run, "-o", d, "--lrr", "1"])
    check(rc == 2 and not restarts(d) and "not restarting" in err and "--lrr" in err,
          f"setup error: rc {rc} {err[-300:]}")
    rc, out, err = supervise(["--restarts", "3", "--", *run])
    check(rc == 2 and "no -o DIR" in err, f"no -o: rc {rc} {err[-200:]}")
    # The trainer's own statuses: 2 for a setup error, alone and under mpirun.
    for cmd in ([TRAIN, "-x", "abc"], ["mpirun", "-np", "2", TRAIN, "-x", "abc"]):
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV)
        check(p.returncode == 2 and "flag -x" in p.stderr, f"{cmd[0]}: setup error rc {p.returncode}")
    print("  a rank killed at step 6: restarted from step 4, the final checkpoint equals the uninterrupted run's;"
          " a fault at every attempt: 2 restarts, then the job's status; a setup error: not restarted")
    hostfile(tmp, data)


FAKE_MPIRUN = r'''#!/usr/bin/env python3
# A stand-in mpirun for hosts this machine does not have: it logs its
# arguments; while nodeB is in the host file a rank there "dies", in
# mpirun's words; else it runs the job here with the real mpirun.
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
hf = args[args.index("--hostfile") + 1]
hosts = [l.split()[0] for l in open(hf) if l.strip()]
if "nodeB" in hosts:
    print("prterun noticed that process rank 3 with PID 4242 on node nodeB exited on signal 9 (Killed).", flush=True)
    sys.exit(137)
i = args.index("--hostfile")
os.execv(os.environ["REAL_MPIRUN"], ["mpirun"] + args[:i] + args[i + 2:])
'''


def hostfile(tmp, data):
    """--hostfile: a host at fault twice is dropped, the world shrinks to the
    slots left and the planner's layout for it replaces the command's."""
    import shutil
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import supervise as sv
    # The pieces, against hand-worked cases.
    hosts = [("nodeA", 2), ("nodeB", 2)]
    check([sv.host_of_rank(hosts, r) for r in range(5)] == ["nodeA", "nodeA", "nodeB", "nodeB", None],
          "ranks fill the hosts slot by slot")
    check(sv.hosts_at_fault("prterun noticed that process rank 3 with PID 1 on node nodeB exited", hosts) == ["nodeB"],
          "mpirun's 'on node' names the host")
    check(sv.hosts_at_fault("collective timed out: ...; ranks that did not arrive: 1 (dp rank 1); ranks waiting in "
                            "no collective (stalled or computing): 2", hosts) == ["nodeA", "nodeB"],
          "the watchdog's ranks name their hosts")
    check(sv.hosts_at_fault("nothing to see", hosts) == [], "no blame without a name")
    hf = os.path.join(tmp, "hosts.txt")
    with open(hf, "w") as f:
        f.write("# two nodes\nnodeA slots=2\nnodeB slots=2 max_slots=4\n")
    check(sv.read_hostfile(hf) == hosts, "the host file read")
    # The whole loop, with a stand-in mpirun.
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir, exist_ok=True)
    fake = os.path.join(bindir, "mpirun")
    with open(fake, "w") as f:
        f.write(FAKE_MPIRUN)
    os.chmod(fake, 0o755)
    log = os.path.join(tmp, "fake.log")
    d = os.path.join(tmp, "hosts_run")
    cmd = [fake, "-np", "4", TRAIN, "-e", "L=2,C=32,NH=4,V=97,Vp=97,T=64", "-i", data, "-j", "", "-t", "16",
           "-d", "256", "-x", "6", "-s", "0", "--tp", "2", "-n", "2", "-o", d]
    rc, out, err = supervise(["--restarts", "4", "--backoff", "0.1", "--hostfile", hf, "--hardware", "cpu", "--",
                              *cmd], env={"FAKE_LOG": log, "REAL_MPIRUN": shutil.which("mpirun")})
    r = restarts(d)
    check(rc == 0, f"hosts: the job finished on the hosts left: rc {rc} {err[-600:]}")
    check(len(r) == 2 and r[0]["at_fault"] == ["nodeB"] and "dropped" not in r[0] and
          r[1].get("dropped") == ["nodeB"] and r[1].get("world") == 2 and r[1].get("layout"),
          f"hosts: nodeB at fault twice, then dropped, world 2: {r}")
    with open(log) as f:
        calls = [l.split() for l in f]
    check(len(calls) == 3 and all(c[c.index("-np") + 1] == "4" for c in calls[:2]) and
          calls[2][calls[2].index("-np") + 1] == "2", f"hosts: -np 4, 4, then 2: {calls}")
    planned = r[1].get("layout", "").split() if r else []
    check(calls and "--tp" not in calls[-1] or "--tp" in planned,
          f"hosts: the command's --tp 2 gave way to the planner's layout {planned}: {calls[-1] if calls else ''}")
    with open(os.path.join(d, "hosts_active.txt")) as f:
        check(f.read().split() == ["nodeA", "slots=2"], "hosts: hosts_active.txt holds nodeA alone")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        steps = [json.loads(l)["step"] for l in f]
    check(steps == list(range(1, 7)), f"hosts: the shrunk run trained every step: {steps}")
    check("dropping host(s) nodeB" in err, f"hosts: the supervisor says so: {err[-300:]}")
    print(f"  --hostfile: nodeB at fault twice, dropped; 2 ranks on nodeA with the planner's {' '.join(planned)}")


def main():
    run_suite(check, "llmc_supervise_", suite)


if __name__ == "__main__":
    main()
