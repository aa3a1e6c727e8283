#!/usr/bin/python3
# tests/reference/test_fp8_grid.py: the FP8 rounding of llmc/backend/fp8.h
# (the one the CPU emulation and the GPU kernels share, docs/fp8.md) bit for
# bit against NumPy's ml_dtypes (float8_e4m3fn and float8_e5m2, an
# independent implementation of the same formats), through
# `build/test_fp8 --encode`. Inputs: random normals at scales from 2^-24 to
# 2^20, every value of each grid with its midpoints and their neighbours,
# values past the largest finite one, infinities, NaN, signed zeros. Our
# quantiser saturates (a magnitude past the largest finite value becomes
# it), so the truth is ml_dtypes' cast of the input clipped to that value;
# NaN must stay NaN. The inputs are fp32 values (what the fp32 backend and a
# GPU quantise): ml_dtypes casts a double through fp32, which would round
# twice. Last line: "N passed, N failed".
import os
import subprocess
import sys
import tempfile

import numpy as np
import ml_dtypes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ROOT, Checks

check = Checks()
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def inputs(dt, fmax, rng):
    grid = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = (0.5 * (grid[:-1] + grid[1:])).astype(np.float32)
    parts = [grid, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))]
    for e in range(-24, 21, 2):
        parts.append(rng.standard_normal(2000) * 2.0 ** e)
    parts.append(np.array([0.0, -0.0, fmax, fmax * 1.01, fmax * 1.5, 1e30, np.inf, -np.inf, np.nan]))
    x = np.concatenate(parts).astype(np.float32).astype(np.float64)
    return np.concatenate([x, -x])


def main():
    rng = np.random.default_rng(8)
    prog = os.path.join(ROOT, "build", "test_fp8")
    with tempfile.TemporaryDirectory(prefix="llmc_fp8_") as tmp:
        for name, (dt, fmax) in FORMATS.items():
            x = inputs(dt, fmax, rng)
            src, dst = os.path.join(tmp, f"{name}.f64"), os.path.join(tmp, f"{name}.u8")
            x.astype("<f8").tofile(src)
            p = subprocess.run([prog, "--encode", name, src, dst], capture_output=True, text=True)
            if not check(p.returncode == 0, f"{name}: test_fp8 --encode failed: {p.stderr[-300:]}"):
                continue
            got = np.fromfile(dst, dtype=np.uint8)
            want = np.clip(x, -fmax, fmax).astype(dt).view(np.uint8)
            nan = np.isnan(x)
            same = (got == want) | (nan & np.isnan(got.view(dt).astype(np.float64)))
            bad = np.flatnonzero(~same)
            check(len(got) == len(x) and bad.size == 0,
                  f"{name}: {bad.size} of {len(x)} bytes differ from ml_dtypes "
                  f"(first: {[(float(x[i]), int(got[i]), int(want[i])) for i in bad[:3]]})")
            print(f"  {name}: {len(x)} values, bytes equal to ml_dtypes {ml_dtypes.__version__}'s "
                  f"(saturated; {int(nan.sum())} NaN kept)")
    sys.exit(check.summary())


if __name__ == "__main__":
    main()
