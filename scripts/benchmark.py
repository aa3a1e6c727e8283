#!/usr/bin/python3
# scripts/benchmark.py: throughput, communication and memory figures of one
# training layout, from the trainer's own reports. Runs train_gpt (under
# mpirun when --np > 1) for a few steps and prints one line:
#   tokens/s (median over the steps after --warmup), MFU (GPU only),
#   bytes moved per step by each group and kind (from metrics.jsonl), and
#   bytes held per rank (model state, activations, peak) from the memory lines,
#   and with --pp the bubble each stage measured from a trace of the run
#   beside the formula (pp-1)/(m·vpp).
# Figures only: nothing here passes or fails (speed targets are not tests).
# Also prints them as "figure NAME VALUE UNIT" lines for scripts/gpu/check.sh.
#   usage: scripts/benchmark.py [--np N] [--steps 20] [--warmup 3] -- TRAIN_GPT_ARGS...
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
    bubble = re.search(r"pipeline bubble \(.*\): (.*); formula \(pp-1\)/\(m\*vpp\) = ([0-9.]+)", p.stdout)
    if bubble:
        for stage, value in re.findall(r"stage (\d+) ([0-9.]+)", bubble.group(1)):
            print(f"figure pipeline_bubble_stage{stage} {value} idle/busy")
        print(f"figure pipeline_bubble_formula {bubble.group(2)} idle/busy")


if __name__ == "__main__":
    main()
