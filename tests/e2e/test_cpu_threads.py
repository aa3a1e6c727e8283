#!/usr/bin/python3
# tests/e2e/test_cpu_threads.py: the default run's CPU threads follow other
# processes' load (llmc/run/cpu_threads.h), and that changes no bit:
#   - with the load given by LLMC_TEST_CPU_OTHERS (busy, then quiet), the
#     run drops to one thread and comes back, each said in one line;
#   - the final weights of that run equal those of runs fixed at one and at
#     two threads (OMP_NUM_THREADS), bit for bit, in fp32 and bf16, and for
#     a Mixtral in fp32 (its experts' small products); the matrix products
#     are cut by shape, not by thread: llmc/backend/cpu_gemm.h;
#   - beside one busy loop per CPU (real load, no hook) the run takes fewer
#     threads than it started with;
#   - OMP_NUM_THREADS from the user fixes the count: no change, and the
#     settings say so.
# Needs at least 2 CPUs for the changes (else one check: the settings say
# one thread). Last line: "N passed, N failed".
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train_gpt")
check = Checks()
CPUS = len(os.sched_getaffinity(0))


def run(args, env, timeout=300):
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LLMC_TEST_CPU_OTHERS")}
    e.update(env)
    p = subprocess.run([TRAIN, "-v", "0", "-s", "0"] + args, cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def changes(out):
    """The (threads, of) pairs of the run's 'threads: N of M' lines, in order."""
    return [(int(a), int(b)) for a, b in re.findall(r"threads: (\d+) of (\d+) \(other processes", out)]


def weights(d):
    files = sorted(glob.glob(os.path.join(d, "model_*.bin")) + glob.glob(os.path.join(d, "hf_*", "model.safetensors")))
    if not files:
        return None
    with open(files[-1], "rb") as f:
        return f.read()


def main():
    if not os.path.exists(TRAIN):
        print("train_gpt missing\n0 passed, 1 failed")
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="cpu_threads_")
    try:
        if CPUS < 2:
            rc, out, err = run(["-x", "2"], {})
            check(rc == 0 and "no: one thread" in out, f"one CPU: the settings say one thread: {err[-300:]}")
            return
        steps = ["-x", "40"]
        # Busy for two windows, quiet for two, busy again (0.5 s windows; 40 steps take several seconds).
        mixtral = ["-e", "arch=mixtral,L=2,C=64,NH=4,NKV=2,F=96,V=257,T=64,E=4,K=2"]
        # (the small Mixtral's steps are short: more of them for five windows)
        for dtype, extra in (("fp32", steps), ("bf16", steps + ["--dtype", "bf16"]),
                             ("mixtral fp32", ["-x", "600"] + mixtral)):
            dirs = {}
            for name, env in (("adaptive", {"LLMC_TEST_CPU_OTHERS": f"{CPUS},{CPUS},0,0,{CPUS}"}),
                              ("one", {"OMP_NUM_THREADS": "1"}), ("two", {"OMP_NUM_THREADS": "2"})):
                d = os.path.join(tmp, f"{dtype.replace(' ', '_')}_{name}")
                rc, out, err = run(extra + ["-o", d], env)
                check(rc == 0, f"{dtype} {name}: the run ends well: {err[-300:]}")
                dirs[name] = d
                if name == "adaptive":
                    ch = changes(out)
                    check(len(ch) >= 2 and ch[0] == (1, CPUS) and ch[1] == (CPUS, CPUS),
                          f"{dtype}: down to one thread under load, back to {CPUS} when quiet: {ch}")
                    check(f"yes: fewer while other processes use its {CPUS} CPUs" in out,
                          "the settings say the threads follow the load")
                if name == "two":
                    check(not changes(out) and "no: OMP_NUM_THREADS fixes them" in out,
                          f"{dtype}: OMP_NUM_THREADS fixes the count, and the settings say so")
            w = {k: weights(v) for k, v in dirs.items()}
            check(w["adaptive"] is not None and w["adaptive"] == w["one"] == w["two"],
                  f"{dtype}: final weights bit for bit: changing threads, one thread, two threads")
        # Real load: one busy loop per CPU beside the run.
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CPUS)]
        try:
            rc, out, err = run(steps, {})
        finally:
            for p in loops:
                p.kill()
                p.wait()
        ch = changes(out)
        check(rc == 0 and ch and ch[0][0] < CPUS,
              f"beside {CPUS} busy loop(s): fewer than {CPUS} threads: {ch} {err[-300:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        sys.exit(check.summary())
