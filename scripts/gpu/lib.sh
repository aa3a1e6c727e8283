# scripts/gpu/lib.sh: sourced (not run) by scripts/gpu/check.sh: the
# machinery of a run: its clock and budget, steps and their time limits,
# programs run under those limits with their output streamed (each figure a
# JSON line, each summary line in summary.txt, as soon as it is printed),
# the build of what a step needs (or the bundle's prebuilt binaries), and
# the dry run, which prints the plan with the assumed timings instead of
# running anything.
# shellcheck shell=bash disable=SC2034

# now: seconds since this run began; in a dry run, the assumed timings
# of what was planned so far.
now() { if [[ $DRY == 1 ]]; then echo "$DRY_T"; else echo "$SECONDS"; fi; }

# say LINE: printed and appended to summary.txt at once.
say() {
    echo "$*"
    [[ -n ${SUMMARY:-} ]] && echo "$*" >> "$SUMMARY"
    return 0
}

# figures LOG PREFIX COMMAND: the log's "figure" lines, now, into $RESULTS.
figures() {
    [[ $DRY == 1 || ! -f $1 ]] && return 0
    "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase "$STEP" --prefix "$2" --command "$3" --log "$1"
}
# figure NAME VALUE UNIT COMMAND: one figure, now.
figure() {
    [[ $DRY == 1 ]] && return 0
    "$PY" scripts/gpu/figures.py --out "$RESULTS" --phase "$STEP" --name "$1" --value "$2" --unit "$3" --command "$4"
}

# ---- steps ------------------------------------------------------------------------
# begin_step NAME LIMIT: a fresh log folder; the step ends by its limit or
# by the run's budget, whichever comes first.
begin_step() {
    STEP=$1 W=$OUTDIR/logs/$1 S_PASS=0 S_FAIL=0 S_SKIP=0 S_T0=$(now)
    STEP_END=$((S_T0 + $2))
    ((STEP_END > END_ALL)) && STEP_END=$END_ALL
    if [[ $DRY == 1 ]]; then
        printf '%-9s (step limit %d s, %d s left in the budget)\n' "$STEP" $((STEP_END - S_T0)) $((END_ALL - S_T0))
        return
    fi
    rm -rf "$W" && mkdir -p "$W"
    say ""
    say "== $STEP ($GPU_DEVICE, commit ${GPU_COMMIT:0:12}, $(date -u +%FT%TZ); limit $((STEP_END - S_T0)) s," \
        "$((END_ALL - S_T0)) s left of $BUDGET)"
}

end_step() {
    [[ $DRY == 1 ]] && return 0
    say "-- $STEP: $S_PASS passed, $S_FAIL failed, $S_SKIP skipped ($(($(now) - S_T0)) s)"
    figure "${STEP}_passed" "$S_PASS" checks "scripts/gpu/check.sh $STEP"
    figure "${STEP}_failed" "$S_FAIL" checks "scripts/gpu/check.sh $STEP"
    ((S_SKIP > 0)) && figure "${STEP}_skipped" "$S_SKIP" programs "scripts/gpu/check.sh $STEP"
    TOTAL_FAILED=$((TOTAL_FAILED + S_FAIL)) TOTAL_SKIPPED=$((TOTAL_SKIPPED + S_SKIP))
}

# fit LIMIT: LIMIT, or the seconds the step has left if fewer.
fit() {
    local left=$((STEP_END - $(now) - 5))
    echo $((left < $1 ? left : $1))
}

# skip_row NAME WHY: a row for something not run.
skip_row() {
    S_SKIP=$((S_SKIP + 1)) DRY_SKIPPED=$((DRY_SKIPPED + 1))
    if [[ $DRY == 1 ]]; then printf '  %-34s SKIPPED (%s)\n' "$1" "$2"; return; fi
    say "$(printf '%-44s SKIPPED (%s)' "$1" "$2")"
}

# run_prog NAME LIMIT ASSUMED CMD...: one program under min(LIMIT, the step's
# time left); skipped (a SKIPPED row) when fewer than MIN seconds (default
# 15) are left. Its output goes, line by line as printed, to $W/NAME.log;
# with FIGS=PREFIX its figure lines to $RESULTS (named PREFIX+NAME, command
# FIGCMD or CMD); with SUMMARY_MATCH=REGEX the matching lines to summary.txt.
# The last "N passed, N failed" line is its count (a non-zero exit without
# failures counts one failure; a clean exit without a count, one pass).
# ASSUMED is the time a dry run assumes (PREBUILT|SOURCE for a build).
# Returns the program's status (125 when skipped).
run_prog() {
    local name=$1 limit=$2 assumed=$3
    shift 3
    local left=$((STEP_END - $(now) - 5)) min=${MIN:-15}
    if ((left < min)); then
        skip_row "$name" "out of time: ${left}s left, needs ${min}s"
        return 125
    fi
    ((limit > left)) && limit=$left
    if [[ $DRY == 1 ]]; then
        dry_row "$name" "$limit" "$assumed" "$*"
        return 0
    fi
    local t0 rc p=0 f=0 note="" last
    t0=$(now)
    local stream=("$PY" scripts/gpu/figures.py --stream --tee "$W/$name.log" --phase "$STEP")
    [[ -n ${FIGS+x} ]] && stream+=(--out "$RESULTS" --prefix "$FIGS" --command "${FIGCMD:-$*}")
    [[ -n ${SUMMARY_MATCH:-} ]] && stream+=(--summary "$SUMMARY" --match "$SUMMARY_MATCH")
    : > "$W/$name.log"
    timeout --kill-after=10 "$limit" "${LINEBUF[@]}" "$@" 2>&1 < /dev/null | "${stream[@]}"
    rc=${PIPESTATUS[0]}
    last=$(grep -aE '[0-9]+ passed, [0-9]+ failed' "$W/$name.log" | tail -n 1)
    [[ $last =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]] && p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}
    if ((rc == 124 || rc == 137)); then note=" TIMEOUT after ${limit}s"
    elif ((rc > 128)); then note=" CRASH (signal $((rc - 128)))"; fi
    ((rc != 0 && f == 0)) && f=1
    [[ -z $last && $rc -eq 0 ]] && p=1
    S_PASS=$((S_PASS + p)) S_FAIL=$((S_FAIL + f))
    say "$(printf '%-44s rc=%-3s %5d passed %4d failed %5ds%s' "$name" "$rc" "$p" "$f" $(($(now) - t0)) "$note")"
    return "$rc"
}

# ---- the dry run ------------------------------------------------------------------
# dry_row NAME LIMIT ASSUMED COMMAND: one planned program; the clock moves
# by its assumed time (at most its limit). ASSUMED "P|S": P seconds with the
# bundle's prebuilt binaries, S building from source (DRY_BUILD picks).
dry_row() {
    local name=$1 limit=$2 assumed=$3 cmd=$4 a pre src note=""
    if [[ $assumed == *"|"* ]]; then
        pre=${assumed%|*} src=${assumed#*|}
        a=$([[ $DRY_BUILD == prebuilt ]] && echo "$pre" || echo "$src")
    else
        pre=$assumed src=$assumed a=$assumed
    fi
    ((a > limit)) && { a=$limit; note=" (cut at its limit)"; }
    DRY_T=$((DRY_T + a)) DRY_PRE=$((DRY_PRE + pre)) DRY_SRC=$((DRY_SRC + src))
    cmd=${cmd//$'\n'/ }
    ((${#cmd} > 100)) && cmd="${cmd:0:58} ... ${cmd: -37}"
    printf '  %-34s %5ds %6s %5ds  %s%s\n' "$name" "$limit" "${a}s" "$(now)" "$cmd" "$note"
}

dry_header() {
    echo "dry run of scripts/gpu/check.sh $WHAT: nothing runs; the plan, with the timings docs/gpu.md assumes"
    echo "(an H100 with 16 CPU cores, OpenBLAS; builds: $DRY_BUILD, GPU_DRY_BUILD=prebuilt|source)"
    echo "budget: $BUDGET s (GPU_CHECK_SECONDS)"
    printf '  %-34s %6s %6s %6s  %s\n' program limit assumed clock command
}

dry_footer() {
    local verdict
    if ((DRY_T <= BUDGET)); then verdict="fits, $((BUDGET - DRY_T)) s to spare"
    else verdict="over by $((DRY_T - BUDGET)) s: the last rows are cut or SKIPPED"; fi
    echo "assumed: $DRY_T s of $BUDGET s ($verdict); $DRY_SKIPPED skipped"
    echo "sums of the assumed times: $DRY_PRE s with prebuilt binaries, $DRY_SRC s building from source"
}

# ---- the build --------------------------------------------------------------------
# Groups of binaries a step needs: core (train_gpt, data/tiny), tests
# (test_gpt, test_real_shapes, test_vocab_ce), lab (every dev/cuda program),
# attn_lab (the three attention lab programs). A group is up to date when
# its stamp (build/gpu/built/stamp_GROUP) holds this source tree's hash and
# CUDA_ARCH, and its binaries exist and find every library: then nothing
# is made (a copied tree has new file times, which would make `make`
# rebuild everything). Otherwise the bundle's prebuilt binaries
# (scripts/gpu/bundle.sh --prebuilt) are tried once, then `make`.
group_bins() {
    case $1 in
        core) echo "train_gpt data/tiny/tiny_train_000001.bin" ;;
        tests) echo "build/test_gpt build/test_real_shapes build/test_vocab_ce" ;;
        lab) local f; for f in dev/cuda/*.cu; do echo "${f%.cu}"; done ;;
        attn_lab) echo "dev/cuda/attention_forward dev/cuda/attention_backward dev/cuda/ring_attention" ;;
    esac
}
# Assumed build seconds (PREBUILT|SOURCE) on the GPU machine, per group.
group_assumed() {
    case $1 in core) echo "5|60" ;; tests) echo "2|30" ;; lab) echo "3|30" ;; attn_lab) echo "1|20" ;; esac
}
src_hash() {
    for f in Makefile dev/cuda/Makefile ./*.cu llmc/*/* llmc/backend/cuda/* tests/*/*.cpp tests/lib/*.h \
        dev/cuda/*.cu dev/cuda/*.h data/*.cpp; do [[ -f $f ]] && echo "$f"; done | LC_ALL=C sort | xargs cat |
        md5sum | cut -c1-32
}
group_ok() {
    [[ -f $BUILT/stamp_$1 && $(cat "$BUILT/stamp_$1") == "$SRC_HASH ${CUDA_ARCH:-}" ]] || return 1
    local b
    for b in $(group_bins "$1"); do
        [[ -e $b ]] || { echo "$b: missing"; return 1; }
        [[ -x $b && ! -d $b ]] || continue
        if ldd "$b" 2>/dev/null | grep -q 'not found'; then echo "$b: libraries unresolved"; return 1; fi
    done
    [[ $1 != core ]] || ./train_gpt --help > /dev/null
}
# ensure_built GROUP...: what is not up to date, from the bundle or made.
ensure_built() {
    local todo=() g pre
    for g in "$@"; do group_ok "$g" > /dev/null || todo+=("$g"); done
    ((${#todo[@]})) || { echo "up to date: $*"; return 0; }
    pre=$(ls "$GPU_BUNDLE"/prebuilt_*.tar.* 2>/dev/null | head -n 1)
    if [[ -n $pre && ! -f $BUILT/prebuilt_tried ]]; then
        touch "$BUILT/prebuilt_tried"
        if archive_unpack "$pre" .; then
            local still=()
            for g in "${todo[@]}"; do group_ok "$g" || still+=("$g"); done
            ((${#still[@]})) || { echo "using $pre for ${todo[*]}"; return 0; }
            echo "prebuilt binaries not usable here for ${still[*]} ($(cat "$BUILT/stamp_${still[0]}" 2>/dev/null)" \
                "vs $SRC_HASH ${CUDA_ARCH:-}): building"
            todo=("${still[@]}")
        fi
    fi
    local targets=() labs=() t0=$SECONDS
    for g in "${todo[@]}"; do
        rm -f "$BUILT/stamp_$g"
        case $g in
            core) targets+=(all) ;;
            tests) targets+=($([[ ${FULL_TESTS:-0} == 1 ]] && echo tests || group_bins tests)) ;;
            lab) labs+=(all) ;;
            attn_lab) labs+=(attention_forward attention_backward ring_attention) ;;
        esac
    done
    echo "building ${todo[*]} (-j$JOBS; $GPU_ENV_SUMMARY)"
    if ((${#targets[@]})); then
        make -j"$JOBS" "${targets[@]}" > "$BUILT/make.log" 2>&1 || { tail -n 30 "$BUILT/make.log"; return 1; }
    fi
    if ((${#labs[@]})); then
        make -C dev/cuda -j"$JOBS" "${labs[@]}" > "$BUILT/make_lab.log" 2>&1 ||
            { tail -n 30 "$BUILT/make_lab.log"; return 1; }
    fi
    for g in "${todo[@]}"; do echo "$SRC_HASH ${CUDA_ARCH:-}" > "$BUILT/stamp_$g"; done
    for g in "${todo[@]}"; do group_ok "$g" || return 1; done
    echo "built ${todo[*]} in $((SECONDS - t0)) s"
}

# need GROUP...: builds (a "make" row) the groups not up to date.
need() {
    local missing=() g
    for g in "$@"; do
        if [[ $DRY == 1 ]]; then [[ " $DRY_BUILT " == *" $g "* ]] || missing+=("$g")
        else group_ok "$g" > /dev/null || missing+=("$g"); fi
    done
    if ((${#missing[@]} == 0)); then
        [[ $DRY == 1 ]] || say "binaries up to date: $*"
        return 0
    fi
    local pre=0 src=0 a
    for g in "${missing[@]}"; do
        a=$(group_assumed "$g")
        pre=$((pre + ${a%|*})) src=$((src + ${a#*|}))
    done
    DRY_BUILT+=" ${missing[*]}"
    MIN=30 run_prog "make_$(IFS=_; echo "${missing[*]}")" 420 "$pre|$src" bash scripts/gpu/check.sh __build "$(IFS=,; echo "${missing[*]}")"
}
