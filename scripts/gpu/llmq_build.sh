#!/usr/bin/env bash
# scripts/gpu/llmq_build.sh LLMQ_SRC: builds llm.q's `train` (IST-DASLab's
# quantized LLM trainer, https://github.com/IST-DASLab/llmq) for a
# side-by-side benchmark of Qwen2.5 shapes, in build/gpu/llmq, from the
# repository root of this tree, on a GPU machine or (for a bundle) on a
# machine with nvcc alone; no network is used.
#   LLMQ_SRC  llm.q's sources: `git clone https://github.com/IST-DASLab/llmq`,
#             or the bundle's copy (scripts/gpu/bundle.sh --llmq), unpacked
#             by scripts/gpu/env.sh to build/gpu/deps/llmq_src. Left
#             untouched: CMake builds out of source, in build/gpu/llmq/cmake.
#   LLMQ_DEPS (default build/gpu/deps/llmq_deps, the bundle's copy) one
#             folder per CMake FetchContent dependency, each handed to CMake
#             as FETCHCONTENT_SOURCE_DIR_<NAME> with
#             FETCHCONTENT_FULLY_DISCONNECTED=ON:
#               json      https://github.com/nlohmann/json v3.11.3 (llm.q asks
#                         for the 3.12.0 release; 3.11.3 builds it)
#               cudnn-fe  https://github.com/NVIDIA/cudnn-frontend v1.12.0
#               cli11     https://github.com/CLIUtils/CLI11 v2.6.1
#               fmt       https://github.com/fmtlib/fmt 12.0.0
#               catch2    https://github.com/catchorg/Catch2 v3.6.0 (configured,
#                         never built: llm.q's CMakeLists always adds it)
#             (nanobind, for llm.q's Python bindings only, is not needed.)
#             A folder's commit is its COMMIT file's first line, else git's.
# It runs
#   cmake -S LLMQ_SRC -B build/gpu/llmq/cmake -DCMAKE_BUILD_TYPE=Release \
#         -DCMAKE_CUDA_ARCHITECTURES=90 -DUSE_MPI=OFF -DUSE_CUFILE=OFF \
#         -DUSE_NVML=OFF -DBUILD_TESTS=OFF -DPYTHON_BINDING=OFF \
#         -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON (+ the dependencies, NCCL, cuDNN)
#   cmake --build build/gpu/llmq/cmake --target train
# and copies train and libllmq-common.so (found beside it through $ORIGIN)
# to build/gpu/llmq. Single GPU, no MPI (llm.q's thread launcher); no cuFile
# and no NVML (file reads and GPU-utilisation logging take llm.q's fallbacks).
# sm_90 (H100, H200) unless LLMQ_CUDA_ARCH says otherwise (e.g. 100).
# NCCL: NCCL_INCLUDE_DIR / NCCL_LIB_DIR (folders of nccl.h and libnccl.so;
# scripts/gpu/env.sh exports them, the toolkit's or PyTorch's nvidia-nccl
# wheel's), else the CUDA toolkit's. cuDNN 9: CUDNN_INCLUDE / CUDNN_LIB (the
# folders of cudnn.h and libcudnn.so, as env.sh exports them), else the
# toolkit's. Needs cmake >= 3.25 and ninja or make.
# Nothing is built when build/gpu/llmq/stamp (llm.q's commit and source
# hash, the dependencies' commits, the flags; no paths) matches and train
# finds its libraries (ldd), so the binary a bundle brings
# (scripts/gpu/bundle.sh --prebuilt --llmq) is taken as it is. Exit status
# 0 when build/gpu/llmq/train is ready, 2 on bad arguments.
#
# Running it (random initialisation: llm.q takes Qwen2.5-0.5B's and -1.5B's
# shapes from the name with --from-scratch; nothing is downloaded, and no
# folder of that name may exist in the working directory). Tokens: llm.q's
# BIN.TOK files; scripts/gpu/llmq_tokens.py makes one from this trainer's
# shard (the same int32 tokens, another header). bf16 (bf16 weights; the
# Adam states fp32 by default, bf16 in llm.q's published recipe):
#   build/gpu/llmq/train --model=Qwen2.5-0.5B --from-scratch \
#       --train-file=TRAIN.bin --eval-file=EVAL.bin --seq-len=1024 \
#       --batch-size=32 --grad-accumulation=4 --steps=12 --gpus=1 \
#       --model-dtype=bf16 --matmul-dtype=bf16 --use-cuda-graphs \
#       --learning-rate=3e-4 --warmup=2 --eval-every-n-steps=0 \
#       --ckpt-interval=0 --save-training-state=false --log-gpu-util=0 \
#       --out-dir=OUT --checkpoint-dir=OUT/ckpt --log-file=OUT/log.json
#   Qwen2.5-1.5B: the same with --model=Qwen2.5-1.5B --lmhead-chunks=4 (llm.q's
#   H100 recipe adds --opt-m-dtype=bf16 --opt-v-dtype=bf16; fp32 states at
#   B=32 have not been tried on an 80 GB GPU)
#   FP8 matmuls (sm_89 and newer): --matmul-dtype=e4m3
# tokens/s from OUT/log.json's "step" lines (step_tokens / duration_ms),
# the median after the first two steps.
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
[[ $# -eq 1 && -n $1 && $1 != -h && $1 != --help ]] || usage
if [[ ! -f $1/train.cpp || ! -f $1/src/models/llama_model.cpp ]] || ! grep -qs 'project(LLMQ' "$1/CMakeLists.txt"; then
    echo "llmq_build.sh: $1 is not llm.q's sources (git clone https://github.com/IST-DASLab/llmq)" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd)
DEPS=${LLMQ_DEPS:-}
[[ -z $DEPS ]] || DEPS=$(cd "$DEPS" 2>/dev/null && pwd) ||
    { echo "llmq_build.sh: LLMQ_DEPS=$LLMQ_DEPS: no such folder" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 1
DEPS=${DEPS:-$PWD/build/gpu/deps/llmq_deps}

source scripts/gpu/archive.sh  # commit_of
# The dependencies: FetchContent name, a file that shows the folder is it, where it comes from.
DEP_LIST=("json include/nlohmann/json.hpp https://github.com/nlohmann/json v3.11.3"
    "cudnn-fe include/cudnn_frontend.h https://github.com/NVIDIA/cudnn-frontend v1.12.0"
    "cli11 include/CLI/CLI.hpp https://github.com/CLIUtils/CLI11 v2.6.1"
    "fmt include/fmt/format.h https://github.com/fmtlib/fmt 12.0.0"
    "catch2 src/catch2/catch_all.hpp https://github.com/catchorg/Catch2 v3.6.0")
DEP_FLAGS=() DEP_COMMITS=""
for d in "${DEP_LIST[@]}"; do
    read -r name probe url tag <<< "$d"
    if [[ ! -f $DEPS/$name/$probe || ! -f $DEPS/$name/CMakeLists.txt ]]; then
        echo "llmq_build.sh: $DEPS/$name: not $url (git clone --branch $tag $url $DEPS/$name)" >&2
        exit 2
    fi
    upper=$(tr '[:lower:]' '[:upper:]' <<< "$name")
    DEP_FLAGS+=("-DFETCHCONTENT_SOURCE_DIR_$upper=$DEPS/$name")
    DEP_COMMITS+=" $name=$(commit_of "$DEPS/$name" | cut -c1-12)"
done

CUDA_HOME_=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
NVCC=$CUDA_HOME_/bin/nvcc
[[ -x $NVCC ]] || { echo "llmq_build.sh: no nvcc (on PATH or /usr/local/cuda/bin)" >&2; exit 1; }
command -v cmake > /dev/null || { echo "llmq_build.sh: no cmake (3.25 or newer) here" >&2; exit 1; }
# The toolkit's library folder (lib64, lib, or targets/ARCH/lib).
CUDA_LIB=$CUDA_HOME_/lib64
for d in lib64 lib "targets/$(uname -m)-linux/lib"; do
    compgen -G "$CUDA_HOME_/$d/libcudart.so*" > /dev/null && { CUDA_LIB=$CUDA_HOME_/$d; break; }
done
# first_with FILE DIR...: the first DIR holding FILE (else the first DIR).
first_with() {
    local f=$1 d
    shift
    for d in "$@"; do [[ -e $d/$f ]] && { echo "$d"; return; }; done
    echo "$1"
}
SYS_LIB=/usr/lib/$(uname -m)-linux-gnu
NCCL_INC=${NCCL_INCLUDE_DIR:-$(first_with nccl.h "$CUDA_HOME_/include" /usr/include)}
NCCL_LIBDIR=${NCCL_LIB_DIR:-$(first_with libnccl.so "$CUDA_LIB" "$SYS_LIB")}
CUDNN_INC=${CUDNN_INCLUDE:-$(first_with cudnn.h "$CUDA_HOME_/include" /usr/include)}
CUDNN_LIBDIR=${CUDNN_LIB:-$(first_with libcudnn.so "$CUDA_LIB" "$SYS_LIB")}
[[ -f $NCCL_INC/nccl.h ]] || { echo "llmq_build.sh: no nccl.h in $NCCL_INC (NCCL_INCLUDE_DIR)" >&2; exit 1; }
[[ -f $CUDNN_INC/cudnn.h ]] || { echo "llmq_build.sh: no cudnn.h in $CUDNN_INC (CUDNN_INCLUDE)" >&2; exit 1; }

ARCH=${LLMQ_CUDA_ARCH:-90}
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DUSE_MPI=OFF -DUSE_CUFILE=OFF -DUSE_NVML=OFF
    -DBUILD_TESTS=OFF -DPYTHON_BINDING=OFF)
LLMQ_COMMIT=$(commit_of "$SRC")
SUM=$( (cd "$SRC" && find CMakeLists.txt train.cpp src -type f | LC_ALL=C sort | xargs cat) | md5sum | cut -c1-32)
STAMP="llm.q $LLMQ_COMMIT $SUM;$DEP_COMMITS; ${FLAGS[*]}"
LB=build/gpu/llmq
if [[ -x $LB/train && $(cat "$LB/stamp" 2>/dev/null) == "$STAMP" ]]; then
    if ldd "$LB/train" 2>/dev/null | grep -q 'not found'; then
        echo "llmq_build.sh: $LB/train does not find its libraries here ($(ldd "$LB/train" | awk '/not found/{print $1}' |
            tr '\n' ' ')): rebuilding"
    else
        echo "llm.q ($LLMQ_COMMIT): $LB/train is up to date"
        exit 0
    fi
fi
rm -rf "$LB" && mkdir -p "$LB"
# Debian 12's CMake 3.25.1 knows no C++20 flag for nvcc, and llm.q sets
# CMAKE_CUDA_STANDARD 20: name it (a CMake that knows it keeps its own).
STD20=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
echo "building llm.q ($LLMQ_COMMIT) in $LB: cmake ${FLAGS[*]}; NCCL $NCCL_LIBDIR, cuDNN $CUDNN_LIBDIR"
t0=$SECONDS
cmake -S "$SRC" -B "$LB/cmake" "${GEN[@]}" "${FLAGS[@]}" "${DEP_FLAGS[@]}" -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON "${STD20[@]}" \
    -DCUDNN_FRONTEND_BUILD_SAMPLES=OFF -DCUDNN_FRONTEND_BUILD_TESTS=OFF -DCUDNN_FRONTEND_BUILD_PYTHON_BINDINGS=OFF \
    -DNCCL_INCLUDE_DIR="$NCCL_INC" -DNCCL_LIB_DIR="$NCCL_LIBDIR" \
    -DCUDNN_INCLUDE_DIR="$CUDNN_INC" -DCUDNN_LIBRARY="$(ls "$CUDNN_LIBDIR"/libcudnn.so "$CUDNN_LIBDIR"/libcudnn.so.9 \
        2>/dev/null | head -n 1)" > "$LB/configure.log" 2>&1 || { tail -n 30 "$LB/configure.log"; exit 1; }
cmake --build "$LB/cmake" --target train --parallel "$(nproc)" > "$LB/build.log" 2>&1 ||
    { grep -E -m 20 'error|Error' "$LB/build.log"; tail -n 10 "$LB/build.log"; exit 1; }
cp "$LB/cmake/train" "$LB/cmake/libllmq-common.so" "$LB/" || exit 1
if ldd "$LB/train" | grep -q 'not found'; then
    echo "llmq_build.sh: built, but $LB/train does not find: $(ldd "$LB/train" | awk '/not found/{print $1}' | tr '\n' ' ')"
    exit 1
fi
echo "$STAMP" > "$LB/stamp"
echo "built $LB/train in $((SECONDS - t0)) s"
