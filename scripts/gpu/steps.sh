# scripts/gpu/steps.sh: sourced (not run) by scripts/gpu/check.sh: one
# function per step (step_NAME), each a list of programs run under time
# limits by run_prog (scripts/gpu/lib.sh); the steps beside the peers
# (peers, qwen, breakdown) are scripts/gpu/steps_peers.sh. Every run_prog names its limit
# and the time a dry run assumes for it on the GPU machine (docs/gpu.md
# lists them: estimates, not measurements).
# shellcheck shell=bash disable=SC2034

# The groups of binaries each step needs (lib.sh: group_bins).
declare -A STEP_NEEDS=([env]="" [build]="" [test]="tests" [shapes]="tests" [bench]="core" [lab]="lab"
    [ranks]="core" [curve]="core" [sanitize]="tests attn_lab" [shapes_more]="tests" [plan]="core" [peers]="core"
    [qwen]="core" [breakdown]="core" [variants]="core" [fp8]="core")

needed_groups() {
    local s g all="" picked=""
    for s in "${STEPS[@]}"; do all+=" ${STEP_NEEDS[$s]} "; done
    for g in core tests lab attn_lab; do [[ $all == *" $g "* ]] && picked+=" $g"; done
    echo $picked
}

# llm.c's sources: LLMC_SRC, else the bundle's copy (unpacked by env.sh).
llmc_source() {
    if [[ -n ${LLMC_SRC:-} ]]; then echo "$LLMC_SRC"
    elif [[ $DRY == 1 ]]; then echo "LLMC_SRC"
    elif [[ -f ${GPU_DEPS:-}/llmc_src/train_gpt2.cu ]]; then echo "$GPU_DEPS/llmc_src"; fi
}

# llm.q's sources (scripts/gpu/llmq_build.sh): LLMQ_SRC, else the bundle's
# copy (unpacked by env.sh); the qwen step runs it (steps_peers.sh).
llmq_source() {
    if [[ -n ${LLMQ_SRC:-} ]]; then echo "$LLMQ_SRC"
    elif [[ $DRY == 1 ]]; then echo "LLMQ_SRC"
    elif [[ -f ${GPU_DEPS:-}/llmq_src/train.cpp ]]; then echo "$GPU_DEPS/llmq_src"; fi
}

# The cudnn-frontend headers of llm.c's cuDNN build: CUDNN_FRONTEND, else the
# bundle's copy (unpacked by env.sh).
cudnn_frontend() {
    if [[ -n ${CUDNN_FRONTEND:-} ]]; then echo "$CUDNN_FRONTEND"
    elif [[ $DRY == 1 ]]; then echo "CUDNN_FRONTEND"
    elif [[ -f ${GPU_DEPS:-}/cudnn_frontend/include/cudnn_frontend.h ]]; then echo "$GPU_DEPS/cudnn_frontend"; fi
}

env_report() {
    echo "date: $(date -u +%FT%TZ)"
    if command -v nvidia-smi > /dev/null; then
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 |
            head -n 1) (name, driver, memory, compute capability)"
    else
        echo "gpu: no nvidia-smi"
    fi
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [^,]*' || echo 'not found')"
    echo "compute-sanitizer: ${SANITIZER:-not found}"
    echo "python: $PY, $("$PY" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)' 2>&1 |
        tail -n 1)"
    echo "torch: $("$TORCH_PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 |
        tail -n 1) ($TORCH_PY)"
    echo "build environment: $GPU_ENV_SUMMARY"
    echo "mpirun: $(command -v mpirun || echo none) $(mpirun --version 2>/dev/null | head -n 1)"
    echo "cpu: $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/ {print $2}') GiB memory;" \
        "disk: $(df -h . | awk 'NR == 2 {print $4}') free"
    echo "archives: $(archive_tool)"
    echo "bundle: $GPU_BUNDLE: $(ls "$GPU_BUNDLE" 2>/dev/null | tr '\n' ' ')"
    echo "llm.c sources: $(llmc_source || true)$([[ -n $(llmc_source) ]] || echo none)"
    echo "cudnn-frontend: $(cudnn_frontend || true)$([[ -n $(cudnn_frontend) ]] || echo none)"
    echo "llm.q sources: $(llmq_source || true)$([[ -n $(llmq_source) ]] || echo none)$([[ -x build/gpu/llmq/train ]] &&
        echo "; build/gpu/llmq/train: $(cut -d' ' -f2 build/gpu/llmq/stamp 2>/dev/null | cut -c1-12)")"
    echo "commit: ${GPU_COMMIT:-unknown}"
    echo "---- nvidia-smi"
    nvidia-smi 2>&1 || true
}

# ldd_report GROUP...: which MPI, BLAS, NCCL and CUDA libraries each binary loads.
ldd_report() {
    local g b
    for g in "$@"; do
        # the lab: one program that links cuBLAS and OpenBLAS stands for all
        for b in $([[ $g == lab ]] && echo dev/cuda/matmul_forward || group_bins "$g"); do
            [[ -x $b && ! -d $b ]] || continue
            echo "ldd $b: $(ldd "$b" 2>&1 | awk '/libmpi\.|libopenblas|libblas|libnccl|libcublas|libcudart|libgomp/ {
                    n = $1; sub(/\.so.*/, "", n); printf "%s%s=%s", s, n, $3; s = ", " }
                /not found/ { printf "%sMISSING %s", s, $1; s = ", " }')"
        done
    done
}

step_env() {
    begin_step env 30
    SUMMARY_MATCH='^[a-z][a-z. -]*: ' run_prog env 30 5 bash scripts/gpu/check.sh __env
    end_step
}

step_build() {
    begin_step build 420
    local groups
    groups=$(needed_groups)
    [[ -n $groups ]] || groups="core tests lab"  # the build step alone: everything
    # llm.c's train_gpt2cu, in the background while this tree builds and the
    # tests run (one nvcc process; bench waits for it).
    local llmc
    llmc=$(llmc_source)
    if [[ " ${STEPS[*]} " == *" bench "* && -n $llmc ]]; then
        llmc_background "" "$llmc" 30
    fi
    local fe
    fe=$(cudnn_frontend)
    if [[ " ${STEPS[*]} " == *" peers "* && -n $llmc && -n $fe ]]; then
        llmc_background "$fe" "$llmc" 90
    fi
    local t0
    t0=$(now)
    need $groups
    [[ $DRY == 1 ]] || cp "$BUILT"/make*.log "$W/" 2>/dev/null
    SUMMARY_MATCH='^ldd ' run_prog ldd 30 2 bash scripts/gpu/check.sh __ldd "${groups// /,}"
    figure build_seconds $(($(now) - t0)) s "scripts/gpu/check.sh build ($groups; $JOBS jobs, ${CUDA_ARCH:-default arch})"
    end_step
}

step_test() {
    begin_step test 150
    need tests
    # tests/run_tests.sh's reference models with a CUDA run: the PyTorch
    # reference's state, then test_gpt on CUDA fp32 and bf16 against it.
    # docmask_fp32, docmask64_fp32: the document mask (heads of 16: the
    # CUDA-core kernels; of 64: in bf16 the tensor-core ones).
    local name d mask
    for name in round_fp32 odd_fp32 docmask_fp32 docmask64_fp32; do
        mask=""
        [[ $name == docmask* ]] && mask=" --document-mask 7"
        rm -f build/test_logs/test_gpt_"$name"_cuda_*.log
        MIN=20 SUMMARY_MATCH='^(ref_|test_gpt_)' run_prog "test_gpt_$name" 90 15 \
            env LLMC_TEST_FILTER="^(ref_${name}|test_gpt_${name}_cuda_)" bash tests/run_tests.sh reference
        for d in fp32 bf16; do
            figures "build/test_logs/test_gpt_${name}_cuda_$d.log" "test_gpt_${name}_cuda_${d}_" \
                "build/test_gpt --model build/ref/$name.model.bin --state build/ref/$name.state.bin --device cuda --dtype $d$mask"
        done
    done
    # FP8 (docs/fp8.md, cuda/fp8.cuh): test_gpt --fp8 1 on CUDA against the reference's own rounding (fp64), and
    # with delayed scaling (fp8_round_delayed, --fp8-history 3: the activation's and the norms' casts): fp32 within
    # 2e-2 (the device scales in fp32, so an operand near a grid midpoint may round the other way; the CPU's fp32
    # emulation passes at 2e-2), bf16 within 0.2 (bf16 operands cross many midpoints: the CPU's bf16 emulation is at
    # 0.11 on the gradients, 2e-4 on the step losses).
    MIN=20 SUMMARY_MATCH='^(ref_|test_gpt_)' run_prog ref_fp8_round 60 5 \
        env LLMC_TEST_FILTER="^ref_fp8_round(_delayed)?_fp64$" bash tests/run_tests.sh reference
    local tol v h
    for v in fp8_round fp8_round_delayed; do
        h="" && [[ $v == *_delayed ]] && h=" --fp8-history 3"
        for d in fp32 bf16; do
            tol=2e-2 && [[ $d == bf16 ]] && tol=0.2
            FIGS="test_gpt_${v}_cuda_${d}_" \
                FIGCMD="build/test_gpt --model build/ref/$v.model.bin --state build/ref/$v.state.bin --device cuda --dtype $d --fp8 1 --tol $tol$h" \
                SUMMARY_MATCH='(passed|FAIL)' run_prog "test_gpt_${v/fp8_round/fp8}_cuda_$d" 60 5 build/test_gpt \
                --model "build/ref/$v.model.bin" --state "build/ref/$v.state.bin" --device cuda --dtype "$d" --fp8 1 --tol "$tol" $h
        done
    done
    # The Hopper attention (LLMC_ATTN_WG=1: forward and backward; det: dq in
    # a fixed order; fwd: the forward alone, to tell a failure's kernel) in
    # bf16 against the same
    # reference (heads of 64, the document mask); elsewhere it runs the default.
    local dm=build/ref/docmask64_fp32 wgm sfx
    for wgm in 1 det fwd; do
        sfx=""
        [[ $wgm == 1 ]] || sfx="_$wgm"
        FIGS=test_gpt_docmask64_fp32_cuda_bf16_attn_wg${sfx}_ \
            FIGCMD="LLMC_ATTN_WG=$wgm build/test_gpt --model $dm.model.bin --state $dm.state.bin --device cuda --dtype bf16 --document-mask 7" \
            SUMMARY_MATCH='(passed|FAIL)' run_prog "test_gpt_docmask64_bf16_attn_wg$sfx" 60 5 env LLMC_ATTN_WG=$wgm \
            build/test_gpt --model "$dm.model.bin" --state "$dm.state.bin" --device cuda --dtype bf16 --document-mask 7
    done
    # Mixtral (docs/moe.md): the bundle's transformers references
    # (scripts/gpu/bundle.sh, unpacked by env.sh), test_gpt on CUDA against
    # them; a name ending in _fp8 with --fp8 1 and FP8's tolerances: fp32
    # 2e-2 as above, bf16 0.3 (the CPU's bf16 emulation is at 0.17 on the
    # experts' gradients, its fp32 at 5e-4). Its experts' blocks have any
    # row count, and B x T = 57: the weight gradients' padded K.
    local R=build/gpu/deps/refs_hf st
    local -a f8
    for st in "$R"/*.state.bin; do
        [[ -f $st ]] || continue
        name=$(basename "$st" .state.bin)
        for d in fp32 bf16; do
            f8=()
            [[ $name == *_fp8 ]] && f8=(--fp8 1 --tol "$([[ $d == bf16 ]] && echo 0.3 || echo 2e-2)")
            FIGS="test_gpt_${name}_cuda_${d}_" FIGCMD="build/test_gpt --model $R/$name.hf --state $st --device cuda --dtype $d ${f8[*]}" \
                SUMMARY_MATCH='(passed|FAIL)' run_prog "test_gpt_${name}_cuda_$d" 60 5 build/test_gpt --model "$R/$name.hf" \
                --state "$st" --device cuda --dtype "$d" "${f8[@]}"
        done
    done
    FIGS=real_shapes_small_ SUMMARY_MATCH='^FAIL' run_prog real_shapes_small 60 15 build/test_real_shapes --shape small
    # The same checks with every switch that changes the numerics on, so a
    # switch the bench step times is also known to be right.
    local -a sw_env
    read -r -a sw_env <<< "$SWITCH_TESTS"
    FIGS=real_shapes_small_switches_ FIGCMD="${sw_env[*]} build/test_real_shapes --shape small" SUMMARY_MATCH='^FAIL' \
        run_prog real_shapes_small_switches 60 15 env "${sw_env[@]}" build/test_real_shapes --shape small
    run_prog vocab_ce 60 5 build/test_vocab_ce
    end_step
}

# The step's variants against the default step, each right and timed:
# AdamW's moments in bf16, the sync-free step (alone and as one graph).
step_variants() {
    begin_step variants 160
    need core
    # AdamW's moments in bf16 (--optimizer-dtype bf16, nearest and
    # stochastic) against fp32 moments: losses and the optimizer's bytes.
    FIGS= FIGCMD="scripts/gpu/optimizer_dtype.py --steps 60" SUMMARY_MATCH='^(PASS|FAIL)' \
        run_prog optimizer_dtype 60 20 "$PY" scripts/gpu/optimizer_dtype.py --out "$W/runs" --steps 60
    # The step without host synchronisation (--sync-free 1), alone and as
    # one CUDA graph, against the host-read step at d12's shape: losses,
    # sync_free_step_over_base, whole_step_graph_over_base and
    # cuda_graph_replays (the scripts name their figures: no prefix).
    FIGS= FIGCMD="scripts/gpu/sync_free.py --steps 40 -b 16" SUMMARY_MATCH='^(PASS|FAIL)' \
        run_prog sync_free 100 60 "$PY" scripts/gpu/sync_free.py --out "$W/runs" --steps 40 -b 16
    # A Mixtral (its routing on the device, the experts' grouped products).
    FIGS= FIGCMD="scripts/gpu/sync_free.py --prefix mixtral_" SUMMARY_MATCH='^(PASS|FAIL)' \
        run_prog sync_free_mixtral 45 15 "$PY" scripts/gpu/sync_free.py --out "$W/runs" --steps 12 --skip 4 -b 8 \
        -t 256 --prefix mixtral_ --model "arch=mixtral,L=4,C=512,NH=8,NKV=4,F=1024,E=8,K=2,V=257,T=256"
    end_step
}

# The switches of scripts/gpu/switches.txt that change the numerics, or how
# the work reaches the GPU (CUDA graphs), as VAR=VALUE words (the rest
# change only speed): command 1's test step checks test_real_shapes with
# all of them on.
SWITCH_TESTS=${SWITCH_TESTS:-"LLMC_GELU_FUSION=2 LLMC_ATTN_BWD=5 LLMC_BIAS_GRAD_EPILOGUE=1 LLMC_CUDA_GRAPH=1 LLMC_ATTN_WG=1"}

# summarise_shapes LOG: per group (e.g. d12_cuda_bf16): checks, failures, largest error.
summarise_shapes() {
    [[ -f $1 ]] || return 0
    awk '/^(PASS|FAIL) [a-z0-9_]+ +rel err/ {
            g = $2; sub(/_(logits|loss|grad_.*)$/, "", g)
            n[g]++; if ($1 == "FAIL") f[g]++; if ($5 + 0 > m[g] || $5 == "nan") m[g] = $5
            if (!(g in o)) { o[g] = ++k; name[k] = g } }
         END { for (i = 1; i <= k; i++) { g = name[i]
                 printf "  %-34s %3d checks %3d failed, largest rel err %s\n", g, n[g], f[g], m[g] } }' "$1" |
        while IFS= read -r line; do say "$line"; done
}

# shapes_run CASES LIMIT ASSUMED: build/test_real_shapes at d12's shapes.
shapes_run() {
    FIGS=shapes_ FIGCMD="build/test_real_shapes --cases $1 --rows ${SHAPES_ROWS:-4}" MIN=60 \
        SUMMARY_MATCH='^(== |  cpu fp64 truth|FAIL)' run_prog "real_shapes_${1//,/_}" "$2" "$3" \
        build/test_real_shapes --cases "$1" --rows "${SHAPES_ROWS:-4}"
    summarise_shapes "$W/real_shapes_${1//,/_}.log"
}

# d12 (heads of 64; SHAPES_CASES picks others, e.g. "d12 hs128": each name
# runs on its own, so a run cut short loses only itself).
step_shapes() {
    begin_step shapes 300
    need tests
    local c
    # d12 here; heads of 128 in shapes_more (command 4), which has the room.
    for c in ${SHAPES_CASES:-d12}; do shapes_run "$c" 190 70; done
    end_step
}

step_shapes_more() {
    begin_step shapes_more 540
    need tests
    shapes_run hs128 190 70
    shapes_run llama 200 70
    shapes_run big 300 150
    end_step
}

# ---- bench ------------------------------------------------------------------------
# The switches to A/B: scripts/gpu/switches.txt (one NAME=ITEM[,ITEM...] a
# line), or LLMC_SWITCHES="NAME=ITEM[,ITEM...] ..." in its place.
bench_switches() {
    if [[ -n ${LLMC_SWITCHES+x} ]]; then tr -s ' \t' '\n\n' <<< "$LLMC_SWITCHES"
    else sed -e 's/#.*//' scripts/gpu/switches.txt 2>/dev/null | tr -s ' \t' '\n\n'; fi | grep -v '^$' || true
}

# bench_data: build/gpu/bench_tokens.bin, 8M random GPT-2 token ids, read by both trainers.
bench_data() {
    [[ -f build/gpu/bench_tokens.bin && $DRY == 0 ]] || run_prog bench_data 60 5 "$PY" -c "import sys
sys.path.insert(0, 'scripts')
import numpy as np, shards
shards.write_shard(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8_000_000), 50257)" \
        build/gpu/bench_tokens.bin
}

# llmc_median_ms LOG: llm.c's median step time over the steps after the first 5.
llmc_median_ms() {
    sed -n 's/^step *[0-9]*\/[0-9]* |.*| \([0-9.]*\) ms |.*/\1/p' "$1" 2>/dev/null | tail -n +6 | sort -g |
        awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'
}

# llm.c's two builds: plain (FE empty: build/gpu/llmc) and cuDNN (FE the
# cudnn-frontend: build/gpu/llmc_cudnn), each one background job at most.
llmc_flavour() { [[ -z $1 ]] && echo llmc || echo llmc_cudnn; }
llmc_build_args() { [[ -z $1 ]] && echo "$2" || echo "--cudnn $1 $2"; }

# llmc_background FE SRC SOURCE_SECONDS: starts a build in the background
# (a dry run: a row, and when it is assumed done).
llmc_background() {
    local f
    f=$(llmc_flavour "$1")
    if [[ $DRY == 1 ]]; then
        local done_at=$(($(now) + $([[ $DRY_BUILD == prebuilt ]] && echo 0 || echo "$3")))
        printf -v "DRY_DONE_$f" '%s' "$done_at"
        printf '  %-34s %5ds %6s %5ds  %s\n' "${f}_build (background)" 400 "$((done_at - $(now)))s" "$done_at" \
            "scripts/gpu/llmc_build.sh $(llmc_build_args "$1" "$2")"
        return
    fi
    printf -v "LOG_$f" '%s' "$W/${f}_build.log"
    # shellcheck disable=SC2046
    (exec timeout 400 bash scripts/gpu/llmc_build.sh $(llmc_build_args "$1" "$2") > "$W/${f}_build.log" 2>&1 \
        < /dev/null) &
    printf -v "PID_$f" '%s' "$!"
    say "llm.c: building $f/train_gpt2cu in the background ($W/${f}_build.log)"
}

# tokens_per_s LOG: the "figure tokens_per_s" a run printed (scripts/benchmark.py, torch_gpt2.py).
tokens_per_s() { sed -n 's/^figure tokens_per_s \([0-9.]*\) .*/\1/p' "$1" 2>/dev/null; }
# llmc_tokens_per_s LOG B: llm.c's tokens/s at T=1024 from its median step.
llmc_tokens_per_s() {
    local ms
    ms=$(llmc_median_ms "$1")
    [[ -n $ms ]] && awk -v b="$2" -v ms="$ms" 'BEGIN {printf "%.0f", b * 1024 / ms * 1000}'
}
# ratio A B: A / B to 3 decimals, nothing when either is missing.
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

# llmc_ready SRC [FE]: llm.c's binary (FE: its cuDNN build), from the
# background build (waited for) or built now.
llmc_ready() {
    local fe=${2:-} f done_var pid_var log_var
    f=$(llmc_flavour "$fe")
    done_var=DRY_DONE_$f pid_var=PID_$f log_var=LOG_$f
    if [[ $DRY == 1 && -n ${!done_var:-} ]]; then
        local wait=$((${!done_var} - $(now)))
        ((wait < 0)) && wait=0
        dry_row "${f}_build_wait" "$(fit 200)" "$wait" "(the background build)"
        return
    fi
    if [[ $DRY == 1 || -z ${!pid_var:-} ]]; then
        # shellcheck disable=SC2046
        run_prog "${f}_build" 200 "0|$([[ -z $fe ]] && echo 30 || echo 90)" bash scripts/gpu/llmc_build.sh \
            $(llmc_build_args "$fe" "$1")
        return
    fi
    local t0 rc end pid=${!pid_var}
    t0=$(now) end=$((STEP_END - 60))
    while kill -0 "$pid" 2>/dev/null && (($(now) < end)); do sleep 2; done
    kill "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    printf -v "$pid_var" '%s' ""
    cp "${!log_var}" "$W/${f}_build.log" 2>/dev/null
    ((rc == 0)) && S_PASS=$((S_PASS + 1)) || S_FAIL=$((S_FAIL + 1))
    say "$(printf '%-44s rc=%-3s (background build; waited %ds)' "${f}_build" "$rc" $(($(now) - t0)))"
    ((rc == 0)) || tail -n 5 "$W/${f}_build.log" | while IFS= read -r l; do say "    $l"; done
    return "$rc"
}

# d12 at T=1024 for each B (BENCH_B): this trainer, llm.c's train_gpt2cu
# beside it; then, at one B (BENCH_SWITCH_B, by default the last of
# BENCH_B), each switch; tokens/s from the median step time after 5
# warm-up steps of 30, both with GELU recompute (-r 1, llm.c's default).
# One B for the switches keeps command 1 within its budget as switches are
# added (8 s assumed for each: 6 to 8 s measured on an H200 at B=32).
step_bench() {
    local -a switches bs
    mapfile -t switches < <(bench_switches)
    read -r -a bs <<< "${BENCH_B:-16 32}"
    local switch_b=${BENCH_SWITCH_B:-${bs[-1]}}
    # 240 s, and 50 s more for each switch's run.
    begin_step bench $((240 + 50 * ${#switches[@]}))
    need core
    local data=build/gpu/bench_tokens.bin llmc sw
    bench_data
    llmc=$(llmc_source)
    if [[ -n $llmc ]]; then llmc_ready "$llmc" || llmc=""
    else say "llm.c: no sources (LLMC_SRC=DIR, a clone of https://github.com/karpathy/llm.c, or the bundle's): ours only"; fi
    [[ $DRY == 1 ]] || say "$(printf '%-22s %6s %14s %14s %10s' run B tokens/s llmc_tok/s ratio)"
    local B ours lm ratio name env flags item args
    for B in "${bs[@]}"; do
        name=d12_b${B}_t1024_r1
        args=(-e d12 -i "$data" -j "" -b "$B" -t 1024 -r 1 --device cuda)
        FIGS=${name}_ours_ FIGCMD="scripts/benchmark.py --steps 30 --warmup 5 -- ${args[*]}" MIN=40 \
            run_prog "ours_b$B" 100 8 "$PY" scripts/benchmark.py --steps 30 --warmup 5 -- "${args[@]}"
        ours=$(tokens_per_s "$W/ours_b$B.log")
        lm="" ratio=""
        if [[ -n $llmc ]]; then
            MIN=40 run_prog "llmc_b$B" 100 8 bash -c 'cd build/gpu/llmc && exec ./train_gpt2cu "$@"' llmc \
                -e d12 -i "$PWD/$data" -j "$PWD/$data" -b "$B" -t 1024 -r 1 -x 30 -v 100000 -m 1 -s 0
            lm=$(llmc_tokens_per_s "$W/llmc_b$B.log" "$B")
            [[ -n $lm ]] && figure "${name}_llmc_tokens_per_s" "$lm" tok/s \
                "train_gpt2cu -e d12 -b $B -t 1024 -r 1 -x 30 (llm.c $(head -c 12 build/gpu/llmc/stamp 2>/dev/null))"
            ratio=$(ratio "$ours" "$lm")
            [[ -n $ratio ]] && figure "${name}_ours_over_llmc" "$ratio" ratio "the two figures above"
        fi
        [[ $DRY == 1 ]] || say "$(printf '%-22s %6s %14s %14s %10s' ours "$B" "${ours:--}" "${lm:--}" "${ratio:--}")"
        [[ $B == "$switch_b" ]] || continue
        for sw in "${switches[@]}"; do
            local sname=${sw%%=*} env=() flags=()
            IFS=, read -r -a items <<< "${sw#*=}"
            for item in "${items[@]}"; do
                if [[ $item == -* ]]; then flags+=("$item")
                elif [[ $item =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then env+=("$item")
                else sname=""; fi
            done
            if [[ ! $sname =~ ^[a-z0-9_]+$ || $sw != *=* ]]; then
                say "switch '$sw': not NAME=ITEM[,ITEM...] (NAME of a-z 0-9 _; ITEM VAR=VALUE or --flag=VALUE)"
                S_FAIL=$((S_FAIL + 1))
                continue
            fi
            FIGS=${name}_sw_${sname}_ FIGCMD="${env[*]} scripts/benchmark.py -- ${args[*]} ${flags[*]}" MIN=40 \
                run_prog "ours_b${B}_sw_$sname" 100 8 env "${env[@]}" "$PY" scripts/benchmark.py --steps 30 \
                --warmup 5 -- "${args[@]}" "${flags[@]}"
            local with
            with=$(tokens_per_s "$W/ours_b${B}_sw_$sname.log")
            ratio=$(ratio "$with" "$ours")
            [[ -n $ratio ]] && figure "${name}_sw_${sname}_over_base" "$ratio" ratio "tokens/s with ${sw#*=} over without"
            [[ $DRY == 1 ]] || say "$(printf '%-22s %6s %14s %14s %10s' "sw $sname" "$B" "${with:--}" "-" "${ratio:--}")"
        done
    done
    end_step
}

# ---- command 3 ------------------------------------------------------------------------
# lab_assumed PROG: seconds a lab program is assumed to take (validation
# against the CPU op, then the d12-size timings).
lab_assumed() {
    case $1 in
        attention_forward) echo 10 ;; attention_backward) echo 25 ;; ring_attention) echo 15 ;;
        matmul_forward | matmul_backward | classifier | vocab_parallel_ce) echo 8 ;;
        *) echo 5 ;;
    esac
}

step_lab() {
    begin_step lab 200
    need lab
    local src p
    for src in dev/cuda/*.cu; do
        p=$(basename "$src" .cu)
        FIGS="lab_${p}_" FIGCMD="dev/cuda/$p" SUMMARY_MATCH='FAIL' \
            run_prog "$p" $([[ $p == *attention* ]] && echo 90 || echo 60) "$(lab_assumed "$p")" "dev/cuda/$p"
    done
    # The bar on the same GPU: PyTorch's SDPA (flash and cuDNN backends) at
    # the lab's record shapes, and our forward and backward over each
    # (attn_fwd_hs64_t1024_over_torch_flash, ..._over_torch_cudnn, hs128_t4096;
    # attn_bwd_... the same).
    FIGS="" FIGCMD="scripts/gpu/torch_attention.py" SUMMARY_MATCH='causal' \
        run_prog torch_attention 60 15 "$TORCH_PY" scripts/gpu/torch_attention.py
    local shape ours be theirs dir
    for dir in fwd bwd; do
        local lab=attention_forward
        [[ $dir == bwd ]] && lab=attention_backward
        for shape in hs64_t1024 hs128_t4096; do
            ours=$(sed -n "s/^figure attn_${dir}_${shape}_tflops \([0-9.e+]*\) .*/\1/p" "$W/$lab.log" 2>/dev/null)
            [[ -n $ours ]] && figure "attn_${dir}_${shape}_tflops" "$ours" TFLOP/s "dev/cuda/$lab v4 (wgmma), causal bf16"
            if [[ $dir == bwd ]]; then  # dq in a fixed order (LLMC_ATTN_WG=det): the price of the turns
                local det
                det=$(sed -n "s/^figure attn_bwd_det_${shape}_tflops \([0-9.e+]*\) .*/\1/p" "$W/$lab.log" 2>/dev/null)
                [[ -n $det ]] && figure "attn_bwd_det_${shape}_tflops" "$det" TFLOP/s "dev/cuda/$lab v6 (wgmma, dq in turns), causal bf16"
            fi
            for be in flash cudnn; do
                theirs=$(sed -n "s/^figure torch_sdpa_${be}_${dir}_${shape}_tflops \([0-9.]*\) .*/\1/p" "$W/torch_attention.log" 2>/dev/null)
                [[ -n $ours && -n $theirs ]] && figure "attn_${dir}_${shape}_over_torch_$be" "$(ratio "$ours" "$theirs")" ratio \
                    "dev/cuda/$lab v4 over scripts/gpu/torch_attention.py ($be), causal bf16"
            done
        done
    done
    end_step
}

step_ranks() {
    begin_step ranks 260
    need core
    if [[ $DRY == 0 ]] && ! command -v mpirun > /dev/null; then
        skip_row ranks "no mpirun: install Open MPI, or bundle it (scripts/gpu/bundle.sh)"
        end_step
        return
    fi
    [[ $DRY == 1 ]] || say "$(mpirun --version 2>&1 | head -n 1)"
    local match='^([a-z0-9]+, one process|  (fp32|bf16) )|^FAIL'
    # GPT-2 in thirteen layouts, fp32 and bf16: 28 runs of ~5 s.
    FIGS=ranks_ FIGCMD="scripts/gpu/ranks.py (mpirun -np N train_gpt --device cuda --comm mpi)" MIN=30 \
        SUMMARY_MATCH=$match run_prog ranks 180 50 "$PY" scripts/gpu/ranks.py --out "$W/runs" --timeout 60
    # A Llama (GQA, SwiGLU, RoPE, untied head) under four of them, fp32: 5 runs.
    FIGS=ranks_ FIGCMD="scripts/gpu/ranks.py --model llama --dtypes fp32 (mpirun -np N train_gpt --device cuda --comm mpi)" \
        MIN=20 SUMMARY_MATCH=$match run_prog ranks_llama 45 10 "$PY" scripts/gpu/ranks.py --model llama --dtypes fp32 \
        --out "$W/runs_llama" --layouts tp2_sp,cp2,dp2_z3,pp2_tp2_sp_z1 --timeout 60
    end_step
}

step_curve() {
    begin_step curve 200
    need core
    local lim
    lim=$(fit 190)
    FIGS=curve_ FIGCMD="scripts/gpu/curve.py (train_gpt -e L=12,C=768,NH=12,V=257,T=1024 -t 1024 -b 4)" MIN=60 \
        SUMMARY_MATCH='^(PASS|FAIL|  c)' run_prog curve 190 160 "$PY" scripts/gpu/curve.py --out "$W/runs" \
        --png "$OUTDIR/d12_tiny_curve.png" --deadline $((lim - 20))
    end_step
}

# ---- command 3 ------------------------------------------------------------------------
# san_assumed TOOL PROG: assumed seconds of one sanitizer run. Measured on
# an H200 (docs/gpu-results.md): memcheck, initcheck and synccheck about 1 s
# for each program; racecheck 2 s (attention_forward), 5 s
# (attention_backward), 40 s (ring_attention), and test_gpt past the 18 s
# it was given (its time here is a guess).
san_assumed() {
    if [[ $1 != racecheck ]]; then echo 3; return; fi
    case $2 in
        test_gpt_*) echo 60 ;; attention_forward) echo 4 ;; attention_backward) echo 8 ;; *) echo 45 ;;
    esac
}

# compute-sanitizer's tools, each over test_gpt (CUDA fp32 and bf16, the
# round reference model) and the attention lab programs on their small
# cases (--small). The time left is shared among the tools by their assumed
# times, and a tool's share among its programs by theirs; time a run leaves
# unused goes to the next.
step_sanitize() {
    begin_step sanitize 540
    need tests attn_lab
    local san=${SANITIZER:-compute-sanitizer}
    if [[ $DRY == 0 && -z ${SANITIZER:-} ]]; then
        skip_row compute-sanitizer "not found"
        end_step
        return
    fi
    local M=build/ref/round_fp32.model.bin S=build/ref/round_fp32.state.bin
    [[ -f $S && $DRY == 0 ]] || MIN=20 run_prog reference 60 10 "$TORCH_PY" tests/reference/reference_gpt.py \
        --spec "L=2,C=64,NH=4,V=128,T=32" --dtype fp32 --B 4 --T 32 --warmup 3 --final-frac 0.1 --wd 0.1 \
        --write-model "$M" --write-state "$S"
    local -A cmd=(
        [test_gpt_fp32]="build/test_gpt --model $M --state $S --device cuda --dtype fp32"
        [test_gpt_bf16]="build/test_gpt --model $M --state $S --device cuda --dtype bf16"
        [attention_forward]="dev/cuda/attention_forward --small" [attention_backward]="dev/cuda/attention_backward --small"
        [ring_attention]="dev/cuda/ring_attention --small")
    local tools=(${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck})
    local progs=(${SANITIZE_PROGS:-test_gpt_fp32 test_gpt_bf16 attention_forward attention_backward ring_attention})
    local -A weight
    local tool p wleft=0 tool_end left k e a
    for tool in "${tools[@]}"; do
        weight[$tool]=0
        for p in "${progs[@]}"; do weight[$tool]=$((weight[$tool] + $(san_assumed "$tool" "$p"))); done
        wleft=$((wleft + weight[$tool]))
    done
    for tool in "${tools[@]}"; do
        tool_end=$(($(now) + (STEP_END - $(now) - 5) * weight[$tool] / wleft))
        wleft=$((wleft - weight[$tool]))
        k=${weight[$tool]}
        for p in "${progs[@]}"; do
            a=$(san_assumed "$tool" "$p")
            left=$(((tool_end - $(now)) * a / k))
            k=$((k - a))
            # shellcheck disable=SC2086
            MIN=10 run_prog "${tool}_$p" "$left" "$(san_assumed "$tool" "$p")" "$san" --tool "$tool" \
                --error-exitcode 99 ${cmd[$p]}
            [[ $DRY == 1 || ! -f $W/${tool}_$p.log ]] && continue
            e=$(sed -n -e 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' \
                       -e 's/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$W/${tool}_$p.log" | tail -n 1)
            say "$(printf '  %-12s %-20s errors: %s' "$tool" "$p" "${e:-no summary}")"
            [[ -n $e ]] && figure "sanitize_${tool}_${p}_errors" "$e" errors "compute-sanitizer --tool $tool ${cmd[$p]}"
        done
    done
    end_step
}

# ---- command 4 (optional) ---------------------------------------------------------------
# The planner (llmc/plan) on this GPU: calibrate at d12's shapes, predict
# d12 B=16 and compare with the measured tokens/s (command 1's figure in the
# same output folder, or a run now).
step_plan() {
    begin_step plan 200
    need core
    local prof=$W/gpu_profile.json fig=d12_b16_t1024_r1_ours_tokens_per_s meas=""
    run_prog calibrate 120 60 ./train_gpt --calibrate "$prof" -e d12 -b 16 -t 1024 --device cuda
    [[ -f $RESULTS ]] && meas=$("$PY" -c "import json, sys
v = [json.loads(l)['value'] for l in open(sys.argv[1]) if '\"$fig\"' in l]
print(v[-1] if v else '')" "$RESULTS" 2>/dev/null)
    if [[ -z $meas ]]; then
        bench_data
        FIGS=d12_b16_t1024_r1_ours_ MIN=40 run_prog ours_b16 100 25 "$PY" scripts/benchmark.py --steps 30 --warmup 5 \
            -- -e d12 -i build/gpu/bench_tokens.bin -j "" -b 16 -t 1024 -r 1 --device cuda
        meas=$(tokens_per_s "$W/ours_b16.log")
    fi
    run_prog plan_d12 60 10 ./train_gpt --plan eval --hardware "$prof" -e d12 -b 16 -t 1024 -r 1 --world 1 \
        --device cuda --plan-json "$W/plan_d12.jsonl"
    if [[ $DRY == 0 && -f $W/plan_d12.jsonl && -n $meas ]]; then
        local pred
        pred=$("$PY" -c "import json, sys; print(json.loads(open(sys.argv[1]).readline())['tokens_per_s'])" \
            "$W/plan_d12.jsonl" 2>/dev/null)
        if [[ -n $pred ]]; then
            say "planner: d12 B=16 predicted $pred tokens/s, measured $meas"
            figure d12_b16_plan_tokens_per_s "$pred" tok/s "train_gpt --calibrate, then --plan eval -e d12 -b 16 -t 1024 -r 1"
            figure d12_b16_plan_over_measured "$(awk -v a="$pred" -v b="$meas" 'BEGIN {printf "%.4f", a / b}')" ratio \
                "the prediction over $fig"
        fi
    fi
    end_step
}
