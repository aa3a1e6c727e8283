#!/usr/bin/python3
# tests/e2e/test_breakdown.py: the step's time by op class (LLMC_BREAKDOWN=1,
# llmc/backend/backend_profile.h; scripts/benchmark.py --breakdown) and the
# planner's prediction of the same classes.
#   - profiling changes nothing: the losses and the final weights of a run
#     under LLMC_BREAKDOWN=1 are those of the run without, bit for bit
#     (GPT-2, Llama, dp2 with ZeRO-1, and with recorded regions asked for);
#   - every step's breakdown_ms names every class once, each at least 0;
#     the classes a model's ops belong to are the ones that took time (GPT-2:
#     its four products, the head, attention both ways, norms, embeddings,
#     the optimizer; Llama adds its activation and rotary embeddings), and
#     those it has no op of took none (GPT-2: rope, moe); with --fp8 1 the
#     FP8 products and their operands' amax count to their layers;
#   - the ops lie inside the step: their sum is at most the step's time and,
#     in one process (the host work between them small, no collectives to
#     wait for), more than half of it;
#   - a malformed LLMC_BREAKDOWN is refused naming the variable;
#   - the planner's classes (--plan eval --plan-json, classes_ms) add up to
#     its compute and optimizer time for a one-stage layout (the formula's
#     parts, docs/design.md section 10), and scripts/benchmark.py
#     --breakdown prints the measured and the planned classes side by side.
# Last line: "N passed, N failed".
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from testlib import Checks, run_suite  # noqa: E402

TRAIN = os.path.join(ROOT, "train_gpt")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
CLASSES = ["embed", "qkv", "attproj", "fc", "fcproj", "head", "attention_fwd", "attention_bwd", "norm", "activation",
           "residual", "rope", "moe", "optimizer", "copy"]
GPT2 = ["-e", "L=2,C=64,NH=4,V=257,T=64"]
LLAMA = ["-e", "arch=llama,L=2,C=64,NH=4,NKV=2,F=96,V=257,T=64"]
c = Checks()


def run(args, breakdown, np=1, extra_env=None):
    cmd = ([TRAIN] if np == 1 else ["mpirun", "-np", str(np), TRAIN]) + args
    env = dict(ENV, LLMC_BREAKDOWN="1" if breakdown else "0")
    env.update(extra_env or {})
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout, p.stderr


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def same_run(tmp, name, args, np=1, extra_env=None):
    """The run with and without profiling: equal losses and weights; returns the profiled metrics."""
    a, b = os.path.join(tmp, name + "_plain"), os.path.join(tmp, name + "_timed")
    os.makedirs(a), os.makedirs(b)
    common = args + ["-b", "4", "-x", "4", "-v", "0", "-s", "0"]
    rc1, _, e1 = run(common + ["-o", a, "--export-hf", os.path.join(a, "hf")], False, np, extra_env)
    rc2, _, e2 = run(common + ["-o", b, "--export-hf", os.path.join(b, "hf")], True, np, extra_env)
    if not c(rc1 == 0 and rc2 == 0, f"{name}: runs failed: {e1[-300:]} {e2[-300:]}"):
        return []
    ma, mb = metrics(a), metrics(b)
    c([m["loss"] for m in ma] == [m["loss"] for m in mb], f"{name}: profiling changed the losses")
    with open(os.path.join(a, "hf", "model.safetensors"), "rb") as f, \
            open(os.path.join(b, "hf", "model.safetensors"), "rb") as g:
        c(f.read() == g.read(), f"{name}: profiling changed the final weights")
    c(all("breakdown_ms" not in m for m in ma), f"{name}: a run without LLMC_BREAKDOWN wrote a breakdown")
    return mb


def check_classes(name, steps, busy, idle, min_share=0.5):
    if not c(steps and all("breakdown_ms" in m for m in steps), f"{name}: every step has breakdown_ms"):
        return
    for m in steps:
        b = m["breakdown_ms"]
        c(list(b) == CLASSES, f"{name} step {m['step']}: the classes {list(b)}")
        c(all(v >= 0 for v in b.values()), f"{name} step {m['step']}: a negative time {b}")
        total = sum(b.values())
        c(total <= m["ms"] * 1.001 + 0.01, f"{name} step {m['step']}: ops {total:.3f} ms over the step {m['ms']:.3f}")
        c(total > min_share * m["ms"], f"{name} step {m['step']}: ops {total:.3f} ms, under {min_share} of the step "
          f"{m['ms']:.3f}")
    last = steps[-1]["breakdown_ms"]
    for k in busy:
        c(any(m["breakdown_ms"][k] > 0 for m in steps), f"{name}: class {k} took no time: {last}")
    for k in idle:
        c(all(m["breakdown_ms"][k] == 0 for m in steps), f"{name}: class {k} took time: {last}")


def test_runs(tmp):
    gpt2_busy = ["embed", "qkv", "attproj", "fc", "fcproj", "head", "attention_fwd", "attention_bwd", "norm",
                 "optimizer"]
    check_classes("gpt-2", same_run(tmp, "gpt2", GPT2), gpt2_busy, ["rope", "moe"])
    check_classes("llama", same_run(tmp, "llama", LLAMA), gpt2_busy + ["activation", "rope"], ["moe"])
    # (With ranks, the step also waits for the collectives: no floor on the ops' share.)
    check_classes("dp2 zero-1", same_run(tmp, "dp2", GPT2 + ["-z", "1"], np=2), gpt2_busy, ["rope", "moe"], 0)
    # --fp8 1: the FP8 products count to their layers (their amax ops too),
    # not to copy, where an op of no known class goes.
    steps = same_run(tmp, "fp8", GPT2 + ["--fp8", "1"])
    check_classes("--fp8 1", steps, gpt2_busy, ["rope", "moe"])
    for m in steps:
        b = m["breakdown_ms"]
        products = b["qkv"] + b["attproj"] + b["fc"] + b["fcproj"]
        c(b["copy"] < products / 4, f"--fp8 1 step {m['step']}: copy {b['copy']} ms against the products' {products}")
    # Recorded regions are off while profiling: every op is seen, the run the same.
    steps = same_run(tmp, "graph", GPT2, extra_env={"LLMC_CPU_GRAPH": "1"})
    check_classes("with LLMC_CPU_GRAPH=1", steps, gpt2_busy, ["rope", "moe"])
    rc, _, err = run(GPT2 + ["-x", "1"], False, extra_env={"LLMC_BREAKDOWN": "yes please"})
    c(rc != 0 and "LLMC_BREAKDOWN" in err, f"a malformed LLMC_BREAKDOWN is refused naming it: rc={rc} {err[-200:]}")


def test_planner(tmp):
    out = os.path.join(tmp, "plan.jsonl")
    p = subprocess.run([TRAIN, "--plan", "eval", "-e", "d12", "-b", "16", "-t", "1024", "-r", "1", "--world", "1",
                        "-d", "16384", "--plan-json", out], cwd=ROOT, capture_output=True, text=True, env=ENV)
    if not c(p.returncode == 0, f"plan eval: {p.stderr[-300:]}"):
        return
    with open(out) as f:
        row = json.loads(f.readline())
    cl, bd = row.get("classes_ms", {}), row["breakdown_ms"]
    want = ["qkv", "attproj", "fc", "fcproj", "attention_fwd", "attention_bwd", "memory_bound", "embed", "head",
            "optimizer"]
    c(sorted(cl) == sorted(want), f"the planner's classes: {sorted(cl)}")
    c(all(v > 0 for v in cl.values()), f"every planned class takes time: {cl}")
    total, parts = sum(cl.values()), bd["compute"] + bd["optimizer"]
    c(abs(total - parts) <= 1e-9 * parts, f"the planned classes add up to compute + optimizer: {total} vs {parts}")
    # GPT-2's MLP products are 4x its attention output's (C x 4C against C x C).
    c(abs(cl["fc"] / cl["attproj"] - 4) < 1.5, f"fc / attproj planned {cl['fc'] / cl['attproj']:.2f} (about 4)")
    p = subprocess.run([sys.executable, "scripts/benchmark.py", "--steps", "4", "--warmup", "1", "--breakdown", "--"]
                       + GPT2 + ["-b", "4"], cwd=ROOT, capture_output=True, text=True, env=ENV, timeout=300)
    figs = dict(line.split()[1:3] for line in p.stdout.splitlines() if line.startswith("figure "))
    c(p.returncode == 0 and "breakdown_qkv_ms" in figs and "breakdown_planned_qkv_ms" in figs
      and "breakdown_idle_ms" in figs, f"benchmark.py --breakdown prints measured and planned: {p.stdout[-400:]}")
    c("  idle" in p.stdout and "planned" in p.stdout, "benchmark.py --breakdown prints its table")


def body(tmp):
    test_runs(tmp)
    test_planner(tmp)


if __name__ == "__main__":
    run_suite(c, "llmc_breakdown_", body)
