#!/usr/bin/python3
# scripts/plot_plan.py: draws the layouts of a plan (./train_gpt --plan search
# --plan-json FILE) as memory per device against tokens/s: every layout a
# point (filled when it fits), the Pareto frontier of the fitting ones (no
# other layout is both faster and smaller) as a line, the memory a rank may
# use (the device's less the runtime's reserve, from the JSON lines) as a
# horizontal line, the winner marked; the title names the model, the world
# and the hardware.
#   scripts/plot_plan.py plan.jsonl -o plan.png [--memory-gib G] [--title T]
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def frontier(points):
    """The fitting layouts no other fitting layout beats on both speed and memory, by memory."""
    pts = sorted(points, key=lambda p: (p["memory_bytes"], -p["tokens_per_s"]))
    out, best = [], -1.0
    for p in pts:
        if p["tokens_per_s"] > best:
            out.append(p)
            best = p["tokens_per_s"]
    return out


def label(p):
    sched = p.get("pp_schedule", "")
    vpp = f" {sched}" if sched in ("zb-h1", "zbv") else f" vpp{p['vpp']}" if p.get("vpp", 1) > 1 else ""
    return (f"pp{p['pp']}{vpp} dp{p['dp']} cp{p['cp']} tp{p['tp']}{' sp' if p['sp'] else ''} z{p['zero']} "
            f"B{p['B']} {p['recompute']}")


def memory_line(plans, memory_gib):
    """(GiB, legend) of the horizontal line: --memory-gib when given, else the usable memory the plan names."""
    if memory_gib > 0:
        return memory_gib, f"device memory {memory_gib:g} GiB"
    usable = plans[0].get("usable_memory_bytes", 0)
    if usable > 0:
        device = plans[0].get("device_memory_bytes", 0) / 2.0 ** 30
        return usable / 2.0 ** 30, f"usable memory {usable / 2.0 ** 30:.1f} GiB (device {device:.1f} less the runtime's reserve)"
    return 0, ""


def title(plans, fit):
    """The model, the world and the hardware the plan is for, and how many layouts fit."""
    p = plans[0]
    if "model" not in p:
        return f"{len(plans)} layouts ({len(fit)} fit)"
    return (f"{p['model']} ({p['params'] / 1e9:.2f}B parameters)\n{p['world']} devices ({p['gpus_per_node']} per node), "
            f"{p['hardware']}: {len(plans)} layouts, {len(fit)} fit")


def main():
    ap = argparse.ArgumentParser(description="Memory per device against tokens/s of every planned layout.")
    ap.add_argument("plan", help="JSON lines from --plan-json")
    ap.add_argument("-o", "--out", default="plan.png")
    ap.add_argument("--memory-gib", type=float, default=0,
                    help="memory line to draw in GiB (0: the usable memory the plan names)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    with open(a.plan) as f:
        plans = [json.loads(line) for line in f if line.strip()]
    if not plans:
        raise SystemExit(f"{a.plan}: no layouts")
    gib = 2.0 ** 30
    fig, ax = plt.subplots(figsize=(9, 6))
    fit = [p for p in plans if p["fits"]]
    nofit = [p for p in plans if not p["fits"]]
    ax.scatter([p["tokens_per_s"] for p in nofit], [p["memory_bytes"] / gib for p in nofit], s=12, facecolors="none",
               edgecolors="tab:gray", label="does not fit")
    ax.scatter([p["tokens_per_s"] for p in fit], [p["memory_bytes"] / gib for p in fit], s=14, color="tab:blue",
               label="fits")
    if fit:
        fr = frontier(fit)
        ax.plot([p["tokens_per_s"] for p in fr], [p["memory_bytes"] / gib for p in fr], color="tab:orange",
                marker="o", label="frontier")
        best = max(fit, key=lambda p: p["tokens_per_s"])
        ax.scatter([best["tokens_per_s"]], [best["memory_bytes"] / gib], s=120, marker="*", color="tab:red", zorder=5,
                   label="winner: " + label(best))
    line, legend = memory_line(plans, a.memory_gib)
    if line > 0:
        ax.axhline(line, color="tab:red", linestyle="--", linewidth=1, label=legend)
    ax.set_xlabel("predicted tokens/s")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.set_title(a.title or title(plans, fit), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"{a.out}: {len(plans)} layouts, {len(fit)} fit; memory line {line:.2f} GiB; title: "
          f"{(a.title or title(plans, fit)).replace(chr(10), ' / ')}; winner: {label(best) if fit else None}")


if __name__ == "__main__":
    main()
