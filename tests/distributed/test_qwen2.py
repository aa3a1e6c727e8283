#!/usr/bin/python3
# tests/distributed/test_qwen2.py: Qwen2 models (Llama with biases on the Q, K
# and V projections: qkvb, split by whole heads under tp as qkvw's rows)
# under every parallel layout on the CPU under mpirun, against one process.
# (One process against Hugging Face transformers' Qwen2ForCausalLM is
# test_gpt on the states that tests/reference/reference_hf.py writes.)
#   - parameters: the count the trainer prints, whole and per tensor-parallel
#     rank, against the formula (Llama's and the biases: Q, K, V rows);
#   - equivalence (GQA 2:1 untied with Qwen's rotary base, and tied): dp
#     with ZeRO 0-3, tp (the K/V heads and their biases split over the tp
#     ranks), tp + sp, cp (ring and all-to-all), pp (1F1B and interleaved;
#     the untied head on the last stage, or the tied wte copied there),
#     recompute modes, and mixes (tp x pp, tp x cp, cp x ZeRO): 10 steps of
#     losses and the final weights, biases included, equal one process
#     (fp64 <= 1e-10; one fp32 pair <= 1e-5). The biases start at zero and
#     move from the first step on, so nine of the ten steps run with
#     nonzero ones;
#   - checkpoints: saved at pp=2, resumed at tp=2 with sp and in one process
#     with the uninterrupted run's losses (the index says arch qwen2);
#   - errors: tp not dividing the key/value heads; --export-model (llm.c
#     files hold GPT-2 only): one line naming the flag, every rank exits.
# Last line: "N passed, N failed".
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import Checks, equivalence, llama_param_count, refusals, resume_check, run_suite, train, write_shard

L, C, NH, NKV, F, V = 4, 64, 4, 2, 96, 97
UNTIED = f"arch=qwen2,L={L},C={C},NH={NH},NKV={NKV},F={F},V={V},T=64,theta=1000000,tied=0"
TIED = f"arch=qwen2,L={L},C={C},NH={NH},NKV={NKV},F={F},V={V},T=64,tied=1"
check = Checks()
DATA = None


def base(dtype, model, steps=10):
    return ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", str(steps), "-s", "0", "-v", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def qwen2_params(tp, tied):
    """Parameters of one tensor-parallel rank (tp = 1: the whole model)."""
    hs = C // NH
    qkv = (NH + 2 * NKV) * hs // tp  # rows of QKV on the rank: its weights' and its biases'
    block = C + C * qkv + qkv + (NH * hs // tp) * C + C + 3 * C * F // tp
    vocab = -(-V // tp) * C  # vocabulary rows split over tp, rounded up
    return vocab * (1 if tied else 2) + L * block + C


PARAMS = re.compile(r"(\d+) parameters \((\d+) on this rank")


def test_params(tmp):
    for model, tied in ((UNTIED, False), (TIED, True)):
        for np_, extra, tp in ((0, [], 1), (2, ["--tp", "2"], 2)):
            rc, out, err = train(np_, base("fp32", model, 1) + ["-b", "2"] + extra)
            m = PARAMS.search(out)
            what = f"{'tied' if tied else 'untied'} tp={tp}"
            if not check(rc == 0 and m, f"params {what}: {err[-300:]}"):
                continue
            whole, here = int(m.group(1)), int(m.group(2))
            print(f"  params {what}: {whole} whole (formula {qwen2_params(1, tied)}), {here} on rank 0 "
                  f"(formula {qwen2_params(tp, tied)})")
            check(whole == qwen2_params(1, tied) == llama_param_count(L, C, NH, NKV, F, V, tied, True),
                  f"params {what}: whole {whole}")
            check(here == qwen2_params(tp, tied), f"params {what}: rank 0 {here}")
            check("model qwen2 " in out, f"params {what}: the run names the model qwen2")


def test_equivalence(tmp, dtype, model, layouts):
    # 128 tokens per step: 8 rows in one process.
    equivalence(check, tmp, dtype, base(dtype, model) + ["-d", "128"], ["-b", "8"], layouts)


def test_checkpoints(tmp):
    resume_check(check, tmp, base("fp64", UNTIED) + ["-d", "128"], ["-b", "8"], (2, ["-b", "2", "--pp", "2"]),
                 ((0, ["-b", "8"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"])))
    index = os.path.join(tmp, "ck_saved", "ckpt_00000005", "index.json")
    try:
        with open(index) as f:
            m = json.load(f)["model"]
    except (OSError, ValueError, KeyError) as e:
        m = {"error": str(e)}
    check(m.get("arch") == "qwen2" and m.get("NKV") == NKV and m.get("theta") == 1e6,
          f"the checkpoint index records arch qwen2: {m}")


def test_errors(tmp):
    cases = ((4, UNTIED, ["--tp", "4"], "--tp"),  # NKV=2 key/value heads over 4 ranks
             (1, UNTIED.replace("NKV=2", "NKV=3"), [], "-e"),
             (1, UNTIED, ["--export-model", os.path.join(tmp, "m.bin")], "--export-model"))
    refusals(check, cases, lambda model: base("fp32", model, 2) + ["-b", "4", "-d", "64"])


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(5).integers(0, V, 40000))
    test_params(tmp)
    layouts = [(2, ["-b", "4"]), (2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "-z", "2"]),
               (2, ["-b", "4", "-z", "3"]),
               (2, ["-b", "8", "--tp", "2"]), (2, ["-b", "8", "--tp", "2", "--sp", "1", "-r", "selective"]),
               (2, ["-b", "8", "--cp", "2"]), (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a", "-r", "full"]),
               (2, ["-b", "2", "--pp", "2"]),
               (2, ["-b", "2", "--pp", "2", "--vpp", "2", "-r", "full"]),
               (4, ["-b", "2", "--pp", "2", "--tp", "2", "--sp", "1"]),
               (4, ["-b", "8", "--tp", "2", "--cp", "2"]),
               (4, ["-b", "4", "--cp", "2", "-z", "2"])]
    test_equivalence(tmp, "fp64", UNTIED, layouts)
    test_equivalence(tmp, "fp64", TIED, [(2, ["-b", "2", "--pp", "2"]), (2, ["-b", "8", "--tp", "2", "-r", "gelu"]),
                                         (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]),
                                         (4, ["-b", "2", "--pp", "2", "-z", "3"])])
    test_equivalence(tmp, "fp32", UNTIED, [(2, ["-b", "8", "--tp", "2", "--sp", "1"])])
    test_checkpoints(tmp)
    test_errors(tmp)


def main():
    run_suite(check, "llmc_qwen2_", suite)


if __name__ == "__main__":
    main()
