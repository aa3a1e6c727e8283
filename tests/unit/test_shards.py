#!/usr/bin/env python3
"""tests/unit/test_shards.py: tests of scripts/shards.py and scripts/prepare_data.py,
and that the C++ DataLoader and Tokenizer read what they write identically.

  /usr/bin/python3 tests/unit/test_shards.py [--dump-rows PATH]

--dump-rows names a built tests/dump_rows; without it the test compiles one
with g++ into a temporary directory. Expected token streams are built here
from the text the test writes (EOT, then the document's bytes), not by the
code under test. Last line: "N passed, M failed"; exit code 1 on any failure.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from shards import read_doc_ids, read_shard, write_shard  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

EOT = 256


class Tally(Checks):
    def check(self, ok, what):
        return self(ok, what)


def byte_stream(docs):
    """The expected byte-level stream: EOT before each document's bytes."""
    out = []
    for d in docs:
        out.append(EOT)
        out.extend(d)
    return out


def prepare(args):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py")] + args
    return subprocess.run(cmd, capture_output=True, text=True)


def dump(exe, *args):
    r = subprocess.run([exe] + [str(a) for a in args], capture_output=True, text=True)
    return r.returncode, r.stdout


def parse_dump(out):
    info = {"files": [], "rows": []}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key == "total":
            info["total"] = int(rest)
        elif key == "rows":
            info["rows_per_epoch"] = int(rest)
        elif key == "file":
            info["files"].append(rest)
        elif key == "row":
            _, _, body = rest.partition(" in: ")
            ins, _, tgs = body.partition(" tg: ")
            info["rows"].append(([int(x) for x in ins.split()], [int(x) for x in tgs.split()]))
    return info


def rows_match_formula(info, stream, T):
    """Row i is stream[i*T .. i*T+T] (positions modulo len(stream))."""
    n = len(stream)
    for i, (ins, tgs) in enumerate(info["rows"]):
        want_in = [stream[(i * T + t) % n] for t in range(T)]
        want_tg = [stream[(i * T + t + 1) % n] for t in range(T)]
        if ins != want_in or tgs != want_tg:
            return f"row {i} differs"
    return ""


def no_temp_files(d):
    return not any(".tmp" in f for f in os.listdir(d))


def test_shards_module(t, tmp, exe):
    p = os.path.join(tmp, "a.bin")
    toks = np.array([0, 5, 256, 255, 17], dtype=np.int64)
    write_shard(p, toks, 257)
    head = np.fromfile(p, dtype="<i4", count=3)
    t.check(list(head) == [20240520, 1, 5] and os.path.getsize(p) == 1024 + 10, "uint16 shard header and size")
    back = read_shard(p)
    t.check(back.dtype == np.uint16 and back.tolist() == toks.tolist(), "uint16 round trip")

    write_shard(p, [65535, 0], 65536)
    t.check(read_shard(p).dtype == np.uint16 and read_shard(p).tolist() == [65535, 0], "vocab 65536 stays uint16")

    big = np.array([0, 65536, 99999, 123, 70000, 5], dtype=np.int64)
    p32 = os.path.join(tmp, "b32.bin")
    write_shard(p32, big, 100000)
    head = np.fromfile(p32, dtype="<i4", count=3)
    t.check(list(head) == [20240801, 7, 6] and os.path.getsize(p32) == 1024 + 24, "uint32 shard header and size")
    t.check(read_shard(p32).dtype == np.uint32 and read_shard(p32).tolist() == big.tolist(), "uint32 round trip")
    rc, out = dump(exe, p32, 2, 100000)
    info = parse_dump(out)
    t.check(rc == 0 and info.get("total") == 6 and rows_match_formula(info, big.tolist(), 2) == "",
            "C++ reads a Python uint32 shard: " + out[-200:])

    for bad, vocab, what in (([1, 257], 257, "id == vocab"), ([-1, 2], 257, "negative id"), ([], 257, "empty"),
                             ([[1, 2]], 257, "2-D"), ([1.5], 257, "floats")):
        try:
            write_shard(os.path.join(tmp, "bad.bin"), np.array(bad), vocab)
            t.check(False, f"write_shard refuses {what}")
        except ValueError:
            t.check(True, "")
    t.check(not os.path.exists(os.path.join(tmp, "bad.bin")), "refused shard left no file")

    raw = open(p32, "rb").read()
    for name, data, what in (("trunc.bin", raw[:-1], "truncated"), ("trail.bin", raw + b"x", "trailing"),
                             ("magic.bin", b"\x01" + raw[1:], "magic"), ("short.bin", raw[:100], "short")):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            read_shard(path)
            t.check(False, f"read_shard refuses {what}")
        except ValueError as e:
            t.check(what in str(e) and name in str(e), f"read_shard message for {what}: {e}")
    t.check(no_temp_files(tmp), "no temporary files left by write_shard")


def test_prepare_files(t, tmp, exe):
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    docs = []
    for i in range(5):
        text = (f"Document {i}.\n" + "The quick brown fox jumps over the lazy dog. " * (3 + 4 * i) +
                "\nCaf\u00e9 na\u00efve \u2603\n").encode("utf-8")
        docs.append(text)
        with open(os.path.join(src, f"doc{i}.txt"), "wb") as f:
            f.write(text)
    inputs = [os.path.join(src, f"doc{i}.txt") for i in range(5)]
    out = os.path.join(tmp, "out")
    r = prepare(["--input"] + inputs + ["--out", out, "--name", "demo", "--tokenizer", "bytes",
                                         "--val-fraction", "0.2", "--shard-tokens", "300"])
    t.check(r.returncode == 0, "prepare_data bytes runs: " + r.stderr)
    if r.returncode != 0:
        return
    # round(0.2 * 5) = 1 document to val, the other four to train.
    want_val = byte_stream(docs[:1])
    want_train = byte_stream(docs[1:])
    names = sorted(os.listdir(out))
    train_files = [n for n in names if n.startswith("demo_train_")]
    val_files = [n for n in names if n.startswith("demo_val_")]
    t.check(val_files == ["demo_val_000000.bin"], f"val shard name: {val_files}")
    n_train = (len(want_train) + 299) // 300
    t.check(train_files == [f"demo_train_{i:06d}.bin" for i in range(1, n_train + 1)],
            f"train shard names: {train_files}")
    got_train = np.concatenate([read_shard(os.path.join(out, n)) for n in train_files]).tolist()
    t.check(got_train == want_train, "train stream = EOT + bytes of each document")
    sizes = [read_shard(os.path.join(out, n)).size for n in train_files]
    t.check(all(s == 300 for s in sizes[:-1]) and 0 < sizes[-1] <= 300, f"shard sizes {sizes}")
    t.check(read_shard(os.path.join(out, val_files[0])).tolist() == want_val, "val stream")
    t.check(all(read_doc_ids(os.path.join(out, n)) == (None, EOT) for n in train_files + val_files),
            "every shard's header records EOT as the token that ends a document, none that opens one")
    t.check(no_temp_files(out), "no temporary files in the output")

    # The C++ loader sees the same stream, rows by the formula, through the wrap.
    T = 16
    rc, text = dump(exe, os.path.join(out, "demo_train_*.bin"), T, 257)
    info = parse_dump(text)
    t.check(rc == 0, "dump_rows on train shards: " + text[-300:])
    t.check(info.get("total") == len(want_train) and info.get("rows_per_epoch") == len(want_train) // T,
            "C++ total_tokens and rows_per_epoch")
    t.check([os.path.basename(f) for f in info["files"]] == train_files, "C++ file order")
    t.check(len(info["rows"]) == len(want_train) // T + 2, "dumped an epoch and two more rows")
    why = rows_match_formula(info, want_train, T)
    t.check(why == "", "C++ rows equal the Python stream: " + why)
    rc, text = dump(exe, os.path.join(out, "demo_val_000000.bin"), 7, 257)
    why = rows_match_formula(parse_dump(text), want_val, 7)
    t.check(rc == 0 and why == "", "C++ reads the val shard: " + why)

    # A vocab smaller than the ids: the C++ error names the shard and offset.
    first = read_shard(os.path.join(out, train_files[0])).tolist()
    off = next(i for i, v in enumerate(first) if v >= 200)
    rc, text = dump(exe, os.path.join(out, train_files[0]), 4, 200)
    t.check(rc == 1 and train_files[0] in text and f"offset {off}" in text, "bad id error from C++: " + text)

    # The tokenizer file: exact bytes, and the C++ Tokenizer decodes it.
    tok_path = os.path.join(out, "tokenizer.bin")
    header = np.zeros(256, dtype="<i4")
    header[:4] = [20240328, 2, 257, 256]
    want = header.tobytes() + b"".join(bytes([1, b]) for b in range(256)) + bytes([13]) + b"<|endoftext|>"
    t.check(open(tok_path, "rb").read() == want, "tokenizer.bin bytes")
    rc, text = dump(exe, "--tokenizer", tok_path)
    lines = text.splitlines()
    want_lines = ["vocab 257", "eot 256"] + [f"token {b} {b:02x}" for b in range(256)] + \
        ["token 256 " + b"<|endoftext|>".hex()]
    t.check(rc == 0 and lines == want_lines, "C++ Tokenizer decodes Python's tokenizer.bin")

    # Same name again: refused without --overwrite; stale shards removed with it.
    r = prepare(["--input"] + inputs + ["--out", out, "--name", "demo", "--shard-tokens", "300"])
    t.check(r.returncode == 1 and "overwrite" in r.stderr, "existing shards are not silently mixed: " + r.stderr)
    r = prepare(["--input"] + inputs + ["--out", out, "--name", "demo", "--shard-tokens", "100000",
                 "--val-fraction", "0.2", "--overwrite"])
    names = sorted(n for n in os.listdir(out) if n.startswith("demo_"))
    t.check(r.returncode == 0 and names == ["demo_train_000001.bin", "demo_val_000000.bin"],
            f"--overwrite replaces old shards: {names} {r.stderr}")
    t.check(read_shard(os.path.join(out, "demo_train_000001.bin")).tolist() == want_train, "rewritten stream")


def test_prepare_modes(t, tmp, exe):
    # --split-blank-lines: paragraphs are documents.
    paras = [b"First paragraph,\nline two.\n", b"Second one.\n", b"Third\nparagraph\nhere.\n", b"Fourth.\n"]
    text = b"\n\n".join(paras) + b"\n   \n"
    src = os.path.join(tmp, "paras.txt")
    with open(src, "wb") as f:
        f.write(b"\n" + text)
    out = os.path.join(tmp, "out_paras")
    r = prepare(["--input", src, "--out", out, "--name", "p", "--split-blank-lines", "--val-fraction", "0.25"])
    t.check(r.returncode == 0, "split-blank-lines runs: " + r.stderr)
    if r.returncode == 0:
        t.check(read_shard(os.path.join(out, "p_val_000000.bin")).tolist() == byte_stream(paras[:1]) and
                read_shard(os.path.join(out, "p_train_000001.bin")).tolist() == byte_stream(paras[1:]),
                "paragraph documents")

    # One document: split by tokens, both parts start with EOT.
    body = bytes(range(32, 127)) * 10
    one = os.path.join(tmp, "one.txt")
    with open(one, "wb") as f:
        f.write(body)
    out = os.path.join(tmp, "out_one")
    r = prepare(["--input", one, "--out", out, "--name", "s", "--val-fraction", "0.1"])
    k = round(0.1 * len(body))
    t.check(r.returncode == 0 and
            read_shard(os.path.join(out, "s_val_000000.bin")).tolist() == [EOT] + list(body[:k]) and
            read_shard(os.path.join(out, "s_train_000001.bin")).tolist() == [EOT] + list(body[k:]),
            "single document split by tokens: " + r.stderr)

    # --val-fraction 0: no val shard.
    out = os.path.join(tmp, "out_noval")
    r = prepare(["--input", one, "--out", out, "--name", "n", "--val-fraction", "0"])
    t.check(r.returncode == 0 and sorted(os.listdir(out)) == ["n_train_000001.bin", "tokenizer.bin"] and
            read_shard(os.path.join(out, "n_train_000001.bin")).tolist() == [EOT] + list(body),
            "val-fraction 0: " + r.stderr)

    # --jsonl: one document per line's "text", UTF-8 encoded.
    texts = ["Hello world.", "Zw\u00f6lf Boxk\u00e4mpfer \u2014 jagen Viktor.", "Line one\nline two", "Last"]
    js = os.path.join(tmp, "docs.jsonl")
    with open(js, "w") as f:
        for s in texts:
            f.write(json.dumps({"text": s, "id": 1}) + "\n")
        f.write("\n")
    out = os.path.join(tmp, "out_jsonl")
    r = prepare(["--input", js, "--out", out, "--name", "j", "--jsonl", "--val-fraction", "0.5"])
    enc = [s.encode("utf-8") for s in texts]
    t.check(r.returncode == 0 and
            read_shard(os.path.join(out, "j_val_000000.bin")).tolist() == byte_stream(enc[:2]) and
            read_shard(os.path.join(out, "j_train_000001.bin")).tolist() == byte_stream(enc[2:]),
            "jsonl documents: " + r.stderr)

    # Bad inputs fail with a message, exit 1.
    r = prepare(["--input", os.path.join(tmp, "missing.txt"), "--out", out, "--name", "m"])
    t.check(r.returncode == 1 and "missing.txt" in r.stderr, "missing input: " + r.stderr)
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    r = prepare(["--input", empty, "--out", os.path.join(tmp, "out_empty"), "--name", "e"])
    t.check(r.returncode == 1 and "no text" in r.stderr, "empty input: " + r.stderr)

    # gpt2: without tiktoken a clear message and exit 1; with it, real shards.
    have_tiktoken = importlib.util.find_spec("tiktoken") is not None
    out = os.path.join(tmp, "out_gpt2")
    r = prepare(["--input", src, "--out", out, "--name", "g", "--tokenizer", "gpt2", "--split-blank-lines"])
    if have_tiktoken:
        rc, text = dump(exe, os.path.join(out, "g_train_*.bin"), 2, 50257)
        t.check(r.returncode == 0 and rc == 0 and parse_dump(text)["rows"][0][0][0] == 50256,
                "gpt2 shards read by C++: " + r.stderr + text[-200:])
    else:
        t.check(r.returncode == 1 and "tiktoken" in r.stderr and "not installed" in r.stderr,
                "gpt2 without tiktoken says so: " + r.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-rows", help="path of a built tests/dump_rows")
    args = ap.parse_args()
    t = Tally()
    with tempfile.TemporaryDirectory(prefix="test_shards_") as tmp:
        exe = args.dump_rows
        if not exe:
            exe = os.path.join(tmp, "dump_rows")
            build = subprocess.run(
                ["g++", "-std=c++17", "-O2", "-I", ROOT, os.path.join(ROOT, "tests", "unit", "dump_rows.cpp"),
                 os.path.join(ROOT, "llmc", "io", "dataloader.cpp"), os.path.join(ROOT, "llmc", "io", "tokenizer.cpp"),
                 os.path.join(ROOT, "llmc", "io", "tokenizer_export.cpp"),
                 os.path.join(ROOT, "llmc", "io", "bpe.cpp"), os.path.join(ROOT, "llmc", "io", "pretokenize.cpp"),
                 os.path.join(ROOT, "llmc", "io", "unicode_table.cpp"),
                 os.path.join(ROOT, "llmc", "base", "fileio.cpp"), "-o", exe], capture_output=True, text=True)
            t.check(build.returncode == 0, "build dump_rows: " + build.stderr)
            if build.returncode != 0:
                print(f"{t.passed} passed, {t.failed} failed")
                return 1
        test_shards_module(t, tmp, exe)
        test_prepare_files(t, tmp, exe)
        test_prepare_modes(t, tmp, exe)
    print(f"{t.passed} passed, {t.failed} failed")
    return 0 if t.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
