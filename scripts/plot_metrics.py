#!/usr/bin/python3
# scripts/plot_metrics.py: draws the loss curves of one or more training runs
# from their metrics.jsonl (written by train_gpt -o DIR) into a PNG:
# training loss per step, validation loss where measured, and the learning
# gradient norm on a second panel. --labels names the runs (default: their
# folders); --zoom K adds a panel of the first K steps (where a short run,
# e.g. the CPU's 20 steps, overlaps a long GPU one); --title sets a title.
#   usage: scripts/plot_metrics.py RUN/metrics.jsonl [MORE.jsonl ...] -o loss.png
#          [--labels A,B] [--zoom K] [--title TEXT]
import argparse
import json
import os
import sys


def load(path):
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    sys.exit(f"plot_metrics.py: {path}:{n}: not a JSON object")
    except OSError as e:
        sys.exit(f"plot_metrics.py: {path}: {e.strerror}")
    if not rows:
        sys.exit(f"plot_metrics.py: {path}: no steps")
    return rows


def main():
    ap = argparse.ArgumentParser(description="Plots loss curves from metrics.jsonl files.")
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    ap.add_argument("-o", "--out", default="loss.png", help="output PNG")
    ap.add_argument("--labels", help="comma-separated names of the runs (default: their folders)")
    ap.add_argument("--zoom", type=int, default=0, help="also plot the first K steps on their own panel")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.metrics):
        sys.exit(f"plot_metrics.py: {len(labels)} labels for {len(args.metrics)} runs")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.zoom > 0:
        fig, (ax, axz, ax2) = plt.subplots(3, 1, figsize=(9, 10), gridspec_kw={"height_ratios": [3, 2, 1]})
    else:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        axz = None
    for i, path in enumerate(args.metrics):
        rows = load(path)
        name = labels[i] if labels else os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        steps = [r["step"] + 1 for r in rows]
        line, = ax.plot(steps, [r["loss"] for r in rows], lw=1, alpha=0.8, label=f"{name} train")
        val = [(r["step"] + 1, r["val_loss"]) for r in rows if "val_loss" in r]
        if val:
            ax.plot(*zip(*val), "o-", color=line.get_color(), ms=3, label=f"{name} val")
        if axz is not None:
            first = [(st, r["loss"]) for st, r in zip(steps, rows) if st <= args.zoom]
            if first:
                axz.plot(*zip(*first), ".-", lw=1, color=line.get_color(), label=name)
        ax2.plot(steps, [r["grad_norm"] for r in rows], lw=0.8, color=line.get_color(), label=f"{name} grad norm")
    if args.title:
        ax.set_title(args.title)
    if axz is not None:
        axz.set_ylabel(f"loss, steps 1-{args.zoom}")
        axz.grid(alpha=0.3)
        axz.legend()
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("grad norm")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
