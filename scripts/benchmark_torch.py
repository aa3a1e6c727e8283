#!/usr/bin/python3
# scripts/benchmark_torch.py: this trainer's CPU step time beside PyTorch
# eager's on the same GPT-2, batch shape, thread count and precision (fp32).
# The two run alternately in one invocation (round 1: ours then torch,
# round 2: torch then ours, ...), each round a fresh process of each, so a
# machine whose load drifts weighs on both alike. Prints every round's step
# times, the median seconds per step and tokens/s of each (over every round's
# steps after --warmup) and the ratio ours tokens/s / torch tokens/s.
# Figures only: nothing here passes or fails (speed targets are not tests).
# Also prints them as "figure NAME VALUE UNIT" lines for scripts/gpu/figures.py.
#
# Ours: train_gpt -e SPEC -b B -t T -x STEPS on the embedded data
# (data/tiny, byte-level ids, valid for V=50257), no validation, no samples,
# under OMP_NUM_THREADS=threads; step times are the "ms" of metrics.jsonl
# (zero_grad, reading the batch, forward, backward, clipping and AdamW).
# Torch: transformers' GPT2LMHeadModel (eager attention, dropout 0) under the
# virtual environment build/hfenv (scripts/setup.sh), torch.set_num_threads,
# torch.optim.AdamW with the trainer's settings; each step is timed over
# zero_grad, a random B x T batch, forward with labels, backward,
# clip_grad_norm_(1.0) and the optimizer step. transformers' loss shifts the
# labels, so it scores T-1 positions per row where ours scores T; ours pads
# the LM head to Vp (50304) columns where torch has V (50257).
#   usage: scripts/benchmark_torch.py [--model small|d12] [--B N] [--T N]
#                                     [--threads N] [--rounds 3] [--steps N] [--warmup 1]
#   e.g.   scripts/benchmark_torch.py --model small --rounds 1 --steps 2
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_PYTHON = os.path.join(ROOT, "build", "hfenv", "bin", "python")
# name: (L, C, NH, V, trainer spec, B, T, steps per round)
MODELS = {
    "small": (6, 512, 8, 50257, "L=6,C=512,NH=8,V=50257,T={T}", 4, 256, 4),
    "d12": (12, 768, 12, 50257, "d12", 4, 1024, 2),
}


def torch_worker(a):
    """Runs in build/hfenv's python: trains a GPT2LMHeadModel for a.steps steps
    and prints one JSON line per step ({"step", "s"}) after one line that
    describes the setup."""
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    kw = dict(n_layer=a.L, n_embd=a.C, n_head=a.NH, vocab_size=a.V, n_positions=a.T,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg = transformers.GPT2Config(attn_implementation="eager", **kw)
    model = transformers.GPT2LMHeadModel(cfg).float()
    model.train()
    attn = getattr(model.config, "_attn_implementation", "eager (the only one in this version)")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8,
                            **({"foreach": True} if a.foreach else {}))
    # None is torch's default: the for-loop update on the CPU.
    foreach = {None: "off (default)", False: "off", True: "on"}[opt.param_groups[0].get("foreach")]
    print(json.dumps({"setup": True, "torch": torch.__version__, "transformers": transformers.__version__,
                      "attn": attn, "attn_class": type(model.transformer.h[0].attn).__name__,
                      "threads": torch.get_num_threads(), "foreach": foreach,
                      "params": sum(p.numel() for p in model.parameters())}), flush=True)
    gen = torch.Generator().manual_seed(1337)
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x = torch.randint(0, a.V, (a.B, a.T), generator=gen)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        s = time.perf_counter() - t0
        print(json.dumps({"step": step, "s": s, "loss": loss.item()}), flush=True)


def run_ours(a, spec, env):
    out_dir = tempfile.mkdtemp(prefix="llmc_bench_torch_")
    try:
        cmd = [os.path.join(ROOT, "train_gpt"), "-e", spec, "-b", str(a.B), "-t", str(a.T),
               "-x", str(a.steps), "-v", "0", "-s", "0", "-j", "", "-o", out_dir,
               "-l", "1e-4", "-u", "0", "-q", "1", "-c", "0.1", "--grad-clip", "1",
               "--device", "cpu", "--dtype", "fp32"]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"benchmark_torch.py: train_gpt failed: {(p.stderr or p.stdout).strip()[-500:]}")
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            steps = [json.loads(line) for line in f]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)  # the final model file (d12: ~500 MB)
    threads = next((ln.split("|")[2].strip() for ln in p.stdout.splitlines() if "threads per rank" in ln), "?")
    return [s["ms"] / 1000.0 for s in steps], threads


def run_torch(a, env):
    cmd = [HF_PYTHON, os.path.abspath(__file__), "--torch-worker", "--threads", str(a.threads),
           "--steps", str(a.steps), "--B", str(a.B), "--T", str(a.T),
           "--L", str(a.L), "--C", str(a.C), "--NH", str(a.NH), "--V", str(a.V)] + (["--foreach"] if a.foreach else [])
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"benchmark_torch.py: the torch run failed: {p.stderr.strip()[-800:]}")
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    setup = next(r for r in rows if r.get("setup"))
    return [r["s"] for r in rows if "s" in r], setup


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def fmt(xs):
    return " ".join(f"{x:.3f}" for x in xs)


def main():
    ap = argparse.ArgumentParser(description="This trainer's CPU step time beside PyTorch eager's.")
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--B", type=int, help="batch rows (default: the model's, 4)")
    ap.add_argument("--T", type=int, help="sequence length (default: 256 small, 1024 d12)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each side (default: the cores)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs both, alternating which goes first")
    ap.add_argument("--steps", type=int, help="steps per round and side (default: 4 small, 2 d12)")
    ap.add_argument("--warmup", type=int, default=1, help="steps of each round left out")
    ap.add_argument("--foreach", action="store_true", help="torch AdamW with foreach=True (default: torch's default)")
    # The torch side runs this file again under build/hfenv's python with these.
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    for k in ("L", "C", "NH", "V"):
        ap.add_argument(f"--{k}", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    L, C, NH, V, spec, B, T, steps = MODELS[a.model]
    a.L, a.C, a.NH, a.V = L, C, NH, V
    a.B = a.B or B
    a.T = a.T or T
    a.steps = a.steps or steps
    spec = spec.format(T=a.T)
    if a.model == "d12" and a.T > 1024:
        sys.exit("benchmark_torch.py: d12 holds T <= 1024")
    if a.steps <= a.warmup:
        sys.exit(f"benchmark_torch.py: --steps {a.steps} leaves nothing after --warmup {a.warmup}")
    if not os.path.exists(os.path.join(ROOT, "train_gpt")):
        sys.exit("benchmark_torch.py: no ./train_gpt (make NO_CUDA=1 train_gpt)")
    if not os.path.exists(HF_PYTHON):
        sys.exit("benchmark_torch.py: no build/hfenv (scripts/setup.sh makes it)")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    env.pop("LLMC_CUDA_GRAPH", None)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    versions = subprocess.run([HF_PYTHON, "-c", "import torch, transformers; "
                               "print('torch', torch.__version__, '/ transformers', transformers.__version__)"],
                              capture_output=True, text=True).stdout.strip() or "torch ? / transformers ?"
    tokens = a.B * a.T
    print(f"benchmark_torch: model={a.model} (L={L} C={C} NH={NH} V={V}) B={a.B} T={a.T} fp32 "
          f"threads={a.threads} rounds={a.rounds} steps/round={a.steps} warmup/round={a.warmup}")
    print(f"  cpu: {cpu_model()} ({os.cpu_count()} logical cores)   {versions}   commit: {commit}")
    print(f"  ours: train_gpt -e {spec} -b {a.B} -t {a.T} (OMP_NUM_THREADS={a.threads})", flush=True)

    ours_all, torch_all, setup = [], [], None
    for r in range(a.rounds):
        order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
        for side in order:
            if side == "ours":
                xs, threads = run_ours(a, spec, env)
                ours_all += xs[a.warmup:]
                print(f"round {r + 1} ours  threads={threads} s/step: {fmt(xs)}", flush=True)
            else:
                xs, setup = run_torch(a, env)
                torch_all += xs[a.warmup:]
                print(f"round {r + 1} torch threads={setup['threads']} s/step: {fmt(xs)}", flush=True)
    print(f"  torch side: torch {setup['torch']}, transformers {setup['transformers']}, attention {setup['attn']} "
          f"({setup['attn_class']}), AdamW foreach={setup['foreach']}, {setup['params']} parameters")

    ours_s = statistics.median(ours_all)
    torch_s = statistics.median(torch_all)
    ours_tps, torch_tps = tokens / ours_s, tokens / torch_s
    ratio = ours_tps / torch_tps
    print(f"ours : median {ours_s:.3f} s/step over {len(ours_all)} steps, {ours_tps:.0f} tokens/s")
    print(f"torch: median {torch_s:.3f} s/step over {len(torch_all)} steps, {torch_tps:.0f} tokens/s")
    print(f"ours/torch tokens/s: {ratio:.3f}")
    # The same figures as "figure NAME VALUE UNIT" lines (scripts/gpu/figures.py).
    print(f"figure ours_s_per_step {ours_s:.4f} s")
    print(f"figure torch_s_per_step {torch_s:.4f} s")
    print(f"figure ours_tokens_per_s {ours_tps:.0f} tok/s")
    print(f"figure torch_tokens_per_s {torch_tps:.0f} tok/s")
    print(f"figure ours_over_torch {ratio:.3f} x")


if __name__ == "__main__":
    main()
