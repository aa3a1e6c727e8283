#!/usr/bin/python3
# scripts/plot_metrics.py: draws the loss curves of one or more training runs
# from their metrics.jsonl (written by train_gpt -o DIR) into a PNG:
# training loss, validation loss where measured, and panels of the gradient
# norm, the learning rate and tokens/s; x in steps or (--x tokens) tokens
# seen. --labels names the runs (default: their folders); --zoom K adds a
# panel of the first K steps (where a short run, e.g. the CPU's 20 steps,
# overlaps a long GPU one); --title sets a title.
#   usage: scripts/plot_metrics.py RUN/metrics.jsonl [MORE.jsonl ...] -o loss.png
#          [--labels A,B] [--zoom K] [--title TEXT] [--x step|tokens]
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
    ap.add_argument("--x", choices=("step", "tokens"), default="step", help="x axis: optimizer steps or tokens seen")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.metrics):
        sys.exit(f"plot_metrics.py: {len(labels)} labels for {len(args.metrics)} runs")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Panels: loss (train and val), then optionally the first K steps, then
    # gradient norm, learning rate and tokens/s; x in steps or tokens.
    n = 5 if args.zoom > 0 else 4
    ratios = [3, 2, 1, 1, 1] if args.zoom > 0 else [3, 1, 1, 1]
    fig, axes = plt.subplots(n, 1, figsize=(9, 3 + 2 * n), gridspec_kw={"height_ratios": ratios})
    ax, axz = axes[0], axes[1] if args.zoom > 0 else None
    ax_norm, ax_lr, ax_tps = axes[-3], axes[-2], axes[-1]
    for i, path in enumerate(args.metrics):
        rows = load(path)
        name = labels[i] if labels else os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        steps = [r["step"] for r in rows]  # counted from 1, as the console
        xs = [r.get("tokens", 0) for r in rows] if args.x == "tokens" else steps
        xval = dict(zip(steps, xs))
        line, = ax.plot(xs, [r["loss"] for r in rows], lw=1, alpha=0.8, label=f"{name} train")
        val = [(xval[r["step"]], r["val_loss"]) for r in rows if "val_loss" in r]
        if val:
            ax.plot(*zip(*val), "o-", color=line.get_color(), ms=3, label=f"{name} val")
        if axz is not None:
            first = [(st, r["loss"]) for st, r in zip(steps, rows) if st <= args.zoom]
            if first:
                axz.plot(*zip(*first), ".-", lw=1, color=line.get_color(), label=name)
        c = line.get_color()
        ax_norm.plot(xs, [r["grad_norm"] for r in rows], lw=0.8, color=c, label=name)
        ax_lr.plot(xs, [r["lr"] for r in rows], lw=0.8, color=c, label=name)
        ax_tps.plot(xs, [r.get("tokens_per_s", 0) for r in rows], lw=0.8, color=c, label=name)
    if args.title:
        ax.set_title(args.title)
    if axz is not None:
        axz.set_ylabel(f"loss, steps 1-{args.zoom}")
        axz.grid(alpha=0.3)
        axz.legend()
    ax.set_ylabel("loss")
    ax.legend()
    ax_norm.set_yscale("log")
    ax_norm.set_ylabel("grad norm")
    ax_lr.set_ylabel("lr")
    ax_tps.set_ylabel("tokens/s")
    for a in (ax, ax_norm, ax_lr, ax_tps):
        a.grid(alpha=0.3)
        a.set_xlabel("tokens" if args.x == "tokens" else "step")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
