#!/usr/bin/env bash
# scripts/fixed_seed_runs.sh: short fixed-seed runs of train_gpt in several
# layouts, and a checksum of every file they leave that does not hold a
# timing, so that a change meant to move code without changing what it
# computes can be checked byte for byte: run it before and after, then
#   diff OUT_BEFORE/SHA256SUMS OUT_AFTER/SHA256SUMS
# The files: checkpoints (shards and indexes), llm.c and Hugging Face
# exports, run_config.json, metrics.jsonl without its timings (ms,
# tokens_per_s, mfu), the step lines' losses and norms, the samples.
# Usage: scripts/fixed_seed_runs.sh OUT   (from the repository root, after make)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
dest=$(cd "$1" && pwd)
trainer="$root/train_gpt"
[ -x "$trainer" ] || { echo "$0: $trainer not built (run make)" >&2; exit 2; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2)
# The data by a path relative to OUT (a link to this tree's data/), so the
# files that record it (run_config.json) do not depend on where the tree is.
data=(-i "data/tiny/tiny_train_*.bin" -j "data/tiny/tiny_val_*.bin" --tokenizer "data/tiny/tokenizer.bin")
common=(-x 6 -v 3 -s 3 -g 8 -n 3 --seed 1337)
llama=arch=llama,L=4,C=128,NH=4,NKV=2,V=257,T=128,F=256
mixtral=arch=mixtral,L=2,C=64,NH=4,NKV=2,V=257,T=64,F=128,E=4,K=2

ln -sfn "$root/data" "$dest/data"

run() {  # name, then the launcher and flags (llm.c files hold GPT-2 only)
    local name=$1
    shift
    local llmc=(--export-model "$name/model.bin")
    case "$*" in *arch=*) llmc=() ;; esac
    rm -rf "${dest:?}/$name"
    mkdir -p "$dest/$name"
    (cd "$dest" && "$@" "${data[@]}" "${common[@]}" -o "$name" "${llmc[@]}" \
        --export-hf "$name/hf" > "$name.log" 2>&1) || { echo "$name failed: $dest/$name.log" >&2; exit 1; }
    # What holds no timing: losses, norms and learning rates of the step
    # lines, the samples, and metrics.jsonl without its timing keys.
    grep -E '^step|^val|^---- sample|^[^|]*$' "$dest/$name.log" | grep -v -E '^(run summary|memory|compute|threads|train_gpt|weights)' |
        sed -E -e 's/\| [0-9.]+ ms .*//' -e 's/ in [0-9.]+ ms$//' > "$dest/$name/log.kept" || true
    python3 - "$dest/$name/metrics.jsonl" > "$dest/$name/metrics.kept" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k in ("ms", "tokens_per_s", "mfu"):
        d.pop(k, None)
    print(json.dumps(d, sort_keys=True))
EOF
    echo "$name: $(tail -n 1 "$dest/$name/metrics.kept" | cut -c1-100)"
}

run single "$trainer"
run dp2_zero1 "${mpi[@]}" "$trainer" -z 1
run tp2_sp "${mpi[@]}" "$trainer" --tp 2 --sp 1
run cp2_ring "${mpi[@]}" "$trainer" --cp 2
run cp2_a2a_recompute "${mpi[@]}" "$trainer" --cp 2 --cp-impl a2a -r full --document-mask 1
run pp2_interleaved "${mpi[@]}" "$trainer" --pp 2 --vpp 2 -d 4096
run llama_bf16_zero3 "${mpi[@]}" "$trainer" -e "$llama" --dtype bf16 -z 3
run mixtral_ep2 "${mpi[@]}" "$trainer" -e "$mixtral" --ep 2 -z 1 -b 4

cd "$dest"
find . -path ./data -prune -o -type f ! -name '*.log' ! -name 'metrics.jsonl' ! -name SHA256SUMS -print | LC_ALL=C sort |
    xargs sha256sum > SHA256SUMS
echo "$(wc -l < SHA256SUMS) files: $dest/SHA256SUMS"
