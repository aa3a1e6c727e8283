#!/usr/bin/env bash
# scripts/gpu/bench_vs_llmc.sh LLMC_SRC [OUTDIR [B...]]: d12 throughput of
# this trainer next to llm.c's train_gpt2cu on the same GPU, token shard,
# model shape (GPT-2 d12: L=12, C=768, NH=12, V=50257, Vp=50304, random
# init), B, T and recompute setting. Run it on a GPU machine, from any directory.
#   LLMC_SRC  an llm.c source tree: `git clone https://github.com/karpathy/llm.c`
#             (or the copy that scripts/gpu/bundle.sh --llmc puts in the
#             bundle, unpacked by scripts/gpu/env.sh to build/gpu/deps/llmc_src).
#             It is left untouched: its Makefile, train_gpt2.cu and llmc/ are
#             copied to build/gpu/llmc, patched there (two small patches,
#             below) and built with
#               make train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 \
#                    GPU_COMPUTE_CAPABILITY=<the GPU's, e.g. 90> [NVML, or -DNO_NVML]
#             (no cuDNN flash attention, no NCCL/MPI: one GPU, llm.c's own
#             kernels).
#   OUTDIR    where every result goes (default build/gpu/bench_vs_llmc):
#             table.txt (B, both tokens/s, the ratio), gpu-results.jsonl (one
#             JSON object per figure, scripts/gpu/figures.py; append it to
#             docs/gpu-results.jsonl) and the logs of every run
#   B...      batch sizes (default 8 16 32)
# Both run STEPS steps; tokens/s is B*T / (median step time over the steps
# after WARMUP). llm.c's step time is the "| N ms |" of its step lines, ours
# the "ms" of metrics.jsonl. Last line "N passed, N failed" (a B passes when
# both trainers gave a figure). This trainer is built first if it is not.
#   env: STEPS (30), WARMUP (5), T (1024), RECOMPUTE (1: GELU, llm.c's default)
# Every run is stopped after 300 s.
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
[[ $# -ge 1 && -n $1 && $1 != -h && $1 != --help ]] || usage
[[ -f $1/train_gpt2.cu ]] ||
    { echo "bench_vs_llmc.sh: $1 is not an llm.c source tree (git clone https://github.com/karpathy/llm.c)" >&2; exit 2; }
SRC=$(cd "$1" && pwd)
OUTDIR=${2:-}
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd) || exit 1; fi
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUTDIR=${OUTDIR:-$ROOT/build/gpu/bench_vs_llmc}
mkdir -p "$OUTDIR"
source scripts/gpu/env.sh
STEPS=${STEPS:-30} WARMUP=${WARMUP:-5} T=${T:-1024} RECOMPUTE=${RECOMPUTE:-1}
BS=("${@:3}")
[[ ${#BS[@]} -gt 0 ]] || BS=(8 16 32)
PY=python3
for cand in python3 /usr/bin/python3; do "$cand" -c "import numpy" 2>/dev/null && { PY=$cand; break; }; done
export GPU_DEVICE=${GPU_DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
[[ -n $GPU_DEVICE ]] || GPU_DEVICE="no GPU"
export GPU_COMMIT=${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat "$GPU_BUNDLE/COMMIT" 2>/dev/null || echo unknown)}

# 1. Both trainers.
[[ -x train_gpt ]] || make -j"$(nproc)" train_gpt > "$OUTDIR/make_ours.log" 2>&1 || { tail -20 "$OUTDIR/make_ours.log"; exit 1; }
if [[ -f $SRC/COMMIT ]]; then LLMC_COMMIT=$(head -n 1 "$SRC/COMMIT")
elif [[ -e $SRC/.git ]]; then LLMC_COMMIT=$(git -C "$SRC" rev-parse HEAD)
else LLMC_COMMIT=unknown; fi
CC_=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
NVML_LIB=$( (ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}'); \
            find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libnvidia-ml.so.1' 2>/dev/null | head -n 1)
NVML_LIB=$(echo "$NVML_LIB" | head -n 1)
LLMC_FLAGS=(USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="${CC_:-90}")
if [[ -n $NVML_LIB ]]; then
    mkdir -p "$GPU_DEPS/nvml" && ln -sf "$NVML_LIB" "$GPU_DEPS/nvml/libnvidia-ml.so"
    LLMC_FLAGS+=(NVCC_LDFLAGS="-lcublas -lcublasLt -L$GPU_DEPS/nvml -lnvidia-ml")
else
    LLMC_FLAGS+=(NVCC_LDFLAGS="-lcublas -lcublasLt" PFLAGS="-DENABLE_BF16 -DNO_NVML")
fi
# llm.c's copy: rebuilt when its sources or the flags change.
LB=build/gpu/llmc
STAMP="$LLMC_COMMIT $( (cd "$SRC" && cat Makefile train_gpt2.cu llmc/*) | md5sum | cut -c1-32) ${LLMC_FLAGS[*]}"
if [[ ! -x $LB/train_gpt2cu || $(cat "$LB/stamp" 2>/dev/null) != "$STAMP" ]]; then
    rm -rf "$LB" && mkdir -p "$LB"
    cp -r "$SRC/Makefile" "$SRC/train_gpt2.cu" "$SRC/llmc" "$LB/"
    # Patch 1: on device OOM llm.c falls back to cudaMallocManaged (which
    # CUDA 13 no longer compiles, cudaMemAdvise wanting a cudaMemLocation,
    # and which can hang a GPU when oversubscribed): stop with a message.
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
    print("bench_vs_llmc.sh: llm.c's cuda_utils.cuh differs from the expected; managed-memory patch not applied")
PYEOF
    # Patch 2: NVML (GPU utilisation logging only) optional with -DNO_NVML,
    # for a machine where no libnvidia-ml.so can be linked.
    sed -i 's/^#if __has_include(<nvml.h>)$/#if __has_include(<nvml.h>) \&\& !defined(NO_NVML)/' "$LB/llmc/mfu.h"
    grep -q 'defined(NO_NVML)' "$LB/llmc/mfu.h" || echo "bench_vs_llmc.sh: llm.c's mfu.h differs; NVML patch not applied"
    echo "building llm.c ($LLMC_COMMIT) in $LB: make train_gpt2cu ${LLMC_FLAGS[*]}"
    make -C "$LB" train_gpt2cu "${LLMC_FLAGS[@]}" > "$OUTDIR/make_llmc.log" 2>&1 || { tail -20 "$OUTDIR/make_llmc.log"; exit 1; }
    echo "$STAMP" > "$LB/stamp"
fi

# 2. One shard of random GPT-2 token ids, read by both.
DATA=build/gpu/bench_tokens.bin
[[ -f $DATA ]] || "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import numpy as np, shards
shards.write_shard(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8_000_000), 50257)" "$DATA"

# median_ms LOG: llm.c's median step time over the steps after WARMUP.
median_ms() {
    sed -n 's/^step *[0-9]*\/[0-9]* |.*| \([0-9.]*\) ms |.*/\1/p' "$1" | tail -n +$((WARMUP + 1)) | sort -g |
        awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'
}
RESULTS=$OUTDIR/gpu-results.jsonl
printf '%-6s %14s %14s %8s\n' B ours_tok/s llmc_tok/s ratio | tee "$OUTDIR/table.txt"
NPASS=0 NFAIL=0
for B in "${BS[@]}"; do
    ours_cmd="train_gpt -e d12 -i $DATA -j '' -b $B -t $T -r $RECOMPUTE -x $STEPS --device cuda"
    timeout 300 "$PY" scripts/benchmark.py --steps "$STEPS" --warmup "$WARMUP" -- -e d12 -i "$DATA" -j "" -b "$B" \
        -t "$T" -r "$RECOMPUTE" --device cuda > "$OUTDIR/ours_b$B.log" 2>&1
    ours=$(sed -n 's/^figure tokens_per_s \([0-9.]*\) .*/\1/p' "$OUTDIR/ours_b$B.log")
    llmc_cmd="train_gpt2cu -e d12 -i $DATA -j $DATA -b $B -t $T -r $RECOMPUTE -x $STEPS -v 100000 -m 1 -s 0"
    (cd "$LB" && timeout 300 ./train_gpt2cu -e d12 -i "$ROOT/$DATA" -j "$ROOT/$DATA" -b "$B" -t "$T" -r "$RECOMPUTE" \
        -x "$STEPS" -v 100000 -m 1 -s 0) > "$OUTDIR/llmc_b$B.log" 2>&1
    ms=$(median_ms "$OUTDIR/llmc_b$B.log")
    llmc=$([[ -n $ms ]] && awk -v b="$B" -v t="$T" -v ms="$ms" 'BEGIN {printf "%.0f", b * t / ms * 1000}')
    ratio=$([[ -n $ours && -n $llmc ]] && awk -v a="$ours" -v b="$llmc" 'BEGIN {printf "%.3f", a / b}')
    printf '%-6s %14s %14s %8s\n' "$B" "${ours:-FAILED}" "${llmc:-FAILED}" "${ratio:--}" | tee -a "$OUTDIR/table.txt"
    name=d12_b${B}_t${T}_r${RECOMPUTE}
    [[ -n $ours ]] && "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase bench_vs_llmc \
        --command "$ours_cmd" --name "${name}_ours_tokens_per_s" --value "$ours" --unit tok/s
    [[ -n $llmc ]] && "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase bench_vs_llmc \
        --command "$llmc_cmd (llm.c ${LLMC_COMMIT:0:12})" --name "${name}_llmc_tokens_per_s" --value "$llmc" --unit tok/s
    [[ -n $ratio ]] && "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase bench_vs_llmc \
        --command "ratio of the two above" --name "${name}_ours_over_llmc" --value "$ratio" --unit ratio
    if [[ -n $ours && -n $llmc ]]; then
        NPASS=$((NPASS + 1))
    else
        NFAIL=$((NFAIL + 1))
        tail -n 5 "$OUTDIR/ours_b$B.log" "$OUTDIR/llmc_b$B.log"
    fi
done
echo "$NPASS passed, $NFAIL failed (results in $OUTDIR)"
[[ $NFAIL -eq 0 ]]
