#!/usr/bin/env python3
# scripts/gpu/ranks.py: several ranks sharing one GPU (--comm mpi: the CUDA
# backend with collectives staged through host memory over MPI; NCCL refuses
# two ranks on one device), each layout against one process on the same GPU:
#   dp=2 x ZeRO 0-3, dp=4 x ZeRO 1, tp=2, tp=2 + sp, cp=2, cp=4, and
#   cp=2 x tp=2 x sp x dp=2 ZeRO-1 (8 ranks), pp=2 (1F1B and zero-bubble
#   ZB-H1), pp=2 x tp=2 + sp x ZeRO-1, pp=2 ZB-H1 x dp=2 ZeRO-2, and pp=2
#   ZBV (its V needs 4 layers: against one process of the same model with
#   L=4),
# trained for 10 steps on the same global batch (-d) from the same seed. The
# losses of every step and the final weights (the step-10 checkpoint's state
# file) are compared by relative error ‖a-b‖/‖b‖:
#   fp32 (--dtype fp32): within 1e-5, as the CPU tests demand;
#   bf16: printed, checked against kBf16Layout (--bf16-tol)
#         until measured (docs/gpu-results.md).
# The model (L=2, C=128, NH=4, byte-level V=257, T=256, data/tiny) is small
# so 20 runs fit a few minutes; --model llama runs a Llama of that size
# (NKV=2, F=344, untied head) instead, its figures named llama_*. Prints
# "figure" lines (relative errors) and ends with "N passed, N failed".
# Needs mpirun. Run by scripts/gpu/check.sh's ranks phase; on its own:
#   usage: scripts/gpu/ranks.py [--dtypes fp32,bf16] [--out DIR] [--bf16-tol X]
#              [--layouts all|NAME,...] [--timeout 240] [--device cuda]
#              [--model gpt2|llama]
# (the runs go to DIR, by default a temporary folder removed at the end;
# --device cpu --dtypes fp32 runs the same comparisons on the CPU: a check of
# this script where there is no GPU.)
import argparse
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from testlib import ROOT, Checks, metrics, read_checkpoint, rel, train  # noqa: E402
from tolerances import TOL  # noqa: E402  (tests/lib/tolerances.h)

MODELS = {"gpt2": "L=2,C=128,NH=4,V=257,T=256", "llama": "arch=llama,L=2,C=128,NH=4,NKV=2,F=344,V=257,T=256"}
ROWS = 16  # rows of T tokens per step (-d = ROWS * T)
T = 256
# name: (ranks, flags); B = ROWS / dp so there is no gradient accumulation.
LAYOUTS = {
    "dp2_z0": (2, ["-z", "0"]), "dp2_z1": (2, ["-z", "1"]), "dp2_z2": (2, ["-z", "2"]),
    "dp2_z3": (2, ["-z", "3"]), "dp4_z1": (4, ["-z", "1"]),
    "tp2": (2, ["--tp", "2"]), "tp2_sp": (2, ["--tp", "2", "--sp", "1"]),
    "cp2": (2, ["--cp", "2"]), "cp4": (4, ["--cp", "4"]),
    "cp2_tp2_sp_dp2_z1": (8, ["--cp", "2", "--tp", "2", "--sp", "1", "-z", "1"]),
    "pp2": (2, ["--pp", "2"]), "pp2_tp2_sp_z1": (4, ["--pp", "2", "--tp", "2", "--sp", "1", "-z", "1"]),
    "pp2_zb": (2, ["--pp", "2", "--pp-schedule", "zb-h1"]),
    "pp2_zb_dp2_z2": (4, ["--pp", "2", "--pp-schedule", "zb-h1", "-z", "2"]),
    "pp2_zbv": (2, ["--pp", "2", "--pp-schedule", "zbv"]),
}
# Layouts whose model has more layers than MODELS' 2 (the one-process run they
# are compared with has them too): ZBV places 2 chunks on each of pp stages.
LAYERS = {"pp2_zbv": 4}


def flag(flags, name):
    return int(flags[flags.index(name) + 1]) if name in flags else 1


def rows_per_micro_batch(np_, flags):
    """B: ROWS / dp (no accumulation), or 4 micro-batches per step for a pipeline."""
    pp = flag(flags, "--pp")
    dp = np_ // (flag(flags, "--tp") * flag(flags, "--cp") * pp)
    return ROWS // dp if pp == 1 else ROWS // (dp * 4)


def main():
    ap = argparse.ArgumentParser(description="Ranks sharing one GPU against one process.")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--bf16-tol", type=float, default=TOL["kBf16Layout"],
                    help="bf16 tolerance (default: tests/lib/tolerances.h)")
    ap.add_argument("--layouts", default="all")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="gpt2", choices=list(MODELS))
    a = ap.parse_args()
    names = list(LAYOUTS) if a.layouts == "all" else a.layouts.split(",")
    tmp = a.out or tempfile.mkdtemp(prefix="llmc_gpu_ranks_")
    os.makedirs(tmp, exist_ok=True)
    check = Checks()
    data = os.path.join(ROOT, "data", "tiny", "tiny_train_000001.bin")
    fig = "" if a.model == "gpt2" else a.model + "_"
    base = ["-i", data, "-j", "", "-t", str(T), "-d", str(ROWS * T), "-x", "10", "-n", "10",
            "-s", "0", "-v", "0", "-l", "1e-3", "-u", "3", "-q", "0.2", "-c", "0.1", "--device", a.device]
    try:
        for dtype in a.dtypes.split(","):
            tol = TOL["kFp32"] if dtype == "fp32" else a.bf16_tol
            refs = {}  # layers: the one-process run's (losses, final weights), or None if it failed

            def reference(layers):
                if layers not in refs:
                    model = MODELS[a.model].replace("L=2,", f"L={layers},")
                    ref = os.path.join(tmp, f"single_{dtype}_L{layers}")
                    rc, out, err = train(0, base + ["-e", model, "--dtype", dtype, "-b", str(ROWS), "-o", ref],
                                         timeout=a.timeout)
                    refs[layers] = None
                    if check(rc == 0, f"one process {dtype} L={layers}: rc={rc} {err[-400:]}"):
                        refs[layers] = ([m["loss"] for m in metrics(ref)], read_checkpoint(ref, 10)[0])
                        losses = refs[layers][0]
                        print(f"{a.model} L={layers}, one process {dtype}: losses {losses[0]:.4f} -> "
                              f"{losses[-1]:.4f}", flush=True)
                return refs[layers]
            for name in names:
                np_, flags = LAYOUTS[name]
                layers = LAYERS.get(name, 2)
                if reference(layers) is None:
                    continue
                ref_l, ref_w = reference(layers)
                model = MODELS[a.model].replace("L=2,", f"L={layers},")
                d = os.path.join(tmp, f"{dtype}_{name}")
                b = rows_per_micro_batch(np_, flags)
                try:
                    rc, out, err = train(np_, base + ["-e", model, "--dtype", dtype, "-b", str(b), "--comm", "mpi",
                                                      "-o", d] + flags, timeout=a.timeout)
                except Exception as e:  # a hang: subprocess.TimeoutExpired
                    rc, err = -1, f"{type(e).__name__}: {e}"
                what = f"{dtype} {name} (np={np_} {' '.join(flags)} -b {b})"
                if not check(rc == 0, f"{what}: rc={rc} {err[-400:]}"):
                    continue
                got_l = [m["loss"] for m in metrics(d)]
                lr = rel(got_l, ref_l) if len(got_l) == len(ref_l) else float("inf")
                wr = rel(read_checkpoint(d, 10)[0], ref_w)
                print(f"  {what}: losses rel {lr:.2e}, final weights rel {wr:.2e} (tol {tol:.0e})", flush=True)
                print(f"figure {fig}{dtype}_{name}_losses_rel {lr:.6e} rel")
                print(f"figure {fig}{dtype}_{name}_weights_rel {wr:.6e} rel")
                check(lr <= tol, f"{what}: losses rel err {lr:.3e} > {tol:.0e}")
                check(wr <= tol, f"{what}: final weights rel err {wr:.3e} > {tol:.0e}")
    finally:
        if not a.out:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
