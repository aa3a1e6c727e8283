#!/usr/bin/python3
# scripts/benchmark_document_mask.py: what the document mask saves in the CPU
# attention. Times forward + backward (build/attention_bench, fp32) on rows of
# T tokens: plain causal attention, the mask on one document of T tokens, and
# the mask on DOCS documents of T/DOCS tokens; prints the times, the score
# elements the 64-row tiles compute, and the ratios of the masked runs to the
# one-document run beside the ideal 1/DOCS (the visible elements: DOCS
# triangles of (T/DOCS)²/2 against one of T²/2).
# Figures only: nothing here passes or fails. Also prints "figure NAME VALUE
# UNIT" lines like scripts/benchmark.py.
#   usage: scripts/benchmark_document_mask.py [--T 4096] [--docs 32] [--NH 4] [--HS 64] [--reps 5] [--threads N]
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "build", "attention_bench")
LINE = re.compile(r"forward ([0-9.]+) ms backward ([0-9.]+) ms score_elements (\d+)")


def run(a, docs):
    cmd = [BENCH, "--T", str(a.T), "--docs", str(docs), "--NH", str(a.NH), "--HS", str(a.HS), "--reps", str(a.reps)]
    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"benchmark_document_mask.py: {' '.join(cmd)} failed: {p.stderr.strip()[-300:]}")
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def main():
    ap = argparse.ArgumentParser(description="CPU attention time with the document mask.")
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--docs", type=int, default=32, help="documents per row of the masked run")
    ap.add_argument("--NH", type=int, default=4)
    ap.add_argument("--HS", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS (0: as the environment has it)")
    a = ap.parse_args()
    if not os.path.exists(BENCH):
        sys.exit("benchmark_document_mask.py: build/attention_bench is missing (make tests)")
    rows = [("causal, no mask", 0), ("mask, 1 document", 1), (f"mask, {a.docs} documents of {a.T // a.docs}", a.docs)]
    res = {docs: run(a, docs) for _, docs in rows}
    print(f"CPU attention, fp32, T={a.T}, NH={a.NH}, HS={a.HS}, forward + backward (median of {a.reps}):")
    for name, docs in rows:
        f, b, w = res[docs]
        print(f"  {name:34s} forward {f:9.2f} ms  backward {b:9.2f} ms  total {f + b:9.2f} ms  "
              f"score elements {w}")
    f1, b1, w1 = res[1]
    fm, bm, wm = res[a.docs]
    print(f"  {a.docs} documents / 1 document: time {(fm + bm) / (f1 + b1):.4f} (1/{(f1 + b1) / (fm + bm):.1f}; "
          f"forward 1/{f1 / fm:.1f}, backward 1/{b1 / bm:.1f}), computed score elements {wm / w1:.4f} "
          f"(1/{w1 / wm:.1f}), visible elements 1/{a.docs} = {1 / a.docs:.4f}")
    print(f"figure docmask_time_ratio {(fm + bm) / (f1 + b1):.4f} x")
    print(f"figure docmask_work_ratio {wm / w1:.4f} x")
    print(f"figure docmask_attention_ms {fm + bm:.2f} ms")
    print(f"figure causal_attention_ms {f1 + b1:.2f} ms")


if __name__ == "__main__":
    main()
