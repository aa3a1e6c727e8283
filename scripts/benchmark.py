#!/usr/bin/python3
# scripts/benchmark.py: throughput, communication and memory figures of one
# training layout, from the trainer's own reports. Runs train_gpt (under
# mpirun when --np > 1) for a few steps and prints one line:
#   tokens/s (median over the steps after --warmup), MFU (GPU only),
#   bytes moved per step by each group and kind (from metrics.jsonl), and
#   bytes held per rank (model state, activations, peak) from the memory lines,
#   and with --pp the bubble each stage measured from a trace of the run
#   beside the formula (pp-1)/(m·vpp) (--pp-schedule zb-h1: (pp-1)/(3m);
#   zbv: (pp-1)/(6m));
#   with --breakdown, the step's time by op class (the trainer under
#   LLMC_BREAKDOWN=1, llmc/backend/backend_profile.h: each op between two
#   timing marks, CUDA events on a GPU; the medians over the timed steps),
#   the step's time the classes leave (idle: collectives, gaps), and the
#   planner's prediction of the same classes for the same flags
#   (./train_gpt --plan eval on --hardware, default h100-sxm).
# Figures only: nothing here passes or fails (speed targets are not tests).
# Also prints them as "figure NAME VALUE UNIT" lines for scripts/gpu/check.sh.
#   usage: scripts/benchmark.py [--np N] [--steps 20] [--warmup 3] [--breakdown [--hardware H]] -- TRAIN_GPT_ARGS...
#   e.g.   scripts/benchmark.py --np 4 -- -e d12 -b 8 -t 1024 -z 1 --device cuda
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEM = re.compile(r"memory\[(\d+)\] start: params=(\d+) grads=(\d+) master=(\d+) optimizer=(\d+) activations=(\d+) "
                 r"comm=(\d+) layer_activations=(\d+) .*?total=\S+ \S+ peak=(\S+ \S+)")


def main():
    ap = argparse.ArgumentParser(description="Throughput, traffic and memory of one layout.")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun when > 1)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--breakdown", action="store_true", help="the step's time by op class, and the planner's")
    ap.add_argument("--hardware", default="h100-sxm", help="the planner's profile for --breakdown")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train_gpt's flags")
    a = ap.parse_args()
    args = [x for x in a.train_args if x != "--"]
    out_dir = tempfile.mkdtemp(prefix="llmc_bench_")
    cmd = [os.path.join(ROOT, "train_gpt"), "-x", str(a.steps), "-v", "0", "-s", "0", "-o", out_dir] + args
    if "--pp" in args and "--trace" not in args:  # the bubble is measured from the trace
        cmd += ["--trace", os.path.join(out_dir, "trace.json")]
    if a.np > 1:
        cmd = ["mpirun", "-np", str(a.np)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if a.breakdown:
        env["LLMC_BREAKDOWN"] = "1"
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"benchmark.py: train_gpt failed: {p.stderr.strip()[-500:]}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    timed = steps[a.warmup:] or steps
    tps = statistics.median(s["tokens_per_s"] for s in timed)
    mfu = statistics.median(s.get("mfu", 0) for s in timed)
    comm = {k: v["bytes"] for k, v in timed[-1].get("comm", {}).items()}
    mem = [m.groups() for m in MEM.finditer(p.stdout)]
    state = max(sum(int(x) for x in m[1:5]) for m in mem) if mem else 0
    acts = max(int(m[5]) for m in mem) if mem else 0
    peak = mem[0][8] if mem else "?"
    print(f"benchmark: np={a.np} args='{' '.join(args)}' tokens/s={tps:.0f}"
          + (f" mfu={100 * mfu:.1f}%" if mfu else "")
          + f" bytes_moved/step={sum(comm.values())} {json.dumps(comm)}"
          + f" model_state_bytes/rank={state} activation_bytes/rank={acts} peak(rank0)={peak}")
    # The same figures as "figure NAME VALUE UNIT" lines (scripts/gpu/check.sh records them).
    print(f"figure tokens_per_s {tps:.0f} tok/s")
    if mfu:
        print(f"figure mfu {100 * mfu:.2f} %")
    print(f"figure bytes_moved_per_step {sum(comm.values())} B")
    print(f"figure model_state_bytes_per_rank {state} B")
    print(f"figure activation_bytes_per_rank {acts} B")
    # The step's recorded regions (CUDA graphs under LLMC_CUDA_GRAPH=1): how
    # many were recorded and how many passes replayed one.
    graphs = re.search(r"^step graphs: (\d+) recorded, (\d+) replays", p.stdout, re.M)
    if graphs:
        print(f"figure step_graphs_recorded {graphs.group(1)} graphs")
        print(f"figure step_graph_replays {graphs.group(2)} replays")
    # The whole step as one of them (--sync-free 1, one process): its replays.
    whole = re.search(r"^whole step as one graph: (\d+) recorded, (\d+) replays", p.stdout, re.M)
    if whole:
        print(f"figure whole_step_graph_replays {whole.group(2)} replays")
    if a.breakdown:
        breakdown(timed, args, a, env)
    bubble = re.search(r"pipeline bubble \(.*\): (.*); formula \S+ = ([0-9.]+)", p.stdout)
    if bubble:
        for stage, value in re.findall(r"stage (\d+) ([0-9.]+)", bubble.group(1)):
            print(f"figure pipeline_bubble_stage{stage} {value} idle/busy")
        print(f"figure pipeline_bubble_formula {bubble.group(2)} idle/busy")


# The measured classes the planner's memory_bound covers (its other classes have the same names).
MEMORY_BOUND = ("norm", "activation", "residual", "rope", "moe", "copy")


def breakdown(timed, args, a, env):
    """Prints the step's time by op class (medians over the timed steps),
    what the classes leave of the step (idle), and the planner's prediction."""
    rows = [s["breakdown_ms"] for s in timed if "breakdown_ms" in s]
    if not rows:
        sys.exit("benchmark.py --breakdown: the trainer wrote no breakdown_ms (LLMC_BREAKDOWN=1 unsupported?)")
    step = statistics.median(s["ms"] for s in timed)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    summed = statistics.median(sum(r.values()) for r in rows)
    idle = step - summed
    plan = planned(args, a, env)
    print(f"breakdown (median of {len(rows)} steps; step {step:.2f} ms, its ops {summed:.2f} ms, "
          f"{100 * summed / step:.1f}% of it):")
    print(f"  {'class':<15} {'ms':>9} {'share':>7} {'planned':>9}")
    grouped = dict(med)
    grouped["memory_bound"] = sum(med.get(k, 0) for k in MEMORY_BOUND)
    shown = [k for k in med if k not in MEMORY_BOUND] + list(MEMORY_BOUND) + ["memory_bound"]
    for k in shown:
        want = plan.get(k) if plan else None
        label = f"  {k:<15}" if k not in MEMORY_BOUND else f"    {k:<13}"
        print(f"{label} {grouped[k]:9.3f} {100 * grouped[k] / step:6.1f}% "
              + (f"{want:9.3f}" if want is not None else f"{'':9}"))
    print(f"  {'idle':<15} {idle:9.3f} {100 * idle / step:6.1f}%   (collectives, host work, gaps between ops)")
    for k, v in med.items():
        print(f"figure breakdown_{k}_ms {v:.4f} ms")
    print(f"figure breakdown_memory_bound_ms {grouped['memory_bound']:.4f} ms")
    print(f"figure breakdown_idle_ms {idle:.4f} ms")
    print(f"figure breakdown_step_ms {step:.4f} ms")
    print(f"figure breakdown_ops_over_step {summed / step:.4f} ratio")
    for k, v in (plan or {}).items():
        print(f"figure breakdown_planned_{k}_ms {v:.4f} ms")


def planned(args, a, env):
    """The planner's classes for the same flags (the run's own, as --plan eval
    takes them), on --hardware; None when it cannot plan them."""
    keep, skip = [], {"-o", "-x", "-v", "-s", "-i", "-j", "--trace"}
    it = iter(args)
    for x in it:
        if x in skip:
            next(it, None)
        else:
            keep.append(x)
    out = tempfile.mktemp(prefix="llmc_plan_", suffix=".jsonl")
    cmd = [os.path.join(ROOT, "train_gpt"), "--plan", "eval", "--world", str(a.np), "--hardware", a.hardware,
           "--plan-json", out] + keep
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(env, LLMC_BREAKDOWN="0"))
    if p.returncode != 0 or not os.path.exists(out):
        print(f"breakdown: no plan ({(p.stderr or p.stdout).strip()[-200:]})")
        return None
    with open(out) as f:
        row = json.loads(f.readline())
    os.unlink(out)
    return row.get("classes_ms")


if __name__ == "__main__":
    main()
