#!/usr/bin/env bash
# scripts/gpu/bundle_selftest.sh [OUTDIR]: proves, on the machine that made it,
# that the bundle of scripts/gpu/bundle.sh (build/gpu/bundle, or GPU_BUNDLE=DIR;
# made first if missing, which needs a network) is enough to build and run
# with MPI where the system has no Open MPI, no OpenBLAS and no `xz`, as on a
# bare GPU machine. In a scratch copy of the working tree, inside a private
# mount namespace (needs root and `unshare`), the system's Open MPI, OpenBLAS
# and xz are hidden (their programs, libraries and headers covered by empty
# mounts); archives are then packed and unpacked without xz
# (scripts/gpu/archive.sh: gzip, or Python's tarfile); scripts/gpu/env.sh
# unpacks the bundle (made with xz or not) and sets up the bundled Open MPI
# and OpenBLAS; the prebuilt binaries (if bundled) are taken as
# scripts/gpu/check.sh would take them, then the project builds (CUDA
# backend, NCCL and staged communicators included, when nvcc is here), and
# with each of the two
#   - mpirun -np 2 of the CPU trainer (--device cpu) runs 5 steps;
#   - the same job under mpirun -np 2 with ZeRO-1 and with --tp 2 ends with
#     the one-process run's losses (fp32, relative 1e-5);
#   - build/test_comm (every collective against formulas) passes at np 2.
# OUTDIR (default build/gpu/bundle_selftest) receives selftest.txt (what is
# printed) and the logs. Last line: "N passed, N failed".
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
[[ $# -le 1 && ${1:-} != -* ]] || usage
OUTDIR=${1:-}
if [[ -n $OUTDIR ]]; then OUTDIR=$(mkdir -p "$OUTDIR" && cd "$OUTDIR" && pwd) || exit 1; fi
cd "$(dirname "$0")/../.." || exit 1
OUTDIR=${OUTDIR:-$PWD/build/gpu/bundle_selftest}
BUNDLE=${GPU_BUNDLE:-build/gpu/bundle}
mkdir -p "$OUTDIR"
ls "$BUNDLE"/openmpi.tar.* > /dev/null 2>&1 || bash scripts/gpu/bundle.sh "$BUNDLE" || exit 1
ls "$BUNDLE"/openmpi.tar.* > /dev/null 2>&1 ||
    { echo "bundle_selftest.sh: $BUNDLE has no Open MPI (see its MANIFEST.txt)" >&2; exit 1; }
S=$(mktemp -d /tmp/llmc_bundle_XXXXXX)
git ls-files -z | xargs -0 cp --parents -t "$S"
git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$S"
mkdir -p "$S/build/gpu" && cp -r "$BUNDLE" "$S/build/gpu/bundle"
echo "scratch copy: $S"
# The inner script goes to a file: mpirun forwards its stdin to rank 0 and
# would swallow a script read from stdin.
cat > "$S/selftest_inner.sh" <<'EOF'
set -uo pipefail
S=$1
A=$(uname -m)-linux-gnu
mkdir -p /tmp/llmc_empty_dir
for d in /usr/lib/$A/openmpi /usr/include/$A/openmpi /usr/lib/$A/openblas-openmp /usr/lib/$A/openblas-pthread \
         /usr/include/$A/openblas-openmp /usr/include/$A/openblas-pthread /usr/include/openblas /etc/openmpi; do
    [[ -d $d ]] && mount --bind /tmp/llmc_empty_dir "$d"
done
for f in /usr/bin/mpi* /usr/bin/orte* /usr/bin/opal* /usr/bin/ompi* /usr/lib/$A/libmpi* /usr/lib/$A/libopen-pal* \
         /usr/lib/$A/libopen-rte* /usr/lib/$A/libopenblas* /usr/lib/$A/libblas* /usr/lib/$A/libcblas* \
         /usr/bin/xz /usr/bin/unxz /usr/bin/xzcat /usr/bin/lzma /usr/bin/unlzma; do
    [[ -e $f ]] && mount --bind /dev/null "$f"
done
cd "$S"
pass=0 fail=0
ok() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $*"; fi; }
ok test ! -x "$(command -v mpicxx 2>/dev/null || echo /nonexistent)"
ok test ! -x "$(command -v xz 2>/dev/null || echo /nonexistent)"
echo "system Open MPI hidden: $(command -v mpirun || echo 'no mpirun on PATH'); xz hidden"
# Archives without xz: packed (gzip, or Python's tarfile) and unpacked, equal.
source scripts/gpu/archive.sh
echo "archives here: $(archive_tool)"
rm -rf build/st_arch && mkdir -p build/st_arch
a=$(archive_pack build/st_arch/pack scripts gpu)
ok test -f "$a"
ok archive_unpack "$a" build/st_arch/out
ok diff -r scripts/gpu build/st_arch/out/gpu
echo "  packed and unpacked without xz: $a"
source scripts/gpu/env.sh
echo "$GPU_ENV_SUMMARY"
for x in build/gpu/bundle/*.tar.*; do
    n=$(basename "$x"); n=${n%%.tar.*}
    [[ $n == prebuilt_* ]] && continue
    ok test -f "build/gpu/deps/$n/.unpacked"
    echo "  unpacked without xz: $x"
done
mpirun --version | head -n 1
# runs LABEL: the CPU trainer alone and under mpirun -np 2, and test_comm.
runs() {
    ok test -x train_gpt
    ldd train_gpt | grep -E 'libmpi|blas|nccl' | sed 's/^/  /'
    ok bash -c "ldd train_gpt | grep -q 'libmpi.so.40 => $S/build/gpu/deps/openmpi/lib/'"
    ok bash -c "ldd train_gpt | grep -q 'libopenblas.so.0 => $S/build/gpu/deps/openblas/lib/'"
    local ARGS=(-i data/tiny/tiny_train_000001.bin -j "" -t 64 -b 4 -d 512 -x 5 -v 0 -s 0 --device cpu --dtype fp32)
    rm -rf build/st_*
    ok ./train_gpt "${ARGS[@]}" -o build/st_one > build/st_one.log 2>&1
    for layout in "-z 1" "--tp 2"; do
        d=build/st_$(echo "$layout" | tr -d ' -')
        ok mpirun -np 2 ./train_gpt "${ARGS[@]}" $layout -o "$d" > "$d.log" 2>&1
        ok python3 - build/st_one/metrics.jsonl "$d/metrics.jsonl" "$1 $layout" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
r = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"  {sys.argv[3]}: mpirun -np 2, {len(b)} steps, max relative loss difference {r:.2e}")
sys.exit(0 if len(a) == len(b) == 5 and r <= 1e-5 else 1)
PY
    done
    ok mpirun -np 2 build/test_comm > build/st_comm.log 2>&1
    tail -n 1 build/st_comm.log | sed "s/^/  $1 test_comm np=2: /"
}
# 1. The prebuilt sm_90 binaries (bundle.sh --prebuilt), as a fresh GPU
#    machine would take them.
if ls build/gpu/bundle/prebuilt_*.tar.* > /dev/null 2>&1; then
    CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" bash scripts/gpu/check.sh __build > build/st_prebuilt.log 2>&1
    cat build/st_prebuilt.log
    ok grep -q '^using build/gpu/bundle/prebuilt' build/st_prebuilt.log
    runs prebuilt
    rm -f train_gpt build/test_* build/dump_rows build/gpu/built/stamp_*
fi
# 2. Built here from the sources with the bundled Open MPI and OpenBLAS.
make -j2 all build/test_comm > build/selftest_build.log 2>&1 || { tail -30 build/selftest_build.log; }
runs built
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
EOF
GPU_BUNDLE=build/gpu/bundle unshare --mount --fork bash "$S/selftest_inner.sh" "$S" < /dev/null 2>&1 | tee "$OUTDIR/selftest.txt"
rc=${PIPESTATUS[0]}
cp "$S"/build/st_*.log "$S"/build/selftest_build.log "$OUTDIR/" 2>/dev/null
echo "logs in $OUTDIR"
rm -rf "$S"
exit $rc
