#!/usr/bin/env bash
# scripts/gpu/check.sh PHASES [OUTDIR]: every check that needs a GPU, run on
# a GPU machine from a checkout of this repository (docs/gpu-results.md: how
# to prepare the machine, which phases to run, where the figures go).
#   PHASES    one phase, several comma-separated (build,lab,test,shapes), or
#             all (every phase in the order below):
#   build     the trainer, tests and kernel lab (sm_XX of this GPU only), with
#             the bundled Open MPI / OpenBLAS when the machine lacks them
#             (scripts/gpu/env.sh), or the bundled prebuilt binaries when they
#             match; every later phase does the same first if needed, so each
#             phase also runs on its own
#   lab       every dev/cuda program: kernels against the CPU ops, timings
#   test      the test suite's CUDA-relevant part (test_gpt on CUDA fp32 and
#             bf16 against the PyTorch reference, test_real_shapes at small
#             shapes; TEST_FILTER='' for the whole suite)
#   shapes    build/test_real_shapes: d12's shapes, HS=128, N*Vp > 2^31, and a
#             Llama (GQA 4:1, heads of 128, SwiGLU, RoPE, untied head)
#   sanitize  compute-sanitizer memcheck, racecheck, initcheck, synccheck over
#             build/test_gpt (CUDA fp32, bf16) and the attention / ring
#             attention lab (validation only); SANITIZE_TOOLS picks tools
#   ranks     ranks sharing the GPU over --comm mpi against one process
#             (scripts/gpu/ranks.py), GPT-2 in every layout, then a Llama in
#             four
#   curve     d12-shaped model on data/tiny: 300 CUDA bf16 steps, 20 CPU fp32
#             and CUDA fp32 steps, the plot (scripts/gpu/curve.py)
#   bench     d12 tokens/s and MFU at T=1024 for a few B (BENCH_B), the
#             planner's prediction against them, then llm.c next to it
#             (scripts/gpu/bench_vs_llmc.sh) when llm.c's sources are at hand:
#             LLMC_SRC=DIR (git clone https://github.com/karpathy/llm.c), or
#             the copy in the bundle (scripts/gpu/bundle.sh --llmc DIR)
#   OUTDIR    where every result goes (default build/gpu/check); runs into
#             the same OUTDIR add up (a phase run again adds its figures
#             again, each with its date):
#     summary.txt        the one-screen summaries printed
#     gpu-results.jsonl  one JSON object per measured figure (scripts/gpu/
#                        figures.py): append it to docs/gpu-results.jsonl
#     logs/PHASE/        every log of the phase; table.txt: one row per program
#     d12_tiny_curve.png the curve phase's plot (for docs/)
# Each phase stops itself within 10 minutes: every program runs under a time
# limit inside the phase's, and what would start too late is reported
# SKIPPED, so a run can be split into short steps. GPU_CHECK_SECONDS=N also
# bounds the whole run (all phases given) to N seconds. A crash, a timeout or
# a FAIL in one program is that program's row and hides nothing else.
# Build state (not results) stays in build/gpu/built and build/gpu/deps.
# Exit status: 0 when nothing failed or was skipped.
set -uo pipefail
ALL_PHASES=(build lab test shapes sanitize ranks curve bench)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
[[ $# -ge 1 && $# -le 2 && -n $1 && $1 != -h && $1 != --help ]] || usage
if [[ $1 != __build ]]; then
    IFS=', ' read -r -a PHASES <<< "$1"
    [[ ${PHASES[*]} == all ]] && PHASES=("${ALL_PHASES[@]}")
    for ph in "${PHASES[@]}"; do
        [[ " ${ALL_PHASES[*]} " == *" $ph "* ]] ||
            { echo "check.sh: unknown phase '$ph' (${ALL_PHASES[*]} all; several: comma-separated)" >&2; exit 2; }
    done
fi
OUTDIR=${2:-}
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd) || exit 1; fi
cd "$(dirname "$0")/../.." || exit 1
BUILT=build/gpu/built
mkdir -p "$BUILT"
JOBS=$(nproc)
source scripts/gpu/env.sh
# ensure_built: make everything unless this exact source tree was built here
# for this GPU (a copied tree has new file times, which would make `make`
# rebuild everything). On a fresh machine, binaries prebuilt for sm_90 by
# scripts/gpu/bundle.sh --prebuilt are used when they match the sources and
# every library they need resolves; otherwise it builds (logs in build/gpu/built).
SRC_HASH=$(for f in Makefile dev/cuda/Makefile ./*.cu llmc/*/* llmc/backend/cuda/* tests/*/*.cpp tests/lib/*.h \
    dev/cuda/*.cu dev/cuda/*.h data/*.cpp; do [[ -f $f ]] && echo "$f"; done | LC_ALL=C sort | xargs cat | md5sum | cut -c1-32)
built_ok() {
    [[ -x train_gpt && -f $BUILT/stamp && $(cat "$BUILT/stamp") == "$SRC_HASH ${CUDA_ARCH:-}" ]] || return 1
    local b
    for b in train_gpt build/test_gpt build/test_real_shapes dev/cuda/attention_forward; do
        if [[ ! -x $b ]] || ldd "$b" 2>/dev/null | grep -q 'not found'; then
            echo "$b: missing, or libraries unresolved"
            return 1
        fi
    done
    ./train_gpt --help > /dev/null
}
ensure_built() {
    if built_ok; then echo "up to date"; return 0; fi
    local pre
    pre=$(ls "$GPU_BUNDLE"/prebuilt_*.tar.xz 2>/dev/null | head -n 1)
    if [[ -n $pre && ! -f $BUILT/prebuilt_tried ]]; then
        touch "$BUILT/prebuilt_tried"
        tar -xJf "$pre" && built_ok && { echo "using $pre"; return 0; }
        echo "prebuilt binaries not usable here ($(cat "$BUILT/stamp" 2>/dev/null) vs $SRC_HASH ${CUDA_ARCH:-}): building"
    fi
    rm -f "$BUILT/stamp"
    echo "building (-j$JOBS; $GPU_ENV_SUMMARY)"
    make -j"$JOBS" all tests > "$BUILT/make.log" 2>&1 || { tail -n 30 "$BUILT/make.log"; return 1; }
    make -C dev/cuda -j"$JOBS" > "$BUILT/make_lab.log" 2>&1 || { tail -n 30 "$BUILT/make_lab.log"; return 1; }
    echo "$SRC_HASH ${CUDA_ARCH:-}" > "$BUILT/stamp"
}
[[ $1 == __build ]] && { ensure_built; exit; }

OUTDIR=${OUTDIR:-build/gpu/check}
mkdir -p "$OUTDIR"
RESULTS=$OUTDIR/gpu-results.jsonl SUMMARY=$OUTDIR/summary.txt
END_ALL=$((SECONDS + ${GPU_CHECK_SECONDS:-1000000000}))
PY=python3
for cand in python3 /usr/bin/python3; do "$cand" -c "import numpy" 2>/dev/null && { PY=$cand; break; }; done
export GPU_DEVICE=${GPU_DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
[[ -n $GPU_DEVICE ]] || GPU_DEVICE="no GPU"
export GPU_COMMIT=${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat "$GPU_BUNDLE/COMMIT" 2>/dev/null || echo unknown)}
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
TOTAL_FAILED=0 TOTAL_SKIPPED=0

say() { echo "$*" | tee -a "$SUMMARY"; }
# figures LOG PREFIX COMMAND: the log's "figure" lines into $RESULTS.
figures() { "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase "$PHASE" --prefix "$2" --command "$3" --log "$1"; }
# figure NAME VALUE UNIT COMMAND: one figure.
figure() {
    "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase "$PHASE" --name "$1" --value "$2" --unit "$3" --command "$4"
}

# begin_phase NAME SECONDS: a fresh log folder and the phase's deadline.
begin_phase() {
    PHASE=$1 W=$OUTDIR/logs/$1 P_PASS=0 P_FAIL=0 P_SKIP=0 P_T0=$SECONDS
    DEADLINE=$((SECONDS + $2))
    ((DEADLINE > END_ALL)) && DEADLINE=$END_ALL
    rm -rf "$W" && mkdir -p "$W"
    : > "$W/table.txt"
    say ""
    say "== $PHASE ($GPU_DEVICE, commit ${GPU_COMMIT:0:12}, $(date -u +%FT%TZ))"
}

# run_prog NAME TIMEOUT CMD...: one program under the phase deadline; log
# $W/NAME.log; its last "N passed, N failed" line is its count (a non-zero
# exit without failures counts one failure; a clean exit without a count,
# one pass). Adds a row to the phase table. Returns the program's status.
run_prog() {
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE - SECONDS - 5))
    if ((left < 15)); then
        printf '%-44s SKIPPED (out of time)\n' "$name" >> "$W/table.txt"
        P_SKIP=$((P_SKIP + 1))
        return 125
    fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS rc p=0 f=0 note=""
    timeout --kill-after=10 "$limit" "$@" > "$W/$name.log" 2>&1
    rc=$?
    local last
    last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$W/$name.log" | tail -n 1)
    [[ $last =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]] && p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}
    if ((rc == 124 || rc == 137)); then note=" TIMEOUT after ${limit}s"
    elif ((rc > 128)); then note=" CRASH (signal $((rc - 128)))"; fi
    ((rc != 0 && f == 0)) && f=1
    [[ -z $last && $rc -eq 0 ]] && p=1
    P_PASS=$((P_PASS + p)) P_FAIL=$((P_FAIL + f))
    printf '%-44s rc=%-3s %5d passed %4d failed %5ds%s\n' "$name" "$rc" "$p" "$f" $((SECONDS - t0)) "$note" \
        >> "$W/table.txt"
    return $rc
}

end_phase() {
    cat "$W/table.txt" | tee -a "$SUMMARY"
    say "-- $PHASE: $P_PASS passed, $P_FAIL failed, $P_SKIP skipped ($((SECONDS - P_T0)) s)"
    figure "${PHASE}_passed" "$P_PASS" checks "scripts/gpu/check.sh $PHASE"
    figure "${PHASE}_failed" "$P_FAIL" checks "scripts/gpu/check.sh $PHASE"
    [[ $P_SKIP -gt 0 ]] && figure "${PHASE}_skipped" "$P_SKIP" programs "scripts/gpu/check.sh $PHASE"
    TOTAL_FAILED=$((TOTAL_FAILED + P_FAIL)) TOTAL_SKIPPED=$((TOTAL_SKIPPED + P_SKIP))
}

phase_build() {
    begin_phase build 540
    { date -u; nvidia-smi; nvcc --version; echo "$GPU_ENV_SUMMARY"; } > "$W/device.txt" 2>&1
    say "$GPU_ENV_SUMMARY"
    run_prog make 500 bash scripts/gpu/check.sh __build
    cat "$W/make.log" | tee -a "$SUMMARY"
    cp "$BUILT"/make*.log "$W/" 2>/dev/null
    figure build_seconds $((SECONDS - P_T0)) s "scripts/gpu/check.sh build ($JOBS jobs, ${CUDA_ARCH:-default arch})"
    end_phase
}

phase_lab() {
    begin_phase lab 480
    run_prog make 400 bash scripts/gpu/check.sh __build
    for src in dev/cuda/*.cu; do
        local p
        p=$(basename "$src" .cu)
        run_prog "$p" 120 "dev/cuda/$p"
        figures "$W/$p.log" "lab_${p}_" "dev/cuda/$p"
    done
    end_phase
}

phase_test() {
    begin_phase test 540
    run_prog make 400 bash scripts/gpu/check.sh __build
    # The tests that touch CUDA (TEST_FILTER='' runs the whole suite, a few
    # minutes more, all CPU work that CI covers).
    LLMC_TEST_FILTER=${TEST_FILTER-'^(ref_|test_gpt|test_real_shapes|test_vocab_ce)'} \
        run_prog run_tests 540 bash tests/run_tests.sh
    # run_tests' own table: the CUDA rows, any failure, the total.
    grep -E '^(test_gpt_.*cuda|test_real_shapes|cuda_)|[1-9][0-9]* failed|^total' "$W/run_tests.log" | tee -a "$SUMMARY"
    cp -r build/test_logs "$W/" 2>/dev/null
    for log in build/test_logs/test_gpt_*_cuda_*.log; do
        [[ -f $log ]] && figures "$log" "$(basename "$log" .log)_" "test_gpt (tests/run_tests.sh, $(basename "$log" .log))"
    done
    [[ -f build/test_logs/test_real_shapes.log ]] &&
        figures build/test_logs/test_real_shapes.log real_shapes_small_ "build/test_real_shapes --shape small"
    end_phase
}

# summarise_shapes LOG: per group (e.g. d12_cuda_bf16): checks, failures, largest error.
summarise_shapes() {
    awk '/^(PASS|FAIL) [a-z0-9_]+ +rel err/ {
            g = $2; sub(/_(logits|loss|grad_.*)$/, "", g)
            n[g]++; if ($1 == "FAIL") f[g]++; if ($5 + 0 > m[g] || $5 == "nan") m[g] = $5
            if (!(g in o)) { o[g] = ++k; name[k] = g } }
         END { for (i = 1; i <= k; i++) { g = name[i]
                 printf "  %-34s %3d checks %3d failed, largest rel err %s\n", g, n[g], f[g], m[g] } }' "$1" |
        tee -a "$SUMMARY"
}

phase_shapes() {
    begin_phase shapes 560
    run_prog make 400 bash scripts/gpu/check.sh __build
    run_prog real_shapes_d12_big 420 build/test_real_shapes --cases d12,big
    run_prog real_shapes_hs128 240 build/test_real_shapes --cases hs128
    run_prog real_shapes_llama 240 build/test_real_shapes --cases llama
    summarise_shapes "$W/real_shapes_d12_big.log"
    summarise_shapes "$W/real_shapes_hs128.log"
    summarise_shapes "$W/real_shapes_llama.log"
    figures "$W/real_shapes_d12_big.log" shapes_ "build/test_real_shapes --cases d12,big"
    figures "$W/real_shapes_hs128.log" shapes_ "build/test_real_shapes --cases hs128"
    figures "$W/real_shapes_llama.log" shapes_ "build/test_real_shapes --cases llama"
    end_phase
}

phase_sanitize() {
    begin_phase sanitize 560
    run_prog make 400 bash scripts/gpu/check.sh __build
    if [[ -z $SANITIZER ]]; then say "compute-sanitizer not found: SKIPPED"; P_SKIP=1; end_phase; return; fi
    local M=build/ref/round_fp32.model.bin S=build/ref/round_fp32.state.bin
    [[ -f $S ]] || run_prog reference 120 "$PY" tests/reference/reference_gpt.py --spec "L=2,C=64,NH=4,V=128,T=32" --dtype fp32 \
        --B 4 --T 32 --warmup 3 --final-frac 0.1 --wd 0.1 --write-model "$M" --write-state "$S"
    local -A progs=(
        [test_gpt_fp32]="build/test_gpt --model $M --state $S --device cuda --dtype fp32"
        [test_gpt_bf16]="build/test_gpt --model $M --state $S --device cuda --dtype bf16"
        [attention_forward]="dev/cuda/attention_forward" [attention_backward]="dev/cuda/attention_backward"
        [ring_attention]="dev/cuda/ring_attention")
    printf '%-12s %-20s %s\n' tool program errors > "$W/errors.txt"
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
        for p in test_gpt_fp32 test_gpt_bf16 attention_forward attention_backward ring_attention; do
            # shellcheck disable=SC2086
            LAB_CHECK_ONLY=1 run_prog "${tool}_$p" 150 "$SANITIZER" --tool "$tool" --error-exitcode 99 ${progs[$p]}
            [[ -f $W/${tool}_$p.log ]] || continue
            local e
            e=$(sed -n -e 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' \
                       -e 's/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$W/${tool}_$p.log" | tail -n 1)
            printf '%-12s %-20s %s\n' "$tool" "$p" "${e:-no summary}" >> "$W/errors.txt"
            [[ -n $e ]] && figure "sanitize_${tool}_${p}_errors" "$e" errors \
                "compute-sanitizer --tool $tool ${progs[$p]}"
        done
    done
    cat "$W/errors.txt" | tee -a "$SUMMARY"
    end_phase
}

phase_ranks() {
    begin_phase ranks 540
    run_prog make 400 bash scripts/gpu/check.sh __build
    if ! command -v mpirun >/dev/null; then
        say "no mpirun (install Open MPI, or bundle it: scripts/gpu/bundle.sh): SKIPPED"
        P_SKIP=1
    else
        mpirun --version 2>&1 | head -n 1 | tee -a "$SUMMARY"
        run_prog ranks 520 "$PY" scripts/gpu/ranks.py --out "$W/runs"
        # A Llama (GQA, SwiGLU, RoPE, untied head) under four of the layouts.
        run_prog ranks_llama 200 "$PY" scripts/gpu/ranks.py --model llama --out "$W/runs_llama" \
            --layouts tp2_sp,cp2,dp2_z3,pp2_tp2_sp_z1
        for prog in ranks ranks_llama; do
            [[ -f $W/$prog.log ]] || continue
            grep -E '^([a-z0-9]+, one process|  (fp32|bf16) )|^FAIL' "$W/$prog.log" | tee -a "$SUMMARY"
            local how="scripts/gpu/ranks.py"
            [[ $prog == ranks_llama ]] && how+=" --model llama"
            figures "$W/$prog.log" ranks_ "$how (mpirun -np N train_gpt --device cuda --comm mpi)"
        done
    fi
    end_phase
}

phase_curve() {
    begin_phase curve 570
    run_prog make 400 bash scripts/gpu/check.sh __build
    run_prog curve 560 "$PY" scripts/gpu/curve.py --out "$W/runs" --png "$OUTDIR/d12_tiny_curve.png" \
        --deadline $((DEADLINE - SECONDS - 20))
    grep -E '^(PASS|FAIL|  c)' "$W/curve.log" | tee -a "$SUMMARY"
    figures "$W/curve.log" curve_ "scripts/gpu/curve.py (train_gpt -e L=12,C=768,NH=12,V=257,T=1024 -t 1024 -b 4)"
    end_phase
}

phase_bench() {
    begin_phase bench 570
    run_prog make 400 bash scripts/gpu/check.sh __build
    local data=build/gpu/bench_tokens.bin
    [[ -f $data ]] || "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import numpy as np, shards
shards.write_shard(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8_000_000), 50257)" "$data"
    for B in ${BENCH_B:-8 16 32}; do
        local args="-e d12 -i $data -j '' -b $B -t 1024 --device cuda"
        run_prog "d12_b$B" 150 "$PY" scripts/benchmark.py --steps 30 --warmup 5 -- -e d12 -i "$data" -j "" -b "$B" \
            -t 1024 --device cuda
        grep '^benchmark:' "$W/d12_b$B.log" | cut -c1-160 | tee -a "$SUMMARY"
        figures "$W/d12_b$B.log" "d12_b${B}_t1024_" "scripts/benchmark.py --steps 30 --warmup 5 -- $args"
    done
    # The planner on this GPU (llmc/plan/planner.h): calibrate the device at d12's
    # shapes, predict the B=16 run, and compare with the benchmark's tokens/s.
    local prof=$W/gpu_profile.json
    run_prog calibrate 120 ./train_gpt --calibrate "$prof" -e d12 -b 16 -t 1024 --device cuda
    if [[ -f $prof && -f $W/d12_b16.log ]]; then
        run_prog plan_d12 60 ./train_gpt --plan eval --hardware "$prof" -e d12 -b 16 -t 1024 --world 1 \
            --device cuda --plan-json "$W/plan_d12.jsonl"
        "$PY" - "$W/plan_d12.jsonl" "$W/d12_b16.log" > "$W/plan_vs_measured.log" <<'PYEOF'
import json, re, sys
pred = json.loads(open(sys.argv[1]).readline())["tokens_per_s"]
meas = float(re.search(r"^figure tokens_per_s (\S+)", open(sys.argv[2]).read(), re.M).group(1))
print(f"planner: d12 B=16 predicted {pred:.0f} tokens/s, measured {meas:.0f} ({pred / meas:.3f}x)")
print(f"figure d12_b16_plan_tokens_per_s {pred:.6g} tok/s")
print(f"figure d12_b16_plan_over_measured {pred / meas:.6g} ratio")
PYEOF
        grep '^planner:' "$W/plan_vs_measured.log" | tee -a "$SUMMARY"
        figures "$W/plan_vs_measured.log" "" "train_gpt --calibrate, then --plan eval -e d12 -b 16 -t 1024 --world 1"
    fi
    # llm.c next to it: LLMC_SRC, else the bundle's copy (unpacked by env.sh).
    local llmc=${LLMC_SRC:-}
    [[ -z $llmc && -f $GPU_DEPS/llmc_src/train_gpt2.cu ]] && llmc=$GPU_DEPS/llmc_src
    if [[ -n $llmc ]]; then
        # shellcheck disable=SC2086
        run_prog bench_vs_llmc 400 bash scripts/gpu/bench_vs_llmc.sh "$llmc" "$W/bench_vs_llmc" ${LLMC_B:-16 32}
        cat "$W/bench_vs_llmc/table.txt" 2>/dev/null | tee -a "$SUMMARY"
        cat "$W/bench_vs_llmc/gpu-results.jsonl" >> "$RESULTS" 2>/dev/null
    else
        say "no llm.c sources (LLMC_SRC=DIR, a clone of https://github.com/karpathy/llm.c): comparison skipped"
    fi
    end_phase
}

for ph in "${PHASES[@]}"; do "phase_$ph"; done
say ""
say "check.sh ${PHASES[*]}: $TOTAL_FAILED failed, $TOTAL_SKIPPED skipped; figures in $RESULTS, logs in $OUTDIR/logs"
[[ $TOTAL_FAILED -eq 0 && $TOTAL_SKIPPED -eq 0 ]]
