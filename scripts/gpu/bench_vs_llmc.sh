#!/usr/bin/env bash
# scripts/gpu/bench_vs_llmc.sh: d12 throughput of this trainer next to llm.c's
# train_gpt2cu on the same GPU, token shard, model shape (GPT-2 d12: L=12,
# C=768, NH=12, V=50257, Vp=50304, random init), B, T and recompute setting.
# llm.c comes from build/gpu_carry/llmc_src.tar.gz (scripts/gpu/bundle.sh:
# github:karpathy/llm.c at a recorded commit, with its two small patches) and
# is built here with
#   make train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 \
#        GPU_COMPUTE_CAPABILITY=<the GPU's, e.g. 90> [NVML, or -DNO_NVML]
# (no cuDNN flash attention, no NCCL/MPI: one GPU, llm.c's own kernels).
# Both run STEPS steps; tokens/s is B*T / (median step time over the steps
# after WARMUP). llm.c's step time is the "| N ms |" of its step lines, ours
# the "ms" of metrics.jsonl. Prints both, the ratio ours/llm.c, and appends
# JSON lines to $OUT/gpu-results.jsonl (scripts/gpu/figures.py). Last line
# "N passed, N failed" (a B passes when both trainers gave a figure).
#   usage: scripts/gpu/bench_vs_llmc.sh [B...]     (default: 8 16 32)
#   env:   OUT, STEPS (30), WARMUP (5), T (1024), RECOMPUTE (1: GELU, llm.c's default)
# Run from a GPU machine after scripts/gpu/check.sh build (or on its own:
# it builds what it needs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-build/gpu_check/out}
W=build/gpu_check/bench_llmc
mkdir -p "$OUT" "$W"
source scripts/gpu/env.sh
STEPS=${STEPS:-30} WARMUP=${WARMUP:-5} T=${T:-1024} RECOMPUTE=${RECOMPUTE:-1}
BS=("$@")
[[ ${#BS[@]} -gt 0 ]] || BS=(8 16 32)
PY=python3
for cand in python3 /usr/bin/python3; do "$cand" -c "import numpy" 2>/dev/null && { PY=$cand; break; }; done
export GPU_DEVICE=${GPU_DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
export GPU_COMMIT=${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat build/gpu_carry/COMMIT 2>/dev/null || echo unknown)}

# 1. Both trainers.
[[ -x train_gpt ]] || make -j"$(nproc)" train_gpt > "$W/make_ours.log" 2>&1 || { tail -20 "$W/make_ours.log"; exit 1; }
SRC=$GPU_DEPS/llmc_src
[[ -f $SRC/train_gpt2.cu ]] || { echo "bench_vs_llmc.sh: no llm.c sources (run scripts/gpu/bundle.sh here and carry build/gpu_carry)"; exit 1; }
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
if [[ ! -x $SRC/train_gpt2cu ]]; then
    echo "building llm.c ($(head -n 1 "$SRC/COMMIT")): make train_gpt2cu ${LLMC_FLAGS[*]}"
    make -C "$SRC" train_gpt2cu "${LLMC_FLAGS[@]}" > "$W/make_llmc.log" 2>&1 || { tail -20 "$W/make_llmc.log"; exit 1; }
fi

# 2. One shard of random GPT-2 token ids, read by both.
DATA=build/gpu_check/bench_tokens.bin
[[ -f $DATA ]] || "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import numpy as np, shards
shards.write_shard(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8_000_000), 50257)" "$DATA"

# median_ms LOG: llm.c's median step time over the steps after WARMUP.
median_ms() {
    sed -n 's/^step *[0-9]*\/[0-9]* |.*| \([0-9.]*\) ms |.*/\1/p' "$1" | tail -n +$((WARMUP + 1)) | sort -g |
        awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'
}
printf '%-6s %14s %14s %8s\n' B ours_tok/s llmc_tok/s ratio | tee "$W/table.txt"
NPASS=0 NFAIL=0
for B in "${BS[@]}"; do
    ours_cmd="train_gpt -e d12 -i $DATA -j '' -b $B -t $T -r $RECOMPUTE -x $STEPS --device cuda"
    timeout 300 "$PY" scripts/benchmark.py --steps "$STEPS" --warmup "$WARMUP" -- -e d12 -i "$DATA" -j "" -b "$B" -t "$T" \
        -r "$RECOMPUTE" --device cuda > "$W/ours_b$B.log" 2>&1
    ours=$(sed -n 's/^figure tokens_per_s \([0-9.]*\) .*/\1/p' "$W/ours_b$B.log")
    llmc_cmd="train_gpt2cu -e d12 -i $DATA -j $DATA -b $B -t $T -r $RECOMPUTE -x $STEPS -v 100000 -m 1 -s 0"
    (cd "$SRC" && timeout 300 ./train_gpt2cu -e d12 -i "$ROOT/$DATA" -j "$ROOT/$DATA" -b "$B" -t "$T" -r "$RECOMPUTE" \
        -x "$STEPS" -v 100000 -m 1 -s 0) > "$W/llmc_b$B.log" 2>&1
    ms=$(median_ms "$W/llmc_b$B.log")
    llmc=$([[ -n $ms ]] && awk -v b="$B" -v t="$T" -v ms="$ms" 'BEGIN {printf "%.0f", b * t / ms * 1000}')
    ratio=$([[ -n $ours && -n $llmc ]] && awk -v a="$ours" -v b="$llmc" 'BEGIN {printf "%.3f", a / b}')
    printf '%-6s %14s %14s %8s\n' "$B" "${ours:-FAILED}" "${llmc:-FAILED}" "${ratio:--}" | tee -a "$W/table.txt"
    [[ -n $ours ]] && "$PY" scripts/gpu/figures.py --out "$OUT/gpu-results.jsonl" --phase bench_vs_llmc \
        --command "$ours_cmd" --name "d12_b${B}_t${T}_r${RECOMPUTE}_ours_tokens_per_s" --value "$ours" --unit tok/s
    [[ -n $llmc ]] && "$PY" scripts/gpu/figures.py --out "$OUT/gpu-results.jsonl" --phase bench_vs_llmc \
        --command "$llmc_cmd (llm.c $(head -c 12 "$SRC/COMMIT"))" --name "d12_b${B}_t${T}_r${RECOMPUTE}_llmc_tokens_per_s" \
        --value "$llmc" --unit tok/s
    [[ -n $ratio ]] && "$PY" scripts/gpu/figures.py --out "$OUT/gpu-results.jsonl" --phase bench_vs_llmc \
        --command "ratio of the two above" --name "d12_b${B}_t${T}_r${RECOMPUTE}_ours_over_llmc" --value "$ratio" --unit ratio
    if [[ -n $ours && -n $llmc ]]; then
        NPASS=$((NPASS + 1))
    else
        NFAIL=$((NFAIL + 1))
        tail -n 5 "$W/ours_b$B.log" "$W/llmc_b$B.log"
    fi
done
echo "$NPASS passed, $NFAIL failed"
[[ $NFAIL -eq 0 ]]
