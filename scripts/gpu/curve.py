#!/usr/bin/env python3
# scripts/gpu/curve.py: a training curve of d12's shape on the embedded data,
# CUDA bf16 against the CPU in fp32 on the same weights and batches.
# The model is GPT-2 d12's shape with the embedded data's byte-level
# vocabulary: L=12, C=768, NH=12, maxT=1024, V=257 (Vp=384), T=1024, B rows
# per step. Every run starts from the same seed (so the same weights: the
# initialisation is drawn on the host in file order) and reads the same
# batches; the learning rate warms up over 20 steps and then stays constant
# (-q 1), so a 20-step run has the 300-step run's schedule.
#   1. CUDA bf16 for --steps steps (validation every 50 steps);
#   2. CUDA fp32 for --cpu-steps steps;
#   3. CPU fp32 for --cpu-steps steps, started first and run beside 1 and 2
#      on all cores but two, within the time left before --deadline (a run
#      cut short is compared over the steps it finished).
# (Throughput is the bench phase's: these runs share the CPU.)
# Compared over the common steps: max over steps of |loss - loss_cpu| /
# loss_cpu, for CUDA fp32 (checked against tests/lib/tolerances.h's kCurveFp32) and CUDA bf16
# (kCurveBf16, both set from a first GPU run; both printed); the bf16 loss must fall. The curves are
# drawn with scripts/plot_metrics.py into --png. Prints "figure" lines and
# ends with "N passed, N failed".
# Run by scripts/gpu/check.sh's curve phase; on its own, from any directory:
#   usage: scripts/gpu/curve.py --out DIR [--png FILE] [--steps 300]
#              [--cpu-steps 20] [-b 4] [--deadline SECONDS] [--gpu-device cuda]
# (the runs and their logs go to DIR; --gpu-device cpu with small --steps
# checks this script on a machine without a GPU.)
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from tolerances import TOL  # noqa: E402  (tests/lib/tolerances.h)
MODEL = "L=12,C=768,NH=12,V=257,T=1024"


def metrics(d):
    try:
        with open(os.path.join(d, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def launch(args, out_dir, log, threads=None):
    cmd = [os.path.join(ROOT, "train_gpt")] + args + ["-o", out_dir]
    print("  $ " + " ".join(cmd), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env), time.time()


def finish(proc, out_dir, timeout):
    p, t0 = proc
    try:
        rc = p.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = "timeout"
    print(f"    {os.path.basename(out_dir)}: rc={rc}, {time.time() - t0:.0f} s, {len(metrics(out_dir))} steps written",
          flush=True)
    return rc


def max_rel(a, b):
    n = min(len(a), len(b))
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a[:n], b[:n])) if n else float("inf")


def main():
    ap = argparse.ArgumentParser(description="d12-shaped training curve: CUDA bf16 vs CPU fp32.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--png")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--cpu-steps", type=int, default=20)
    ap.add_argument("-b", type=int, default=4, help="rows of 1024 tokens per step")
    ap.add_argument("--deadline", type=float, default=540, help="seconds from start for everything")
    ap.add_argument("--gpu-device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("-t", type=int, default=1024)
    a = ap.parse_args()
    start = time.time()
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(ROOT, "data", "tiny")
    common = ["-e", a.model, "-i", os.path.join(data, "tiny_train_*.bin"), "-j", os.path.join(data, "tiny_val_*.bin"),
              "-t", str(a.t), "-b", str(a.b), "-l", "6e-4", "-u", "20", "-q", "1", "-s", "0", "--seed", "1337"]
    dirs = {k: os.path.join(a.out, k) for k in ("cuda_bf16", "cuda_fp32", "cpu_fp32")}
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        passed, failed = passed + bool(ok), failed + (not ok)

    left = lambda: a.deadline - (time.time() - start)  # noqa: E731
    # The CPU run is the long one: it starts first and runs beside the GPU
    # runs (which need a core or two of their own).
    cpu_threads = max(1, (os.cpu_count() or 2) - 2)
    cpu = launch(common + ["-x", str(a.cpu_steps), "-v", "0", "--device", "cpu", "--dtype", "fp32"], dirs["cpu_fp32"],
                dirs["cpu_fp32"] + ".log", cpu_threads)
    gpu_bf16 = ["--device", a.gpu_device] + (["--dtype", "bf16"] if a.gpu_device == "cuda" else [])
    rc = finish(launch(common + ["-x", str(a.steps), "-v", "50", "-m", "4"] + gpu_bf16, dirs["cuda_bf16"],
                      dirs["cuda_bf16"] + ".log"), dirs["cuda_bf16"], left() - 60)
    check(rc == 0, f"CUDA bf16 {a.steps} steps (rc={rc})")
    rc = finish(launch(common + ["-x", str(a.cpu_steps), "-v", "0", "--device", a.gpu_device, "--dtype", "fp32"],
                      dirs["cuda_fp32"], dirs["cuda_fp32"] + ".log"), dirs["cuda_fp32"], left() - 45)
    check(rc == 0, f"CUDA fp32 {a.cpu_steps} steps (rc={rc})")
    rc = finish(cpu, dirs["cpu_fp32"], left() - 15)
    m = {k: metrics(d) for k, d in dirs.items()}
    k = len(m["cpu_fp32"])
    check(k >= min(5, a.cpu_steps), f"CPU fp32: {k} of {a.cpu_steps} steps in the time left (rc={rc})")
    print(f"figure cpu_fp32_steps {k} steps")
    for name, tol in (("cuda_fp32", TOL["kCurveFp32"]), ("cuda_bf16", TOL["kCurveBf16"])):
        r = max_rel(m[name], m["cpu_fp32"])
        print(f"  {name} vs cpu_fp32 over {min(k, len(m[name]))} steps: max relative loss difference {r:.3e}")
        if r != float("inf"):
            print(f"figure {name}_vs_cpu_fp32_loss_rel {r:.6e} rel")
        check(r <= tol, f"{name} vs CPU fp32: {r:.3e} (tolerance {tol:.0e})")
    bf = m["cuda_bf16"]
    if bf:
        print(f"figure cuda_bf16_first_loss {bf[0]['loss']:.6f} nats")
        print(f"figure cuda_bf16_final_loss {bf[-1]['loss']:.6f} nats")
        vals = [r["val_loss"] for r in bf if "val_loss" in r]
        if vals:
            print(f"figure cuda_bf16_final_val_loss {vals[-1]:.6f} nats")
        check(len(bf) == a.steps and bf[-1]["loss"] < bf[0]["loss"] - 1.0,
              f"CUDA bf16 loss falls: {bf[0]['loss']:.3f} -> {bf[-1]['loss']:.3f} over {len(bf)} steps")
    if a.png:
        runs = [(k, dirs[k]) for k in ("cuda_bf16", "cpu_fp32", "cuda_fp32") if m[k]]
        labels = {"cuda_bf16": "CUDA bf16", "cpu_fp32": "CPU fp32", "cuda_fp32": "CUDA fp32"}
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_metrics.py")]
                           + [os.path.join(d, "metrics.jsonl") for _, d in runs]
                           + ["-o", a.png, "--labels", ",".join(labels[k] for k, _ in runs), "--zoom", str(a.cpu_steps),
                              "--title", f"d12 shape (V=257, T={a.t}, B={a.b}) on data/tiny"],
                           capture_output=True, text=True)
        check(p.returncode == 0 and os.path.exists(a.png), f"plot {a.png}: {p.stderr.strip()[-300:]}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
