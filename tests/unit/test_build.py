#!/usr/bin/env python3
"""tests/unit/test_build.py: where the Makefile finds the CUDA libraries.

A toolkit installed by NVIDIA's packages keeps them in CUDA_HOME/lib64, one
installed from Python wheels in CUDA_HOME/lib, some in
CUDA_HOME/targets/ARCH/lib; the link line must name the folder that exists
(and nothing under a folder that does not). Checked on fake toolkit trees
with `make -n` (nothing is built): each tree has a stand-in nvcc and an empty
libcudart.so in one place.
Run: python3 tests/unit/test_build.py. Last line: "N passed, N failed".
"""
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

check = Checks()


def fake_toolkit(base, libdir):
    os.makedirs(os.path.join(base, "bin"))
    nvcc = os.path.join(base, "bin", "nvcc")
    with open(nvcc, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(nvcc, 0o755)
    if libdir:
        os.makedirs(os.path.join(base, libdir))
        open(os.path.join(base, libdir, "libcudart.so.13"), "w").close()
    return nvcc


def link_line(tmp, home):
    """The libraries folder the Makefile reports and the -L flags of its link line for toolkit `home`."""
    p = subprocess.run(["make", "-n", "-B", "NVCC=" + os.path.join(home, "bin", "nvcc"), "CUDA_HOME=" + home,
                        "BUILD=" + os.path.join(tmp, "build"), "train_gpt"], cwd=ROOT, capture_output=True, text=True)
    m = re.search(r"building with the CUDA backend \(.*; libraries: (.*)\)\n", p.stdout)
    return p.returncode, (m.group(1) if m else None), re.findall(r"-L(\S+)", p.stdout)


def main():
    if shutil.which("make") is None:
        check(False, "make not found")
        return check.summary()
    arch = platform.machine() + "-linux"
    tmp = tempfile.mkdtemp(prefix="llmc_build_")
    try:
        for libdir in ("lib64", "lib", f"targets/{arch}/lib"):
            home = os.path.join(tmp, libdir.replace("/", "_"))
            fake_toolkit(home, libdir)
            rc, said, flags = link_line(tmp, home)
            want = os.path.join(home, libdir)
            check(rc == 0, f"{libdir}: make -n failed")
            check(said == want, f"{libdir}: the Makefile says the libraries are in {said}, expected {want}")
            check(want in flags, f"{libdir}: -L{want} on the link line (got {flags})")
            check(not any(f.startswith(home) and f != want for f in flags),
                  f"{libdir}: no -L to a folder of the toolkit that does not hold the libraries ({flags})")
        # lib64 wins over lib when both exist (a toolkit with both keeps its own in lib64).
        home = os.path.join(tmp, "both")
        fake_toolkit(home, "lib64")
        os.makedirs(os.path.join(home, "lib"))
        open(os.path.join(home, "lib", "libcudart.so"), "w").close()
        rc, said, _ = link_line(tmp, home)
        check(said == os.path.join(home, "lib64"), f"lib64 and lib: lib64 chosen (got {said})")
        # None in the toolkit: never a -L into it (the dynamic linker's cache, or the defaults).
        home = os.path.join(tmp, "none")
        fake_toolkit(home, None)
        rc, said, flags = link_line(tmp, home)
        check(rc == 0 and said is not None, f"no libraries in the toolkit: make -n runs and says where ({said})")
        check(not any(f.startswith(home) for f in flags), f"no libraries in the toolkit: no -L into it ({flags})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
