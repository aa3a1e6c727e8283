# scripts/gpu/archive.sh: sourced (not run) by scripts/gpu/bundle.sh,
# scripts/gpu/env.sh, scripts/gpu/check.sh, scripts/gpu/bundle_selftest.sh,
# scripts/gpu/llmc_build.sh and scripts/gpu/llmq_build.sh.
# Packs and unpacks the bundle's archives with what the machine has, since a
# bare GPU machine may lack `xz`:
#   archive_pack OUT_BASE DIR ITEM...  packs ITEMs (relative to DIR) into
#       OUT_BASE.tar.xz when `xz` is here, else OUT_BASE.tar.gz (tar and
#       gzip), else with Python's tarfile (xz when its lzma module imports,
#       else gzip); prints the file it wrote.
#   archive_unpack FILE [DEST]  unpacks a .tar.xz, .tar.gz or .tar into DEST
#       (default .): tar with xz or gzip when the tool is here, else Python's
#       tarfile (which reads xz through lzma and gzip through zlib).
#   archive_tool                prints what archive_pack would use.
#   commit_of DIR               a source folder's commit: its COMMIT file's
#       first line (what a bundled copy carries), else git's, else "unknown".
# The archive functions return non-zero on failure, with a message.
# shellcheck shell=bash
# _have TOOL: TOOL is an executable file on PATH (`command -v` alone also
# names a file that is there but cannot run).
_have() {
    local p
    p=$(command -v "$1" 2>/dev/null) && [[ -f $p && -x $p ]]
}
_archive_py() {
    local p
    for p in python3 /usr/bin/python3; do
        _have "$p" && { echo "$p"; return 0; }
    done
    return 1
}

archive_tool() {
    if _have tar && _have xz; then echo "tar+xz"
    elif _have tar && _have gzip; then echo "tar+gzip"
    else echo "python tarfile"; fi
}

archive_pack() {
    local base=$1 dir=$2
    shift 2
    local tool archive py
    tool=$(archive_tool)
    case $tool in
        tar+xz) archive=$base.tar.xz; tar -C "$dir" -cJf "$archive" "$@" || return 1 ;;
        tar+gzip) archive=$base.tar.gz; tar -C "$dir" -czf "$archive" "$@" || return 1 ;;
        *)
            py=$(_archive_py) || { echo "archive_pack: no tar with xz or gzip, and no python3" >&2; return 1; }
            archive=$("$py" - "$base" "$dir" "$@" <<'PYEOF'
import os, sys, tarfile
base, d, items = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    import lzma  # noqa: F401
    mode, out = "w:xz", base + ".tar.xz"
except ImportError:
    mode, out = "w:gz", base + ".tar.gz"
with tarfile.open(out, mode) as t:
    for it in items:
        t.add(os.path.join(d, it), arcname=it)
print(out)
PYEOF
            ) || return 1
            ;;
    esac
    echo "$archive"
}

archive_unpack() {
    local f=$1 dest=${2:-.} py
    mkdir -p "$dest" || return 1
    case $f in
        *.tar.xz | *.txz)
            if _have tar && _have xz; then
                tar -C "$dest" -xJf "$f"
                return
            fi ;;
        *.tar.gz | *.tgz)
            if _have tar && _have gzip; then
                tar -C "$dest" -xzf "$f"
                return
            fi ;;
        *.tar)
            if _have tar; then
                tar -C "$dest" -xf "$f"
                return
            fi ;;
    esac
    py=$(_archive_py) || { echo "archive_unpack: $f: no tool to unpack it (xz/gzip, or python3)" >&2; return 1; }
    "$py" - "$f" "$dest" <<'PYEOF'
import sys, tarfile
f, dest = sys.argv[1], sys.argv[2]
try:
    with tarfile.open(f, "r:*") as t:
        if hasattr(tarfile, "tar_filter"):
            t.extractall(dest, filter="tar")  # keeps modes and relative links
        else:
            t.extractall(dest)
except (tarfile.TarError, OSError, EOFError) as e:
    sys.exit(f"archive_unpack: {f}: {e}")
PYEOF
}

commit_of() {
    if [[ -f $1/COMMIT ]]; then head -n 1 "$1/COMMIT"
    elif [[ -e $1/.git ]]; then git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown
    else echo unknown; fi
}
