#!/usr/bin/env bash
# scripts/run_tests.sh: the whole test suite (what `make test` and .ci/run
# run). Each test program prints "N passed, N failed" last; this script adds
# them up and prints the total the same way. A program that crashes or exits
# non-zero without a count counts as one failure.
#   1. the PyTorch reference against independent math (scripts/test_reference.py)
#   2. test_gpt against the reference: round and odd models, CPU fp64 and fp32
#      (and the CUDA backend in bf16 and fp32 when a GPU is present); and
#      against transformers (scripts/reference_hf.py in build/hfenv, made by
#      scripts/setup.sh): GPT2LMHeadModel and LlamaForCausalLM checkpoints in
#      fp64, and
#      tests/test_hf.py (export round trip, tensor maps, tokenizer.json)
#   3. unit tests of the library (tests/test_*.cpp) and the data pipeline
#   4. the trainer end to end: determinism, resume, learning, errors
#   5. the distributed runtime under mpirun (communicators; data parallel
#      and ZeRO 0-3, tensor and sequence parallel, context parallel (ring
#      attention), pipeline parallel (1F1B, interleaved), each against one
#      process; memory and traffic formulas)
#   6. the CUDA code compiles (trainer backend and dev/cuda kernel lab)
set -u
cd "$(dirname "$0")/.."
# The python that has PyTorch: Debian's python3-torch lives in /usr/bin
# (shared/reference.md 8); a GPU image may have it in the first python3.
PY=/usr/bin/python3
for cand in /usr/bin/python3 python3; do
    if "$cand" -c "import torch, numpy" 2>/dev/null; then PY=$cand; break; fi
done
LOG=build/test_logs
mkdir -p "$LOG"
TOTAL_PASS=0
TOTAL_FAIL=0

# run NAME CMD...: runs a test program, shows its failures and count.
# LLMC_TEST_FILTER (an extended regex) runs only the tests whose name matches
# (scripts/gpu_check.sh's test phase: the CUDA-relevant ones).
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

REF=build/ref
mkdir -p "$REF"
# reference NAME DTYPE SPEC B T EXTRA...: reference state, then test_gpt on it.
reference() {
    local name=$1 dtype=$2 spec=$3 B=$4 T=$5
    shift 5
    run "ref_$name" "$PY" scripts/reference_gpt.py --spec "$spec" --dtype "$dtype" --B "$B" --T "$T" \
        --write-model "$REF/$name.model.bin" --write-state "$REF/$name.state.bin" "$@"
    run "test_gpt_$name" ./test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
        --device cpu --dtype "$dtype"
    if [[ -n ${HAVE_GPU:-} && $dtype == fp32 ]]; then
        run "test_gpt_${name}_cuda_fp32" ./test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
            --device cuda --dtype fp32
        run "test_gpt_${name}_cuda_bf16" ./test_gpt --model "$REF/$name.model.bin" --state "$REF/$name.state.bin" \
            --device cuda --dtype bf16
    fi
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAVE_GPU=1; fi

# The Hugging Face reference's python (scripts/setup.sh makes it). Its tests
# are named hf_* so that gpu_check's filter (ref_, test_gpt) leaves them out:
# the GPU image has no transformers.
HFPY=build/hfenv/bin/python
hf_ready() { "$HFPY" -c "import transformers, tokenizers, safetensors" 2>/dev/null; }
# reference_hf NAME SPEC B T EXTRA...: a random Hugging Face model and its
# fp64 debug state (transformers), then test_gpt loading the directory.
reference_hf() {
    local name=$1 spec=$2 B=$3 T=$4
    shift 4
    rm -rf "$REF/$name.hf"
    run "hf_ref_$name" "$HFPY" scripts/reference_hf.py --spec "$spec" --B "$B" --T "$T" \
        --save-dir "$REF/$name.hf" --write-state "$REF/$name.state.bin" "$@"
    run "hf_gpt_$name" ./test_gpt --model "$REF/$name.hf" --state "$REF/$name.state.bin" --device cpu --dtype fp64
}

run reference_selfcheck "$PY" scripts/test_reference.py
ROUND="L=2,C=64,NH=4,V=128,T=32"
ODD="L=3,C=48,NH=3,V=97,T=24"
reference round_fp64 fp64 "$ROUND" 4 32 --warmup 3 --final-frac 0.1 --wd 0.1
reference round_fp32 fp32 "$ROUND" 4 32 --warmup 3 --final-frac 0.1 --wd 0.1
reference odd_fp64 fp64 "$ODD" 3 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
reference odd_fp32 fp32 "$ODD" 3 19 --warmup 2 --final-frac 0.2 --wd 0.05 --clip 0.5
# the embedded data and a bf16 (version 5) model file
reference tiny_v5_fp64 fp64 "L=2,C=64,NH=2,V=257,T=64" 2 64 --data data/tiny/tiny_val_000000.bin \
    --model-version 5 --lr 3e-3

if hf_ready; then
    run hf_reference_selfcheck "$HFPY" scripts/reference_hf.py --selfcheck
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
    run hf_roundtrip "$HFPY" tests/test_hf.py
else
    run hf_reference_missing sh -c "echo 'build/hfenv does not import transformers: run scripts/setup.sh'; exit 1"
fi

for prog in build/test_*; do
    [[ -x $prog && ! -d $prog ]] || continue
    # test_real_shapes at d12's shapes is scripts/gpu_check.sh's `shapes`
    # phase (minutes); here its small shapes (CUDA too when a GPU is present).
    extra=()
    [[ $prog == */test_real_shapes ]] && extra=(--shape small)
    run "$(basename "$prog")" "$prog" "${extra[@]}"
done
for t in scripts/test_shards.py; do
    [[ -f $t ]] && run "$(basename "$t" .py)" "$PY" "$t"
done
run test_train "$PY" tests/test_train.py

# mpirun as root needs these (shared/reference.md section 8); more ranks than
# cores need oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if command -v mpirun >/dev/null; then
    for np in 2 4; do
        run test_comm_np$np mpirun -np $np build/test_comm
        run test_ring_attention_np$np mpirun -np $np build/test_ring_attention
    done
fi
if command -v mpirun >/dev/null; then
    run test_dist "$PY" tests/test_dist.py
    run test_tp "$PY" tests/test_tp.py
    run test_cp "$PY" tests/test_cp.py
    run test_pp "$PY" tests/test_pp.py
    run test_llama "$PY" tests/test_llama.py
    run test_memory "$PY" tests/test_memory.py
    run test_multinode "$PY" tests/test_multinode.py
    run test_planner "$PY" tests/test_planner.py
else
    echo "(mpirun not found: distributed tests skipped; scripts/setup.sh installs OpenMPI)"
fi
NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [[ -n $NVCC ]]; then
    # The trainer itself was built with its CUDA backend by `make` above;
    # check that it was, then build every kernel lab program.
    run cuda_backend_built test -f build/llmc/backend/backend_cuda.o
    run cuda_kernel_lab make -C dev/cuda -j2
else
    echo "(nvcc not found: CUDA compile checks skipped)"
fi

echo "total: $TOTAL_PASS passed, $TOTAL_FAIL failed"
[[ $TOTAL_FAIL -eq 0 ]]
