# scripts/gpu/steps_peers.sh: sourced (not run) by scripts/gpu/check.sh: the
# steps that measure this trainer beside the strongest peers on the same
# GPU, in the same command (each ratio's two figures side by side), and
# where its step's time goes:
#   peers      d12 beside llm.c's production build (cuDNN) and compiled PyTorch
#   qwen       Qwen2.5-0.5B and -1.5B shapes beside llm.q
#   fp8        --fp8 1 against bf16 (d12, Qwen2.5-1.5B), and llm.q's FP8 mode
#   breakdown  d12's step by op class, measured and planned
# Helpers (bench_data, llmc_ready, tokens_per_s, llmc_tokens_per_s, ratio)
# are scripts/gpu/steps.sh's.
# shellcheck shell=bash disable=SC2034

# ---- peers --------------------------------------------------------------------------
# d12 (T=1024, the same token shard and model shape) beside the strongest
# peers on this GPU, each ratio measured in the same command:
#   llm.c's production build (cuDNN attention: llmc_build.sh --cudnn) at its
#   recipe, B=64 without recompute (-r 0), and at B=32 -r 1;
#   GPT-2 in compiled PyTorch (scripts/gpu/torch_gpt2.py: SDPA, torch.compile,
#   fused AdamW, bf16 autocast) at B=32, which recomputes nothing: this
#   trainer at -r 0 beside it.
# tokens/s from the median step after the warm-up steps of 30 (5; PyTorch
# 10, its compile among them). Figures: d12_b64_t1024_r0_*, d12_b32_t1024_r1_*
# (ours_tokens_per_s, llmc_cudnn_tokens_per_s, ours_over_llmc_cudnn) and
# d12_b32_t1024_* (ours_r0_tokens_per_s, torch_compile_tokens_per_s,
# ours_over_torch_compile), each peer's commit and flags in its command.
step_peers() {
    begin_step peers 330
    need core
    local data=build/gpu/bench_tokens.bin llmc fe desc="" B r name ours lm ratio args
    bench_data
    llmc=$(llmc_source) fe=$(cudnn_frontend)
    if [[ -n $llmc && -n $fe ]]; then
        llmc_ready "$llmc" "$fe" || llmc=""
        # What the figures say of the peer: llm.c's commit, the frontend's, cuDNN's version.
        if [[ $DRY != 1 ]]; then  # one string (words after an assignment would run as a command)
            desc="llm.c $(cut -d' ' -f1 build/gpu/llmc_cudnn/stamp 2>/dev/null | head -c 12),"
            desc+=" USE_CUDNN=1, cudnn-frontend $(cut -d' ' -f3 build/gpu/llmc_cudnn/stamp 2>/dev/null | head -c 12),"
            desc+=" cudnn ${GPU_ENV_SUMMARY#*cudnn: }"
        fi
        desc=${desc%%; CUDA_ARCH*}
    else
        say "llm.c with cuDNN: no $([[ -z $llmc ]] && echo "llm.c sources (LLMC_SRC=DIR)" ||
            echo "cudnn-frontend (CUDNN_FRONTEND=DIR, a clone of https://github.com/NVIDIA/cudnn-frontend)"): skipped"
        llmc=""
    fi
    [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' run tokens/s peer_tok/s ratio)"
    for B in 64 32; do
        r=$([[ $B == 64 ]] && echo 0 || echo 1) name=d12_b${B}_t1024_r$r
        args=(-e d12 -i "$data" -j "" -b "$B" -t 1024 -r "$r" --device cuda)
        FIGS=${name}_ours_ FIGCMD="scripts/benchmark.py --steps 30 --warmup 5 -- ${args[*]}" MIN=40 \
            run_prog "ours_b${B}_r$r" 100 10 "$PY" scripts/benchmark.py --steps 30 --warmup 5 -- "${args[@]}"
        ours=$(tokens_per_s "$W/ours_b${B}_r$r.log")
        lm="" ratio=""
        if [[ -n $llmc ]]; then
            MIN=40 run_prog "llmc_cudnn_b${B}_r$r" 120 15 bash -c 'cd build/gpu/llmc_cudnn && exec ./train_gpt2cu "$@"' \
                llmc -e d12 -i "$PWD/$data" -j "$PWD/$data" -b "$B" -t 1024 -r "$r" -x 30 -v 100000 -m 1 -s 0
            lm=$(llmc_tokens_per_s "$W/llmc_cudnn_b${B}_r$r.log" "$B")
            [[ -n $lm ]] && figure "${name}_llmc_cudnn_tokens_per_s" "$lm" tok/s \
                "train_gpt2cu -e d12 -b $B -t 1024 -r $r -x 30 ($desc)"
            ratio=$(ratio "$ours" "$lm")
            [[ -n $ratio ]] && figure "${name}_ours_over_llmc_cudnn" "$ratio" ratio "the two figures above ($desc)"
        fi
        [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' "ours B=$B -r $r" "${ours:--}" "${lm:--}" "${ratio:--}")"
    done
    name=d12_b32_t1024
    args=(-e d12 -i "$data" -j "" -b 32 -t 1024 -r 0 --device cuda)
    FIGS=${name}_ours_r0_ FIGCMD="scripts/benchmark.py --steps 30 --warmup 5 -- ${args[*]}" MIN=40 \
        run_prog ours_b32_r0 100 10 "$PY" scripts/benchmark.py --steps 30 --warmup 5 -- "${args[@]}"
    ours=$(tokens_per_s "$W/ours_b32_r0.log")
    local tcmd="scripts/gpu/torch_gpt2.py --data $data --B 32 --T 1024 --steps 30 --warmup 10"
    FIGS=${name}_torch_compile_ FIGCMD="$tcmd" MIN=60 \
        run_prog torch_compile_b32 240 150 "$TORCH_PY" scripts/gpu/torch_gpt2.py --data "$data" --B 32 --T 1024 \
        --steps 30 --warmup 10
    local tt backend tver
    tt=$(tokens_per_s "$W/torch_compile_b32.log")
    backend=$(sed -n 's/^sdpa_backend \(.*\)/\1/p' "$W/torch_compile_b32.log" 2>/dev/null)
    tver=$(sed -n 's/^torch \([^,]*\),.*/\1/p' "$W/torch_compile_b32.log" 2>/dev/null)
    ratio=$(ratio "$ours" "$tt")
    [[ -n $ratio ]] && figure "${name}_ours_over_torch_compile" "$ratio" ratio \
        "ours -r 0 over $tcmd (torch $tver, sdpa $backend)"
    [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' "ours B=32 -r 0" "${ours:--}" "${tt:--}" "${ratio:--}")" \
        "(compiled PyTorch $tver, SDPA backend: ${backend:-?})"
    end_step
}

# ---- qwen ---------------------------------------------------------------------------
# Qwen2.5-0.5B and -1.5B shapes from random initialisation, bf16, T=1024,
# 131,072 tokens a step, no recompute, this trainer beside llm.q
# (scripts/gpu/llmq_build.sh; --from-scratch takes the shapes from the
# name) on the same random tokens of Qwen's vocabulary (llm.q reads them
# through scripts/gpu/llmq_tokens.py): tokens/s from the median step after
# the first 2 of 12. llm.q: B=32, 4 micro-batches; this trainer: 0.5B at
# B=32, 4 micro-batches; 1.5B at B=16, 8 (its fp32 master weights and Adam
# state do not leave room for B=32 without recompute on 80 GB). Figures:
# qwen2.5_{0.5b,1.5b}_{ours_tokens_per_s, ours_mfu, llmq_tokens_per_s,
# ours_over_llmq}, llm.q's commit and flags in its command.
QWEN_05B=arch=qwen2,L=24,C=896,NH=14,NKV=2,F=4864,V=151936,T=1024,theta=1000000,tied=1
QWEN_15B=arch=qwen2,L=28,C=1536,NH=12,NKV=2,F=8960,V=151936,T=1024,theta=1000000,tied=1

# llmq_median_tps LOG: llm.q's tokens/s, from its JSON log's step lines, the median after the first 2.
llmq_median_tps() {
    sed -n 's/.*"log": "step".*"step_tokens": \([0-9]*\), "duration_ms": \([0-9]*\).*/\1 \2/p' "$1" 2>/dev/null |
        tail -n +3 | awk '$2 > 0 {print $1 / $2 * 1000}' | sort -g |
        awk '{a[NR] = $1} END {if (NR) printf "%.0f\n", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'
}

QWEN_TOKENS=build/gpu/qwen_tokens.bin

# qwen_tokens: random tokens of Qwen's vocabulary in QWEN_TOKENS (made once).
qwen_tokens() {
    [[ -f $QWEN_TOKENS && $DRY == 0 ]] || run_prog qwen_data 60 10 "$PY" -c "import sys
sys.path.insert(0, 'scripts')
import numpy as np, shards
shards.write_shard(sys.argv[1], np.random.default_rng(0).integers(0, 151936, 8_000_000), 151936)" "$QWEN_TOKENS"
}

# llmq_prepare: llm.q built from its sources and its token files made from
# QWEN_TOKENS; LLMQ_OK=1 when it can run, LLMQ_DESC its commit for the figures.
llmq_prepare() {
    local src
    LLMQ_OK=0 LLMQ_DESC=""
    src=$(llmq_source)
    if [[ -z $src ]]; then
        say "llm.q: no sources (LLMQ_SRC=DIR, a clone of https://github.com/IST-DASLab/llmq, or the bundle's):" \
            "ours only"
        return
    fi
    run_prog llmq_build 300 "0|120" bash scripts/gpu/llmq_build.sh "$src" && LLMQ_OK=1
    run_prog llmq_tokens 60 5 "$PY" scripts/gpu/llmq_tokens.py "$QWEN_TOKENS" build/gpu/llmq_train.bin \
        --vocab 151936
    run_prog llmq_tokens_eval 60 3 "$PY" scripts/gpu/llmq_tokens.py "$QWEN_TOKENS" \
        build/gpu/llmq_eval.bin --vocab 151936 --head 65537
    [[ $DRY == 1 ]] || LLMQ_DESC="llm.q $(cut -d' ' -f2 build/gpu/llmq/stamp 2>/dev/null | cut -c1-12)"
}

# llmq_measure PROG ASSUMED SIZE MATMUL QDIR EXTRA...: llm.q from scratch at
# Qwen2.5-SIZE with the qwen step's recipe (B=32, 4 micro-batches, 12 steps,
# CUDA graphs), its products in MATMUL (bf16, or e4m3: its FP8 mode), as
# program PROG; LLMQ_CMD its command, LLMQ_TPS its tokens/s (empty if none).
llmq_measure() {
    local prog=$1 assumed=$2 size=$3 mm=$4 qdir=$5
    shift 5
    LLMQ_CMD=(build/gpu/llmq/train "--model=Qwen2.5-${size}B" --from-scratch --gpus=1
        --train-file=build/gpu/llmq_train.bin --eval-file=build/gpu/llmq_eval.bin --seq-len=1024
        --batch-size=32 --grad-accumulation=4 --steps=12 --model-dtype=bf16 "--matmul-dtype=$mm"
        --use-cuda-graphs --learning-rate=3e-4 --warmup=2 --eval-every-n-steps=0 --ckpt-interval=0
        --save-training-state=false --log-gpu-util=0 "$@" "--out-dir=$qdir"
        "--checkpoint-dir=$qdir/ckpt" "--log-file=$qdir/log.json")
    [[ $DRY == 1 ]] || mkdir -p "$qdir"
    MIN=60 run_prog "$prog" 200 "$assumed" "${LLMQ_CMD[@]}"
    LLMQ_TPS=$(llmq_median_tps "$qdir/log.json")
    [[ $DRY == 1 ]] || rm -rf "$qdir/ckpt" "$qdir"/*.safetensors 2>/dev/null  # the model llm.q writes at its end
}

step_qwen() {
    begin_step qwen 420
    need core
    local tok=$QWEN_TOKENS name spec B ours lm ratio
    qwen_tokens
    llmq_prepare
    [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' run tokens/s llmq_tok/s ratio)"
    for name in 0.5b 1.5b; do
        if [[ $name == 0.5b ]]; then spec=$QWEN_05B B=32; else spec=$QWEN_15B B=16; fi
        local args=(-e "$spec" -i "$tok" -j "" -b "$B" -t 1024 -d 131072 -r 0 --device cuda) extra=()
        [[ $name == 1.5b ]] && extra=(--lmhead-chunks=4)
        FIGS=qwen2.5_${name}_ours_ FIGCMD="scripts/benchmark.py --steps 12 --warmup 2 -- ${args[*]}" MIN=60 \
            run_prog "ours_qwen_$name" 150 "$([[ $name == 0.5b ]] && echo 40 || echo 70)" "$PY" scripts/benchmark.py \
            --steps 12 --warmup 2 -- "${args[@]}"
        ours=$(tokens_per_s "$W/ours_qwen_$name.log")
        lm="" ratio=""
        if ((LLMQ_OK)); then
            llmq_measure "llmq_qwen_$name" "$([[ $name == 0.5b ]] && echo 50 || echo 90)" "${name%b}" bf16 \
                "$W/llmq_$name" "${extra[@]}"
            lm=$LLMQ_TPS
            [[ -n $lm ]] && figure "qwen2.5_${name}_llmq_tokens_per_s" "$lm" tok/s "${LLMQ_CMD[*]} ($LLMQ_DESC)"
            ratio=$(ratio "$ours" "$lm")
            [[ -n $ratio ]] &&
                figure "qwen2.5_${name}_ours_over_llmq" "$ratio" ratio "the two figures above ($LLMQ_DESC)"
        fi
        [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' "Qwen2.5-$name" "${ours:--}" "${lm:--}" "${ratio:--}")"
    done
    end_step
}

# ---- fp8 ----------------------------------------------------------------------------
# FP8 training (--fp8 1, docs/fp8.md) against bf16 on the same GPU, in the
# same command: d12 (B=32, T=1024, -r 1, the bench step's run) and the
# Qwen2.5-1.5B shape (the qwen step's run: B=16, 8 micro-batches), each
# with and without --fp8 1 (tokens/s from the median step after the
# warm-up); FP8 with delayed scaling, --fp8-history 16 (FP8_ARGS), the
# recipe whose casts leave out most of the operands' passes; llm.q's FP8
# mode (--matmul-dtype=e4m3) at the 1.5B shape with the qwen step's
# recipe; then scripts/gpu/fp8_loss.py: 300 steps of the embedded text
# with and without FP8 (the same recipe), d12's and the 1.5B model's bodies.
# d12 again with FP8 on fc and fcproj alone (--fp8-layers fc,fcproj: the
# layers the planner says pay at its width).
# Figures: fp8_d12_over_bf16, fp8_d12_layers_fc_fcproj_over_bf16, fp8_qwen2.5_1.5b_over_bf16,
# fp8_qwen2.5_1.5b_over_llmq_fp8 (and the tokens/s behind each),
# fp8_d12_loss_rel_diff_300, fp8_qwen2.5_1.5b_loss_rel_diff_300.
# fp8_pair NAME FIG LIMIT ASSUMED MIN STEPS WARMUP WHAT ARGS...: scripts/benchmark.py
# of ARGS with --fp8 0 and with --fp8 1 and FP8_ARGS (programs NAME_fp8_0
# and _1, figures FIG_fp8_0_... and FIG_fp8_1_...), then figure
# fp8_FIG_over_bf16 (WHAT names the run) and a row; FP8_TPS: the FP8 run's
# tokens/s.
FP8_ARGS=(--fp8-history 16)
fp8_pair() {
    local name=$1 fig=$2 limit=$3 assumed=$4 min=$5 steps=$6 warmup=$7 what=$8 f bf ratio
    shift 8
    for f in 0 1; do
        local extra=()
        ((f)) && extra=("${FP8_ARGS[@]}")
        FIGS=${fig}_fp8_${f}_ FIGCMD="scripts/benchmark.py --steps $steps --warmup $warmup -- $* --fp8 $f ${extra[*]}" \
            MIN=$min run_prog "${name}_fp8_$f" "$limit" "$assumed" "$PY" scripts/benchmark.py --steps "$steps" \
            --warmup "$warmup" -- "$@" --fp8 "$f" "${extra[@]}"
    done
    bf=$(tokens_per_s "$W/${name}_fp8_0.log") FP8_TPS=$(tokens_per_s "$W/${name}_fp8_1.log")
    ratio=$(ratio "$FP8_TPS" "$bf")
    [[ -n $ratio ]] && figure "fp8_${fig}_over_bf16" "$ratio" ratio \
        "$what: tokens/s with --fp8 1 ${FP8_ARGS[*]} over without"
    [[ $DRY == 1 ]] || say "$(printf '%-22s %14s %14s %10s' "$name" "${bf:--}" "${FP8_TPS:--}" "${ratio:--}")"
}

step_fp8() {
    begin_step fp8 540
    need core lab
    local data=build/gpu/bench_tokens.bin ratio
    # The FP8 lab's checks first, without its timings: amax, every byte of
    # the quantised copies, the products against the CPU's emulation, the
    # measuring activations and norms, the activation's cast under delayed
    # scaling. A FAIL here says the figures below are not FP8's to quote.
    FIGS="" FIGCMD="LAB_CHECK_ONLY=1 dev/cuda/fp8" SUMMARY_MATCH='FAIL|passed' \
        run_prog fp8_lab 60 8 env LAB_CHECK_ONLY=1 dev/cuda/fp8
    bench_data
    fp8_pair d12 d12 100 35 40 30 5 "d12 -b 32 -t 1024 -r 1" -e d12 -i "$data" -j "" -b 32 -t 1024 -r 1 --device cuda
    # ... and with FP8 on the layers the planner says pay at d12's width
    # (docs/fp8.md, --fp8-layers), against the same bf16 run (fewer steps:
    # the loss runs below need the time).
    local d12=(-e d12 -i "$data" -j "" -b 32 -t 1024 -r 1 --device cuda --fp8 1 "${FP8_ARGS[@]}" --fp8-layers "fc,fcproj")
    FIGS=d12_fp8_layers_ FIGCMD="scripts/benchmark.py --steps 20 --warmup 5 -- ${d12[*]}" MIN=30 \
        run_prog d12_fp8_layers 80 25 "$PY" scripts/benchmark.py --steps 20 --warmup 5 -- "${d12[@]}"
    ratio=$(ratio "$(tokens_per_s "$W/d12_fp8_layers.log")" "$(tokens_per_s "$W/d12_fp8_0.log")")
    [[ -n $ratio ]] && figure fp8_d12_layers_fc_fcproj_over_bf16 "$ratio" ratio \
        "d12 -b 32 -t 1024 -r 1: tokens/s with --fp8 1 ${FP8_ARGS[*]} --fp8-layers fc,fcproj over without"
    qwen_tokens
    fp8_pair qwen_1.5b qwen2.5_1.5b 150 70 60 12 2 "Qwen2.5-1.5B shape -b 16 -d 131072" -e "$QWEN_15B" \
        -i "$QWEN_TOKENS" -j "" -b 16 -t 1024 -d 131072 -r 0 --device cuda
    llmq_prepare
    if ((LLMQ_OK)); then
        llmq_measure llmq_qwen_1.5b_fp8 90 1.5 e4m3 "$W/llmq_fp8" --lmhead-chunks=4
        [[ -n $LLMQ_TPS ]] && figure qwen2.5_1.5b_llmq_fp8_tokens_per_s "$LLMQ_TPS" tok/s "${LLMQ_CMD[*]} ($LLMQ_DESC)"
        ratio=$(ratio "$FP8_TPS" "$LLMQ_TPS")
        [[ -n $ratio ]] && figure fp8_qwen2.5_1.5b_over_llmq_fp8 "$ratio" ratio \
            "ours with --fp8 1 ${FP8_ARGS[*]} (above) over llm.q --matmul-dtype=e4m3 ($LLMQ_DESC)"
        [[ $DRY == 1 ]] ||
            say "$(printf '%-22s %14s %14s %10s' "llm.q e4m3 1.5B" "${LLMQ_TPS:--}" "${FP8_TPS:--}" "${ratio:--}")"
    fi
    local lim
    lim=$(fit 240)
    FIGS="" FIGCMD="scripts/gpu/fp8_loss.py (train_gpt, data/tiny, 300 steps, -b 8 -t 1024, --fp8 0 and 1 ${FP8_ARGS[*]})" \
        MIN=60 SUMMARY_MATCH='^(PASS|FAIL|  [a-z])' run_prog fp8_loss 240 200 "$PY" scripts/gpu/fp8_loss.py \
        --out "$W/runs" --deadline $((lim - 10)) "${FP8_ARGS[@]}"
    end_step
}

# ---- breakdown ----------------------------------------------------------------------
# d12 at B=32, T=1024, -r 1: the step's GPU time by op class (CUDA events
# around every op, llmc/backend/backend_profile.h) and the planner's
# prediction of the same classes on the h100-sxm profile
# (scripts/benchmark.py --breakdown). Figures: d12_b32_breakdown_<class>_ms,
# d12_b32_breakdown_planned_<class>_ms, d12_b32_breakdown_idle_ms and the
# ops' share of the step.
step_breakdown() {
    begin_step breakdown 120
    need core
    local data=build/gpu/bench_tokens.bin
    bench_data
    local args=(-e d12 -i "$data" -j "" -b 32 -t 1024 -r 1 --device cuda)
    FIGS=d12_b32_ FIGCMD="scripts/benchmark.py --steps 20 --warmup 5 --breakdown -- ${args[*]}" MIN=40 \
        SUMMARY_MATCH='^breakdown|^  [a-z_]+ +[0-9.]+ ' run_prog breakdown_d12_b32 100 15 "$PY" scripts/benchmark.py \
        --steps 20 --warmup 5 --breakdown -- "${args[@]}"
    end_step
}
