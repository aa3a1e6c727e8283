#!/usr/bin/python3
# tests/distributed/test_document_mask.py: --document-mask (attention within
# documents, docs/attention.md) in one process and under mpirun, against
# independent truths:
#   - data without any EOT: --document-mask 1 trains exactly as without it
#     (every loss and the final weights bit for bit), fp64 and fp32; data with
#     EOTs: it trains differently (the mask acts);
#   - every layout equals one process with the mask, fp64, on a shard of
#     documents of 1 to 40 tokens (so at T=16 rows hold several EOTs and
#     documents cross cp chunks, tp/sp shards and rows): dp with ZeRO 1 and
#     3, tp + sp, pp, pp with vpp, cp 2 and 4 (ring blocks wholly before
#     their queries' documents skipped), cp 2 and 4 all-to-all, cp 4 hybrid
#     (all-to-all groups of 2, a ring of 2: the group's document starts and
#     the ring's key positions), and the mixes tp 2 sp x pp 2, cp 2 x dp 2
#     and cp 4 hybrid x pp 2, and each cp implementation x tp 2 sp (ring,
#     a2a cp 2, hybrid cp 4) and x pp 2 (ring, a2a cp 2); Llama (GQA 2:1)
#     under cp 2 x tp 2, pp 2, cp 2 all-to-all and cp 4 hybrid; one cp 2 run at
#     T=160 (several 64-row tiles per ring block); 6 steps, losses and final
#     weights (<= 1e-10), validation losses too;
#   - recorded regions (LLMC_CPU_GRAPH=1, docs/design.md section 2.9): the
#     document starts change every step while the recorded ops replay; the
#     run equals the one without recording, bit for bit;
#   - start tokens: documents [S, body, Z] (S and Z nowhere else): the
#     starts that --bos-token S gives (a document opens at S) are those
#     --eot-token Z gives (it ends after Z), so the runs are equal bit for bit,
#     and so is the run that takes both from the shard's header (and says
#     so); a token that never occurs in the data gets a one-line warning;
#   - errors: --eot-token (and --bos-token) not below the vocabulary ends
#     every rank with one line naming the flag.
# The masked attention itself: tests/unit/test_cpu_attention.cpp; one process
# against PyTorch and transformers: the reference tier (docmask cases).
# Last line: "N passed, N failed".
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, equivalence, metrics, read_checkpoint, run_suite, train, write_shard

L, C, NH, V, EOT = 4, 32, 4, 97, 7
GPT2 = f"L={L},C={C},NH={NH},V={V},Vp={V},T=1024"
LLAMA = f"arch=llama,L=2,C={C},NH=4,NKV=2,F=48,V={V},T=1024,tied=0"
HYBRID = ["--cp-impl", "hybrid", "--cp-a2a", "2"]
check = Checks()
DOCS = PLAIN = None


def base(model, data, T=16, steps=6):
    return ["-e", model, "-i", data, "-j", data, "-v", "3", "-m", "2", "-t", str(T), "-x", str(steps), "-s", "0",
            "--dtype", "fp64", "-c", "0.1", "-l", "3e-3", "-u", "2", "-q", "0.2", "--grad-clip", "0.5",
            "--eot-token", str(EOT)]


def documents(rng, n):
    """Random documents of 1 to 40 tokens, each ending with EOT (ids 0..V-1, EOT only at the ends)."""
    out = []
    while len(out) < n:
        k = int(rng.integers(1, 41))
        body = rng.integers(0, V, k - 1)
        body[body == EOT] = EOT + 1
        out.extend(body.tolist() + [EOT])
    return np.array(out[:n])


def test_no_eot(tmp):
    """Without EOTs the mask is causal attention: the same run, bit for bit."""
    for dtype in ("fp64", "fp32"):
        runs = {}
        for mask in ("0", "1"):
            d = os.path.join(tmp, f"plain_{dtype}_{mask}")
            args = base(GPT2, PLAIN) + ["--dtype", dtype, "-b", "4", "-d", "64", "-n", "6", "-o", d]
            rc, out, err = train(0, args + ["--document-mask", mask])
            if check(rc == 0, f"no EOT {dtype} mask {mask}: {err[-300:]}"):
                runs[mask] = ([m["loss"] for m in metrics(d)], read_checkpoint(d, 6)[0])
        if len(runs) == 2:
            same = runs["0"][0] == runs["1"][0] and np.array_equal(runs["0"][1], runs["1"][1])
            check(same, f"no EOT {dtype}: --document-mask 1 changed the run: {runs['0'][0]} vs {runs['1'][0]}")
            print(f"  data without EOT, {dtype}: --document-mask 1 = no mask, losses and weights bit for bit")
    runs = []
    for mask in ("0", "1"):
        d = os.path.join(tmp, f"docs_{mask}")
        rc, out, err = train(0, base(GPT2, DOCS) + ["-b", "4", "-d", "64", "-o", d, "--document-mask", mask])
        runs.append([m["loss"] for m in metrics(d)] if rc == 0 else [])
    check(runs[0] and runs[1] and abs(runs[0][-1] - runs[1][-1]) > 1e-4,
          f"data with EOTs: the mask changed nothing ({runs})")


def test_layouts(tmp):
    args = base(GPT2, DOCS) + ["--document-mask", "1", "-d", "128"]
    one = ["-b", "8"]
    layouts = [(2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "-z", "3"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"]),
               (2, ["-b", "4", "--pp", "2"]), (2, ["-b", "4", "--pp", "2", "--vpp", "2"]),
               (2, ["-b", "8", "--cp", "2"]), (4, ["-b", "8", "--cp", "4"]),
               (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]), (4, ["-b", "8", "--cp", "4", "--cp-impl", "a2a"]),
               (4, ["-b", "4", "--tp", "2", "--sp", "1", "--pp", "2"]), (4, ["-b", "4", "--cp", "2", "-z", "1"]),
               (4, ["-b", "8", "--cp", "4"] + HYBRID), (8, ["-b", "4", "--cp", "4", "--pp", "2"] + HYBRID),
               # each implementation with tp + sp, and with pp
               (4, ["-b", "8", "--cp", "2", "--tp", "2", "--sp", "1"]),
               (4, ["-b", "8", "--cp", "2", "--cp-impl", "a2a", "--tp", "2", "--sp", "1"]),
               (4, ["-b", "4", "--cp", "2", "--cp-impl", "a2a", "--pp", "2"]),
               (4, ["-b", "4", "--cp", "2", "--pp", "2"]),
               (8, ["-b", "8", "--cp", "4", "--tp", "2", "--sp", "1"] + HYBRID)]
    equivalence(check, tmp, "fp64", args, one, layouts, steps=6)
    llama = base(LLAMA, DOCS) + ["--document-mask", "1", "-d", "128"]
    equivalence(check, tmp, "fp64", llama, one, [(4, ["-b", "8", "--cp", "2", "--tp", "2"]),
                                                 (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]),
                                                 (2, ["-b", "4", "--pp", "2"]),
                                                 (4, ["-b", "8", "--cp", "4"] + HYBRID)], steps=6)
    # Longer rows: several query tiles per ring block.
    equivalence(check, tmp, "fp64", base(GPT2, DOCS, T=160, steps=3) + ["--document-mask", "1", "-d", "320"],
                ["-b", "2"], [(2, ["-b", "2", "--cp", "2"])], steps=3)


def test_val(tmp):
    """Validation losses (forward only, through every stage) equal one process's
    (the same rows: validation reads B rows per micro-batch)."""
    args = base(GPT2, DOCS) + ["--document-mask", "1", "-d", "128"]
    vals = []
    for np_, extra in ((0, ["-b", "4"]), (4, ["-b", "4", "--cp", "2", "--pp", "2"])):
        d = os.path.join(tmp, f"val_{np_}")
        rc, out, err = train(np_, args + extra + ["-o", d])
        vals.append([m["val_loss"] for m in metrics(d) if "val_loss" in m] if rc == 0 else [])
    ok = len(vals[0]) == 2 and len(vals[1]) == 2 and max(abs(a - b) / a for a, b in zip(*vals)) <= 1e-10
    check(ok, f"val losses with the mask, cp 2 x pp 2 vs one process: {vals}")


def test_regions(tmp):
    runs = []
    for graphs in ("0", "1"):
        d = os.path.join(tmp, f"regions_{graphs}")
        args = base(GPT2, DOCS) + ["-b", "4", "-d", "64", "--document-mask", "1", "-o", d]
        p = subprocess.run([TRAIN] + args, cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env=dict(ENV, LLMC_CPU_GRAPH=graphs))
        runs.append(([m["loss"] for m in metrics(d)], p.stdout) if p.returncode == 0 else ([], p.stderr[-300:]))
    ok = runs[0][0] and runs[0][0] == runs[1][0] and "replays" in runs[1][1]
    check(ok, f"recorded regions with the mask: {runs[0][0]} vs {runs[1][0]} {runs[1][1][-200:]!r}")


def test_start_tokens(tmp):
    S, Z = 11, 13
    rng = np.random.default_rng(9)
    toks = []
    while len(toks) < 30000:
        body = rng.integers(0, V, int(rng.integers(0, 30)))
        body[(body == S) | (body == Z) | (body == EOT)] = S + 1
        toks += [S] + body.tolist() + [Z]
    data, marked = os.path.join(tmp, "starts.bin"), os.path.join(tmp, "starts_marked.bin")
    write_shard(data, toks[:30000])
    write_shard(marked, toks[:30000], doc_start=S, doc_end=Z)
    args = [a for a in base(GPT2, data) if a not in ("--eot-token", str(EOT))] + ["-b", "4", "-d", "64",
                                                                                 "--document-mask", "1"]
    runs = {}
    for name, extra, d_in in (("eot Z", ["--eot-token", str(Z)], data), ("bos S", ["--bos-token", str(S)], data),
                              ("both", ["--eot-token", str(Z), "--bos-token", str(S)], data),
                              ("header", [], marked), ("no mask", ["--document-mask", "0"], data)):
        d = os.path.join(tmp, "starts_" + name.replace(" ", "_"))
        a = [x if x != data else d_in for x in args]
        rc, out, err = train(0, a + extra + ["-n", "6", "-o", d])
        if check(rc == 0, f"start tokens, {name}: {err[-300:]}"):
            runs[name] = ([m["loss"] for m in metrics(d)], read_checkpoint(d, 6)[0], out)
    if len(runs) == 5:
        same = all(runs[k][0] == runs["eot Z"][0] and np.array_equal(runs[k][1], runs["eot Z"][1])
                   for k in ("bos S", "both", "header"))
        check(same, "documents opened by --bos-token S train as those ended by --eot-token Z, and as the header's: "
              + str({k: v[0][-1] for k, v in runs.items()}))
        check(runs["no mask"][0] != runs["eot Z"][0], "the mask acts on these documents")
        check(f"documents: {Z} " in runs["header"][2] and f"{S} " in runs["header"][2] and
              "(the shards' header)" in runs["header"][2], "the run names the header's document tokens")
        print(f"  start tokens: --bos-token {S} = --eot-token {Z} = the header's, bit for bit")
    # A token that never occurs: one warning line naming it.
    rc, out, err = train(0, args + ["--eot-token", str(EOT), "-x", "1", "-o", os.path.join(tmp, "starts_never")])
    warn = [l for l in err.splitlines() if "never occurs" in l]
    check(rc == 0 and len(warn) == 1 and f"--eot-token {EOT}" in warn[0], f"an --eot-token not in the data: {err!r}")


def test_errors(tmp):
    for np_ in (0, 2):
        for flag in ("--eot-token", "--bos-token"):
            rc, out, err = train(np_, base(GPT2, DOCS) + ["-b", "4", "--document-mask", "1", flag, str(V)],
                                 timeout=60)
            lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
            check(rc != 0 and len(lines) == 1 and flag in lines[0],
                  f"{flag} {V} (V={V}), np={np_}: rc={rc} {err[-300:]!r}")


def suite(tmp):
    global DOCS, PLAIN
    rng = np.random.default_rng(5)
    DOCS, PLAIN = os.path.join(tmp, "docs.bin"), os.path.join(tmp, "plain.bin")
    write_shard(DOCS, documents(rng, 30000))
    plain = rng.integers(0, V, 30000)
    plain[plain == EOT] = EOT + 1
    write_shard(PLAIN, plain)
    test_no_eot(tmp)
    test_layouts(tmp)
    test_val(tmp)
    test_regions(tmp)
    test_start_tokens(tmp)
    test_errors(tmp)


def main():
    run_suite(check, "llmc_docmask_", suite)


if __name__ == "__main__":
    main()
