#!/usr/bin/env python3
"""tests/unit/test_structure.py: the layout of this tree against its own rules.

The library is cut into layers, one folder each (llmc/README.md lists them in
order). Each folder's README.md says what the folder holds and, on a line
starting "Includes:", which other folders its files may include. This test
reads every #include "..." of the C++ and CUDA sources and checks:
  - each include names an existing file, written from the project root;
  - each include inside llmc/ stays in its folder or goes to one its README
    allows, and the allowed folders form an order (no folder allows one
    that allows it back);
  - no include circle between modules (a module: the files of one stem,
    such as llmc/io/checkpoint.h and llmc/io/checkpoint.cpp);
  - no source file is longer than 600 lines;
  - every source file under llmc/ opens with a comment naming its own path;
  - the README's code map has one line per folder of llmc/ and names only
    paths that exist;
  - each parallel mode has its one home in llmc/parallel/ (no file named for
    a mode elsewhere), and no file of llmc/model/ names a collective or a
    communicator: the model reaches the modes through the hooks it declares
    (llmc/model/parallel_hooks.h);
  - the README is the front door, under 300 lines, and every relative link
    of README.md and docs/*.md (and every docs/NAME.md they name) resolves;
  - the repository stands alone: no text cites notes kept outside it.
Run: python3 tests/unit/test_structure.py. Last line: "N passed, N failed".
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_LINES = 600
SOURCE = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh")

sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

check = Checks()


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return [f for f in out.stdout.split("\n") if f and os.path.isfile(os.path.join(ROOT, f))]
    # Not a git checkout (an unpacked archive, say): every file under the root.
    files = []
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("build",)]
        files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    return files


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def layer_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "llmc" else None


def module_of(path):
    return os.path.splitext(path)[0]


def main():
    files = tracked()
    cxx = [f for f in files if f.endswith((".h", ".cpp", ".cu", ".cuh"))]
    layers = sorted({layer_of(f) for f in files if layer_of(f)})

    # ---- each folder's rules ----------------------------------------------------
    allowed = {}
    for L in layers:
        readme = f"llmc/{L}/README.md"
        if not check(os.path.isfile(os.path.join(ROOT, readme)), f"{readme} exists (what the folder holds, what it may include)"):
            continue
        m = re.search(r"^Includes:(.*)$", read(readme), re.M)
        if not check(m is not None, f"{readme} has a line 'Includes: ...'"):
            continue
        names = re.findall(r"llmc/([a-z_]+)", m.group(1))
        for n in names:
            check(n in layers, f"{readme}: 'Includes:' names llmc/{n}, which is not a folder")
        allowed[L] = set(names)
    # The allowed folders form an order: no circle among them.
    for a in allowed:
        for b in allowed[a]:
            check(a not in allowed.get(b, set()), f"llmc/{a} and llmc/{b} each allow the other")

    # ---- includes ------------------------------------------------------------------
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    edges = {}
    n_includes = 0
    bad_target = []
    for f in cxx:
        for target in inc.findall(read(f)):
            n_includes += 1
            here = os.path.join(os.path.dirname(f), target)
            if os.path.isfile(os.path.join(ROOT, target)):
                t = os.path.normpath(target)
            elif os.path.isfile(os.path.join(ROOT, here)):
                t = os.path.normpath(here)
                # dev/cuda's lab files include their own helpers by name; the
                # library writes every include from the root.
                if f.startswith("llmc/"):
                    bad_target.append(f"{f}: #include \"{target}\" (write it from the project root: \"{t}\")")
            else:
                bad_target.append(f"{f}: #include \"{target}\" names no file")
                continue
            a, b = module_of(f), module_of(t)
            if a != b:
                edges.setdefault(a, set()).add(b)
            lf, lt = layer_of(f), layer_of(t)
            if lf and lt and lf != lt and lf in allowed:
                check(lt in allowed[lf], f"{f} includes {t}: llmc/{lf} may include only "
                      + (", ".join("llmc/" + x for x in sorted(allowed[lf])) or "nothing of llmc"))
            if lf and not lt and t.split("/")[0] != "llmc":
                check(False, f"{f} includes {t}, outside the library")
    check(not bad_target, "every include names a file from the project root: " + "; ".join(bad_target[:5]))
    check(n_includes > 100, f"the includes were read ({n_includes})")

    # Circles between modules (Tarjan's strongly connected components).
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    check(not sccs, "no include circle between modules: " + "; ".join(" <-> ".join(c) for c in sccs))

    # ---- sizes and headers -------------------------------------------------------------
    for f in files:
        if not f.endswith(SOURCE):
            continue
        n = read(f).count("\n")
        check(n <= MAX_LINES, f"{f}: {n} lines (at most {MAX_LINES})")
    for f in files:
        if f.startswith("llmc/") and f.endswith((".h", ".cpp", ".cu", ".cuh")):
            first = read(f).split("\n", 1)[0]
            check(first.startswith(f"// {f}:"), f"{f} opens with '// {f}: what it holds' (it opens with '{first[:60]}')")

    # ---- the README's code map -------------------------------------------------------
    readme = read("README.md")
    m = re.search(r"^## Code map\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    if check(m is not None, "README.md has a '## Code map' section"):
        cmap = m.group(1)
        for L in layers:
            check(re.search(rf"`llmc/{L}/`", cmap) is not None, f"README code map has a line for llmc/{L}/")
        rows = re.findall(r"^\| `([A-Za-z0-9_./-]+)` \|", cmap, re.M)
        check(len(rows) >= len(layers), f"README code map has a row per path ({len(rows)} rows)")
        for p in rows:
            check(os.path.exists(os.path.join(ROOT, p.rstrip("/"))), f"README code map names {p}, which exists")

    # ---- one home per parallel mode --------------------------------------------------
    modes = ["data_parallel", "tensor_parallel", "context_parallel", "expert_parallel", "pipeline_parallel"]
    for mode in modes:
        check(os.path.isfile(os.path.join(ROOT, f"llmc/parallel/{mode}.h")), f"llmc/parallel/{mode}.h: the mode's home")
        elsewhere = [f for f in files if mode in os.path.basename(f) and f.startswith("llmc/")
                     and not f.startswith("llmc/parallel/")]
        check(not elsewhere, f"{mode} has its home in llmc/parallel/ only (also: {elsewhere})")
    # The model's sources name no collective and no communicator: their
    # identifiers (comments and strings aside) are the hooks' and the backend's.
    collective = re.compile(r"\b(all_reduce|reduce_scatter|all_gather|all_to_all\w*|send_recv|broadcast|"
                            r"host_all_reduce|start_\w+|p2p\w*|Comm|MPI_\w+|nccl\w*|ReduceOp)\b")
    model_files = [f for f in cxx if f.startswith("llmc/model/")]
    check(len(model_files) > 10, f"the model's sources were read ({len(model_files)})")
    for f in model_files:
        code = re.sub(r"//[^\n]*|\"(?:\\.|[^\"\\])*\"", "", read(f))
        names = sorted(set(m.group(1) for m in collective.finditer(code)))
        check(not names, f"{f} names no collective or communicator (it names {names})")

    # ---- the README as the front door; docs links ------------------------------------
    n = readme.count("\n")
    check(n < 300, f"README.md is the front door: {n} lines (under 300; the rest lives in docs/)")
    docs = ["README.md"] + sorted(f for f in files if f.startswith("docs/") and f.endswith(".md"))
    n_links = 0
    for f in docs:
        base = os.path.dirname(f)
        text = read(f)
        # Markdown links and images to relative paths (anchors and URLs aside).
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            n_links += 1
            check(os.path.exists(os.path.join(ROOT, base, path)), f"{f}: the link ({target}) resolves")
        # A docs page named by its path, from the root.
        for path in sorted(set(re.findall(r"(?<![\w/.-])(docs/[\w.-]+\.md)\b", text))):
            check(os.path.isfile(os.path.join(ROOT, path)), f"{f}: {path} exists")
    check(n_links > 10, f"the docs' links were read ({n_links})")

    # ---- a repository that stands alone --------------------------------------------
    outside = [
        re.compile("shared" + r"/reference"),
        re.compile(r"\bissues? " + r"#?[0-9]"),
        re.compile(r"/work" + r"/"),
    ]
    for f in files:
        if f.endswith((".png", ".bin", ".jsonl", ".gz", ".pdf")):
            continue
        text = read(f)
        for p in outside:
            for i, line in enumerate(text.split("\n")):
                if p.search(line):
                    check(False, f"{f}:{i + 1}: cites something outside the repository: {line.strip()[:100]}")
    check(True, "the text of the tree was read")

    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
