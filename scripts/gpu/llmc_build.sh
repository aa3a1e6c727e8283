#!/usr/bin/env bash
# scripts/gpu/llmc_build.sh [--cudnn FRONTEND] LLMC_SRC: builds llm.c's
# train_gpt2cu for the side-by-side benchmark (scripts/gpu/check.sh bench
# and peers) in build/gpu/llmc, from the repository root of this tree, on a
# GPU machine or (for a bundle) on a machine with nvcc alone.
#   --cudnn FRONTEND  llm.c's production build instead, in build/gpu/llmc_cudnn:
#             USE_CUDNN=1 (cuDNN's flash attention), FRONTEND a checkout of
#             https://github.com/NVIDIA/cudnn-frontend (headers only: its
#             include/; the bundle's copy is build/gpu/deps/cudnn_frontend),
#             cuDNN 9 from the CUDA toolkit or from PyTorch's nvidia-cudnn
#             wheel (CUDNN_INCLUDE, CUDNN_LIB: the folders of cudnn.h and
#             libcudnn.so; found by scripts/gpu/env.sh when unset), and the
#             libraries the frontend's newer versions call (nvrtc, the driver).
#   LLMC_SRC  an llm.c source tree: `git clone https://github.com/karpathy/llm.c`,
#             or the copy in the bundle (scripts/gpu/bundle.sh --llmc),
#             unpacked by scripts/gpu/env.sh to build/gpu/deps/llmc_src. It is
#             left untouched: its Makefile, train_gpt2.cu and llmc/ are copied
#             to build/gpu/llmc, patched there (two small patches, below) and
#             built with
#               make train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 \
#                    GPU_COMPUTE_CAPABILITY=<the GPU's, e.g. 90> [NVML, or -DNO_NVML]
#             (no cuDNN flash attention, no NCCL/MPI: one GPU, llm.c's own
#             kernels). Without a GPU: compute capability LLMC_CC (default
#             90); LLMC_NO_NVML=1 leaves NVML out (the bundle's prebuilt copy).
# Nothing is built when build/gpu/llmc/stamp names these sources and flags,
# with or without NVML (NVML only logs GPU use), so a binary the bundle
# brings (bundle.sh --prebuilt --llmc) is taken as it is. Exit status 0 when
# build/gpu/llmc/train_gpt2cu (with --cudnn, build/gpu/llmc_cudnn/...) is ready.
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
FRONTEND=
if [[ ${1:-} == --cudnn ]]; then
    [[ $# -ge 2 && -f $2/include/cudnn_frontend.h ]] ||
        { echo "llmc_build.sh: --cudnn ${2:-}: not a cudnn-frontend checkout (its include/cudnn_frontend.h)" >&2; exit 2; }
    FRONTEND=$(cd "$2" && pwd)
    shift 2
fi
[[ $# -eq 1 && -n $1 && $1 != -h && $1 != --help ]] || usage
[[ -f $1/train_gpt2.cu ]] ||
    { echo "llmc_build.sh: $1 is not an llm.c source tree (git clone https://github.com/karpathy/llm.c)" >&2; exit 2; }
SRC=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.." || exit 1
PY=python3
command -v "$PY" > /dev/null || PY=/usr/bin/python3
GPU_DEPS=${GPU_DEPS:-$PWD/build/gpu/deps}
source scripts/gpu/archive.sh  # commit_of
LLMC_COMMIT=$(commit_of "$SRC")
CC_=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
[[ $CC_ =~ ^[0-9]+$ ]] || CC_=${LLMC_CC:-90}
NVML_LIB=$( (ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}');
            find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libnvidia-ml.so.1' 2>/dev/null | head -n 1)
NVML_LIB=$(echo "$NVML_LIB" | head -n 1)
[[ ${LLMC_NO_NVML:-0} == 1 ]] && NVML_LIB=
BASE=(USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="$CC_")
NO_NVML=("${BASE[@]}" NVCC_LDFLAGS="-lcublas -lcublasLt" PFLAGS="-DENABLE_BF16 -DNO_NVML")
if [[ -n $NVML_LIB ]]; then
    mkdir -p "$GPU_DEPS/nvml" && ln -sf "$NVML_LIB" "$GPU_DEPS/nvml/libnvidia-ml.so"
    FLAGS=("${BASE[@]}" NVCC_LDFLAGS="-lcublas -lcublasLt -L$GPU_DEPS/nvml -lnvidia-ml")
else
    FLAGS=("${NO_NVML[@]}")
fi
LB=build/gpu/llmc
if [[ -n $FRONTEND ]]; then
    # The cuDNN build: the frontend's headers by path, cuDNN's own by
    # CUDNN_INCLUDE (appended to the path llm.c's Makefile adds, as its
    # Windows branch does), libraries by CUDNN_LIB, nvrtc and the driver for
    # the frontend's runtime-compiled kernels (the stub at link time).
    LB=build/gpu/llmc_cudnn
    CUDA_HOME_=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
    FE_COMMIT=$(commit_of "$FRONTEND")
    FE_PATH=cudnn-frontend/include${CUDNN_INCLUDE:+ -I$CUDNN_INCLUDE}  # relative to $LB: the link below
    LIBS="-lcublas -lcublasLt -lcudnn -lnvrtc -L$CUDA_HOME_/lib64/stubs -L$CUDA_HOME_/lib/stubs -lcuda"
    [[ -n ${CUDNN_LIB:-} ]] && LIBS="-L$CUDNN_LIB -Xlinker -rpath=$CUDNN_LIB $LIBS"
    BASE=(USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="$CC_" CUDNN_FRONTEND_PATH="$FE_PATH")
    NO_NVML=("${BASE[@]}" NVCC_LDFLAGS="$LIBS" PFLAGS="-DENABLE_BF16 -DNO_NVML")
    if [[ -n $NVML_LIB ]]; then FLAGS=("${BASE[@]}" NVCC_LDFLAGS="$LIBS -L$GPU_DEPS/nvml -lnvidia-ml")
    else FLAGS=("${NO_NVML[@]}"); fi
    LLMC_COMMIT="$LLMC_COMMIT cudnn-frontend $FE_COMMIT"
fi
SUM=$( (cd "$SRC" && cat Makefile train_gpt2.cu llmc/*) | md5sum | cut -c1-32)
STAMP="$LLMC_COMMIT $SUM ${FLAGS[*]}"
# The cuDNN build's stamp names no folder of this machine, so a binary built
# elsewhere (the bundle's) is taken when its libraries resolve here.
[[ -n $FRONTEND ]] && STAMP="$LLMC_COMMIT $SUM USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=$CC_"
if [[ -x $LB/train_gpt2cu ]] && ldd "$LB/train_gpt2cu" 2>/dev/null | grep -q 'not found'; then
    echo "llmc_build.sh: $LB/train_gpt2cu does not find its libraries here: rebuilding"
elif [[ -x $LB/train_gpt2cu && ( $(cat "$LB/stamp" 2>/dev/null) == "$STAMP" ||
        ( -z $FRONTEND && $(cat "$LB/stamp" 2>/dev/null) == "$LLMC_COMMIT $SUM ${NO_NVML[*]}" ) ) ]]; then
    echo "llm.c ($LLMC_COMMIT): $LB/train_gpt2cu is up to date"
    exit 0
fi
rm -rf "$LB" && mkdir -p "$LB"
cp -r "$SRC/Makefile" "$SRC/train_gpt2.cu" "$SRC/llmc" "$LB/"
# llm.c's Makefile looks for ./cudnn-frontend/include before it takes CUDNN_FRONTEND_PATH.
[[ -n $FRONTEND ]] && ln -sfn "$FRONTEND" "$LB/cudnn-frontend"
# Patch 1: on device OOM llm.c falls back to cudaMallocManaged (which CUDA 13
# no longer compiles, cudaMemAdvise wanting a cudaMemLocation, and which can
# hang a GPU when oversubscribed): stop with a message.
"$PY" - "$LB/llmc/cuda_utils.cuh" <<'PYEOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = """        cudaCheck_(cudaMallocManaged(out, bytes), file, line);
        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);
        return 1;"""
new = """        fprintf(stderr, "out of device memory (%zu bytes); no managed-memory fallback in this build\\n", bytes);
        exit(EXIT_FAILURE);"""
if old in s:
    open(p, "w").write(s.replace(old, new))
else:
    print("llmc_build.sh: llm.c's cuda_utils.cuh differs from the expected; managed-memory patch not applied")
PYEOF
# Patch 2: NVML (GPU utilisation logging only) optional with -DNO_NVML, for
# a machine where no libnvidia-ml.so can be linked.
sed -i 's/^#if __has_include(<nvml.h>)$/#if __has_include(<nvml.h>) \&\& !defined(NO_NVML)/' "$LB/llmc/mfu.h"
grep -q 'defined(NO_NVML)' "$LB/llmc/mfu.h" || echo "llmc_build.sh: llm.c's mfu.h differs; NVML patch not applied"
echo "building llm.c ($LLMC_COMMIT) in $LB: make train_gpt2cu ${FLAGS[*]}"
t0=$SECONDS
make -C "$LB" train_gpt2cu "${FLAGS[@]}" > "$LB/make.log" 2>&1 || { tail -n 20 "$LB/make.log"; exit 1; }
echo "$STAMP" > "$LB/stamp"
echo "built $LB/train_gpt2cu in $((SECONDS - t0)) s"
