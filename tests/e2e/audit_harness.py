# tests/e2e/audit_harness.py: the machinery of tests/e2e/test_audit.py.
# Running train_gpt (one process, or under mpirun with each rank's exit
# status reported) under a hard time limit that kills the whole process
# group; sorting an outcome into ok, crash, hang, silent or unclear; and
# writing the small bad files the cases feed it (shards, model files,
# tokenizers, a checkpoint shard with NaN Adam state).
import os
import re
import signal
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train_gpt")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from testlib import ENV, _fnv1a64  # noqa: E402  (mpirun as root, oversubscribed; the shard checksum)

SMALL = ["-e", "L=2,C=32,NH=2,V=257,T=64", "-b", "4", "-t", "32", "--device", "cpu", "-v", "0", "-s", "0"]
LIMIT, MPI_LIMIT = 60, 90
# What a crash leaves on stderr, whoever prints it (the C++ runtime, the
# shell, mpirun reporting a rank that died of a signal).
CRASH = re.compile(r"terminate called|what\(\): |Traceback \(most recent|core dumped|Segmentation fault|^Aborted|"
                   r"uncaught exception|exited on signal|Floating point exception|Bus error|double free|"
                   r"stack smashing", re.M)
# The shell each rank runs under in the per-rank form (write_rank_shell):
# runs the trainer, reports its status, and exits with it. A script file,
# since mpirun would read `sh -c` as its own -c.
RANK_SH = None
RANK_EXIT = re.compile(r"^audit-rank-exit (\d+) (\d+)$", re.M)
results = []


class Run:
    def __init__(self, rc, out, err, hung, secs):
        self.rc, self.out, self.err, self.hung, self.secs = rc, out, err, hung, secs


def start(cmd, env=None):
    # A session of its own, so that a hang's whole process group (mpirun and
    # its ranks) can be killed at once.
    return subprocess.Popen(cmd, cwd=ROOT, env=env or ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)


def finish(p, limit, t0):
    try:
        out, err = p.communicate(timeout=max(1.0, limit - (time.time() - t0)))
        return Run(p.returncode, out, err, False, time.time() - t0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:  # ended in the meantime
            pass
        out, err = p.communicate()
        return Run(p.returncode, out, err, True, time.time() - t0)


def write_rank_shell(tmp):
    global RANK_SH
    RANK_SH = write(os.path.join(tmp, "rank.sh"),
                    b'"$@"; s=$?; echo "audit-rank-exit $OMPI_COMM_WORLD_RANK $s" >&2; exit $s\n')


def mpi_cmd(ranks):
    """mpirun for ranks = [args of rank 0, args of rank 1, ...] (the `-np 1 cmd : -np 1 cmd` form). Each rank
    runs under a shell that reports its own exit status, so that "every rank ends non-zero" can be checked."""
    cmd = ["mpirun"]
    for i, args in enumerate(ranks):
        cmd += ([":"] if i else []) + ["-np", "1", "sh", RANK_SH, TRAIN] + args
    return cmd


def run(args, np_=0, env=None, limit=None, ranks=None):
    """One process, plain `mpirun -np np_`, or with ranks the per-rank form that reports each rank's status."""
    cmd = mpi_cmd(ranks) if ranks else ["mpirun", "-np", str(np_), TRAIN] + args if np_ else [TRAIN] + args
    t0 = time.time()
    return finish(start(cmd, env), limit or (MPI_LIMIT if (np_ or ranks) else LIMIT), t0)


def record(cls, name, detail=""):
    """One case's line. An ok refusal's detail is its message without the `train_gpt: error: ` that ok
    implies, so that tests/run_tests.sh, which shows a failed test's lines holding "error" or "FAIL",
    shows the cases that are not ok (listed again at the end as FAIL lines) rather than the ok ones."""
    if cls == "ok":
        detail = re.sub(r"^train_gpt: error( \(rank \d+\))?: ", "", detail)
    line = f"{cls:<8} {name:<34} {detail}"[:400]
    results.append((cls, line))
    print(line, flush=True)


def crashed(r):
    """A crash's detail, or None: a death by signal (the process's own, or a rank's reported by mpirun) or
    a crash's text on stderr or stdout."""
    if r.rc is not None and r.rc < 0:
        return f"killed by signal {-r.rc}"
    for text in (r.err, r.out):
        m = CRASH.search(text)
        if m:
            return "output: " + text[text.rfind("\n", 0, m.start()) + 1:].split("\n")[0][:200]
    ranks = RANK_EXIT.findall(r.err)
    if any(int(s) > 128 for _, s in ranks):
        return "a rank ended with status " + ", ".join(s for _, s in ranks)
    return None


def error_lines(r):
    """The trainer's lines on stderr, warnings and test-hook notes left out. Under mpirun only the lines
    that start with train_gpt count: mpirun adds its own paragraphs about ranks that ended."""
    lines = [l.strip() for l in r.err.splitlines() if l.strip() and not re.match(r"train_gpt: (warning|test)", l)]
    if RANK_EXIT.search(r.err) or "mpirun" in r.err or "MPI_ABORT" in r.err:
        lines = [l for l in lines if l.startswith("train_gpt")]
    return lines


def expect_error(name, args, needles, np_=0, env=None, ranks=None):
    """A case that must be refused: non-zero on every rank, one `train_gpt: error` line naming one of needles."""
    r = run(args, 0, env, ranks=ranks or ([args] * np_ if np_ else None))
    classify_error(name, r, needles)


def classify_error(name, r, needles):
    needles = [needles] if isinstance(needles, str) else needles
    lines = error_lines(r)
    first = lines[0] if lines else ""
    zero_ranks = [k for k, s in RANK_EXIT.findall(r.err) if s == "0"]
    if r.hung:
        record("hang", name, f"still running after {r.secs:.0f} s; stderr: {r.err.strip()[-150:]!r}")
    elif crashed(r):
        record("crash", name, crashed(r))
    elif r.rc == 0 or zero_ranks:
        record("silent", name, f"exit 0 (ranks {zero_ranks})" if zero_ranks else
               f"exit 0; stdout ends {r.out.strip()[-100:]!r}")
    elif not first.startswith("train_gpt: error") and not first.startswith("train_gpt: error ("):
        record("unclear", name, f"exit {r.rc}, no error line: {r.err.strip()[-200:]!r}")
    elif not any(n in first for n in needles):
        record("unclear", name, f"does not name {needles[0]!r}: {first[:250]!r}")
    elif len(set(re.sub(r"^train_gpt: error \(rank \d+\)", "train_gpt: error", l) for l in lines)) > 1:
        record("unclear", name, f"{len(lines)} lines: {lines[:3]!r}")
    elif r.rc not in (1, 2):
        record("unclear", name, f"exit {r.rc}, not 1 (a fault) or 2 (a setup error): {first[:200]!r}")
    else:
        record("ok", name, first[:200])


def expect_survive(name, r, good, what, killed=False):
    """A fault the run must come through: good(r) says whether it did as documented. killed: the case
    itself kills a process, so a death by signal is no crash."""
    if r.hung:
        record("hang", name, f"still running after {r.secs:.0f} s")
    elif crashed(r) and not killed:
        record("crash", name, crashed(r))
    elif good(r):
        record("ok", name, what)
    elif r.rc == 0:
        record("silent", name, f"exit 0 without {what}; stderr {r.err.strip()[-200:]!r}")
    else:
        record("unclear", name, f"exit {r.rc}, wanted {what}: {r.err.strip()[-250:]!r}")



# ---- files --------------------------------------------------------------------------------------

def header(*vals):
    h = list(vals) + [0] * (256 - len(vals))
    return struct.pack("<256i", *h)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def shard(path, tokens, magic=20240520, version=1, count=None, fmt="H", extra=b""):
    n = len(tokens) if count is None else count
    return write(path, header(magic, version, n) + struct.pack(f"<{len(tokens)}{fmt}", *tokens) + extra)


def tokenizer(path, vocab=257, cut=None, magic=20240328):
    body = b"".join(bytes([1, i]) for i in range(256)) + bytes([5]) + b"<eot>"
    data = header(magic, 2, vocab, 256) + body
    return write(path, data[:cut] if cut else data)


def model_header(magic=20240326, version=3, T=64, V=257, L=2, NH=2, C=32, Vp=384):
    return header(magic, version, T, V, L, NH, C, Vp)


def swap(args, flag, value):
    """args with the value of flag replaced."""
    return [value if i and args[i - 1] == flag else a for i, a in enumerate(args)]


def param_count(L, C, Vp, T):
    return 12 * L * C * C + 13 * L * C + (Vp + T) * C + 2 * C


def refuse_or_warn(name, r, needle):
    """A case that must not pass silently: refused with one line, or run with a warning, naming needle."""
    warn = [l for l in r.err.splitlines() if l.startswith("train_gpt: warning") and needle in l]
    if r.rc in (1, 2) and error_lines(r) and needle in error_lines(r)[0]:
        record("ok", name, "refused: " + error_lines(r)[0][:150])
    else:
        expect_survive(name, r, lambda r: r.rc == 0 and warn, "a warning naming " + needle)


def adam_nan(path, fix_sums):
    """Writes NaN over the first element of Adam m (fp32 state), found from the shard's header and piece
    tables (docs/design.md section 1.3); with fix_sums the trailer's checksums are made to match again."""
    data = bytearray(open(path, "rb").read())
    h = struct.unpack("<256i", bytes(data[:1024]))
    nw, na = h[6] | (h[7] << 32), h[8] | (h[9] << 32)
    size = {0: 4, 1: 8, 2: 2}
    pieces = [struct.unpack("<4Q", bytes(data[1024 + 32 * k:1056 + 32 * k])) for k in range(nw + na)]
    lens = [[q[1] * q[3] * size[h[4]] for q in pieces[:nw]]] + [[q[1] * q[3] * size[h[5]] for q in pieces[nw:]]] * 2
    start = 1024 + 32 * (nw + na)
    m_at = start + sum(lens[0])
    data[m_at:m_at + 4] = struct.pack("<f", float("nan"))
    if fix_sums:
        sums, pos = [], start
        for sec in lens:
            for n in sec:
                sums.append(_fnv1a64(bytes(data[pos:pos + n])))
                pos += n
        data[pos + 16:pos + 16 + 8 * len(sums)] = struct.pack(f"<{len(sums)}Q", *sums)
    write(path, bytes(data))


def signal_rank(args, out, sigs, np_=0, env=None, steps=3):
    """Starts a run with -o out, waits for `steps` steps in metrics.jsonl, sends sigs (1 s apart) to the
    trainer (under mpirun: the last rank) while it runs, and waits for the end; the Run's `after` is the
    seconds from the last signal to the end, `delivered` how many signals found it running."""
    cmd = (["mpirun", "-np", str(np_)] if np_ else []) + [TRAIN] + args + ["-o", out]
    t0 = time.time()
    p = start(cmd, env)
    while time.time() - t0 < 45 and p.poll() is None:
        try:
            if len(open(os.path.join(out, "metrics.jsonl")).readlines()) >= steps:
                break
        except OSError:
            pass
        time.sleep(0.05)
    target = p.pid
    if np_:
        # The ranks are mpirun's children: the last one.
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        target = int(kids[-1]) if kids else None
    delivered = 0
    for i, s in enumerate(sigs):
        if i:
            time.sleep(1)
        if target and p.poll() is None:
            try:
                os.kill(target, s)
                delivered += 1
            except ProcessLookupError:
                pass
    sent = time.time()
    r = finish(p, (MPI_LIMIT if np_ else LIMIT) + (sent - t0), t0)
    r.after, r.delivered = time.time() - sent, delivered
    return r
