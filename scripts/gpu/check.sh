#!/usr/bin/env bash
# scripts/gpu/check.sh [--dry-run] WHAT [OUTDIR]: the checks that need a GPU,
# run on a GPU machine from a checkout (or a copy) of this repository, in
# commands that each fit 9 minutes (docs/gpu.md: what to bring, what each
# prints, how to read it, what to record).
#   WHAT   a command, in this order:
#     1    is it right, and how fast against every peer: the environment,
#          the build (or the bundle's prebuilt binaries), test_gpt on CUDA
#          fp32 and bf16 against the PyTorch reference; d12 tokens/s beside
#          llm.c's production build (cuDNN) at its recipe (B=64 -r 0) and at
#          B=32 -r 1, and beside compiled PyTorch (the peers step); then
#          beside llm.c without cuDNN at two batch sizes, and each switch of
#          scripts/gpu/switches.txt, with and without (the bench step)
#     2    how fast at 0.5B and 1.5B, and where the time goes: Qwen2.5-0.5B
#          and -1.5B shapes beside llm.q (the qwen step); d12's step by op
#          class, measured and planned (the breakdown step)
#     3    the kernel lab at d12 sizes, ranks sharing the GPU (--comm mpi)
#          against one process, the d12-shaped training curve
#     4    d12's shapes (heads of 64) against the CPU in fp64; the step's
#          variants (bf16 AdamW moments, the sync-free step) against the
#          default step, right and timed; compute-sanitizer (memcheck,
#          racecheck, initcheck, synccheck) on small cases
#     5    optional, after the others: the rest of test_real_shapes (heads
#          of 128, a Llama, N*Vp > 2^31) and the planner against the measured
#          tokens/s
#     6    FP8 (--fp8 1) against bf16: d12 and the Qwen2.5-1.5B shape's
#          tokens/s, beside llm.q's FP8 mode, and the loss after 300 steps
#          of the same data (the fp8 step)
#          or steps, comma-separated: env build test peers bench qwen
#          breakdown shapes variants lab ranks curve sanitize shapes_more
#          plan fp8; or all
#          (commands 1 to 6)
#   OUTDIR where the results go (default build/gpu/check); runs into the
#          same folder add up:
#     summary.txt        every line printed, as it is printed
#     gpu-results.jsonl  one JSON object per figure, written as soon as it
#                        is measured (scripts/gpu/figures.py); append it to
#                        docs/gpu-results.jsonl
#     logs/STEP/         every program's log
#     d12_tiny_curve.png command 3's curve
#   --dry-run (or GPU_DRY_RUN=1): runs nothing, needs no GPU: prints the
#          plan (each program, its time limit, the time docs/gpu.md assumes
#          for it, the clock) against the budget. GPU_DRY_BUILD=prebuilt|
#          source: which build to assume (default: prebuilt when the bundle
#          has prebuilt binaries).
# Budget: GPU_CHECK_SECONDS (default 540; `all`: 6 x 540). Every program
# runs under a time limit inside its step's, and the steps inside the
# budget; what would start with too little time left is a row marked
# SKIPPED. A crash, a timeout or a FAIL is its program's row and hides
# nothing else. Build state (not results) stays in build/gpu/built and
# build/gpu/deps. Exit status: 0 when nothing failed or was skipped.
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
ALL_STEPS=(env build test peers bench qwen breakdown shapes variants lab ranks curve sanitize shapes_more plan fp8)
DRY=${GPU_DRY_RUN:-0}
[[ ${1:-} == --dry-run ]] && { DRY=1; shift; }
[[ $DRY == 1 ]] || DRY=0
[[ $# -ge 1 && $# -le 2 && -n $1 && $1 != -h && $1 != --help ]] || usage
WHAT=$1
BUDGET=${GPU_CHECK_SECONDS:-540}
case $WHAT in
    1) STEPS=(env build test peers bench) ;;
    2) STEPS=(env build qwen breakdown) ;;
    3) STEPS=(env build lab ranks curve) ;;
    4) STEPS=(env build shapes variants sanitize) ;;
    5) STEPS=(env build shapes_more plan) ;;
    6) STEPS=(env build fp8) ;;
    all) STEPS=(env build test peers bench qwen breakdown shapes variants lab ranks curve sanitize shapes_more plan fp8)
         BUDGET=${GPU_CHECK_SECONDS:-3240} ;;
    __build | __env | __ldd) STEPS=() ;;
    *) IFS=', ' read -r -a STEPS <<< "$WHAT"
       for s in "${STEPS[@]}"; do
           [[ " ${ALL_STEPS[*]} " == *" $s "* ]] ||
               { echo "check.sh: unknown step '$s' (1 2 3 4 5 6 all, or: ${ALL_STEPS[*]})" >&2; exit 2; }
       done ;;
esac
OUTDIR=${2:-}
if [[ -n $OUTDIR && $DRY == 0 && $WHAT != __* ]]; then
    OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd) || exit 1
fi
cd "$(dirname "$0")/../.." || exit 1
source scripts/gpu/archive.sh
source scripts/gpu/lib.sh
source scripts/gpu/steps.sh
source scripts/gpu/steps_peers.sh
BUILT=build/gpu/built
JOBS=$(nproc)
GPU_BUNDLE=${GPU_BUNDLE:-build/gpu/bundle}
PY=python3
TORCH_PY=/usr/bin/python3
DRY_T=0 DRY_PRE=0 DRY_SRC=0 DRY_SKIPPED=0 DRY_BUILT=""
TOTAL_FAILED=0 TOTAL_SKIPPED=0
if [[ $DRY == 1 ]]; then
    DRY_BUILD=${GPU_DRY_BUILD:-$(ls "$GPU_BUNDLE"/prebuilt_*.tar.* > /dev/null 2>&1 && echo prebuilt || echo source)}
    GPU_DEVICE="(dry run)" GPU_COMMIT=dry GPU_ENV_SUMMARY="(dry run)" SUMMARY="" RESULTS=/dev/null
    OUTDIR=${OUTDIR:-build/gpu/check}
    END_ALL=$BUDGET
    dry_header
    for s in "${STEPS[@]}"; do "step_$s"; done
    dry_footer
    exit 0
fi

mkdir -p "$BUILT"
source scripts/gpu/env.sh
for cand in python3 /usr/bin/python3; do "$cand" -c "import numpy" 2>/dev/null && { PY=$cand; break; }; done
for cand in /usr/bin/python3 python3; do "$cand" -c "import torch, numpy" 2>/dev/null && { TORCH_PY=$cand; break; }; done
SRC_HASH=$(src_hash)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
export PYTHONUNBUFFERED=1
LINEBUF=()
command -v stdbuf > /dev/null && LINEBUF=(stdbuf -oL -eL)
case $WHAT in
    __build) FULL_TESTS=$([[ $# -eq 1 ]] && echo 1 || echo 0)
             if [[ $# -eq 1 ]]; then ensure_built core tests lab attn_lab; else ensure_built ${2//,/ }; fi
             exit ;;
    __env) env_report; exit 0 ;;
    __ldd) ldd_report ${2//,/ }; exit 0 ;;
esac

OUTDIR=${OUTDIR:-build/gpu/check}
mkdir -p "$OUTDIR"
RESULTS=$OUTDIR/gpu-results.jsonl SUMMARY=$OUTDIR/summary.txt
END_ALL=$BUDGET
export GPU_DEVICE=${GPU_DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
[[ -n $GPU_DEVICE ]] || GPU_DEVICE="no GPU"
export GPU_COMMIT=${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat "$GPU_BUNDLE/COMMIT" 2>/dev/null || echo unknown)}
PID_llmc= PID_llmc_cudnn=
trap 'for _pid in "${PID_llmc:-}" "${PID_llmc_cudnn:-}"; do [[ -n $_pid ]] && kill "$_pid" 2>/dev/null; done' EXIT
say ""
say "==== scripts/gpu/check.sh $WHAT: ${STEPS[*]} ($(date -u +%FT%TZ), budget $BUDGET s; $GPU_DEVICE)"
for s in "${STEPS[@]}"; do "step_$s"; done
say ""
say "check.sh $WHAT: $TOTAL_FAILED failed, $TOTAL_SKIPPED skipped in $SECONDS s; figures in $RESULTS, logs in $OUTDIR/logs"
[[ $TOTAL_FAILED -eq 0 && $TOTAL_SKIPPED -eq 0 ]]
