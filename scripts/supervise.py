#!/usr/bin/env python3
# scripts/supervise.py: runs a training command and, when it fails, runs it
# again from its newest complete checkpoint, so a job survives a dead rank, a
# killed mpirun or a stalled collective without a person (docs/training.md,
# "Restarts").
#
#   usage: scripts/supervise.py --restarts N [--backoff S] [--hostfile FILE
#              [--hardware H]] -- COMMAND...
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
#
# With --hostfile FILE (Open MPI's format: "host slots=N" per line) the
# supervisor runs COMMAND (mpirun ...) on the hosts still trusted: it gives
# mpirun --hostfile DIR/hosts_active.txt and -np their slots. After a failed
# run it finds the hosts at fault in the run's output: mpirun's "... on
# node HOST ..." lines, and the ranks the trainer's watchdog names (ranks
# that did not arrive, ranks waiting in no collective), placed on hosts in
# slot order as mpirun places them. A host at fault in two runs is dropped;
# the world shrinks to the remaining slots and the layout is planned again
# for it: `train_gpt --plan search --world N --hardware H` (H: --hardware,
# default h100-sxm) on the command's own flags, whose launch line's layout
# flags (--pp, --vpp, --tp, --cp, --sp, --ep, -z, -b, -r) replace the
# command's. The checkpoints resume across layouts. The restart's line in
# restarts.jsonl then holds "dropped" (the host), "world" and "layout".
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


LAUNCHERS = ("mpirun", "mpiexec", "prterun", "orterun")
# The layout flags the planner chooses (those taking a value), long and short.
LAYOUT_FLAGS = {"--pp", "--vpp", "--tp", "--cp", "--sp", "--ep", "-z", "--zero", "-b", "--batch-size", "-r",
                "--recompute", "--cp-impl", "--cp-a2a"}


def read_hostfile(path):
    """[(host, slots)] of an Open MPI host file (slots 1 when not given)."""
    hosts = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            slots = 1
            for p in parts[1:]:
                m = re.match(r"slots=(\d+)$", p)  # (max_slots= and the like: not ours to use)
                if m:
                    slots = int(m.group(1))
            if slots < 1:
                raise ValueError(f"{path}: {parts[0]}: slots must be at least 1")
            hosts.append((parts[0], slots))
    if not hosts:
        raise ValueError(f"{path}: no hosts")
    return hosts


def host_of_rank(hosts, rank):
    """The host mpirun puts world rank `rank` on: hosts filled in order, slot by slot."""
    for h, s in hosts:
        if rank < s:
            return h
        rank -= s
    return None


def hosts_at_fault(text, hosts):
    """The hosts a failed run's output blames: mpirun's "on node HOST" and the
    ranks the trainer's watchdog names, in the hosts' order."""
    names = {h for h, _ in hosts}
    blamed = set(re.findall(r"on node ([\w.\-]+)", text)) & names
    for part in re.findall(r"(?:ranks that did not arrive|ranks waiting in no collective[^:]*): ([\d, ]+)", text):
        for r in re.findall(r"\d+", part):
            h = host_of_rank(hosts, int(r))
            if h:
                blamed.add(h)
    return [h for h, _ in hosts if h in blamed]


def launch_index(cmd):
    """The index of the launcher (mpirun ...) in cmd, or -1."""
    for i, a in enumerate(cmd):
        if os.path.basename(a) in LAUNCHERS:
            return i
    return -1


def on_hosts(cmd, hostfile, world):
    """cmd with its launcher given --hostfile hostfile and -np world (replacing
    any host file or process count of its own)."""
    i = launch_index(cmd)
    out, skip = [], False
    for j, a in enumerate(cmd):
        if skip:
            skip = False
            continue
        if j > i and a in ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-np", "-n", "--np") and \
                (j < train_index(cmd)):
            skip = True
            continue
        out.append(a)
        if j == i:
            out += ["--hostfile", hostfile, "-np", str(world)]
    return out


def train_index(cmd):
    """The index of the trainer (train_gpt) in cmd, or len(cmd)."""
    for i, a in enumerate(cmd):
        if os.path.basename(a).startswith("train_gpt"):
            return i
    return len(cmd)


def without_flags(args, flags):
    """args less the flags named (each with its value; --flag=value too)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if a.startswith("--") and a.split("=", 1)[0] in flags:
            continue
        out.append(a)
    return out


def replan(cmd, world, hardware):
    """(new command, layout flags) for a world of `world` ranks: the planner's
    winner on the command's flags; raises RuntimeError naming why not."""
    t = train_index(cmd)
    if t == len(cmd):
        raise RuntimeError("no train_gpt in the command")
    run_only = {"-o", "--output-dir", "-y", "--resume", "--resume-from", "-n", "--checkpoint-every", "--hardware",
                "--world", "--plan"}
    args = without_flags(without_flags(cmd[t + 1:], LAYOUT_FLAGS), run_only)
    p = subprocess.run([cmd[t]] + args + ["--plan", "search", "--world", str(world), "--hardware", hardware],
                       capture_output=True, text=True)
    line = next((l for l in p.stdout.splitlines() if l.startswith("launch:")), None)
    if p.returncode != 0 or not line:
        err = (p.stderr.strip().splitlines() or ["no launch line"])[-1]
        raise RuntimeError(f"the planner found no layout for {world} ranks: {err}")
    words = line.split()
    k = next(i for i, w in enumerate(words) if os.path.basename(w).startswith("train_gpt"))
    planned, layout, i = words[k + 1:], [], 0
    while i < len(planned):
        if planned[i] in LAYOUT_FLAGS and i + 1 < len(planned):
            layout += planned[i:i + 2]
            i += 2
        else:
            i += 1
    return cmd[:t + 1] + without_flags(cmd[t + 1:], LAYOUT_FLAGS) + layout, layout


def main():
    ap = argparse.ArgumentParser(description="run a training command again from its checkpoints when it fails")
    ap.add_argument("--restarts", type=int, required=True, help="restarts at most")
    ap.add_argument("--backoff", type=float, default=5.0, help="seconds before the first restart (doubling)")
    ap.add_argument("--hostfile", help="the hosts (Open MPI's format); hosts at fault twice are dropped")
    ap.add_argument("--hardware", default="h100-sxm", help="the planner's profile when the world shrinks")
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

    hosts, active = None, None
    if a.hostfile:
        try:
            hosts = read_hostfile(a.hostfile)
        except (OSError, ValueError) as e:
            print(f"supervise.py: --hostfile {a.hostfile}: {e}", file=sys.stderr)
            return SETUP_ERROR
        if launch_index(cmd) < 0:
            print("supervise.py: --hostfile needs a command that starts with mpirun (or mpiexec)", file=sys.stderr)
            return SETUP_ERROR
        os.makedirs(d, exist_ok=True)
        active = os.path.join(d, "hosts_active.txt")
        with open(active, "w") as f:
            f.writelines(f"{h} slots={s}\n" for h, s in hosts)
        cmd = on_hosts(cmd, active, sum(s for _, s in hosts))
    faults = {}  # host -> runs it was at fault in

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
        text = []
        if hosts is None:
            child = subprocess.Popen(run)
            rc = child.wait()
        else:  # the output is read for the hosts at fault, and passed on
            child = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            for line in child.stdout:
                text.append(line)
                sys.stdout.write(line)
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
        if hosts is not None:
            blamed = hosts_at_fault("".join(text), hosts)
            rec["at_fault"] = blamed
            for h in blamed:
                faults[h] = faults.get(h, 0) + 1
            dropped = [h for h, _ in hosts if faults.get(h, 0) >= 2]
            if dropped:
                left = [(h, s) for h, s in hosts if h not in dropped]
                if not left:
                    print(f"supervise.py: every host failed twice ({', '.join(dropped)}): giving up", file=sys.stderr)
                    return rc
                world = sum(s for _, s in left)
                try:
                    cmd, layout = replan(cmd, world, a.hardware)
                except RuntimeError as e:
                    print(f"supervise.py: dropping {', '.join(dropped)}: {e}; giving up", file=sys.stderr)
                    return rc
                hosts = left
                with open(active, "w") as f:
                    f.writelines(f"{h} slots={s}\n" for h, s in hosts)
                cmd = on_hosts(cmd, active, world)
                rec.update({"dropped": dropped, "world": world, "layout": " ".join(layout)})
                for h in dropped:
                    faults.pop(h)
                print(f"supervise.py: dropping host(s) {', '.join(dropped)} (at fault twice): {world} ranks on "
                      f"{', '.join(h for h, _ in hosts)}, layout {' '.join(layout) or '(the defaults)'}",
                      file=sys.stderr, flush=True)
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
