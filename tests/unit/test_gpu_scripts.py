#!/usr/bin/env python3
"""tests/unit/test_gpu_scripts.py: the GPU runbook's scripts, without a GPU.

- every scripts/gpu/*.sh parses (bash -n);
- the dry run of each command (scripts/gpu/check.sh --dry-run 1..5), building
  from source and with prebuilt binaries, plans every program it should and
  fits the 540 s budget with nothing skipped (on the timings docs/gpu.md
  assumes); the switches of the bench step (LLMC_SWITCHES) add their runs,
  and a malformed one is refused; command 1 builds llm.c with cuDNN and
  runs the peers step (llm.c with cuDNN, compiled PyTorch) before the bench;
- llm.q's build (scripts/gpu/llmq_build.sh) refuses, in one line with exit
  status 2, a folder that is not llm.q's sources and llm.q's sources
  without their dependencies; bundle.sh --llmq refuses what is not llm.q;
- scripts/gpu/llmq_tokens.py turns this trainer's shards (uint32 and
  uint16) into llm.q's BIN.TOK files: the header as llm.q's loader reads
  it, the same tokens, --head, a token outside --vocab refused;
- the compiled-PyTorch peer (scripts/gpu/torch_gpt2.py --selfcheck, on the
  CPU): d12's parameter count is the trainer's, and the model learns;
- scripts/gpu/figures.py --stream writes a figure the moment a program
  prints it, so a program killed afterwards leaves it, and copies the
  summary lines as they come;
- scripts/gpu/optimizer_dtype.py (bf16 AdamW moments against fp32 ones) and
  scripts/gpu/sync_free.py (the step without host synchronisation against the
  host-read one) run their trainings and checks on the CPU;
- scripts/gpu/archive.sh packs and unpacks with xz, with gzip alone, and
  with Python's tarfile alone (no xz, no gzip), keeping modes and links; an
  xz that is on PATH but cannot run counts as none.
Run: python3 tests/unit/test_gpu_scripts.py. Last line: "N passed, N failed".
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

check = Checks()
BASH = shutil.which("bash") or "/bin/bash"


def sh(cmd, env=None, timeout=60):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def dry_runs():
    must = {
        "1": ["env", "make_core_tests", "ldd", "test_gpt_round_fp32", "test_gpt_odd_fp32", "ours_b64_r0",
              "llmc_cudnn_b64_r0", "ours_b32_r1", "llmc_cudnn_b32_r1", "ours_b32_r0", "torch_compile_b32", "ours_b16",
              "llmc_b16", "ours_b32", "llmc_b32"],
        "2": ["make_core", "qwen_data", "llmq_build", "llmq_tokens", "ours_qwen_0.5b", "llmq_qwen_0.5b",
              "ours_qwen_1.5b", "llmq_qwen_1.5b", "breakdown_d12_b32"],
        "3": ["make_core_lab", "attention_forward", "matmul_forward", "ranks", "ranks_llama", "curve"],
        "4": ["make_core_tests_attn_lab", "real_shapes_d12", "optimizer_dtype", "sync_free", "memcheck_test_gpt_fp32",
              "racecheck_attention_backward", "initcheck_ring_attention", "synccheck_attention_forward"],
        "5": ["real_shapes_llama", "real_shapes_big", "calibrate", "plan_d12"],
    }
    for n, names in must.items():
        for build in ("source", "prebuilt"):
            rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", n],
                         {"GPU_DRY_BUILD": build, "GPU_CHECK_SECONDS": "540", "LLMC_SWITCHES": ""})
            what = f"check.sh --dry-run {n} ({build})"
            if not check(rc == 0, f"{what}: exit {rc}: {out[-300:]}"):
                continue
            rows = set(re.findall(r"^  (\S+) ", out, re.M))
            for name in names:
                check(name in rows, f"{what} plans {name}")
            m = re.search(r"^assumed: (\d+) s of 540 s \((fits)?.*\); (\d+) skipped", out, re.M)
            check(m is not None and m.group(2) == "fits", f"{what} fits 540 s: {m.group(0) if m else out[-200:]}")
            check(m is not None and m.group(3) == "0" and "SKIPPED" not in out, f"{what} skips nothing")
    # The sanitizer runs the labs' small cases.
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "4"])
    labs = re.findall(r"--error-exitcode 99 dev/cuda/(\w+)( --small)?", out)
    check(len(labs) == 12 and all(x[1] for x in labs), f"every sanitizer run of a lab program passes --small: {labs}")
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "bench"],
                 {"LLMC_SWITCHES": "fast_thing=LLMC_FOO=1,--recompute=none other=--seed=7"})
    rows = set(re.findall(r"^  (\S+) ", out, re.M))
    # At one batch size: the last of BENCH_B unless BENCH_SWITCH_B says which.
    for r in ("ours_b32_sw_fast_thing", "ours_b32_sw_other"):
        check(r in rows, f"a switch adds its run {r}")
    check(not any(r.startswith("ours_b16_sw_") for r in rows), f"switches run at one batch size: {sorted(rows)}")
    check("LLMC_FOO=1" in out and "--recompute=none" in out, "a switch's environment and flags reach its run")
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "bench"],
                 {"LLMC_SWITCHES": "fast_thing=LLMC_FOO=1", "BENCH_SWITCH_B": "16"})
    rows = set(re.findall(r"^  (\S+) ", out, re.M))
    check("ours_b16_sw_fast_thing" in rows and "ours_b32_sw_fast_thing" not in rows, "BENCH_SWITCH_B picks the batch size")
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "bench"], {"LLMC_SWITCHES": "Bad=x"})
    check("switch 'Bad=x': not NAME=ITEM" in out and "_sw_" not in out, "a malformed switch is refused")
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "nonsense"])
    check(rc == 2 and "unknown step" in out, "an unknown step is an error")
    # The peers step: llm.c's cuDNN build in the background, then its runs.
    rc, out = sh([BASH, "scripts/gpu/check.sh", "--dry-run", "1"], {"LLMC_SWITCHES": ""})
    check("llmc_build.sh --cudnn CUDNN_FRONTEND LLMC_SRC" in out and out.index("peers ") < out.index("bench "),
          "command 1 builds llm.c with cuDNN and runs the peers before the bench")
    rc, out = sh([BASH, "scripts/gpu/llmc_build.sh", "--cudnn", "/nonexistent", "/nonexistent"])
    check(rc == 2 and "not a cudnn-frontend checkout" in out, f"llmc_build.sh --cudnn refuses what is no frontend: {out}")


def llmq(tmp):
    """llm.q's build script and token converter, without llm.q or a GPU."""
    rc, out = sh([BASH, "scripts/gpu/llmq_build.sh", tmp])
    check(rc == 2 and len(out.strip().splitlines()) == 1 and "is not llm.q's sources" in out,
          f"llmq_build.sh refuses a folder that is not llm.q's sources in one line, exit 2: rc={rc} {out!r}")
    rc, out = sh([BASH, "scripts/gpu/llmq_build.sh"])
    check(rc == 2, f"llmq_build.sh without arguments: the usage, exit 2: rc={rc}")
    # A folder shaped like llm.q's sources, with no dependencies beside it.
    fake, deps = os.path.join(tmp, "llmq"), os.path.join(tmp, "no_deps")
    os.makedirs(os.path.join(fake, "src", "models"))
    os.makedirs(deps)
    open(os.path.join(fake, "train.cpp"), "w").close()
    open(os.path.join(fake, "src", "models", "llama_model.cpp"), "w").close()
    open(os.path.join(fake, "CMakeLists.txt"), "w").write("project(LLMQ CUDA CXX)\n")
    rc, out = sh([BASH, "scripts/gpu/llmq_build.sh", fake], {"LLMQ_DEPS": deps})
    check(rc == 2 and len(out.strip().splitlines()) == 1 and "git clone --branch" in out,
          f"llmq_build.sh names a missing dependency and how to get it, exit 2: rc={rc} {out!r}")
    rc, out = sh([BASH, "scripts/gpu/bundle.sh", "--llmq", tmp, os.path.join(tmp, "bundle")])
    check(rc == 2 and "not llm.q's sources" in out, f"bundle.sh --llmq refuses what is not llm.q: rc={rc} {out!r}")
    # The token files: a Qwen-sized vocabulary (uint32 shard) and GPT-2's (uint16).
    py = next((p for p in (sys.executable, "/usr/bin/python3")
               if subprocess.run([p, "-c", "import numpy"], capture_output=True).returncode == 0), None)
    if py is None:
        check(False, "llmq_tokens.py: no Python with numpy here")
        return
    script = f"""
import sys
sys.path.insert(0, 'scripts'); sys.path.insert(0, 'scripts/gpu')
import numpy as np, shards, llmq_tokens
t = '{tmp}/'
for vocab, n in ((151936, 5000), (50257, 3000)):
    toks = np.random.default_rng(vocab).integers(0, vocab, n)
    shards.write_shard(t + 'ours.bin', toks, vocab)
    for head in (None, 1234):
        got_n, got_v = llmq_tokens.convert(t + 'ours.bin', t + 'llmq.bin', vocab, head)
        m = head or n
        raw = open(t + 'llmq.bin', 'rb').read()
        hdr = np.frombuffer(raw[:1024], dtype='<i4')
        body = np.frombuffer(raw[1024:], dtype='<i4')
        print('case', vocab, head, raw[:8] == b'BIN.TOK\\n', list(hdr[2:7]) == [2, 4, m, vocab, 0],
              got_n == m and got_v == vocab, body.size == m and np.array_equal(body, toks[:m]))
shards.write_shard(t + 'big.bin', np.array([1, 2, 300]), 1000)
try:
    llmq_tokens.convert(t + 'big.bin', t + 'x.bin', vocab=100)
    print('refused False')
except ValueError:
    import os
    print('refused', not os.path.exists(t + 'x.bin'))
"""
    rc, out = sh([py, "-c", script])
    cases = re.findall(r"^case (\d+) (\S+) (.*)$", out, re.M)
    check(rc == 0 and len(cases) == 4, f"llmq_tokens.py ran its cases: rc={rc} {out[-300:]}")
    for vocab, head, flags in cases:
        check(flags.split() == ["True"] * 4,
              f"llmq_tokens.py vocab {vocab} head {head}: magic, header, counts, tokens: {flags}")
    check("refused True" in out, f"llmq_tokens.py refuses a token outside --vocab and leaves no file: {out[-200:]}")


def torch_peer():
    """The compiled-PyTorch peer's model: d12's parameter count is the
    trainer's and llm.c's, and it learns (on the CPU, any PyTorch)."""
    py = "/usr/bin/python3"
    if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0:
        check(False, "torch_gpt2.py --selfcheck: no PyTorch in /usr/bin/python3 (scripts/setup.sh installs it)")
        return
    rc, out = sh([py, "scripts/gpu/torch_gpt2.py", "--selfcheck"], timeout=300)
    m = re.search(r"^(\d+) passed, (\d+) failed", out, re.M)
    check(rc == 0 and m is not None and m.group(2) == "0" and int(m.group(1)) >= 4,
          f"torch_gpt2.py --selfcheck: {out[-300:]}")


def streaming(tmp):
    res, log, summ = (os.path.join(tmp, x) for x in ("r.jsonl", "p.log", "s.txt"))
    prog = "echo 'figure a_ms 1.5 ms'; echo 'PASS x'; echo 'figure b_ms nan ms'; sleep 30; echo 'figure c 2 s'"
    cmd = (f"timeout 2 {BASH} -c \"{prog}\" 2>&1 | {sys.executable} scripts/gpu/figures.py --stream --tee {log} "
           f"--out {res} --phase t --prefix p_ --command cmd --summary {summ} --match '^PASS'")
    rc, out = sh([BASH, "-c", cmd], {"GPU_DEVICE": "dev", "GPU_COMMIT": "abc"})
    rows = [json.loads(x) for x in open(res)] if os.path.exists(res) else []
    check(len(rows) == 1 and rows[0]["name"] == "p_a_ms" and rows[0]["value"] == 1.5 and rows[0]["unit"] == "ms"
          and rows[0]["device"] == "dev" and rows[0]["phase"] == "t", f"figures streamed before the kill: {rows}")
    check(os.path.exists(log) and "PASS x" in open(log).read() and "figure c" not in open(log).read(),
          "the log holds what was printed")
    check(os.path.exists(summ) and open(summ).read() == "PASS x\n" and "PASS x" in out, "summary lines as they come")


def archives(tmp):
    src = os.path.join(tmp, "src", "d")
    os.makedirs(os.path.join(src, "sub"))
    with open(os.path.join(src, "run"), "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(os.path.join(src, "run"), 0o755)
    open(os.path.join(src, "sub", "x"), "w").write("x\n")
    os.symlink("run", os.path.join(src, "link"))
    tools = {"xz": ["tar", "xz", "gzip", "mkdir"], "gzip": ["tar", "gzip", "mkdir"], "python": ["mkdir"]}
    for name, keep in tools.items():
        b = os.path.join(tmp, "bin_" + name)
        os.makedirs(b)
        for t in keep:
            if shutil.which(t):
                os.symlink(shutil.which(t), os.path.join(b, t))
        os.symlink(sys.executable, os.path.join(b, "python3"))
        if name == "gzip":  # an xz that is there but cannot run (as when hidden) does not count
            open(os.path.join(b, "xz"), "w").close()
        if name != "python" and not all(os.path.exists(os.path.join(b, t)) for t in keep):
            print(f"(archive test with {name}: a tool is missing here; skipped)")
            continue
        out_dir = os.path.join(tmp, "out_" + name)
        script = (f"PATH={b}; source scripts/gpu/archive.sh; echo tool=$(archive_tool); "
                  f"f=$(archive_pack {tmp}/pack_{name} {tmp}/src d) && echo file=$f && "
                  f"archive_unpack $f {out_dir} && echo unpacked")
        rc, out = sh([BASH, "-c", script])
        m = re.search(r"file=(\S+)", out)
        want = {"xz": ".tar.xz", "gzip": ".tar.gz", "python": ".tar."}[name]
        check(rc == 0 and "unpacked" in out and m and want in m.group(1), f"archive with {name}: {out.strip()[-200:]}")
        d = os.path.join(out_dir, "d")
        check(os.access(os.path.join(d, "run"), os.X_OK) and os.readlink(os.path.join(d, "link")) == "run"
              and open(os.path.join(d, "sub", "x")).read() == "x\n", f"archive with {name}: modes, links, contents")
    # An xz archive unpacked where only Python is (the bundle made with xz, a GPU machine without it).
    xzs = glob.glob(os.path.join(tmp, "pack_xz.tar.xz"))
    if xzs:
        rc, out = sh([BASH, "-c", f"PATH={tmp}/bin_python; source scripts/gpu/archive.sh; "
                      f"archive_unpack {xzs[0]} {tmp}/out_xz_py && echo ok"])
        check(rc == 0 and os.path.exists(os.path.join(tmp, "out_xz_py", "d", "sub", "x")),
              f"an xz archive unpacked without xz: {out.strip()[-200:]}")


def optimizer_dtype(tmp):
    py = shutil.which("python3") or sys.executable
    rc, out = sh([py, "scripts/gpu/optimizer_dtype.py", "--out", os.path.join(tmp, "optdtype"), "--steps", "3",
                  "--device", "cpu", "--dtype", "fp32"], env={"OMP_NUM_THREADS": "1"}, timeout=300)
    check(rc == 0 and "7 passed, 0 failed" in out and "figure optimizer_bf16_stochastic_loss_rel" in out,
          f"optimizer_dtype.py on the CPU: {out[-400:]}")
    rc, out = sh([py, "scripts/gpu/sync_free.py", "--out", os.path.join(tmp, "syncfree"), "--steps", "4", "--skip",
                  "1", "--device", "cpu", "--dtype", "fp32", "--model", "L=2,C=32,NH=2,V=257,T=64", "-t", "64", "-b",
                  "4"], env={"OMP_NUM_THREADS": "1"}, timeout=300)
    check(rc == 0 and "10 passed, 0 failed" in out and "figure sync_free_step_over_base" in out and
          "figure whole_step_graph_over_base" in out and "figure cuda_graph_replays 2 replays" in out,
          f"sync_free.py on the CPU: {out[-400:]}")


def main():
    for f in sorted(glob.glob(os.path.join(ROOT, "scripts", "gpu", "*.sh"))):
        rc, out = sh([BASH, "-n", f])
        check(rc == 0, f"bash -n {os.path.relpath(f, ROOT)}: {out}")
    dry_runs()
    torch_peer()
    tmp = tempfile.mkdtemp(prefix="llmc_gpu_scripts_")
    try:
        streaming(tmp)
        archives(tmp)
        llmq(tmp)
        optimizer_dtype(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
