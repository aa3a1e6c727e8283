#!/usr/bin/env python3
# scripts/gpu/figures.py: appends measured figures as JSON lines, one object
# per figure, in the format of docs/gpu-results.jsonl:
#   {"date", "device", "commit", "phase", "name", "value", "unit", "command"}
# Figures come from "figure NAME VALUE UNIT" lines in a program's output (the
# test programs, the kernel lab, scripts/benchmark.py and scripts/gpu/*.py
# print them), or one figure from --name/--value/--unit. date is UTC, taken
# when the figure is written; device and commit come from the environment
# (GPU_DEVICE, GPU_COMMIT; scripts/gpu/check.sh sets both). A value that is
# not a finite number is skipped with a warning: nothing but measured numbers
# goes in. Every figure is appended and flushed as soon as it is read, so a
# run killed halfway leaves every figure measured before.
#   usage: scripts/gpu/figures.py --out FILE --phase P --command CMD [--prefix X]
#                                 (--log LOG | --name N --value V --unit U)
#          PROGRAM | scripts/gpu/figures.py --stream --tee LOG [--out FILE --phase P
#                                 --command CMD --prefix X] [--summary FILE --match REGEX]
# --stream reads a running program's output line by line: every line goes to
# LOG at once, every figure line to FILE at once, and the lines matching
# REGEX to FILE --summary and to stdout (the one-screen summary, as it grows).
import argparse
import datetime
import json
import math
import os
import re
import sys

FIGURE = re.compile(r"^figure (\S+) (\S+) (\S+)\s*$")


def record(out, phase, command, name, value, unit):
    """Appends one figure to out (flushed); False when value is not a finite number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v):
        print(f"figures.py: {name}: value {value!r} is not a finite number; not recorded", file=sys.stderr)
        return False
    if v == int(v) and abs(v) < 2**53 and "." not in value and "e" not in value.lower():
        v = int(v)
    row = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": os.environ.get("GPU_DEVICE", "unknown"),
        "commit": os.environ.get("GPU_COMMIT", "unknown"),
        "phase": phase,
        "name": name,
        "value": v,
        "unit": unit,
        "command": command,
    }
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
    return True


def stream(a):
    match = re.compile(a.match) if a.match else None
    log = open(a.tee, "a", errors="replace") if a.tee else None
    for raw in sys.stdin.buffer:
        line = raw.decode("utf-8", errors="replace")
        if log:
            log.write(line)
            log.flush()
        text = line.rstrip("\n")
        m = FIGURE.match(text)
        if m and a.out:
            record(a.out, a.phase, a.command, a.prefix + m.group(1), m.group(2), m.group(3))
        if match and match.search(text):
            print(text, flush=True)
            if a.summary:
                with open(a.summary, "a") as s:
                    s.write(text + "\n")
    if log:
        log.close()


def main():
    ap = argparse.ArgumentParser(description="Appends figures as JSON lines.")
    ap.add_argument("--out", help="the JSON-lines file figures are appended to")
    ap.add_argument("--phase", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--prefix", default="", help="prepended to every name read from a log or the stream")
    ap.add_argument("--log")
    ap.add_argument("--name")
    ap.add_argument("--value")
    ap.add_argument("--unit", default="")
    ap.add_argument("--stream", action="store_true", help="read a program's output from stdin as it comes")
    ap.add_argument("--tee", help="with --stream: every line also goes to this file")
    ap.add_argument("--summary", help="with --stream: lines matching --match are appended here")
    ap.add_argument("--match", help="with --stream: a regular expression for the summary lines")
    a = ap.parse_args()
    if a.stream:
        stream(a)
        return
    if not a.out or not a.phase or not a.command:
        ap.error("--out, --phase and --command are required without --stream")
    n = 0
    if a.log:
        try:
            with open(a.log, errors="replace") as f:
                for line in f:
                    m = FIGURE.match(line)
                    if m:
                        n += record(a.out, a.phase, a.command, a.prefix + m.group(1), m.group(2), m.group(3))
        except OSError as e:
            sys.exit(f"figures.py: {a.log}: {e.strerror}")
    if a.name is not None:
        n += record(a.out, a.phase, a.command, a.name, a.value, a.unit)
    return n


if __name__ == "__main__":
    main()
