#!/usr/bin/env bash
# scripts/test_under_load.sh: the README's test command under background
# load, several times in a row: the suite must stay green on a busy
# machine, not only on a quiet one (timing goals live in benchmarks; a test
# may check a time only with a margin no load breaks).
#
#   bash scripts/test_under_load.sh [RUNS] [BUSY]     (defaults: 3 runs, 2 busy loops)
#
# BUSY processes spin on the CPU for the whole time (as `stress -c BUSY`
# would; none is installed here); each run is `make -j2 test` in this tree.
# Prints each run's total line and ends with "N passed, N failed" over the
# runs (a run passes when its total says 0 failed and make exits 0).
set -u
cd "$(dirname "$0")/.."
RUNS=${1:-3}
BUSY=${2:-2}
pids=()
stop_busy() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_busy EXIT
for _ in $(seq "$BUSY"); do
    (while :; do :; done) &
    pids+=($!)
done
echo "test_under_load: $BUSY busy loops (pids ${pids[*]}), $RUNS runs of make -j2 test; load: $(cut -d' ' -f1-3 /proc/loadavg)"
pass=0
fail=0
mkdir -p build
for i in $(seq "$RUNS"); do
    t0=$SECONDS
    log=build/test_under_load_$i.log
    make -j2 test >"$log" 2>&1
    rc=$?
    total=$(grep -E '^total: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [[ $rc -eq 0 && $total =~ \ 0\ failed ]]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    echo "run $i: exit $rc, ${total:-no total line} ($((SECONDS - t0)) s, load $(cut -d' ' -f1 /proc/loadavg)); log $log"
    [[ $rc -ne 0 ]] && grep -E 'failed  \(|FAIL' "$log" | grep -v ' 0 failed' | head -n 20
done
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
