#!/usr/bin/python3
# tests/e2e/test_soak.py: scripts/soak.py in small: 2 ranks, 16000 steps of a
# tiny model, a checkpoint every 200, one fault of each kind (kill -9 of a rank, of
# mpirun, SIGTERM, a SIGSTOP longer than --collective-timeout, a truncated
# newest checkpoint) injected while scripts/supervise.py runs the job. The
# supervised run must finish by itself after one restart per fault, the
# restart after the truncated checkpoint must resume from an older one,
# and the final weights must equal the undisturbed run's byte for byte.
# Last line: "N passed, N failed".
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, Checks, run_suite

check = Checks()
KINDS = ("kill", "mpirun", "term", "stop", "truncate")


def body(tmp):
    out = os.path.join(tmp, "soak.json")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "soak.py"), "--ranks", "2", "--steps", "16000",
                        "--checkpoint-every", "200", "--faults", "5", "--seed", "3", "--json", out],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    print("\n".join("  " + l for l in p.stdout.splitlines() if l.startswith("soak:")))
    if not check(p.returncode == 0 and os.path.exists(out), f"soak.py: exit {p.returncode}: {p.stderr[-1500:]}"):
        return
    with open(out) as f:
        fig = json.load(f)
    check(fig["faults_injected"] == 5 and all(fig["faults_by_kind"][k] == 1 for k in KINDS),
          f"one fault of each kind: {fig['faults_by_kind']}")
    check(fig["restarts"] == 5, f"one restart per fault: {fig['restarts']}")
    check(fig["supervisor_exit"] == 0, f"the supervised run finished by itself: exit {fig['supervisor_exit']}")
    check(fig["final_weights_equal"] is True, "final weights equal the undisturbed run's byte for byte")
    # The truncated checkpoint's restart resumed from before it.
    faults = [k for _, k, _ in fig["faults"]]
    i = faults.index("truncate")
    cut = [d for _, k, d in fig["faults"] if k == "truncate"][0]
    cut_step = int(cut.split("ckpt_")[1][:8]) if "ckpt_" in cut else -1
    resumed = fig["resumed_from"]
    check(len(resumed) == 5 and cut_step > 0 and resumed[i] < cut_step,
          f"after the truncated ckpt_{cut_step:08d} the run resumed from an older one: {resumed}")
    check(fig["steps_recomputed"] >= 0 and fig["time_lost_s"] > 0, f"figures: {fig['steps_recomputed']} steps "
          f"again, {fig['time_lost_s']} s lost")


if __name__ == "__main__":
    run_suite(check, "llmc_soak_", body)
