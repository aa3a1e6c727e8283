# tests/lib/testlib.py: helpers shared by the mpirun test scripts (test_dist.py,
# test_tp.py, test_cp.py): running the trainer under mpirun, reading its
# metrics and checkpoints, making shards, and counting checks.
import filecmp
import glob
import json
import os
import struct
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from checks import Checks  # noqa: F401  (re-exported: the tests import it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train_gpt")
# mpirun as root, and more ranks than cores (docs/design.md section 8).
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def train(np_, args, timeout=240, env=None):
    """Runs train_gpt in one process (np_ = 0) or under mpirun -np np_,
    with env's variables added to the environment."""
    cmd = ([TRAIN] if np_ == 0 else ["mpirun", "-np", str(np_), TRAIN]) + args
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=dict(ENV, **(env or {})))
    return p.returncode, p.stdout, p.stderr


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def param_count(L, C, V, Vp, T):
    return 12 * L * C * C + 13 * L * C + (Vp + T) * C + 2 * C


def llama_param_count(L, C, NH, NKV, F, Vp, tied, qkv_bias=False):
    """wte, per block RMSNorm, Q/K/V (NKV key/value heads; with qkv_bias,
    Qwen2's, their biases), o_proj, RMSNorm, gate/up/down; final RMSNorm;
    lm_head when untied."""
    hs = C // NH
    qkv = (NH + 2 * NKV) * hs
    return Vp * C * (1 if tied else 2) + L * (2 * C + C * qkv + (qkv if qkv_bias else 0) + NH * hs * C + 3 * C * F) + C


def _floats(raw, code):
    """Raw little-endian values of a checkpoint dtype code (0 fp32, 1 fp64, 2 bf16) as float64."""
    if code == 0:
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if code == 1:
        return np.frombuffer(raw, dtype="<f8").astype(np.float64)
    if code == 2:
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError(f"dtype code {code}")


def read_state(path):
    """weights, m, v of an earlier-format state file as float64 arrays (file order), and (L, C, Vp, maxT)."""
    with open(path, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        T, V, L, NH, C, Vp = h[5:11]
        P = param_count(L, C, V, Vp, T)
        arrays = []
        for dt in (h[3], h[4], h[4]):
            size = {0: 4, 1: 8, 2: 2}[dt]
            arrays.append(_floats(f.read(P * size), dt))
    return arrays[0], arrays[1], arrays[2], (L, C, Vp, T)


def _fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_checkpoint(d, step):
    """weights, m, v of the checkpoint of `step` in output directory d as
    float64 arrays in model-file order, and (L, C, Vp, maxT). Assembled here
    from the shard files by their piece tables (an independent reader of the
    format in llmc/io/checkpoint.h); every element must come from exactly one
    shard."""
    cdir = os.path.join(d, f"ckpt_{step:08d}")
    if not os.path.isdir(cdir):
        return read_state(os.path.join(d, f"state_{step:08d}.bin"))
    with open(os.path.join(cdir, "index.json")) as f:
        ix = json.load(f)
    m = ix["model"]
    L, C, V, Vp, T = m["L"], m["C"], m["V"], m["Vp"], m["maxT"]
    if m.get("arch", "gpt2") in ("llama", "qwen2"):  # Qwen2: and the Q, K, V biases
        P = llama_param_count(L, C, m["NH"], m["NKV"], m["F"], Vp, m["tied"], m["arch"] == "qwen2")
    elif m.get("arch") == "mixtral":  # the MLP's 3·C·F is the router's E·C and E experts' 3·C·F
        P = llama_param_count(L, C, m["NH"], m["NKV"], m["F"], Vp, m["tied"]) + L * m["E"] * C * (1 + 3 * m["F"]) \
            - L * 3 * C * m["F"]
    else:
        P = param_count(L, C, V, Vp, T)
    assert ix["params"] == P, f"checkpoint: index says {ix['params']} parameters, the formula {P}"
    out = [np.zeros(P), np.zeros(P), np.zeros(P)]
    cover = [np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)]
    for name in ix["shards"]:
        with open(os.path.join(cdir, name), "rb") as f:
            h = struct.unpack("<256i", f.read(1024))
            assert h[0] == 20241124 and h[1] == 1, f"{name}: magic/version {h[:2]}"
            wt, ot = h[4], h[5]
            nw = (h[6] & 0xffffffff) | (h[7] << 32)
            no = (h[8] & 0xffffffff) | (h[9] << 32)
            tables = [np.frombuffer(f.read(32 * n), dtype="<u8").reshape(n, 4) for n in (nw, no)]
            sizes = {0: 4, 1: 8, 2: 2}
            # FNV-1a 64 of each (section, piece), as the trailer must hold them
            # (recomputed here for shards up to 4 MiB: it is a byte-by-byte loop).
            sums, small = [], os.path.getsize(os.path.join(cdir, name)) <= (4 << 20)
            for k, (table, code) in enumerate(((tables[0], wt), (tables[1], ot), (tables[1], ot))):
                total = int(sum(int(p[1]) * int(p[3]) for p in table))
                raw = f.read(total * sizes[code])
                at_byte = 0
                for p in table:
                    n = int(p[1]) * int(p[3]) * sizes[code]
                    sums.append(_fnv1a64(raw[at_byte:at_byte + n]) if small else None)
                    at_byte += n
                vals = _floats(raw, code)
                at = 0
                for off, ln, stride, count in table:
                    for i in range(int(count)):
                        b = int(off) + i * int(stride)
                        out[k][b:b + int(ln)] = vals[at:at + int(ln)]
                        if k < 2:
                            cover[k][b:b + int(ln)] += 1
                        at += int(ln)
            # The trailer: magic "llmc-sum", the count, the checksums.
            magic, count = struct.unpack("<2Q", f.read(16))
            assert magic == 0x6C6C6D632D73756D and count == len(sums), f"{name}: trailer {magic:#x} {count}"
            got = list(struct.unpack(f"<{count}Q", f.read(8 * count)))
            assert not small or got == sums, f"{name}: checksums differ from the payload's FNV-1a"
            assert f.read(1) == b"", f"{name}: bytes past its trailer"
    assert all((c == 1).all() for c in cover), "checkpoint: an element missing or in two shards"
    return out[0], out[1], out[2], (L, C, Vp, T)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return np.linalg.norm(a - b) / nb if nb > 0 else np.linalg.norm(a - b)


def write_shard(path, tokens, doc_start=None, doc_end=None):
    """An llm.c uint16 token shard; doc_start, doc_end: the document tokens
    its header records (header[3], header[4]: 1 + the id; scripts/shards.py)."""
    tokens = np.asarray(tokens, dtype="<u2")
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2] = 20240520, 1, len(tokens)
    if doc_start is not None:
        h[3] = doc_start + 1
    if doc_end is not None:
        h[4] = doc_end + 1
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(tokens.tobytes())


def equivalence(check, tmp, dtype, args, single, layouts, steps=10, keys=("loss",)):
    """Trains one process with args + single, then every (np, extra) layout
    with args + extra; checks that the losses (each metrics.jsonl key of
    `keys`) and the final weights (from the step-`steps` checkpoint) equal
    the single run's: relative error <= 1e-10 in fp64, <= 1e-5 in fp32."""
    tol = 1e-10 if dtype == "fp64" else 1e-5
    ck = ["-n", str(steps)]
    os.makedirs(tmp, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"eq_{dtype}_", dir=tmp)  # fresh directories for each call
    ref = os.path.join(tmp, f"single_{dtype}")
    rc, out, err = train(0, args + single + ck + ["-o", ref])
    if not check(rc == 0, f"single {dtype}: {err[-400:]}"):
        return
    ref_l, ref_w = {k: [m[k] for m in metrics(ref)] for k in keys}, read_checkpoint(ref, steps)[0]
    for np_, extra in layouts:
        d = os.path.join(tmp, f"{dtype}_{np_}_" + "_".join(extra).replace("-", ""))
        rc, out, err = train(np_, args + ck + ["-o", d] + extra)
        what = f"{dtype} np={np_} {' '.join(extra)}"
        if not check(rc == 0, f"{what}: {err[-400:]}"):
            continue
        lr = {k: rel([m[k] for m in metrics(d)], ref_l[k]) for k in keys}
        wr = rel(read_checkpoint(d, steps)[0], ref_w)
        print(f"  {what}: " + ", ".join(f"{k} rel {lr[k]:.2e}" for k in keys) + f", final weights rel {wr:.2e}")
        for k in keys:
            check(lr[k] <= tol, f"{what}: {k} rel err {lr[k]:.3e}")
        check(wr <= tol, f"{what}: final weights rel err {wr:.3e}")
        if "--tp" in extra:
            check("tp replicas of LayerNorm, wpe and row-parallel biases: identical" in out, f"{what}: replicas differ")


def refusals(check, cases, args_of, timeout=60, env=None):
    """Each (np, model, extra, flag): train_gpt with args_of(model) + extra
    (and env's variables) ends with exit status != 0 and one line (the ranks
    agree) that names flag (a string, or a tuple of strings it names all
    of); flag None: the run succeeds."""
    for np_, model, extra, flag in cases:
        rc, out, err = train(np_, args_of(model) + extra, timeout=timeout, env=env)
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        what = f"{model.split(',', 1)[1]} {' '.join(extra)}"
        if flag is None:
            check(rc == 0, f"{what}: rc={rc} {err[-300:]!r}")
            continue
        named = all(f in lines[0] for f in ((flag,) if isinstance(flag, str) else flag)) if lines else False
        check(rc != 0 and len(lines) == 1 and named, f"{what}: rc={rc} {err[-300:]!r}")
        if lines:
            print(f"  {' '.join(extra) or model}: {lines[0]}")


def plan_memory(np_, args, extra_plan=()):
    """Trains args (np_ ranks, 0: one process) and plans them (--plan eval,
    --world np_): (rank 0's memory line bytes of the run, of the plan, and
    the two runs' stderr), None for a bytes figure that is missing."""
    import re
    rc, out, err = train(np_, args)
    run_b = re.search(r"memory\[0\] start: .* bytes=(\d+)", out)
    rc2, out2, err2 = train(0, args + ["--plan", "eval"] + (["--world", str(np_)] if np_ else []) + list(extra_plan))
    plan_b = re.search(r"memory\[0\] plan: .* bytes=(\d+)", out2)
    return (run_b.group(1) if rc == 0 and run_b else None), (plan_b.group(1) if rc2 == 0 and plan_b else None), \
        err[-200:] + err2[-200:]


def resume_check(check, tmp, args, single, saved, resumes, at=5):
    """Trains one process with args + single (uninterrupted); saves at step
    `at` with saved = (np, extra); resumes a copy of that checkpoint with each
    (np, extra) of resumes; checks the resumed losses equal the
    uninterrupted run's (fp64: relative error <= 1e-10)."""
    full = os.path.join(tmp, "ck_full")
    train(0, args + single + ["-o", full])
    full_l = [m["loss"] for m in metrics(full)]
    src = os.path.join(tmp, "ck_saved")
    rc, out, err = train(saved[0], args + saved[1] + ["-n", str(at), "-o", src])
    if not check(rc == 0, f"save at {' '.join(saved[1])}: {err[-300:]}"):
        return
    for i, (np_, extra) in enumerate(resumes):
        d = os.path.join(tmp, f"ck_resume_{i}")
        copy_checkpoint(src, d, at)
        rc, out, err = train(np_, args + ["-y", "1", "-o", d] + extra)
        if not check(rc == 0, f"resume {extra}: {err[-300:]}"):
            continue
        r = rel([m["loss"] for m in metrics(d)], full_l[at:])
        print(f"  saved at {' '.join(saved[1])}, resumed at {' '.join(extra) or 'one process'}: losses rel {r:.2e}")
        check(r <= 1e-10, f"resume {extra}: rel err {r:.3e}")


def shards_equal(a, b, step):
    """Whether the checkpoints of `step` in run directories a and b have the
    same shard files, byte for byte."""
    fa = sorted(glob.glob(os.path.join(a, f"ckpt_{step:08d}", "*.bin")))
    fb = sorted(glob.glob(os.path.join(b, f"ckpt_{step:08d}", "*.bin")))
    return len(fa) > 0 and [os.path.basename(x) for x in fa] == [os.path.basename(x) for x in fb] and all(
        filecmp.cmp(x, y, shallow=False) for x, y in zip(fa, fb))


def copy_checkpoint(src, dst, step):
    """Copies the complete checkpoint of `step` (its directory and DONE file) from src into dst (made if missing)."""
    os.makedirs(dst, exist_ok=True)
    shutil.copytree(os.path.join(src, f"ckpt_{step:08d}"), os.path.join(dst, f"ckpt_{step:08d}"))
    shutil.copy(os.path.join(src, f"DONE_{step:08d}"), dst)


def run_suite(check, prefix, body):
    """Runs body(tmp) in a fresh temporary directory (removed after), then
    exits with the checks' summary; one failure when train_gpt or mpirun is
    missing."""
    if not os.path.exists(TRAIN) or shutil.which("mpirun") is None:
        print("train_gpt or mpirun missing")
        print("0 passed, 1 failed")
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        body(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(check.summary())
