#!/usr/bin/env bash
# scripts/gpu_check.sh: every check that needs a GPU, in one go, for a
# session that is lent one (a few full calls beat many small ones). Writes
# logs and a summary under $OUT (the device tool's output folder) or
# build/gpu_check. Record what it measured in docs/gpu-results.md.
#   1. build (CUDA backend; without OpenBLAS/OpenMPI if the image lacks them)
#   2. the kernel lab: every dev/cuda program against the CPU backend's ops
#   3. the test suite (test_gpt runs the CUDA backend in fp32 and bf16
#      against the PyTorch reference when nvidia-smi sees a GPU)
#   4. several ranks sharing the GPU (--comm mpi, when mpirun exists): dp x
#      ZeRO 0-3, tp with and without sp, cp 2 and 4, against one process
#   5. d12 throughput on random GPT-2 tokens (tokens/s, MFU, memory)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
JOBS=$(nproc)
{ date -u; nvidia-smi; nvcc --version; } > "$OUT/device.txt" 2>&1
echo "== build"
make -j"$JOBS" all tests > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
make -C dev/cuda -j"$JOBS" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

echo "== kernel lab"
for p in dev/cuda/*; do
    [[ -x $p && -f $p && $p != *.cu && $p != *.h && $p != */Makefile ]] || continue
    echo "### $p"
    timeout 300 "$p"
done > "$OUT/kernels.log" 2>&1
grep -E '^### |passed, .* failed|FAIL' "$OUT/kernels.log" | paste - - | head -40

echo "== test suite"
bash scripts/run_tests.sh > "$OUT/tests.log" 2>&1
grep -E 'cuda|total' "$OUT/tests.log"

PY=python3
DATA=build/gpu_check_data.bin
$PY - <<PYEOF
import numpy as np
t = np.random.default_rng(0).integers(0, 50257, 4_000_000).astype("<u2")
h = np.zeros(256, dtype="<i4"); h[0], h[1], h[2] = 20240520, 1, len(t)
open("$DATA", "wb").write(h.tobytes() + t.tobytes())
PYEOF

if command -v mpirun >/dev/null; then
    echo "== ranks sharing the GPU (--comm mpi), bf16, against one process"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    A=(-e "L=4,C=256,NH=8,V=50257,T=256" -i "$DATA" -j "" -t 256 -b 8 -d 16384 -x 10 -v 0 -s 0 --device cuda)
    ./train_gpt "${A[@]}" -o "$OUT/single" > "$OUT/single.log" 2>&1
    for layout in "2 -z 0" "2 -z 1" "2 -z 2" "2 -z 3" "4 -z 3" "2 --tp 2" "2 --tp 2 --sp 1" "2 --cp 2" "4 --cp 4"; do
        set -- $layout
        np=$1
        shift
        d="$OUT/np${np}_$(echo "$*" | tr -d ' -')"
        mpirun -np "$np" ./train_gpt "${A[@]}" --comm mpi "$@" -o "$d" > "$d.log" 2>&1
        $PY - "$OUT/single/metrics.jsonl" "$d/metrics.jsonl" "$np $*" <<'PYEOF'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
try:
    b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
except OSError:
    print(f"  {sys.argv[3]}: FAILED (see log)"); sys.exit()
print(f"  np={sys.argv[3]}: max relative loss difference over {len(b)} steps "
      f"{max(abs(x - y) / x for x, y in zip(a, b)):.2e}")
PYEOF
    done
else
    echo "(mpirun not found: multi-rank checks skipped)"
fi

echo "== d12 throughput (one GPU, bf16)"
for bt in "16 1024" "32 1024"; do
    set -- $bt
    $PY scripts/benchmark.py --steps 30 --warmup 5 -- -e d12 -i "$DATA" -j "" -b "$1" -t "$2" --device cuda
done | tee "$OUT/throughput.txt"
