#!/usr/bin/python3
# tests/distributed/test_bf16.py: mixed precision on the CPU (--device cpu
# --dtype bf16: the CUDA build's bf16 parameters, gradients and activations,
# fp32 master weights, Adam state and statistics; llmc/backend/
# backend_cpu_bf16.cpp) in every layout, against independent truths:
#   - layouts against one bf16 process (dp x ZeRO 0-3, tp, tp+sp, cp, pp,
#     vpp, mixes, and Llama with GQA): 10 steps of losses and the final
#     master weights within kCpuBf16LayoutLoss / kCpuBf16LayoutWeights of
#     tests/lib/tolerances.h. Why not 1e-10 as in fp64: a layout changes
#     where gradients are rounded to bf16 (per rank's micro-steps, and each
#     partial sum of a bf16 reduction, as NCCL's), and Adam's normalisation
#     turns a last-bit gradient difference of an element with a tiny
#     gradient into an update difference of up to lr;
#   - one bf16 process against the fp64 run (itself PyTorch's reference to
#     1e-10, tests/reference): the 10 losses within kCpuBf16Steps; and two
#     bf16 runs bit for bit (the CPU backend is deterministic);
#   - checkpoints keep the fp32 master: a shard's weights are fp32, and a
#     resume in one process continues bit for bit (a resume from the
#     rounded bf16 parameters would not); a checkpoint of dp=2 ZeRO-1
#     resumes under tp=2 and pp=2 within the layout tolerance;
#   - exports round the master to bf16: --export-model writes a version-5
#     llm.c file and --export-hf bf16 safetensors, each exactly
#     round-to-nearest-even of the checkpoint's master weights;
#   - the planner's memory line (--plan eval --device cpu --dtype bf16)
#     equals the run's, byte for byte, in one process and under dp2 ZeRO-1.
# Last line: "N passed, N failed".
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ROOT, TRAIN, Checks, copy_checkpoint, metrics, read_checkpoint, rel, run_suite, train, write_shard
from tolerances import TOL

check = Checks()
GPT2 = "L=4,C=32,NH=4,V=97,Vp=97,T=64"
LLAMA = "arch=llama,L=4,C=32,NH=4,NKV=2,F=48,V=97,T=64"
STEPS = 10


def bf16_round(x):
    """fp32 values rounded to bf16 (nearest even), as float64."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32).astype(np.float64)


def args_for(data, model, dtype="bf16"):
    return ["-e", model, "-i", data, "-j", data, "-t", "16", "-d", "256", "-x", str(STEPS), "-s", "0", "-v", "0",
            "--dtype", dtype, "-l", "3e-3", "-u", "3", "-n", str(STEPS)]


def run_to(tmp, name, np_, args):
    d = os.path.join(tmp, name)
    rc, out, err = train(np_, args + ["-o", d])
    check(rc == 0, f"{name}: exit {rc}: {err[-400:]}")
    return d if rc == 0 else None, out


def test_layouts(tmp, data):
    for model, tag, layouts in (
        (GPT2, "gpt2", [(2, ["-b", "8"]), (2, ["-b", "8", "-z", "1"]), (2, ["-b", "8", "-z", "2"]),
                        (2, ["-b", "8", "-z", "3"]), (2, ["-b", "16", "--tp", "2"]),
                        (2, ["-b", "16", "--tp", "2", "--sp", "1"]), (2, ["-b", "16", "--cp", "2"]),
                        (2, ["-b", "4", "--pp", "2"]), (2, ["-b", "2", "--pp", "2", "--vpp", "2"]),
                        (4, ["-b", "8", "--tp", "2", "-z", "1"]), (4, ["-b", "4", "--pp", "2", "-z", "1"])]),
        (LLAMA, "llama", [(2, ["-b", "16", "--tp", "2", "--sp", "1"]), (2, ["-b", "8", "-z", "1"])]),
    ):
        one, _ = run_to(tmp, f"{tag}_one", 0, args_for(data, model) + ["-b", "16"])
        if not one:
            continue
        l0, w0 = [m["loss"] for m in metrics(one)], read_checkpoint(one, STEPS)[0]
        for np_, extra in layouts:
            d, _ = run_to(tmp, f"{tag}_" + "_".join(extra).replace("-", ""), np_, args_for(data, model) + extra)
            if not d:
                continue
            lr = rel([m["loss"] for m in metrics(d)], l0)
            wr = rel(read_checkpoint(d, STEPS)[0], w0)
            print(f"  {tag} np={np_} {' '.join(extra)}: losses rel {lr:.2e}, master weights rel {wr:.2e}")
            check(lr <= TOL["kCpuBf16LayoutLoss"], f"{tag} {extra}: losses rel {lr:.3e}")
            check(wr <= TOL["kCpuBf16LayoutWeights"], f"{tag} {extra}: weights rel {wr:.3e}")


def test_reference_and_determinism(tmp, data):
    a, _ = run_to(tmp, "ref_bf16_a", 0, args_for(data, GPT2) + ["-b", "16"])
    b, _ = run_to(tmp, "ref_bf16_b", 0, args_for(data, GPT2) + ["-b", "16"])
    f, _ = run_to(tmp, "ref_fp64", 0, args_for(data, GPT2, "fp64") + ["-b", "16"])
    if not (a and b and f):
        return
    la, lb, lf = ([m["loss"] for m in metrics(x)] for x in (a, b, f))
    r = rel(la, lf)
    print(f"  one bf16 process vs fp64 over {STEPS} steps: losses rel {r:.2e}")
    check(r <= TOL["kCpuBf16Steps"], f"bf16 vs fp64 losses rel {r:.3e}")
    check(la == lb and np.array_equal(read_checkpoint(a, STEPS)[0], read_checkpoint(b, STEPS)[0]),
          "two bf16 runs are bit for bit the same")


def shard_weight_dtypes(d, step):
    cdir = os.path.join(d, f"ckpt_{step:08d}")
    with open(os.path.join(cdir, "index.json")) as f:
        names = json.load(f)["shards"]
    codes = set()
    for n in names:
        with open(os.path.join(cdir, n), "rb") as f:
            codes.add(struct.unpack("<256i", f.read(1024))[4])
    return codes


def test_resume(tmp, data):
    full, _ = run_to(tmp, "res_full", 0, args_for(data, GPT2) + ["-b", "16"])
    # Checkpoints every 5 steps of the same 10-step run (the schedule depends on -x).
    saved, _ = run_to(tmp, "res_saved", 0, args_for(data, GPT2) + ["-b", "16", "-n", "5"])
    if not (full and saved):
        return
    check(shard_weight_dtypes(saved, 5) == {0}, "bf16 checkpoint holds fp32 (master) weights")
    full_l = [m["loss"] for m in metrics(full)]
    d = os.path.join(tmp, "res_same")
    copy_checkpoint(saved, d, 5)
    rc, out, err = train(0, args_for(data, GPT2) + ["-b", "16", "-y", "1", "-o", d])
    if check(rc == 0, f"bf16 resume: {err[-300:]}"):
        got = [m["loss"] for m in metrics(d)]
        check(got == full_l[5:], f"bf16 resume in one process continues bit for bit ({got[:2]} vs {full_l[5:7]})")
    dp, _ = run_to(tmp, "res_dp2z1", 2, args_for(data, GPT2) + ["-b", "8", "-z", "1", "-n", "5"])
    if not dp:
        return
    for i, (np_, extra) in enumerate([(2, ["-b", "16", "--tp", "2"]), (2, ["-b", "4", "--pp", "2"])]):
        d = os.path.join(tmp, f"res_across_{i}")
        copy_checkpoint(dp, d, 5)
        rc, out, err = train(np_, args_for(data, GPT2) + extra + ["-y", "1", "-o", d])
        if check(rc == 0, f"bf16 resume {extra}: {err[-300:]}"):
            r = rel([m["loss"] for m in metrics(d)], full_l[5:])
            print(f"  saved at dp2 ZeRO-1, resumed at {' '.join(extra)}: losses rel {r:.2e}")
            check(r <= TOL["kCpuBf16LayoutLoss"], f"bf16 resume {extra}: rel {r:.3e}")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    return header, blob


def test_exports(tmp, data):
    hf = os.path.join(tmp, "hf_out")
    llmc_file = os.path.join(tmp, "model_bf16.bin")
    d, _ = run_to(tmp, "exp", 0, args_for(data, GPT2) + ["-b", "16", "--export-model", llmc_file, "--export-hf", hf])
    if not d:
        return
    want = bf16_round(read_checkpoint(d, STEPS)[0])
    with open(llmc_file, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        vals = (np.frombuffer(f.read(), dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    check(h[1] == 5, f"--export-model of a bf16 run: llm.c version {h[1]} (want 5, bf16)")
    check(vals.shape == want.shape and np.array_equal(vals, want),
          "--export-model: the master weights rounded to bf16, exactly")
    files = [x for x in os.listdir(hf) if x.endswith(".safetensors")] if os.path.isdir(hf) else []
    if not check(files, "--export-hf wrote safetensors"):
        return
    dtypes, wte = set(), None
    for name in files:
        header, blob = read_safetensors(os.path.join(hf, name))
        for key, t in header.items():
            if key == "__metadata__":
                continue
            dtypes.add(t["dtype"])
            if key.endswith("wte.weight"):
                b, e = t["data_offsets"]
                wte = (np.frombuffer(blob[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    check(dtypes == {"BF16"}, f"--export-hf of a bf16 run: dtypes {dtypes}")
    V, C = 97, 32
    check(wte is not None and np.array_equal(wte.astype(np.float64), want[:V * C]),
          "--export-hf: wte is the master rounded to bf16, exactly")


def test_planner_memory(tmp, data):
    for np_, extra in ((0, []), (2, ["-z", "1"])):
        args = args_for(data, GPT2) + ["-b", "8"] + extra
        plan = subprocess.run([TRAIN, "--plan", "eval", "--device", "cpu", "--world", str(max(np_, 1))] + args,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        want = re.search(r"memory\[0\] plan: (.*?) total=", plan.stdout)
        rc, out, err = train(np_, args)
        got = re.search(r"memory\[0\] end: (.*?) total=", out)
        if check(want and got and rc == 0, f"plan/run memory lines {extra}: {plan.stderr[-200:]} {err[-200:]}"):
            print(f"  memory plan {extra}: {want.group(1)}")
            check(want.group(1).replace("plan", "") == got.group(1), f"planner memory {extra}: {want.group(1)} "
                  f"vs run {got.group(1)}")


def body(tmp):
    data = os.path.join(tmp, "train.bin")
    write_shard(data, np.random.default_rng(3).integers(0, 97, 40000))
    test_layouts(tmp, data)
    test_reference_and_determinism(tmp, data)
    test_resume(tmp, data)
    test_exports(tmp, data)
    test_planner_memory(tmp, data)


if __name__ == "__main__":
    run_suite(check, "llmc_bf16_", body)
