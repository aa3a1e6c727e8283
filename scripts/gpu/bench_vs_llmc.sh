#!/usr/bin/env bash
# scripts/gpu/bench_vs_llmc.sh [--dry-run] LLMC_SRC [OUTDIR [B...]]: d12
# throughput of this trainer next to llm.c's train_gpt2cu on the same GPU,
# token shard, model shape (GPT-2 d12: L=12, C=768, NH=12, V=50257,
# Vp=50304, random init), B, T=1024 and GELU recompute (-r 1, llm.c's
# default), then each optimization switch A/B. It is scripts/gpu/check.sh's
# bench step on its own (with the build step first); docs/gpu.md says how
# to read it.
#   LLMC_SRC  an llm.c source tree (git clone https://github.com/karpathy/llm.c,
#             or the bundle's copy, build/gpu/deps/llmc_src), built by
#             scripts/gpu/llmc_build.sh (patched copy in build/gpu/llmc)
#   OUTDIR    where the results go (default build/gpu/bench_vs_llmc):
#             summary.txt, gpu-results.jsonl, logs/bench/
#   B...      batch sizes (default 16 32)
#   env       LLMC_SWITCHES="NAME=ITEM[,ITEM...] ..." the switches to A/B
#             (default: scripts/gpu/switches.txt); GPU_CHECK_SECONDS (540)
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
DRY=()
[[ ${1:-} == --dry-run ]] && { DRY=(--dry-run); shift; }
[[ $# -ge 1 && -n $1 && $1 != -h && $1 != --help ]] || usage
[[ -f $1/train_gpt2.cu || ${#DRY[@]} -gt 0 ]] ||
    { echo "bench_vs_llmc.sh: $1 is not an llm.c source tree (git clone https://github.com/karpathy/llm.c)" >&2; exit 2; }
LLMC_SRC=$(cd "$1" 2>/dev/null && pwd || echo "$1")
export LLMC_SRC
[[ $# -ge 3 ]] && export BENCH_B="${*:3}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
exec bash "$ROOT/scripts/gpu/check.sh" "${DRY[@]}" build,bench "${2:-$ROOT/build/gpu/bench_vs_llmc}"
