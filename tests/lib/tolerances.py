"""tests/lib/tolerances.py: the tolerances of tests/lib/tolerances.h, for the
Python checks, so that one file holds every figure.

    from tolerances import TOL      # TOL["kBf16Layout"] == 3e-3
"""
import os
import re

_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tolerances.h")


def load(path=_HEADER):
    """Every `constexpr double kName = value;` line of the header, by name."""
    with open(path) as f:
        found = re.findall(r"^\s*constexpr double (k\w+) = ([0-9.eE+-]+);", f.read(), re.M)
    if not found:
        raise RuntimeError(f"{path}: no tolerances found")
    return {name: float(value) for name, value in found}


TOL = load()
