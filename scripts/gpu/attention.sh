#!/usr/bin/env bash
# scripts/gpu/attention.sh STAGE [OUTDIR]: the GPU checks and measurements of
# the tensor-core attention kernels (docs/attention.md), in stages, run on a
# GPU machine; each stage writes its logs to OUTDIR (default
# build/gpu/attention) and ends with a short summary:
#   scripts/gpu/attention.sh lab [OUTDIR]      build and run the three attention
#                                              lab programs (validation + timing)
#   scripts/gpu/attention.sh sanitize [memcheck|racecheck|synccheck|initcheck] [OUTDIR]
#                                              compute-sanitizer on the labs' small
#                                              cases (--small), one tool (default
#                                              memcheck)
#   scripts/gpu/attention.sh train [OUTDIR]    d12 training, tensor-core attention
#                                              against LLMC_ATTN_TC=0: tokens/s and
#                                              the per-step loss difference
#   scripts/gpu/attention.sh ptxas [OUTDIR]    registers and spills of the kernels
#                                              (needs nvcc only, no GPU)
# Every lab program run stops after 280 s, every sanitizer run after 180 s.
# Extra nvcc flags for the lab build (tile experiments): LAB_FLAGS=-DTC_FWD64_BN=32.
set -u
usage() { sed -n '2,/^set -u$/p' "$0" | sed '$d'; exit 2; }
stage=${1:-}
[[ $stage =~ ^(lab|sanitize|train|ptxas)$ ]] || usage
shift
tool=memcheck
if [[ $stage == sanitize && ${1:-} =~ ^(memcheck|racecheck|synccheck|initcheck)$ ]]; then tool=$1; shift; fi
[[ $# -le 1 ]] || usage
OUTDIR=${1:-}
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd) || exit 1; fi
cd "$(dirname "$0")/../.." || exit 1
OUTDIR=${OUTDIR:-build/gpu/attention}
mkdir -p "$OUTDIR"
JOBS=$(nproc)
LABS="attention_forward attention_backward ring_attention"

build_labs() {
    # Only the device's own architecture: half the compile time.
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    local args=()
    [[ $cc == 90 ]] && cc=90a  # Hopper: the architecture-specific target (wgmma)
    [[ -n $cc ]] && args+=("CUDA_ARCH=-gencode arch=compute_$cc,code=sm_$cc")
    make -C dev/cuda -B -j"$JOBS" $LABS "${args[@]}" LAB_FLAGS="${LAB_FLAGS:-}" \
        > "$OUTDIR/build_labs.log" 2>&1 || { tail -30 "$OUTDIR/build_labs.log"; exit 1; }
}

case $stage in
lab)
    { date -u; nvidia-smi; nvcc --version; } > "$OUTDIR/device.txt" 2>&1
    build_labs
    for p in $LABS; do
        timeout 280 "./dev/cuda/$p" > "$OUTDIR/$p.log" 2>&1
        echo "== $p: $(tail -n 1 "$OUTDIR/$p.log")"
        grep -E 'FAIL' "$OUTDIR/$p.log" | head -n 10
        grep -E '^ B=|^ tensor|^ CUDA|^timing|TFLOP/s|speedup' "$OUTDIR/$p.log"
    done
    ;;
sanitize)
    # One tool per run: memcheck (default), racecheck, synccheck, initcheck.
    [[ -x dev/cuda/attention_forward ]] || build_labs
    for p in $LABS; do
        timeout 180 compute-sanitizer --tool "$tool" --error-exitcode 9 "./dev/cuda/$p" --small \
            > "$OUTDIR/sanitize_${tool}_$p.log" 2>&1
        echo "== $tool $p: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/sanitize_${tool}_$p.log" | tail -1)" \
            "$(tail -n 1 "$OUTDIR/sanitize_${tool}_$p.log")"
    done
    ;;
train)
    make -j"$JOBS" train_gpt > "$OUTDIR/build.log" 2>&1 || { tail -30 "$OUTDIR/build.log"; exit 1; }
    DATA=build/gpu/attention_tokens.bin
    mkdir -p build/gpu
    [[ -f $DATA ]] || python3 - <<PYEOF
import numpy as np
t = np.random.default_rng(0).integers(0, 50257, 4_000_000).astype("<u2")
h = np.zeros(256, dtype="<i4"); h[0], h[1], h[2] = 20240520, 1, len(t)
open("$DATA", "wb").write(h.tobytes() + t.tobytes())
PYEOF
    A=(-e d12 -i "$DATA" -j "" -t 1024 -v 0 -s 0 --device cuda)
    for tc in 1 0; do
        LLMC_ATTN_TC=$tc ./train_gpt "${A[@]}" -b 16 -x 20 -o "$OUTDIR/train_tc$tc" > "$OUTDIR/train_tc$tc.log" 2>&1
        echo "== LLMC_ATTN_TC=$tc: rc=$?"
    done
    python3 - "$OUTDIR/train_tc1/metrics.jsonl" "$OUTDIR/train_tc0/metrics.jsonl" <<'PYEOF'
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
    done | tee "$OUTDIR/throughput.txt"
    ;;
ptxas)
    # One line per tensor-core kernel: architecture, kernel<template args>, registers, spills.
    NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    for arch in 80 90; do
        "$NVCC" -O3 -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch" -I. -Xptxas -v -c llmc/backend/backend_cuda.cu \
            -o /dev/null 2>&1 | grep -E "registers|spill|Compiling entry" | paste - - - | grep attn_tc_dev |
            sed -E "s/.*Compiling entry function '([^']*)'.* ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads.*Used ([0-9]+) registers.*/\1 regs=\4 spill_stores=\2 spill_loads=\3/" |
            while read -r name rest; do
                echo "sm_$arch $(echo "$name" | c++filt | sed -E 's/^void llmc_cuda::attn_tc_dev:://; s/\(.*//') $rest"
            done
    done | tee "$OUTDIR/ptxas.txt"
    ;;
esac
