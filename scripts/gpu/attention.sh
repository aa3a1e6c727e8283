#!/usr/bin/env bash
# scripts/gpu/attention.sh: the GPU checks and measurements of the
# tensor-core attention kernels (docs/attention.md), in stages that each fit
# one 10-minute device command. Logs go to $OUT (the device tool's output
# folder) or build/attention_gpu; each stage ends with a short summary.
#   bash scripts/gpu/attention.sh lab        build and run the three attention
#                                            lab programs (validation + timing)
#   bash scripts/gpu/attention.sh sanitize [memcheck|racecheck|synccheck]
#                                            compute-sanitizer on the labs' small cases
#   bash scripts/gpu/attention.sh train      d12 training, tensor-core attention
#                                            against LLMC_ATTN_TC=0: tokens/s and
#                                            the per-step loss difference
#   bash scripts/gpu/attention.sh ptxas      registers and spills of the kernels
# Extra nvcc flags for the lab build (tile experiments): LAB_FLAGS=-DTC_FWD64_BN=32.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/attention_gpu}
mkdir -p "$OUT"
JOBS=$(nproc)
LABS="attention_forward attention_backward ring_attention"
stage=${1:-lab}

build_labs() {
    # Only the device's own architecture: half the compile time.
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    local args=()
    [[ -n $cc ]] && args+=("CUDA_ARCH=-gencode arch=compute_$cc,code=sm_$cc")
    make -C dev/cuda -B -j"$JOBS" $LABS "${args[@]}" LAB_FLAGS="${LAB_FLAGS:-}" \
        > "$OUT/build_labs.log" 2>&1 || { tail -30 "$OUT/build_labs.log"; exit 1; }
}

case $stage in
lab)
    { date -u; nvidia-smi; nvcc --version; } > "$OUT/device.txt" 2>&1
    build_labs
    for p in $LABS; do
        timeout 280 "./dev/cuda/$p" > "$OUT/$p.log" 2>&1
        echo "== $p: $(tail -n 1 "$OUT/$p.log")"
        grep -E 'FAIL' "$OUT/$p.log" | head -n 10
        grep -E '^ B=|^ tensor|^ CUDA|^timing|TFLOP/s|speedup' "$OUT/$p.log"
    done
    ;;
sanitize)
    # One tool per call (each fits the 10-minute limit): memcheck (default), racecheck, synccheck.
    tool=${2:-memcheck}
    [[ -x dev/cuda/attention_forward ]] || build_labs
    for p in $LABS; do
        timeout 180 compute-sanitizer --tool "$tool" --error-exitcode 9 "./dev/cuda/$p" --quick \
            > "$OUT/sanitize_${tool}_$p.log" 2>&1
        echo "== $tool $p: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_$p.log" | tail -1)" \
            "$(tail -n 1 "$OUT/sanitize_${tool}_$p.log")"
    done
    ;;
train)
    make -j"$JOBS" train_gpt > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    DATA=build/attention_gpu_data.bin
    [[ -f $DATA ]] || python3 - <<PYEOF
import numpy as np
t = np.random.default_rng(0).integers(0, 50257, 4_000_000).astype("<u2")
h = np.zeros(256, dtype="<i4"); h[0], h[1], h[2] = 20240520, 1, len(t)
open("$DATA", "wb").write(h.tobytes() + t.tobytes())
PYEOF
    A=(-e d12 -i "$DATA" -j "" -t 1024 -v 0 -s 0 --device cuda)
    for tc in 1 0; do
        LLMC_ATTN_TC=$tc ./train_gpt "${A[@]}" -b 16 -x 20 -o "$OUT/train_tc$tc" > "$OUT/train_tc$tc.log" 2>&1
        echo "== LLMC_ATTN_TC=$tc: rc=$?"
    done
    python3 - "$OUT/train_tc1/metrics.jsonl" "$OUT/train_tc0/metrics.jsonl" <<'PYEOF'
import json, sys
def load(p):
    try:
        return [json.loads(l) for l in open(p)]
    except OSError:
        return []
a, b = load(sys.argv[1]), load(sys.argv[2])
la = [r["loss"] for r in a if "loss" in r]
lb = [r["loss"] for r in b if "loss" in r]
if la and lb:
    d = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    print(f"  losses over {min(len(la), len(lb))} steps: tc first {la[0]:.4f} last {la[-1]:.4f}; "
          f"CUDA cores first {lb[0]:.4f} last {lb[-1]:.4f}; max relative difference {d:.2e}")
else:
    print("  no metrics (see the train logs)")
PYEOF
    for tc in 1 0; do
        for b in 16 32; do
            echo "== d12 B=$b T=1024 LLMC_ATTN_TC=$tc"
            LLMC_ATTN_TC=$tc python3 scripts/benchmark.py --steps 20 --warmup 5 -- "${A[@]}" -b "$b" 2>&1 | tail -n 2
        done
    done | tee "$OUT/throughput.txt"
    ;;
ptxas)
    # One line per tensor-core kernel: architecture, kernel<template args>, registers, spills.
    for arch in 80 90; do
        nvcc -O3 -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch" -I. -Xptxas -v -c llmc/backend/backend_cuda.cu \
            -o /dev/null 2>&1 | grep -E "registers|spill|Compiling entry" | paste - - - | grep attn_tc_dev |
            sed -E "s/.*Compiling entry function '([^']*)'.* ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads.*Used ([0-9]+) registers.*/\1 regs=\4 spill_stores=\2 spill_loads=\3/" |
            while read -r name rest; do
                echo "sm_$arch $(echo "$name" | c++filt | sed -E 's/^void llmc_cuda::attn_tc_dev:://; s/\(.*//') $rest"
            done
    done
    ;;
*)
    echo "usage: $0 lab|sanitize [tool]|train|ptxas" >&2
    exit 2
    ;;
esac
