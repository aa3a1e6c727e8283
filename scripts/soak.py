#!/usr/bin/env python3
# scripts/soak.py: a soak benchmark of the fault handling. It trains a small
# model with several ranks on the CPU twice, on the same data and flags:
# once undisturbed, and once under scripts/supervise.py while faults are
# injected at random times, then says whether the two runs' final weights
# are equal byte for byte, and what the faults cost.
#
#   usage: scripts/soak.py [--ranks 4] [--steps 6000] [--checkpoint-every 100]
#              [--faults 6] [--kinds kill,mpirun,term,stop,truncate] [--seed 1]
#              [--collective-timeout 3] [--dir DIR] [--json FILE]
#
# The faults, taken in a shuffled cycle over --kinds so that each kind is
# injected before any is repeated:
#   kill      kill -9 of a random rank;
#   mpirun    kill -9 of mpirun (its ranks then end by themselves);
#   term      SIGTERM to a random rank: the ranks agree to stop, checkpoint
#             and exit with 143;
#   stop      SIGSTOP of a random rank for longer than --collective-timeout:
#             the others' watchdog ends the job (the rank is continued after);
#   truncate  the newest complete checkpoint cut to half of one shard, then
#             kill -9 of a random rank: the restart must fall back to the
#             checkpoint before it.
# A fault strikes once the running attempt has written a checkpoint past
# where it started, after a random extra 0-1.5 s, so every attempt makes
# progress. The supervisor (--restarts 4 x --faults, --backoff 2) relaunches
# with -y 1 after each. The runs keep their newest 4 checkpoints.
#
# Printed at the end (and written to --json FILE): the faults injected by
# kind, the restarts, the steps computed again (the steps an attempt reached
# less the step the next one resumed from, as the trainer's "resume:" line
# says), the wall time of each run and the time lost, and whether the final
# weights (model_SSSSSSSS.bin) are equal. Exit status 0 when the supervised
# run finished by itself with the faults all injected and the weights equal.
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from shards import write_shard  # noqa: E402
from supervise import newest_checkpoint  # noqa: E402

KINDS = ("kill", "mpirun", "term", "stop", "truncate")
MODEL = "L=2,C=32,NH=4,V=97,Vp=97,T=32"


def environment():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # More ranks than cores, and mpirun as root in containers.
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def children(pid):
    """The pids whose parent is pid."""
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(os.path.join(d, "stat")) as f:
                st = f.read()
            if int(st[st.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(os.path.basename(d)))
        except (OSError, ValueError):
            pass
    return out


def named(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Soak:
    def __init__(self, a, env, cmd, out_dir):
        self.a, self.env, self.cmd, self.d = a, env, cmd, out_dir
        self.rng = random.Random(a.seed)
        self.injected = []   # (time since start, kind, detail)
        self.resumes = []    # the steps the trainer says each restart resumed from
        self.lines = []

    def read(self, stream):
        for line in stream:
            self.lines.append(line)
            m = re.search(r"resume: .*ckpt_(\d{8}), step (\d+)", line)
            if m:
                self.resumes.append(int(m.group(2)))

    def job(self, sup):
        """(mpirun pid, [rank pids]) of the running attempt, or (None, [])."""
        for c in children(sup.pid):
            if named(c) in ("mpirun", "mpiexec", "prterun", "orterun"):
                return c, [r for r in children(c) if named(r) == "train_gpt"]
        return None, []

    def run(self):
        a = self.a
        sup_cmd = [sys.executable, os.path.join(HERE, "supervise.py"), "--restarts", str(4 * a.faults + 4),
                   "--backoff", "2", "--"] + self.cmd
        t0 = time.time()
        sup = subprocess.Popen(sup_cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        reader = threading.Thread(target=self.read, args=(sup.stdout,), daemon=True)
        reader.start()
        cycle = []
        last_mpirun = None
        while sup.poll() is None and len(self.injected) < a.faults:
            mp, ranks = self.job(sup)
            if mp is None or mp == last_mpirun or len(ranks) < a.ranks:
                time.sleep(0.05)  # between attempts, or one still starting
                continue
            # Progress first: a checkpoint newer than any there was when this attempt began.
            start = newest_checkpoint(self.d)
            while sup.poll() is None and self.job(sup)[0] == mp and newest_checkpoint(self.d) <= start:
                time.sleep(0.05)
            time.sleep(self.rng.uniform(0, 1.5))
            mp2, ranks = self.job(sup)
            if mp2 != mp or len(ranks) < a.ranks or sup.poll() is not None:
                continue  # the attempt is ending by itself (the run finished)
            if not cycle:
                cycle = list(a.kinds)
                self.rng.shuffle(cycle)
            kind = cycle.pop()
            victim = self.rng.choice(sorted(ranks))
            detail = self.inject(kind, mp, victim)
            self.injected.append((round(time.time() - t0, 2), kind, detail))
            print(f"soak: {time.time() - t0:7.2f} s  fault {len(self.injected)}: {kind} ({detail})", flush=True)
            last_mpirun = mp
        rc = sup.wait()
        reader.join(timeout=5)
        return rc, time.time() - t0

    def inject(self, kind, mp, victim):
        if kind == "kill":
            os.kill(victim, signal.SIGKILL)
            return f"kill -9 of rank pid {victim}"
        if kind == "mpirun":
            os.kill(mp, signal.SIGKILL)
            return f"kill -9 of mpirun pid {mp}"
        if kind == "term":
            os.kill(victim, signal.SIGTERM)
            return f"SIGTERM to rank pid {victim}"
        if kind == "stop":
            os.kill(victim, signal.SIGSTOP)
            hold = self.a.collective_timeout + 3
            # Continued later whatever happened, so nothing stays stopped.
            threading.Timer(hold, lambda: self.cont(victim)).start()
            return f"SIGSTOP of rank pid {victim} for {hold:g} s (--collective-timeout {self.a.collective_timeout:g})"
        # truncate: the newest complete checkpoint loses half of a shard, then a rank dies.
        step = newest_checkpoint(self.d)
        shards = sorted(glob.glob(os.path.join(self.d, f"ckpt_{step:08d}", "shard_*.bin")))
        cut = ""
        if shards:
            f = self.rng.choice(shards)
            size = os.path.getsize(f)
            os.truncate(f, size // 2)
            cut = f"{os.path.relpath(f, self.d)} cut from {size} to {size // 2} bytes, then "
        os.kill(victim, signal.SIGKILL)
        return cut + f"kill -9 of rank pid {victim}"

    @staticmethod
    def cont(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def final_weights(d, steps):
    return os.path.join(d, f"model_{steps:08d}.bin")


def main():
    ap = argparse.ArgumentParser(description="faults injected under the supervisor; final weights against an "
                                             "undisturbed run")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--faults", type=int, default=6)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--collective-timeout", type=float, default=3.0)
    ap.add_argument("--dir", help="work directory (kept); default: a temporary one, removed")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    a.kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in a.kinds if k not in KINDS]
    if bad or not a.kinds:
        ap.error(f"--kinds: unknown {bad}; choose from {', '.join(KINDS)}")
    if a.ranks < 2 or a.steps < 1 or a.checkpoint_every < 1 or a.faults < 0:
        ap.error("--ranks must be at least 2, --steps and --checkpoint-every at least 1, --faults at least 0")
    if a.steps < 2 * a.checkpoint_every * max(1, a.faults):
        ap.error(f"--steps {a.steps} leaves too little room: at least 2 x --checkpoint-every x --faults")
    train = os.path.join(ROOT, "train_gpt")
    if not os.path.exists(train) or not shutil.which("mpirun"):
        print("soak.py: needs ./train_gpt (make) and mpirun", file=sys.stderr)
        return 2

    work = a.dir or tempfile.mkdtemp(prefix="llmc_soak_")
    os.makedirs(work, exist_ok=True)
    env = environment()
    try:
        import numpy as np
        data = os.path.join(work, "train.bin")
        write_shard(data, np.random.default_rng(a.seed).integers(0, 97, 50000), 97)
        common = ["-i", data, "--val-data=", "-e", MODEL, "-t", "32", "-b", "2", "-d", str(64 * a.ranks), "-x",
                  str(a.steps), "-u", "10", "-l", "1e-3", "-s", "0", "-v", "0", "-n", str(a.checkpoint_every),
                  "--keep-checkpoints", "4", "--collective-timeout", f"{a.collective_timeout:g}", "--log-every", "1000"]

        def cmd(out):
            return ["mpirun", "-np", str(a.ranks), train] + common + ["-o", out]

        ref_dir, soak_dir = os.path.join(work, "undisturbed"), os.path.join(work, "soak")
        for d in (ref_dir, soak_dir):
            shutil.rmtree(d, ignore_errors=True)
        print(f"soak: the undisturbed run ({a.ranks} ranks, {a.steps} steps, a checkpoint every "
              f"{a.checkpoint_every})", flush=True)
        t0 = time.time()
        p = subprocess.run(cmd(ref_dir), cwd=ROOT, env=env, capture_output=True, text=True)
        t_ref = time.time() - t0
        if p.returncode != 0:
            print(f"soak.py: the undisturbed run failed (exit {p.returncode}): {p.stderr[-800:]}", file=sys.stderr)
            return 1
        print(f"soak: the supervised run with {a.faults} faults ({', '.join(a.kinds)})", flush=True)
        s = Soak(a, env, cmd(soak_dir), soak_dir)
        rc, t_soak = s.run()

        restarts = []
        try:
            with open(os.path.join(soak_dir, "restarts.jsonl")) as f:
                restarts = [json.loads(l) for l in f if l.strip()]
        except OSError:
            pass
        # Steps computed again: what each failed attempt reached less where the next resumed.
        reached = [r["last_step"] for r in restarts]
        redone = sum(max(0, x - y) for x, y in zip(reached, s.resumes))
        fw_ref, fw_soak = final_weights(ref_dir, a.steps), final_weights(soak_dir, a.steps)
        equal = False
        if os.path.exists(fw_ref) and os.path.exists(fw_soak):
            with open(fw_ref, "rb") as f1, open(fw_soak, "rb") as f2:
                equal = f1.read() == f2.read()
        kinds = {k: sum(1 for _, kk, _ in s.injected if kk == k) for k in a.kinds}
        fig = {"ranks": a.ranks, "steps": a.steps, "checkpoint_every": a.checkpoint_every,
               "faults_injected": len(s.injected), "faults_by_kind": kinds, "faults": s.injected,
               "restarts": len(restarts), "resumed_from": s.resumes, "steps_recomputed": redone,
               "undisturbed_s": round(t_ref, 2), "supervised_s": round(t_soak, 2),
               "time_lost_s": round(t_soak - t_ref, 2), "supervisor_exit": rc, "final_weights_equal": equal}
        print(f"soak: faults injected {len(s.injected)} ({', '.join(f'{k} {n}' for k, n in kinds.items())}), "
              f"restarts {len(restarts)}, steps computed again {redone} (resumed from {s.resumes})")
        print(f"soak: wall time {t_soak:.1f} s supervised, {t_ref:.1f} s undisturbed: {t_soak - t_ref:.1f} s lost")
        print(f"soak: supervisor exit status {rc}; final weights "
              + ("equal to the undisturbed run's, byte for byte" if equal else "DIFFER from the undisturbed run's"))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(fig, f, indent=1)
        ok = rc == 0 and equal and len(s.injected) == a.faults
        if not ok and rc != 0:
            print("soak: the supervised run's last lines:\n" + "".join(s.lines[-15:]), file=sys.stderr)
        return 0 if ok else 1
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
