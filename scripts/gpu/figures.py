#!/usr/bin/env python3
# scripts/gpu/figures.py: appends measured figures as JSON lines, one object
# per figure, in the format of docs/gpu-results.jsonl:
#   {"date", "device", "commit", "phase", "name", "value", "unit", "command"}
# Figures come from "figure NAME VALUE UNIT" lines in a program's log (the
# test programs, the kernel lab, scripts/benchmark.py and scripts/gpu/*.py
# print them), or one figure from --name/--value/--unit. date is UTC; device
# and commit come from the environment (GPU_DEVICE, GPU_COMMIT;
# scripts/gpu/check.sh and scripts/gpu/bench_vs_llmc.sh set both). A value
# that is not a finite number is skipped with a warning: nothing but measured
# numbers goes in.
#   usage: scripts/gpu/figures.py --out FILE --phase P --command CMD [--prefix X]
#                                 (--log LOG | --name N --value V --unit U)
import argparse
import datetime
import json
import math
import os
import re
import sys

FIGURE = re.compile(r"^figure (\S+) (\S+) (\S+)\s*$")


def main():
    ap = argparse.ArgumentParser(description="Appends figures as JSON lines.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--prefix", default="", help="prepended to every name from --log")
    ap.add_argument("--log")
    ap.add_argument("--name")
    ap.add_argument("--value")
    ap.add_argument("--unit", default="")
    a = ap.parse_args()
    figures = []
    if a.log:
        try:
            with open(a.log, errors="replace") as f:
                for line in f:
                    m = FIGURE.match(line)
                    if m:
                        figures.append((a.prefix + m.group(1), m.group(2), m.group(3)))
        except OSError as e:
            sys.exit(f"figures.py: {a.log}: {e.strerror}")
    if a.name is not None:
        figures.append((a.name, a.value, a.unit))
    base = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": os.environ.get("GPU_DEVICE", "unknown"),
        "commit": os.environ.get("GPU_COMMIT", "unknown"),
        "phase": a.phase,
    }
    n = 0
    with open(a.out, "a") as out:
        for name, value, unit in figures:
            try:
                v = float(value)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                print(f"figures.py: {name}: value {value!r} is not a finite number; not recorded", file=sys.stderr)
                continue
            if v == int(v) and abs(v) < 2**53 and "." not in value and "e" not in value.lower():
                v = int(v)
            out.write(json.dumps(dict(base, name=name, value=v, unit=unit, command=a.command)) + "\n")
            n += 1
    return n


if __name__ == "__main__":
    main()
