#!/usr/bin/env bash
# tests/run_tests.sh: the test suite, in tiers (what `make test` and .ci/run
# run, all tiers in this order). Each test program prints "N passed, N
# failed" last; this script adds them up and prints the total the same way.
# A program that crashes or exits non-zero without a count counts as one
# failure.
#
#   bash tests/run_tests.sh [TIER ...]     (no TIER: all of them)
#
#   unit         tests/unit/: one process, no reference: the library's pieces
#                (tensor table, flags, schedules, data, files, kernels'
#                index arithmetic and tensor-core layouts on the CPU, the
#                GPU path's host-side decisions, where the Makefile finds
#                the CUDA libraries, the GPU runbook's scripts and their dry
#                runs), and the layout of this tree (tests/unit/test_structure.py).
#                Needs: the test programs (make tests).
#   reference    tests/reference/: one process against an independent truth:
#                the PyTorch reference (itself checked against functional
#                PyTorch, finite differences and torch.optim.AdamW), and
#                transformers' GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM
#                and MixtralForCausalLM, and the `tokenizers` package (BPE
#                encoding).
#                Needs: PyTorch (python3-torch) and build/hfenv
#                (transformers; scripts/setup.sh makes it).
#   distributed  tests/distributed/: under mpirun, every layout (dp, ZeRO
#                1-3, tp, sp, cp, pp, vpp and their mixes, GPT-2, Llama,
#                Qwen2 and Mixtral) against one process, in fp64 and in bf16 mixed
#                precision; the step's recorded regions (CUDA
#                graphs, emulated) against running the ops; the
#                communicators and ring attention against formulas; a job
#                over two hosts.
#                Needs: Open MPI (2 cores are enough: ranks oversubscribe).
#   e2e          tests/e2e/: the trainer as a user runs it: determinism,
#                resume, learning, every error path, the robustness audit
#                (bad inputs and faults, each outcome classified), recompute
#                modes, checkpoints, the memory check, the planner against
#                measured runs. Needs: Open MPI for its multi-rank cases.
#   cuda         the CUDA code compiles (the trainer's backend and the
#                dev/cuda kernel lab); with a GPU, test_gpt on the CUDA
#                backend joins the reference tier. Needs: nvcc.
set -u
cd "$(dirname "$0")/.."
# The python that has PyTorch: Debian's python3-torch lives in /usr/bin,
# which may not be the first python3 on PATH (docs/design.md section 8); a
# GPU machine may have it in the first python3.
PY=/usr/bin/python3
for cand in /usr/bin/python3 python3; do
    if "$cand" -c "import torch, numpy" 2>/dev/null; then PY=$cand; break; fi
done
LOG=build/test_logs
mkdir -p "$LOG"
TOTAL_PASS=0
TOTAL_FAIL=0
TIERS=("$@")
[[ ${#TIERS[@]} -eq 0 ]] && TIERS=(unit reference distributed e2e cuda)
for t in "${TIERS[@]}"; do
    case $t in
        unit | reference | distributed | e2e | cuda) ;;
        *) echo "run_tests.sh: unknown tier '$t' (unit, reference, distributed, e2e, cuda)" >&2; exit 2 ;;
    esac
done

# run NAME CMD...: runs a test program, shows its failures and count.
# LLMC_TEST_FILTER (an extended regex) runs only the tests whose name matches
# (scripts/gpu/check.sh's test step: one reference model and its CUDA runs).
run() {
    local name=$1
    shift
    if [[ -n ${LLMC_TEST_FILTER:-} && ! $name =~ $LLMC_TEST_FILTER ]]; then return 0; fi
    local log="$LOG/$name.log"
    local t0=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local last
    last=$(grep -E '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    local p=0 f=0
    if [[ $last =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
        p=${BASH_REMATCH[1]}
        f=${BASH_REMATCH[2]}
    fi
    if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
    if [[ -z $last && $rc -eq 0 ]]; then p=1; fi  # a build step: success counts once
    TOTAL_PASS=$((TOTAL_PASS + p))
    TOTAL_FAIL=$((TOTAL_FAIL + f))
    printf '%-34s %4d passed, %3d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - t0))
    if [[ $f -ne 0 ]]; then
        grep -E 'FAIL|error|Error' "$log" | head -n 20 | sed 's/^/    /'
        echo "    (full log: $log)"
    fi
}
tier() { echo "== $1"; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAVE_GPU=1; fi
# mpirun as root needs these, and more ranks than cores need
# oversubscription (docs/design.md section 8).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
HAVE_MPI=
command -v mpirun >/dev/null && HAVE_MPI=1

unit_tier() {
    tier "unit: one process (tests/unit)"
    local src prog extra
    for src in tests/unit/test_*.cpp; do
        prog=build/$(basename "$src" .cpp)
        # test_real_shapes at d12's shapes is scripts/gpu/check.sh's `shapes`
        # step (minutes); here its small shapes (CUDA too when a GPU is present).
        extra=()
        [[ $prog == */test_real_shapes ]] && extra=(--shape small)
        run "$(basename "$prog")" "$prog" "${extra[@]}"
    done
    run test_shards "$PY" tests/unit/test_shards.py
    run test_structure "$PY" tests/unit/test_structure.py
    run test_build "$PY" tests/unit/test_build.py
    run test_gpu_scripts "$PY" tests/unit/test_gpu_scripts.py
}

REF=build/ref
# mask_args EXTRA...: the --document-mask EOT among a reference's EXTRA
# arguments, for test_gpt (the state holds the tokens, not the flag).
mask_args() {
    MASK=()
    while [[ $# -gt 0 ]]; do
        if [[ $1 == --document-mask ]]; then MASK=(--document-mask "$2"); fi
        shift
    done
}
# reference NAME DTYPE SPEC B T EXTRA...: reference state, then test_gpt on it.
reference() {
    local name=$1 dtype=$2 spec=$3 B=$4 T=$5
    shift 5
    mask_args "$@"
    run "ref_$name" "$PY" tests/reference/reference_gpt.py --spec "$spec" --dtype "$dtype" --B "$B" --T "$T" \
        --write-model "$REF/$name.model.bin" --write-state "$REF/$name.state.bin" "$@"
    run "test_gpt_$name" build/test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
        --device cpu --dtype "$dtype" "${MASK[@]}"
    # The CPU's bf16 mixed precision against the same reference (tests/lib/tolerances.h).
    run "test_gpt_${name}_cpu_bf16" build/test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
        --device cpu --dtype bf16 "${MASK[@]}"
    if [[ -n ${HAVE_GPU:-} && $dtype == fp32 ]]; then
        run "test_gpt_${name}_cuda_fp32" build/test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
            --device cuda --dtype fp32 "${MASK[@]}"
        run "test_gpt_${name}_cuda_bf16" build/test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
            --device cuda --dtype bf16 "${MASK[@]}"
    fi
}
# The Hugging Face reference's python (scripts/setup.sh makes it). Its tests
# are named hf_* so that scripts/gpu/check.sh's filter (ref_, test_gpt)
# leaves them out: a GPU machine may have no transformers.
HFPY=build/hfenv/bin/python
hf_ready() { "$HFPY" -c "import transformers, tokenizers, safetensors" 2>/dev/null; }
# reference_hf NAME SPEC B T EXTRA...: a random Hugging Face model and its
# fp64 debug state (transformers), then test_gpt loading the directory.
reference_hf() {
    local name=$1 spec=$2 B=$3 T=$4
    shift 4
    mask_args "$@"
    rm -rf "$REF/$name.hf"
    run "hf_ref_$name" "$HFPY" tests/reference/reference_hf.py --spec "$spec" --B "$B" --T "$T" \
        --save-dir "$REF/$name.hf" --write-state "$REF/$name.state.bin" "$@"
    run "hf_gpt_$name" build/test_gpt --model "$REF/$name.hf" --state "$REF/$name.state.bin" --device cpu --dtype fp64 \
        "${MASK[@]}"
    run "hf_gpt_${name}_cpu_bf16" build/test_gpt --model "$REF/$name.hf" --state "$REF/$name.state.bin" \
        --device cpu --dtype bf16 "${MASK[@]}"
}

# reference_hf_fp8 NAME SPEC B T EXTRA...: the same with --fp8 1 on both
# sides, fp64 only (an fp32 operand a rounding from a grid midpoint may
# round the other way: one FP8 step, past fp32's tolerance). FP8_LAYERS:
# --fp8-layers on both sides (default all).
reference_hf_fp8() {
    local name=$1 spec=$2 B=$3 T=$4 layers=${FP8_LAYERS:-all}
    shift 4
    rm -rf "$REF/$name.hf"
    run "hf_ref_$name" "$HFPY" tests/reference/reference_hf.py --spec "$spec" --B "$B" --T "$T" --fp8 1 \
        --fp8-layers "$layers" --save-dir "$REF/$name.hf" --write-state "$REF/$name.state.bin" "$@"
    run "hf_gpt_$name" build/test_gpt --model "$REF/$name.hf" --state "$REF/$name.state.bin" --device cpu --dtype fp64 \
        --fp8 1 --fp8-layers "$layers"
}

reference_tier() {
    tier "reference: one process against PyTorch and transformers (tests/reference)"
    mkdir -p "$REF"
    run reference_selfcheck "$PY" tests/reference/test_reference.py
    local ROUND="L=2,C=64,NH=4,V=128,T=32" ODD="L=3,C=48,NH=3,V=97,T=24"
    reference round_fp64 fp64 "$ROUND" 4 32 --warmup 3 --final-frac 0.1 --wd 0.1
    reference round_fp32 fp32 "$ROUND" 4 32 --warmup 3 --final-frac 0.1 --wd 0.1
    reference odd_fp64 fp64 "$ODD" 3 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
    reference odd_fp32 fp32 "$ODD" 3 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
    # the embedded data and a bf16 (version 5) model file
    reference tiny_v5_fp64 fp64 "L=2,C=64,NH=2,V=257,T=64" 2 64 --data data/tiny/tiny_val_000000.bin \
        --model-version 5 --lr 3e-3
    # The document mask: random rows with several EOTs (token 7) each.
    reference docmask_fp64 fp64 "$ODD" 3 24 --warmup 2 --final-frac 0.2 --steps 6 --document-mask 7
    reference docmask_fp32 fp32 "$ODD" 3 24 --warmup 2 --final-frac 0.2 --steps 6 --document-mask 7
    # FP8 operands (docs/fp8.md) against the reference's own rounding, in fp64
    # (in fp32 an operand a rounding away from a grid midpoint may round the
    # other way, so the figures drift past fp32's tolerance).
    run ref_fp8_fp64 "$PY" tests/reference/reference_gpt.py --spec "$ODD" --dtype fp64 --B 3 --T 19 --warmup 2 \
        --final-frac 0.2 --wd 0.05 --clip 0.5 --fp8 1 --write-model "$REF/fp8.model.bin" --write-state "$REF/fp8.state.bin"
    run test_gpt_fp8_fp64 build/test_gpt --model "$REF/fp8.model.bin" --state "$REF/fp8.state.bin" --device cpu \
        --dtype fp64 --fp8 1
    # ... with delayed scaling: each operand's scale from the largest amax of
    # its last 3 steps (the reference's own bookkeeping, fp8_reference.py).
    run ref_fp8_delayed_fp64 "$PY" tests/reference/reference_gpt.py --spec "$ODD" --dtype fp64 --B 3 --T 19 \
        --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5 --fp8 1 --fp8-history 3 \
        --write-model "$REF/fp8_delayed.model.bin" --write-state "$REF/fp8_delayed.state.bin"
    run test_gpt_fp8_delayed_fp64 build/test_gpt --model "$REF/fp8_delayed.model.bin" \
        --state "$REF/fp8_delayed.state.bin" --device cpu --dtype fp64 --fp8 1 --fp8-history 3
    # ... and at widths and a token count that cuBLASLt's FP8 products take
    # (multiples of 16): the reference a GPU checks its FP8 path against.
    run ref_fp8_round_fp64 "$PY" tests/reference/reference_gpt.py --spec "$ROUND" --dtype fp64 --B 4 --T 32 --warmup 3 \
        --final-frac 0.1 --fp8 1 --write-model "$REF/fp8_round.model.bin" --write-state "$REF/fp8_round.state.bin"
    run test_gpt_fp8_round_fp64 build/test_gpt --model "$REF/fp8_round.model.bin" --state "$REF/fp8_round.state.bin" \
        --device cpu --dtype fp64 --fp8 1
    # ... with delayed scaling there: on a GPU the activation and the norms
    # then cast their outputs for the next product (docs/fp8.md).
    run ref_fp8_round_delayed_fp64 "$PY" tests/reference/reference_gpt.py --spec "$ROUND" --dtype fp64 --B 4 --T 32 \
        --warmup 3 --final-frac 0.1 --fp8 1 --fp8-history 3 --write-model "$REF/fp8_round_delayed.model.bin" \
        --write-state "$REF/fp8_round_delayed.state.bin"
    run test_gpt_fp8_round_delayed_fp64 build/test_gpt --model "$REF/fp8_round_delayed.model.bin" \
        --state "$REF/fp8_round_delayed.state.bin" --device cpu --dtype fp64 --fp8 1 --fp8-history 3
    # ... and with some of the four layers left in the compute type
    # (--fp8-layers): delayed scaling on attproj and fcproj alone (GPT-2's
    # GELU apart from fc, casting fcproj's input), current scaling on QKV and fc.
    local layers
    for layers in attproj,fcproj qkv,fc; do
        local hist=() tag=${layers/,/_}
        [[ $layers == attproj,fcproj ]] && hist=(--fp8-history 3)
        run "ref_fp8_layers_${tag}_fp64" "$PY" tests/reference/reference_gpt.py --spec "$ROUND" --dtype fp64 --B 4 \
            --T 32 --warmup 3 --final-frac 0.1 --fp8 1 "${hist[@]}" --fp8-layers "$layers" \
            --write-model "$REF/fp8_$tag.model.bin" --write-state "$REF/fp8_$tag.state.bin"
        run "test_gpt_fp8_layers_${tag}_fp64" build/test_gpt --model "$REF/fp8_$tag.model.bin" \
            --state "$REF/fp8_$tag.state.bin" --device cpu --dtype fp64 --fp8 1 "${hist[@]}" --fp8-layers "$layers"
    done
    # heads of 64: on a GPU, bf16 runs the tensor-core kernels with the mask
    reference docmask64_fp32 fp32 "L=2,C=128,NH=2,V=97,T=80" 2 80 --warmup 2 --steps 6 --document-mask 7
    if hf_ready; then
        run hf_reference_selfcheck "$HFPY" tests/reference/reference_hf.py --selfcheck
        # GPT-2: odd sizes; bf16 weights in shards (read through the index).
        reference_hf gpt2_odd "L=3,C=48,NH=3,V=97,T=24" 3 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf gpt2_bf16_sharded "L=2,C=64,NH=4,V=131,T=32" 2 32 --save-dtype bf16 --shard-size 40KB \
            --warmup 3 --final-frac 0.1
        # Llama: GQA 2:1 untied and 4:1 tied, F not 4C, V prime (no tp
        # divides it).
        reference_hf llama_gqa2 "arch=llama,L=3,C=48,NH=4,NKV=2,F=72,V=101,T=24,theta=500" 3 19 \
            --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf llama_gqa4_tied "arch=llama,L=2,C=64,NH=8,NKV=2,F=100,V=97,T=16,tied=1,eps=1e-6" 2 16 \
            --save-dtype bf16 --shard-size 30KB --warmup 3 --final-frac 0.1
        # Qwen2: Llama with Q, K, V biases (random, nonzero): GQA 2:1
        # untied with Qwen's rotary base; 4:1 tied, bf16, in shards.
        reference_hf qwen2_gqa2 "arch=qwen2,L=3,C=48,NH=4,NKV=2,F=72,V=101,T=24,theta=1000000" 3 19 \
            --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf qwen2_gqa4_tied "arch=qwen2,L=2,C=64,NH=8,NKV=2,F=100,V=97,T=16,tied=1" 2 16 \
            --save-dtype bf16 --shard-size 30KB --warmup 3 --final-frac 0.1
        # Mixtral (docs/moe.md): 4 experts, top 2, the load-balancing loss
        # in the objective; 3 experts, top 1 (the weight renormalised to 1),
        # a tied head, a larger coefficient, bf16 weights in shards.
        reference_hf mixtral_e4k2 "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=64,E=4,K=2,V=101,T=24,theta=500" 3 19 \
            --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf mixtral_e3k1_tied "arch=mixtral,L=2,C=32,NH=4,NKV=1,F=48,E=3,K=1,V=97,T=16,tied=1,aux=0.1" 2 16 \
            --save-dtype bf16 --shard-size 30KB --warmup 3 --final-frac 0.1
        # FP8 operands (docs/fp8.md) through transformers' own modules with
        # their products' operands rounded (hf_fp8.py): Llama, Qwen2 with
        # its biases, and Mixtral, each expert's rows one tensor (fp64).
        reference_hf_fp8 llama_fp8 "arch=llama,L=3,C=48,NH=4,NKV=2,F=72,V=101,T=24,theta=500" 3 19 \
            --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf_fp8 qwen2_fp8 "arch=qwen2,L=2,C=64,NH=8,NKV=2,F=96,V=97,T=16,tied=1" 2 16 --warmup 3
        reference_hf_fp8 mixtral_e4k2_fp8 "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=64,E=4,K=2,V=101,T=24,theta=500" 3 19 \
            --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
        reference_hf_fp8 mixtral_e3k1_fp8 "arch=mixtral,L=2,C=32,NH=4,NKV=1,F=48,E=3,K=1,V=97,T=16,tied=1,aux=0.1" \
            2 16 --save-dtype bf16 --warmup 3 --final-frac 0.1
        # --fp8-layers: QKV and the experts' down products alone on FP8 operands.
        FP8_LAYERS=qkv,fcproj reference_hf_fp8 mixtral_e4k2_fp8_layers \
            "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=64,E=4,K=2,V=101,T=24,theta=500" 3 19 --warmup 2 --final-frac 0.2
        # The document mask through transformers' attention masks: GPT-2, and Llama GQA 2:1.
        reference_hf gpt2_docmask "L=3,C=48,NH=3,V=97,T=24" 3 24 --steps 6 --warmup 2 --document-mask 7
        reference_hf llama_docmask "arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=24,theta=500" 3 24 --steps 6 \
            --warmup 2 --document-mask 7
        run hf_roundtrip "$HFPY" tests/reference/test_hf.py
        # The BPE encoder against the `tokenizers` package; then train_gpt
        # --generate (KV cache, text prompts) against transformers' generate.
        run hf_tokenize "$HFPY" tests/reference/test_tokenize.py
        run hf_generate "$HFPY" tests/reference/test_generate.py
        # FP8's rounding (llmc/backend/fp8.h) against NumPy's ml_dtypes, bit for bit.
        run fp8_grid "$HFPY" tests/reference/test_fp8_grid.py
    else
        run hf_reference_missing sh -c "echo 'build/hfenv does not import transformers: run scripts/setup.sh'; exit 1"
    fi
}

distributed_tier() {
    tier "distributed: every layout against one process, under mpirun (tests/distributed)"
    if [[ -z $HAVE_MPI ]]; then
        echo "(mpirun not found: distributed tests skipped; scripts/setup.sh installs Open MPI)"
        return
    fi
    local np
    run test_comm build/test_comm
    run test_ring_attention build/test_ring_attention
    for np in 2 4; do
        run test_comm_np$np mpirun -np $np build/test_comm
        run test_ring_attention_np$np mpirun -np $np build/test_ring_attention
    done
    run test_arrivals_np3 mpirun -np 3 build/test_arrivals
    run test_dist "$PY" tests/distributed/test_dist.py
    run test_tp "$PY" tests/distributed/test_tp.py
    run test_cp "$PY" tests/distributed/test_cp.py
    run test_pp "$PY" tests/distributed/test_pp.py
    run test_zero_bubble "$PY" tests/distributed/test_zero_bubble.py
    run test_document_mask "$PY" tests/distributed/test_document_mask.py
    run test_llama "$PY" tests/distributed/test_llama.py
    run test_qwen2 "$PY" tests/distributed/test_qwen2.py
    run test_moe "$PY" tests/distributed/test_moe.py
    run test_graphs "$PY" tests/distributed/test_graphs.py
    run test_watchdog "$PY" tests/distributed/test_watchdog.py
    run test_stragglers "$PY" tests/distributed/test_stragglers.py
    run test_fp8 "$PY" tests/distributed/test_fp8.py
    run test_bf16 "$PY" tests/distributed/test_bf16.py
    run test_optimizer_dtype "$PY" tests/distributed/test_optimizer_dtype.py
    run test_sync_free "$PY" tests/distributed/test_sync_free.py
    run test_matmul_tune "$PY" tests/distributed/test_matmul_tune.py
    run test_skipped_step "$PY" tests/distributed/test_skipped_step.py
    run test_multinode "$PY" tests/distributed/test_multinode.py
}

e2e_tier() {
    tier "e2e: the trainer as a user runs it (tests/e2e)"
    run test_train "$PY" tests/e2e/test_train.py
    run test_defaults "$PY" tests/e2e/test_defaults.py
    run test_cpu_threads "$PY" tests/e2e/test_cpu_threads.py
    run test_audit "$PY" tests/e2e/test_audit.py
    if [[ -z $HAVE_MPI ]]; then
        echo "(mpirun not found: test_memory and test_planner skipped; scripts/setup.sh installs Open MPI)"
        return
    fi
    run test_memory "$PY" tests/e2e/test_memory.py
    run test_async_checkpoint "$PY" tests/e2e/test_async_checkpoint.py
    run test_supervise "$PY" tests/e2e/test_supervise.py
    run test_soak "$PY" tests/e2e/test_soak.py
    run test_planner "$PY" tests/e2e/test_planner.py
    run test_breakdown "$PY" tests/e2e/test_breakdown.py
    run test_under_load "$PY" tests/e2e/test_under_load.py
}

cuda_tier() {
    tier "cuda: the CUDA code compiles"
    local NVCC
    NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    if [[ -z $NVCC ]]; then
        echo "(nvcc not found: CUDA compile checks skipped)"
        return
    fi
    # The trainer itself was built with its CUDA backend by `make`; check
    # that it was, then build every kernel lab program.
    run cuda_backend_built test -f build/llmc/backend/backend_cuda.o
    run cuda_kernel_lab make -C dev/cuda -j2
}

for t in "${TIERS[@]}"; do "${t}_tier"; done
echo "total: $TOTAL_PASS passed, $TOTAL_FAIL failed"
[[ $TOTAL_FAIL -eq 0 ]]
