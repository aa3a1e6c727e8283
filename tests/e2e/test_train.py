#!/usr/bin/python3
# tests/e2e/test_train.py: end-to-end tests of the train_gpt binary on the CPU.
#   - determinism: same seed and flags give bit-identical losses and models;
#   - resume: a run resumed from a mid-run checkpoint continues bit for bit
#     (losses after the resume and the final model equal the uninterrupted
#     run's), with gradient accumulation and sampling (RNG state) on; named
#     (--resume-from), an index with out-of-range integers is refused naming
#     the field, a shard with a flipped bit naming the shard, section and
#     tensor, NaN or negative Adam state (checksums intact) naming the
#     tensor; with -y 1 each falls back to the previous checkpoint with a
#     warning; a resume on other data or with another T warns;
#   - learning: the default model on the embedded data brings the loss well
#     below its start and prints samples; metrics.jsonl has the fields;
#     scripts/plot_metrics.py draws it;
#   - errors: bad flags and bad files end with one line naming the flag or
#     file, exit status 2 for a setup error (no crash, no hang), and no half-written files;
#   - bad steps: a NaN gradient (LLMC_TEST_NAN_STEP) skips that step's
#     update, counted in metrics.jsonl, alike on every rank (dp2 ZeRO-2 and
#     pp2 equal one process); --skip-spikes skips loss spikes; --max-skips
#     ends the run with one line;
#   - signals: SIGTERM to one rank under mpirun makes every rank finish the
#     step, write one checkpoint and exit with 128 + 15; the resume equals
#     the uninterrupted run bit for bit (also with --sync-free 1, where the
#     step queued when the signal came is reported first).
# Last line: "N passed, N failed".
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train_gpt")
SMALL = ["-e", "L=2,C=32,NH=2,V=257,T=64", "-b", "4", "-t", "32", "--device", "cpu", "-v", "0", "-s", "0"]
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL", what)


def run(args, timeout=300):
    p = subprocess.run([TRAIN] + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_determinism(tmp):
    a, b = os.path.join(tmp, "det_a"), os.path.join(tmp, "det_b")
    for d in (a, b):
        rc, out, err = run(SMALL + ["-x", "6", "-n", "6", "-o", d, "--seed", "11"])
        check(rc == 0, f"determinism run failed: {err}")
    la, lb = [m["loss"] for m in metrics(a)], [m["loss"] for m in metrics(b)]
    check(len(la) == 6 and la == lb, f"losses differ run to run: {la} vs {lb}")
    check(read(os.path.join(a, "model_00000006.bin")) == read(os.path.join(b, "model_00000006.bin")),
          "final models differ run to run")
    rc, out, err = run(SMALL + ["-x", "6", "-o", os.path.join(tmp, "det_c"), "--seed", "12"])
    check([m["loss"] for m in metrics(os.path.join(tmp, "det_c"))] != la, "a different seed gave the same losses")


def test_final_weights(tmp):
    """With -o, every run leaves its final weights in a form -e loads: GPT-2 as
    llm.c's model file, Llama (which llm.c files cannot hold) as a Hugging
    Face directory; the summary names them; reloaded, the Llama directory
    gives the loss a continued run sees (same weights, same first batch)."""
    d = os.path.join(tmp, "weights_gpt2")
    rc, out, err = run(SMALL + ["-x", "2", "-o", d])
    path = os.path.join(d, "model_00000002.bin")
    check(rc == 0 and os.path.isfile(path) and f"weights: {path}" in out, f"GPT-2 -o leaves model_00000002.bin: {err}")
    check(re.search(r"^run summary: 2 steps, 256 tokens in ", out, re.M) is not None, f"run summary line: {out[-400:]!r}")
    rc, out7, err = run(SMALL + ["-x", "7", "--log-every", "3"])
    lines = re.findall(r"^step +(\d+)/7 ", out7, re.M)
    check(rc == 0 and lines == ["1", "3", "6", "7"], f"--log-every 3 prints steps 1, 3, 6, 7: {lines}")
    # The settings table lists the flags that apply to training, not the planner's.
    table = [l for l in out.splitlines() if l.startswith("| ")]
    check(any(l.startswith("| max-steps ") for l in table) and not any(l.startswith("| plan-top ") for l in table)
          and not any(l.startswith("| calibrate ") for l in table) and not any(l.startswith("| top-p ") for l in table),
          f"settings table: {table}")
    # Each step line carries the progress: tokens seen, elapsed, ETA, memory.
    check(re.search(r"^step +2/2 \|.*\| 256 tok \| \d+:\d\d:\d\d, ETA 0:00:00 \| mem [\d.]+ MiB", out, re.M) is not None,
          f"progress on the step line: {out[-600:]!r}")
    # --overfit 1: every step trains on the first batch, and -q 1 keeps the lr
    # schedule the same for 3 and 4 steps, so the reloaded weights' first loss
    # is the 4-step run's last one (the export is fp32).
    llama = ["-e", "arch=llama,L=2,C=32,NH=4,NKV=2,F=48,V=257,T=64", "-b", "4", "-t", "32", "--device", "cpu",
             "-v", "0", "-s", "0", "--dtype", "fp64", "--overfit", "1", "-q", "1"]
    d = os.path.join(tmp, "weights_llama")
    rc, out, err = run(llama + ["-x", "3", "-o", d])
    hf = os.path.join(d, "hf_00000003")
    check(rc == 0 and os.path.isfile(os.path.join(hf, "config.json")) and f"weights: {hf}" in out,
          f"Llama -o leaves an HF directory: {err} {os.listdir(d) if os.path.isdir(d) else ''}")
    d4 = os.path.join(tmp, "weights_llama4")
    rc4, _, err4 = run(llama + ["-x", "4", "-o", d4])
    e = os.path.join(tmp, "weights_llama_e")
    rc, out, err = run(["-e", hf] + llama[2:] + ["-x", "1", "-o", e])
    want = metrics(d4)[3]["loss"] if rc4 == 0 else None
    got = metrics(e)[0]["loss"] if rc == 0 else None
    check(got is not None and want is not None and abs(got - want) <= 1e-5 * abs(want),
          f"reloaded Llama weights: loss {got} vs {want} ({err4[-200:]} {err[-200:]})")


def test_convert(tmp):
    """--convert exports a checkpoint without training: the latest one of a
    run's directory gives the run's own final model file byte for byte, a
    named ckpt_SSSSSSSS gives that step's weights; the run's directory is
    left as it was. A run without checkpoints converts from its final
    model file, and so does a model file named directly, or -e FILE -x 0:
    each gives the file back byte for byte."""
    d = os.path.join(tmp, "conv_run")
    rc, out, err = run(SMALL + ["-x", "4", "-n", "2", "-o", d])
    check(rc == 0, f"convert: the run to convert: {err}")
    if rc != 0:
        return
    before = sorted(os.listdir(d))
    x, y = os.path.join(tmp, "conv_latest.bin"), os.path.join(tmp, "conv_step2.bin")
    rc1, out1, err1 = run(["--convert", d, "--export-model", x])
    rc2, out2, err2 = run(["--convert", os.path.join(d, "ckpt_00000002"), "--export-model", y])
    check(rc1 == 0 and read(x) == read(os.path.join(d, "model_00000004.bin")) and not re.search(r"^step\s", out1, re.M),
          f"--convert DIR: the latest checkpoint's weights, nothing trained: {err1}")
    check(rc2 == 0 and os.path.isfile(y) and read(y) != read(x), f"--convert DIR/ckpt_00000002: that step: {err2}")
    check(sorted(os.listdir(d)) == before, f"--convert leaves the run's directory as it was: {before} -> {os.listdir(d)}")
    for extra, needle in ((["--convert", d], "--export-hf"),
                          (["--convert", tmp, "--export-model", x], "no complete checkpoint and no model_SSSSSSSS.bin"),
                          (["--convert", d, "--export-model", x, "-o", d], "-o"),
                          (["--convert", os.path.join(tmp, "nothing"), "--export-model", x], "no such file or directory"),
                          (SMALL + ["-x", "0"], "-x 0 with --export-hf or --export-model"),
                          (SMALL + ["-x", "0", "--export-model", x, "-o", d], "flag -x 0: -o")):
        rc, out, err = run(extra)
        check(rc == 2 and needle in err and err.count("\n") == 1, f"{extra}: {err!r}")
    # No checkpoint: the run's final model file; a model file; -x 0.
    e = os.path.join(tmp, "conv_nockpt")
    rc, out, err = run(SMALL + ["-x", "3", "-o", e])
    final = os.path.join(e, "model_00000003.bin")
    check(rc == 0 and os.path.isfile(final), f"convert: the run without -n: {err}")
    if rc != 0:
        return
    for i, extra in enumerate((["--convert", e], ["--convert", final], ["-e", final, "-x", "0"])):
        z = os.path.join(tmp, f"conv_file{i}.bin")
        rc, out, err = run(extra + ["--export-model", z])
        check(rc == 0 and os.path.isfile(z) and read(z) == read(final) and
              f"convert: the weights of {final}, nothing trained" in out and not re.search(r"^step\s", out, re.M),
              f"{extra}: the model file back byte for byte: {err[-300:]}")


def test_config(tmp):
    """--config FILE.json sets flags, the command line overrides it, and the
    run's run_config.json (its full resolved flags) reproduces the run."""
    import json
    cfg = os.path.join(tmp, "flags.json")
    with open(cfg, "w") as f:
        json.dump({"max-steps": 5, "lr": 3e-3, "seed": 7, "--warmup": 2}, f)
    d1, d2, d3 = (os.path.join(tmp, n) for n in ("cfg_a", "cfg_b", "cfg_c"))
    rc1, _, e1 = run(SMALL + ["--config", cfg, "-x", "3", "-o", d1])
    rc2, _, e2 = run(SMALL + ["-x", "3", "-l", "3e-3", "--seed", "7", "-u", "2", "-o", d2])
    check(rc1 == 0 and rc2 == 0 and [m["loss"] for m in metrics(d1)] == [m["loss"] for m in metrics(d2)]
          and len(metrics(d1)) == 3, f"--config sets flags, -x on the command line overrides it: {e1} {e2}")
    if rc1 != 0:
        return
    with open(os.path.join(d1, "run_config.json")) as f:
        record = json.load(f)
    saved, given = record.get("resolved", {}), record.get("given", {})
    check(saved.get("max-steps") == 3 and "generate" not in saved and "plan" not in saved and "config" not in saved,
          f"run_config.json holds the training flags only: {sorted(saved)}")
    # What the user gave, as given (-x from the command line over the file's
    # 5; the file's own flags; -t 32), and nothing resolved (-d: no).
    check(given.get("max-steps") == 3 and given.get("lr") == 3e-3 and given.get("warmup") == 2 and
          given.get("seq-len") == 32 and "total-batch" not in given and saved.get("total-batch") == 128,
          f"run_config.json: given {given}, resolved total-batch {saved.get('total-batch')}")
    rc3, out3, e3 = run(["--config", os.path.join(d1, "run_config.json"), "-o", d3])
    check(rc3 == 0 and rc1 == 0 and [m["loss"] for m in metrics(d3)] == [m["loss"] for m in metrics(d1)],
          f"run_config.json reproduces the run: rc {rc3} {e3} {out3[-300:]}")
    # In another world: two ranks resolve the total batch again (2 x 4 x 32);
    # the run's resolved record held 128, a -d the user never typed.
    d4 = os.path.join(tmp, "cfg_d")
    p = subprocess.run(["mpirun", "-np", "2", TRAIN, "--config", os.path.join(d1, "run_config.json"), "-o", d4],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                                OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1"))
    rec4 = json.load(open(os.path.join(d4, "run_config.json"))) if p.returncode == 0 else {}
    check(p.returncode == 0 and len(metrics(d4)) == 3 and rec4["resolved"]["total-batch"] == 256 and
          dict(rec4["given"], **{"output-dir": d1}) == given,
          f"run_config.json repeats the run on 2 ranks: rc {p.returncode} {p.stderr[-300:]}")
    # A flat object of flags (a hand-written file, an older run_config.json) is read whole.
    flat = os.path.join(tmp, "flat.json")
    with open(flat, "w") as f:
        json.dump(saved, f)
    rc5, _, e5 = run(["--config", flat, "-o", os.path.join(tmp, "cfg_e")])
    check(rc5 == 0 and [m["loss"] for m in metrics(os.path.join(tmp, "cfg_e"))] == [m["loss"] for m in metrics(d1)],
          f"a flat config of the resolved flags reproduces the run: {e5}")
    bad = os.path.join(tmp, "bad_flags.json")
    with open(bad, "w") as f:
        json.dump({"lrr": 1}, f)
    rc, out, err = run(SMALL + ["--config", bad])
    check(rc == 2 and "lrr" in err and "did you mean lr" in err and err.count("\n") == 1, f"unknown flag in a config: {err!r}")
    with open(bad, "w") as f:
        json.dump({"learning_rate": 1e-3}, f)  # another trainer's name for -l
    rc, out, err = run(SMALL + ["--config", bad])
    check(rc == 2 and "did you mean lr?" in err and err.count("\n") == 1, f"another trainer's name in a config: {err!r}")
    with open(bad, "w") as f:
        f.write('{"lr": 3e-4,\n "max-steps": }\n')  # the error is the '}' at line 2, column 15
    rc, out, err = run(SMALL + ["--config", bad])
    check(rc == 2 and "not valid JSON at line 2, column 15" in err and err.count("\n") == 1,
          f"a JSON syntax error names its line and column: {err!r}")


def test_resume(tmp, dtype):
    full, part = os.path.join(tmp, f"full_{dtype}"), os.path.join(tmp, f"part_{dtype}")
    args = SMALL + ["--dtype", dtype, "-x", "10", "-n", "4", "-d", "256", "-s", "3", "-g", "8", "-v", "5",
                    "-j", "data/tiny/tiny_val_*.bin", "-m", "2", "-u", "2", "-q", "0.1", "-c", "0.1"]
    rc, out_full, err = run(args + ["-o", full])
    check(rc == 0, f"uninterrupted run failed: {err}")
    # Interrupted run: same flags, stopped after the step-4 checkpoint.
    os.makedirs(part)
    shutil.copytree(os.path.join(full, "ckpt_00000004"), os.path.join(part, "ckpt_00000004"))
    shutil.copy(os.path.join(full, "DONE_00000004"), part)
    with open(os.path.join(full, "metrics.jsonl")) as f, open(os.path.join(part, "metrics.jsonl"), "w") as g:
        lines = f.readlines()
        g.writelines(lines[:4] + lines[6:7])  # a stale line past the checkpoint must be dropped
    rc, out_part, err = run(args + ["-o", part, "-y", "1"])
    check(rc == 0, f"resumed run failed: {err}")
    mf, mp = metrics(full), metrics(part)
    check([m["step"] for m in mp] == list(range(1, 11)), f"resumed metrics steps {[m['step'] for m in mp]}")
    for key in ("loss", "lr", "grad_norm"):
        check([m[key] for m in mf] == [m[key] for m in mp], f"{dtype}: {key} differs after resume")
    check([m.get("val_loss") for m in mf] == [m.get("val_loss") for m in mp], f"{dtype}: val loss differs after resume")
    check(read(os.path.join(full, "model_00000010.bin")) == read(os.path.join(part, "model_00000010.bin")),
          f"{dtype}: final model differs after resume")
    check(read(os.path.join(full, "ckpt_00000010", "shard_00000.bin")) ==
          read(os.path.join(part, "ckpt_00000010", "shard_00000.bin")),
          f"{dtype}: final optimizer state differs after resume")
    def samples(out):
        return [s.split("----------------")[0] for s in out.split("---- sample ----")[1:]]
    sf, sp = samples(out_full), samples(out_part)
    check(len(sf) == 4 and len(sp) == 3 and sf[-3:] == sp, f"{dtype}: samples differ after resume (RNG state)")
    if dtype != "fp32":
        return
    # A resume on other data, or with another T, says so (the data position
    # is kept in rows of T tokens).
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    from testlib import write_shard
    import numpy as np
    other = os.path.join(tmp, "other_data.bin")
    write_shard(other, np.random.default_rng(3).integers(0, 257, 20000))
    for extra, want in ((["-i", other], "-i " + other + ", other data"), (["-t", "16"], "-t 16 where the")):
        d = os.path.join(tmp, "resume_" + extra[0].strip("-"))
        shutil.copytree(part, d)
        rc, out, err = run(args + ["-o", d, "-y", "1", "-x", "12"] + extra)
        check(rc == 0 and any(l.startswith("train_gpt: warning: resuming with " + want) for l in err.splitlines()),
              f"resume with {extra}: rc={rc} {err[-300:]!r}")
    # A flipped bit anywhere in a shard's payload (weights, then Adam m and
    # v): refused, naming the shard, the section and the tensor.
    for where, section in ((0.05, "weights"), (0.5, "Adam m"), (0.9, "Adam v")):
        flip = os.path.join(tmp, f"flip_{section.replace(' ', '_')}")
        shutil.copytree(part, flip)
        shard = os.path.join(flip, "ckpt_00000010", "shard_00000.bin")
        data = bytearray(read(shard))
        data[1024 + int(where * (len(data) - 1024 - 4096))] ^= 0x04
        with open(shard, "wb") as f:
            f.write(bytes(data))
        rc, out, err = run(args + ["-o", flip, "--resume-from", "10", "-x", "12"])
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        check(rc != 0 and len(lines) == 1 and "shard_00000.bin" in lines[0] and "checksum mismatch" in lines[0]
              and f"the {section} of tensor" in lines[0], f"a bit flipped in the {section}: rc={rc} {err[-300:]!r}")
        falls_back(f"a bit flipped in the {section}", flip, args)
    # NaN in Adam's m, or a negative v, with the checksums made to match (a
    # shard that is intact but holds bad state): refused naming the tensor.
    from testlib import _fnv1a64
    for section, value in ((1, float("nan")), (2, -1.0)):
        bad = os.path.join(tmp, f"bad_adam_{section}")
        shutil.copytree(part, bad)
        shard = os.path.join(bad, "ckpt_00000010", "shard_00000.bin")
        data = bytearray(read(shard))
        h = struct.unpack("<256i", bytes(data[:1024]))
        nw, no = h[6] | (h[7] << 32), h[8] | (h[9] << 32)
        tables = [np.frombuffer(bytes(data[1024 + 32 * o:1024 + 32 * (o + n)]), dtype="<u8").reshape(n, 4)
                  for o, n in ((0, nw), (nw, no))]
        es = {0: 4, 1: 8, 2: 2}
        lens = [[int(q[1]) * int(q[3]) * es[h[4] if k == 0 else h[5]] for q in tables[min(k, 1)]] for k in range(3)]
        starts = [1024 + 32 * (nw + no)]
        for k in range(2):
            starts.append(starts[-1] + sum(lens[k]))
        at = starts[section]
        data[at:at + 4] = struct.pack("<f", value)  # the first element of m (1) or v (2), fp32 Adam state
        sums, pos = [], starts[0]
        for k in range(3):
            for n in lens[k]:
                sums.append(_fnv1a64(bytes(data[pos:pos + n])))
                pos += n
        data[pos + 16:] = struct.pack(f"<{len(sums)}Q", *sums)
        with open(shard, "wb") as f:
            f.write(bytes(data))
        rc, out, err = run(args + ["-o", bad, "--resume-from", "10", "-x", "12"])
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        check(rc != 0 and len(lines) == 1 and "Adam state" in lines[0] and "tensor" in lines[0],
              f"bad Adam state in section {section}: rc={rc} {err[-300:]!r}")
        falls_back(f"bad Adam state in section {section}", bad, args)
    # An index whose integers are out of range (a negative data position once
    # wrapped to 2^64-1): refused, naming the checkpoint and the field.
    for field, value in (("rows_consumed", -1), ("step", -4), ("zero", 7)):
        bad = os.path.join(tmp, f"bad_index_{field}")
        shutil.copytree(part, bad)
        ix = os.path.join(bad, "ckpt_00000010", "index.json")
        with open(ix) as f:
            j = json.load(f)
        (j["run"] if field in j["run"] else j)[field] = value
        with open(ix, "w") as f:
            json.dump(j, f)
        rc, out, err = run(args + ["-o", bad, "--resume-from", "10", "-x", "12"])
        lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
        check(rc != 0 and len(lines) == 1 and "index.json" in lines[0] and f"'{field}'" in lines[0],
              f"index with {field} = {value}: rc={rc} {err[-300:]!r}")
        falls_back(f"index with {field} = {value}", bad, args)


def falls_back(what, d, args):
    """-y 1 on a run whose newest checkpoint (10) is damaged: a warning naming it, the resume from 8."""
    rc, out, err = run(args + ["-o", d, "-y", "1", "-x", "12"])
    line = next((l for l in err.splitlines() if l.startswith("train_gpt: warning: -y 1:")), "")
    check(rc == 0 and "ckpt_00000010 fails" in line and "resuming from" in line and "ckpt_00000008" in line,
          f"{what}: -y 1 does not fall back to step 8: rc={rc} {line!r} {err[-200:]!r}")


def test_learning(tmp):
    d = os.path.join(tmp, "learn")
    rc, out, err = run(["-x", "80", "-v", "40", "-s", "80", "-o", d])
    check(rc == 0, f"default run failed: {err}")
    m = metrics(d)
    first, last = m[0]["loss"], sum(x["loss"] for x in m[-5:]) / 5
    print(f"default model: loss {first:.3f} -> {last:.3f} in {len(m)} steps, val {m[-1].get('val_loss')}")
    check(first > 5.0 and last < first - 2.0, f"loss did not fall well: {first} -> {last}")
    check(all(k in m[0] for k in ("step", "loss", "lr", "grad_norm", "tokens", "ms")), f"metrics fields {m[0]}")
    check("val_loss" in m[39] and "val_loss" in m[-1], "val_loss missing")
    # One step numbering: the console's step lines, metrics.jsonl and the
    # summary's best validation step all count from 1.
    console = [int(x) for x in re.findall(r"^step +(\d+)/80 ", out, re.M)]
    check(console == [x["step"] for x in m] == list(range(1, 81)), f"steps: console {console[:3]}, "
          f"metrics {[x['step'] for x in m][:3]}")
    val_at, step_now = {}, None
    for line in out.splitlines():
        if (g := re.match(r"step +(\d+)/", line)):
            step_now = int(g.group(1))
        elif (g := re.match(r"val loss ([0-9.]+)", line)):
            val_at[step_now] = float(g.group(1))
    best = re.search(r"best val loss ([0-9.]+) at step (\d+)", out)
    want = min(val_at, key=val_at.get) if val_at else None
    check(best and int(best.group(2)) == want and set(val_at) == {x["step"] for x in m if "val_loss" in x},
          f"best val step: summary {best and best.groups()}, console {val_at}")
    check("---- sample ----" in out, "no sample printed")
    check("parameters" in out and "| lr" in out, "no startup table")
    for extra in ([], ["--x", "tokens", "--zoom", "20"]):
        png = os.path.join(d, "loss.png")
        p = subprocess.run(["/usr/bin/python3", "scripts/plot_metrics.py", os.path.join(d, "metrics.jsonl"), "-o", png]
                           + extra, cwd=ROOT, capture_output=True, text=True)
        check(p.returncode == 0 and os.path.getsize(png) > 1000 and read(png)[:4] == b"\x89PNG",
              f"plot {extra} failed: {p.stderr}")


def write_shard(path, tokens, magic=20240520, version=1, count=None, dtype="H"):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *h))
        f.write(struct.pack(f"<{len(tokens)}{dtype}", *tokens))


def test_errors(tmp):
    good = os.path.join(tmp, "good.bin")
    write_shard(good, [i % 250 for i in range(5000)])
    bad_id = os.path.join(tmp, "bad_id.bin")
    write_shard(bad_id, [7] * 100 + [300] + [7] * 900)
    bad_magic = os.path.join(tmp, "bad_magic.bin")
    write_shard(bad_magic, [1] * 100, magic=1234)
    trunc = os.path.join(tmp, "trunc.bin")
    write_shard(trunc, [1] * 100, count=500)
    model_bad = os.path.join(tmp, "model_bad.bin")
    with open(model_bad, "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, 64, 257, 2, 2, 32, 384] + [0] * 248)))  # no payload
    out_dir = os.path.join(tmp, "err_out")
    # A checkpoint of the earlier one-file format is refused by name.
    old_ckpt = os.path.join(tmp, "old_ckpt")
    os.makedirs(old_ckpt, exist_ok=True)
    for name in ("DONE_00000002", "state_00000002.bin"):
        with open(os.path.join(old_ckpt, name), "wb") as f:
            f.write(struct.pack("<256i", *([20241122, 1, 2] + [0] * 253)))
    base = SMALL + ["-i", good, "-j", "", "-x", "2"]
    cases = [
        (["--bogus"], "--bogus"),
        (["-b", "abc"], "-b"),
        (["-t", "128"], "-t"),               # T > maxT = 64
        (["-d", "100"], "-d"),               # not a multiple of B*T
        (["-e", "L=2,C=30,NH=4,V=257,T=64"], "-e"),
        (["-e", os.path.join(tmp, "missing.bin")], "missing.bin"),
        (["-e", model_bad], "model_bad.bin"),
        (["-i", os.path.join(tmp, "nothing_*.bin")], "nothing_"),
        (["-i", bad_magic], "bad_magic.bin"),
        (["-i", trunc], "trunc.bin"),
        (["-i", bad_id, "-o", out_dir, "-n", "1"], "bad_id.bin"),
        (["-y", "1"], "-y"),
        (["-o", old_ckpt, "-y", "1"], "state_00000002.bin"),
        (["-e", "L=100000000,C=32,NH=2,V=257,T=64"], "L=100000000"),  # refused before the tensor table
        (["-z", "4"], "-z"),
        (["--comm", "nccl"], "--comm"),      # nccl needs the CUDA backend
        (["--dtype", "fp16"], "--dtype"),
        (["--device", "gpu"], "gpu"),
    ]
    for extra, name in cases:
        rc, out, err = run(base + extra, timeout=60)
        lines = [l for l in err.splitlines() if l.strip()]
        check(rc == 2 and len(lines) == 1 and name in lines[0] and lines[0].startswith("train_gpt: error:"),
              f"{extra}: rc={rc}, stderr={err!r}")
    rc, out, err = run(base + ["-i", bad_id], timeout=60)
    check("offset 100" in err, f"bad token id message lacks the offset: {err!r}")
    # Messages that point at the fix: the nearest flag, the missing path, mpirun
    # for a parallel layout in one process, and the -d a pipeline needs.
    hints = [
        (["--lrr", "1e-3"], "did you mean --lr?"),
        (["--max-step", "3"], "did you mean --max-steps?"),
        (["--learning-rate", "1e-3"], "did you mean --lr?"),
        (["--max_iters", "3"], "did you mean --max-steps?"),
        (["--zzzzzz", "3"], "unknown flag '--zzzzzz' (see --help)"),
        (["-e", os.path.join(tmp, "no_such_dir")], "no such file or directory"),
        (["--tp", "2"], "mpirun -np 2"),
        (["--pp", "2", "--cp", "2"], "mpirun -np 4"),
    ]
    for extra, needle in hints:
        rc, out, err = run(base + extra, timeout=60)
        check(rc == 2 and needle in err and err.count("\n") == 1, f"{extra}: wanted {needle!r}: rc={rc} {err!r}")
    rc, out, err = run(["--help"])
    check("examples:" in out and "mpirun -np" in out and "Llama" in out and "GPT-2" in out,
          "--help ends with examples and names GPT-2 and Llama")
    # An id far past what the run reaches (and away from the first and last
    # 256 tokens that the ranks' data fingerprint reads) still stops it
    # before the first step: the shards are read up front.
    bad_late = os.path.join(tmp, "bad_late.bin")
    write_shard(bad_late, [i % 250 for i in range(2950)] + [257] + [7] * 2049)
    rc, out, err = run(base + ["-i", bad_late, "-x", "1"], timeout=60)
    check(rc == 2 and "bad_late.bin" in err and "offset 2950" in err and not re.search(r"^step\s+\d", out, re.M),
          f"a late bad id is refused at start: rc={rc}, stderr={err!r}")
    leftovers = glob.glob(os.path.join(out_dir, "*"))
    check(not any(".tmp." in p or "DONE" in p for p in leftovers), f"half-written files: {leftovers}")
    rc, out, err = run(["--help"])
    check(rc == 0 and "--max-steps" in out and "-x," in out and "[-1]" in out, "--help")
    # The README's flag table is the --help text, line for line.
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = [l.strip() for l in f]
    opts = [l.strip() for l in out.splitlines() if l.strip().startswith("-")]
    missing = [l for l in opts if l not in readme]
    check(opts and not missing, f"README flags differ from --help: {missing}")


def test_bad_steps(tmp):
    """A bad step's update is skipped on every rank and counted; --max-skips ends the run."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    from testlib import write_shard
    import numpy as np
    args = SMALL + ["--dtype", "fp64", "-x", "6", "-d", "256"]
    clean, bad = os.path.join(tmp, "clean"), os.path.join(tmp, "nan")
    run(args + ["-o", clean])
    env = dict(os.environ, LLMC_TEST_NAN_STEP="3")
    p = subprocess.run([TRAIN] + args + ["-o", bad], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    mc, mb = metrics(clean), metrics(bad)
    check(p.returncode == 0 and len(mb) == 6, f"a NaN gradient at step 3: rc={p.returncode} {p.stderr[-300:]!r}")
    if len(mb) == 6:
        check(mb[3].get("skipped") is True and mb[3].get("skips") == 1 and mb[3]["grad_norm"] is None,
              f"step 3 marked skipped and counted: {mb[3]}")
        check([m["loss"] for m in mb[:4]] == [m["loss"] for m in mc[:4]], "losses up to the bad step unchanged")
        # Had the NaN gradient reached the weights, every later loss would be NaN.
        check(all(m["loss"] is not None and m["skipped"] is False for m in mb[4:]),
              f"training goes on from the weights before the bad step: {[m['loss'] for m in mb[4:]]}")
    # Every rank skips alike: dp2 ZeRO-2 and pp2 with the same bad step give one process's losses.
    for extra in (["-z", "2"], ["--pp", "2", "-e", "L=4,C=32,NH=2,V=257,T=64"]):
        one = os.path.join(tmp, "nan_one" + extra[0])
        two = os.path.join(tmp, "nan_two" + extra[0])
        a = args + extra[2:]
        subprocess.run([TRAIN] + a + ["-o", one], cwd=ROOT, capture_output=True, timeout=300, env=env)
        penv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
        q = subprocess.run(["mpirun", "-np", "2", TRAIN] + a + extra[:2] + ["-o", two], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=penv)
        if not check(q.returncode == 0, f"{extra[:2]} with a bad step: {q.stderr[-300:]!r}"):
            continue
        l1, l2 = [m["loss"] for m in metrics(one)], [m["loss"] for m in metrics(two)]
        check(metrics(two)[3].get("skipped") is True and max(abs(x - y) / abs(x) for x, y in zip(l1, l2)) < 1e-12,
              f"{extra[:2]}: the bad step skipped on every rank, losses as one process: {l1} vs {l2}")
    p = subprocess.run([TRAIN] + args + ["--max-skips", "0", "-o", os.path.join(tmp, "nan_stop")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    lines = [l for l in p.stderr.splitlines() if l.startswith("train_gpt")]
    check(p.returncode != 0 and len(lines) == 1 and "--max-skips 0" in lines[0], f"--max-skips 0: {p.stderr[-300:]!r}")
    # Spikes: a shard whose first 3200 tokens repeat 0..7 and whose rest is
    # random; once the model has learnt the pattern, the random rows' loss is
    # a spike: skipped from there on with --skip-spikes 3, never without.
    data = os.path.join(tmp, "spike.bin")
    rng = np.random.default_rng(5)
    write_shard(data, np.concatenate([np.tile(np.arange(8), 400), rng.integers(0, 97, 2000)]))
    sargs = ["-e", "L=2,C=32,NH=2,V=97,T=16", "-t", "16", "-b", "4", "-i", data, "-j", "", "-x", "54", "-s", "0",
             "-v", "0", "-l", "1e-2", "-u", "2", "--dtype", "fp64"]
    for flags, want in (([], []), (["--skip-spikes", "3", "--max-skips", "100"], [51, 52, 53, 54])):
        d = os.path.join(tmp, "spikes" + str(len(flags)))
        rc, out, err = run(sargs + flags + ["-o", d])
        got = [m["step"] for m in metrics(d) if m.get("skipped")] if rc == 0 else None
        check(got == want, f"--skip-spikes {flags}: skipped steps {got}, want {want} (rc={rc} {err[-200:]!r})")
    rc, out, err = run(sargs + ["--skip-spikes", "3", "--max-skips", "2", "-o", os.path.join(tmp, "spikes_stop")])
    lines = [l for l in err.splitlines() if l.startswith("train_gpt")]
    check(rc != 0 and len(lines) == 1 and "--max-skips 2" in lines[0] and "by step 53" in lines[0],
          f"--max-skips 2 with spikes: {err[-300:]!r}")


def test_signal(tmp, extra=()):
    """SIGTERM to one rank under mpirun: every rank ends the step, one checkpoint, 128+15; the resume is bit for bit.
    extra: more flags (--sync-free 1: the step queued before the signal is reported first)."""
    import time
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    args = SMALL + ["--dtype", "fp64", "-x", "80", "-d", "256", "-z", "1", "-s", "0"] + list(extra)
    tag = "".join(extra).replace("-", "")
    full, part = os.path.join(tmp, "sig_full" + tag), os.path.join(tmp, "sig_part" + tag)
    mpi = ["mpirun", "-np", "2", TRAIN]
    subprocess.run(mpi + args + ["-o", full], cwd=ROOT, capture_output=True, timeout=300, env=env)
    p = subprocess.Popen(mpi + args + ["-o", part], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            with open(os.path.join(part, "metrics.jsonl")) as f:
                if len(f.readlines()) >= 3:
                    break
        except OSError:
            pass
        time.sleep(0.02)
    # The ranks are mpirun's children; signal the last one only.
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    if kids:
        os.kill(int(kids[-1]), 15)
    out, err = p.communicate(timeout=120)
    done = sorted(f for f in os.listdir(part) if f.startswith("DONE_"))
    check(kids and p.returncode != 0 and "stopped by signal 15 after step" in out and len(done) == 1,
          f"SIGTERM to rank 1: rc={p.returncode} {done} {out[-300:]!r} {err[-300:]!r}")
    q = subprocess.run(mpi + args + ["-o", part, "-y", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=env)
    check(q.returncode == 0, f"resume after the signal: {q.stderr[-300:]!r}")
    if q.returncode == 0:
        check([m["loss"] for m in metrics(full)] == [m["loss"] for m in metrics(part)],
              f"losses after the signal and resume equal the uninterrupted run's (stopped at {done}) {extra}")
        check(read(os.path.join(full, "model_00000080.bin")) == read(os.path.join(part, "model_00000080.bin")),
              "final model after the signal and resume equals the uninterrupted run's")


def main():
    if not os.path.exists(TRAIN):
        print("train_gpt is not built (run make)")
        print("0 passed, 1 failed")
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="llmc_train_")
    try:
        test_errors(tmp)
        test_determinism(tmp)
        test_final_weights(tmp)
        test_convert(tmp)
        test_config(tmp)
        test_resume(tmp, "fp32")
        test_resume(tmp, "fp64")
        test_learning(tmp)
        test_bad_steps(tmp)
        test_signal(tmp)
        test_signal(tmp, ["--sync-free", "1"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
