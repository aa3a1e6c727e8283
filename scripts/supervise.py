#!/usr/bin/env python3
# scripts/supervise.py: runs a training command and, when it fails, runs it
# again from its newest complete checkpoint, so a job survives a dead rank, a
# killed mpirun or a stalled collective without a person (docs/training.md,
# "Restarts").
#
#   usage: scripts/supervise.py --restarts N [--backoff S] -- COMMAND...
#   e.g.   scripts/supervise.py --restarts 5 -- mpirun -np 4 ./train_gpt -e d12 \
#              -i 'data/fineweb_train_*.bin' -o runs/d12 -n 200
#
# COMMAND must write checkpoints into an output directory (-o DIR or
# --output-dir DIR, with -n K): the restarts resume from them. Each run's
# exit status decides:
#   0            the run finished: the supervisor exits 0;
#   2            a setup error (bad flags, bad files, --max-skips reached):
#                running it again cannot fix it, so it exits 2 at once;
#   anything else (a fault: a rank that died, a collective that timed out,
#                a signal) the command is started again with -y 1 (resume
#                from the newest checkpoint that passes its check; the
#                trainer falls back to an older one when it is damaged),
#                after S seconds (--backoff, default 5, doubling after
#                each run that failed without writing a newer checkpoint,
#                at most 300; back to S after one that made progress), up
#                to N times; then it exits with the last run's status.
# Each restart is a line of DIR/restarts.jsonl: {"time", "attempt",
# "exit_status", "last_step" (the steps the failed run reported), "resumed_from"
# (the newest complete checkpoint's step, -1 when none: the run starts over),
# "steps_lost" (last_step - resumed_from), "backoff_s"}. SIGTERM or SIGINT to
# the supervisor goes to the running command (which checkpoints and stops) and
# ends the supervision with its status.
import argparse
import datetime
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

SETUP_ERROR = 2  # the trainer's exit status for errors a restart cannot fix


def output_dir(cmd):
    """The command's -o / --output-dir value (the last one), or None."""
    out = None
    for i, a in enumerate(cmd):
        if a in ("-o", "--output-dir") and i + 1 < len(cmd):
            out = cmd[i + 1]
        elif a.startswith("--output-dir="):
            out = a.split("=", 1)[1]
    return out


def with_resume(cmd):
    """The command with -y 1 (replacing a -y or --resume it has)."""
    out, skip = [], False
    for i, a in enumerate(cmd):
        if skip:
            skip = False
            continue
        if a in ("-y", "--resume") and i + 1 < len(cmd):
            skip = True
            continue
        if a.startswith("--resume="):
            continue
        out.append(a)
    return out + ["-y", "1"]


def newest_checkpoint(d):
    """The step of the newest complete checkpoint in d (its DONE_ file), -1 when none."""
    steps = [int(m.group(1)) for f in glob.glob(os.path.join(d, "DONE_*"))
             if (m := re.search(r"DONE_(\d{8})$", f))]
    return max(steps, default=-1)


def last_step(d):
    """The steps the run reported (metrics.jsonl's last step, counted from 1), 0 when none."""
    try:
        with open(os.path.join(d, "metrics.jsonl")) as f:
            lines = [l for l in f if l.strip()]
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def main():
    ap = argparse.ArgumentParser(description="run a training command again from its checkpoints when it fails")
    ap.add_argument("--restarts", type=int, required=True, help="restarts at most")
    ap.add_argument("--backoff", type=float, default=5.0, help="seconds before the first restart (doubling)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command after --")
    if a.restarts < 0 or a.backoff < 0:
        ap.error("--restarts and --backoff must not be negative")
    d = output_dir(cmd)
    if not d:
        print("supervise.py: the command has no -o DIR: a restart would start over; give it -o and -n",
              file=sys.stderr)
        return SETUP_ERROR

    child = None
    stopping = []

    def forward(sig, _frame):
        stopping.append(sig)
        if child and child.poll() is None:
            child.send_signal(sig)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    attempt, backoff, run = 0, a.backoff, cmd
    started_from = newest_checkpoint(d)
    while True:
        child = subprocess.Popen(run)
        rc = child.wait()
        if rc == 0 or rc == SETUP_ERROR or stopping:
            if rc == SETUP_ERROR:
                print("supervise.py: a setup error (exit status 2): not restarting", file=sys.stderr)
            return rc
        if attempt >= a.restarts:
            print(f"supervise.py: exit status {rc} after {attempt} restart(s): giving up", file=sys.stderr)
            return rc
        attempt += 1
        reached, resumed = last_step(d), newest_checkpoint(d)
        if resumed > started_from:
            backoff = a.backoff  # it made progress: not a failure that repeats at once
        started_from = resumed
        rec = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "attempt": attempt, "exit_status": rc, "last_step": reached, "resumed_from": resumed,
               "steps_lost": reached - max(resumed, 0), "backoff_s": backoff}
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "restarts.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"supervise.py: exit status {rc} at step {reached}; restart {attempt} of {a.restarts} in "
              f"{backoff:g} s, from " + (f"step {resumed}" if resumed >= 0 else "the start (no checkpoint)"),
              file=sys.stderr, flush=True)
        time.sleep(backoff)
        if stopping:
            return rc
        backoff = min(backoff * 2, 300.0)
        run = with_resume(cmd)


if __name__ == "__main__":
    sys.exit(main())
