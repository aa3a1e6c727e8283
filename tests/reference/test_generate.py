#!/usr/bin/env python3
# tests/reference/test_generate.py: train_gpt --generate against transformers'
# generate (run with build/hfenv/bin/python, which scripts/setup.sh makes):
#   - greedy ids token for token: random GPT2LMHeadModel, LlamaForCausalLM
#     (GQA 2:1 untied, GQA 4:1 tied), Qwen2ForCausalLM (GQA 2:1, the
#     Q, K, V biases through the KV cache's prefill and decode) and
#     MixtralForCausalLM (4 experts, top 2: the MoE block on the prefill's
#     rows and on each new token's) directories saved
#     with save_pretrained (safetensors), 20 new tokens after a prompt of
#     ids, in fp32 (transformers in fp32) and in fp64 (transformers in
#     float64, patched to stay fp64: tests/reference/reference_hf.py);
#   - the KV cache against no cache: --kv-cache 0 (the training forward over
#     the whole sequence for every token) gives the same ids, greedy and
#     sampled (temperature, top-k, top-p, seed);
#   - stopping: at config.json's eos_token_id (the ids transformers gives
#     with that eos), at the model's maxT, and --ignore-eos;
#   - other sources: an -e size spec with random weights, an llm.c model
#     file and the checkpoint of the run that wrote it (-o DIR -y) give the
#     same ids; a byte-level prompt as text encodes to its bytes;
#   - text prompts: --generate "TEXT" on a GPT-2 directory with a byte-level
#     BPE tokenizer.json and on a Llama directory with a SentencePiece-style
#     one (tests/reference/hf_tokenizers.py) gives the prompt ids of
#     transformers' AutoTokenizer (Llama's <s> first) and its greedy
#     continuation;
#   - errors: a prompt longer than maxT, an id past the vocabulary, text for
#     a tokenizer that cannot encode (a split pattern not implemented: the
#     file and the pattern named), --generate with --tp 2, -y with
#     another model's -e, and (with mpirun) two ranks: one line
#     "train_gpt: error: ...", exit status 2 (1 for a fault while running).
# Last line: "N passed, N failed".
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(ROOT, "train_gpt")
sys.path.insert(0, HERE)
import reference_hf as rh  # noqa: E402  (random HF models, the fp64 patch)
import hf_tokenizers as hft  # noqa: E402  (tokenizers made with the `tokenizers` package)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402  (the suites' shared counter)

ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
PROMPT = [5, 17, 42, 3, 88, 11, 60]
NEW = 20
check = Checks()  # counts; prints each failure; summary() ends with "N passed, N failed"


def run(args, cmd=None, timeout=300):
    p = subprocess.run((cmd or [TRAIN]) + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)
    return p.returncode, p.stdout, p.stderr


def generate(args):
    """train_gpt --generate ARGS -> (ids or None, stdout + stderr)."""
    rc, out, err = run(["--device", "cpu"] + args)
    ids = [l[5:] for l in out.splitlines() if l.startswith("ids: ")]
    if rc != 0 or not ids:
        return None, out + err
    return [int(x) for x in ids[-1].split(",")], out + err


def ids_arg(ids):
    return ",".join(str(i) for i in ids)


def hf_model(spec, seed):
    s = rh.parse_spec(spec)
    torch.manual_seed(seed)
    model = rh.model_class(s)(rh.make_config(s))
    model.eval()
    rh.randomize(model, seed)
    model.generation_config.eos_token_id = None  # every run makes NEW tokens unless a test sets one
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model, prompt, new, eos=None):
    # The mask given: generate would take a prompt id equal to pad_token_id
    # (a text's <|endoftext|>, id 0) for padding and mask it out.
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)
    return out[0].tolist()


def margin_note(model, ours, theirs):
    """At the first differing step: transformers' gap between its top two logits (a near-tie?)."""
    k = next(i for i in range(min(len(ours), len(theirs))) if ours[i] != theirs[i])
    with torch.no_grad():
        row = rh.logits_of(model, torch.tensor([theirs[:k]]))[0, -1].double()
    top = torch.topk(row, 2).values
    return f"first difference at position {k}: ours {ours[k]}, transformers {theirs[k]}, its top-2 gap {float(top[0] - top[1]):.3g}"


def test_against_transformers(tmp, name, spec):
    d = os.path.join(tmp, name)
    model = hf_model(spec, 1234)
    model.save_pretrained(d, safe_serialization=True)
    common = ["-e", d, "--prompt-ids", ids_arg(PROMPT), "--max-new-tokens", str(NEW), "--temperature", "0",
              "--ignore-eos"]
    want32 = hf_greedy(model, PROMPT, NEW)
    for cache in ("1", "0"):
        ids, out = generate(common + ["--dtype", "fp32", "--kv-cache", cache])
        ok = ids == want32
        check(ok, f"{name} fp32 --kv-cache {cache}: {NEW} greedy ids equal transformers' fp32 generate" +
              ("" if ok or ids is None else " (" + margin_note(model.double(), ids, want32) + ")") +
              ("" if ids is not None else ": " + out.strip()[-300:]))
        model.float()
    rh.patch_fp64()
    model.double()
    want64 = hf_greedy(model, PROMPT, NEW)
    got = {}
    for cache in ("1", "0"):
        got[cache], out = generate(common + ["--dtype", "fp64", "--kv-cache", cache])
        check(got[cache] == want64, f"{name} fp64 --kv-cache {cache}: greedy ids equal transformers' float64 "
              f"generate" + ("" if got[cache] is not None else ": " + out.strip()[-300:]))
    check(len(want64) == len(PROMPT) + NEW and want64[:len(PROMPT)] == PROMPT, f"{name}: the prompt comes back first")

    # Sampled: the cache changes nothing (fp64: the same logits, the same draws).
    samp = ["-e", d, "--prompt-ids", ids_arg(PROMPT), "--max-new-tokens", str(NEW), "--dtype", "fp64",
            "--temperature", "0.8", "--top-k", "10", "--top-p", "0.9", "--seed", "7", "--ignore-eos"]
    a, _ = generate(samp)
    b, _ = generate(samp + ["--kv-cache", "0"])
    c, _ = generate(samp[:-1] + ["--seed", "8", "--ignore-eos"])
    check(a is not None and a == b, f"{name}: sampled ids (temperature, top-k, top-p) equal with and without the cache")
    check(a is not None and c is not None and a != c, f"{name}: another --seed draws other tokens")

    # EOS from config.json: a token the greedy run makes at step 5 becomes
    # eos_token_id; both stop right after it.
    eos = want64[len(PROMPT) + 5]
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = eos
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    stop = hf_greedy(model, PROMPT, NEW, eos=eos)
    ids, out = generate(common[:-1] + ["--dtype", "fp64"])
    check(ids == stop and ids[-1] == eos and len(ids) < len(want64) and "end-of-text" in out,
          f"{name}: stops at config.json's eos_token_id {eos} as transformers does ({len(stop) - len(PROMPT)} new)")
    ids, _ = generate(common + ["--dtype", "fp64"])
    check(ids == want64, f"{name}: --ignore-eos goes past it")
    return d


def test_sources(tmp):
    """An -e spec, an llm.c model file and a checkpoint of it; text prompts; maxT."""
    spec = "L=2,C=32,NH=2,V=257,T=48"
    base = ["--max-new-tokens", "12", "--temperature", "0", "--ignore-eos"]
    a, out = generate(["-e", spec, "--prompt-ids", ids_arg(PROMPT)] + base)
    b, _ = generate(["-e", spec, "--prompt-ids", ids_arg(PROMPT), "--kv-cache", "0"] + base)
    check(a is not None and a == b and len(a) == len(PROMPT) + 12, "-e spec (seeded random weights): the cache equals "
          "the recompute" + ("" if a else ": " + out.strip()[-300:]))
    # Text through the byte-level tokenizer (-e spec has no tokenizer.json;
    # --tokenizer "" is byte-level).
    ids, out = generate(["-e", spec, "--tokenizer", "", "--generate", "Hello"] + base)
    check(ids is not None and ids[:5] == list(b"Hello") and out.startswith("Hello"),
          "a text prompt encodes to its bytes and prints first")
    # maxT: a prompt of maxT - 3 tokens gets 3 new ones and a note.
    ids, out = generate(["-e", spec, "--prompt-ids", ids_arg([7] * 45)] + base)
    check(ids is not None and len(ids) == 48 and "maxT" in out, "generation stops at the model's maxT")
    # A model file and a checkpoint from a short run of the trainer.
    o = os.path.join(tmp, "run")
    rc, out, err = run(["-e", spec, "-x", "2", "-b", "2", "-t", "32", "-v", "0", "-s", "0", "-n", "2", "-o", o,
                        "--device", "cpu"])
    model_file = os.path.join(o, "model_00000002.bin")
    if not check(rc == 0 and os.path.exists(model_file), "a 2-step run writes a model file and a checkpoint"):
        print(err[-500:])
        return
    f1, out = generate(["-e", model_file, "--prompt-ids", ids_arg(PROMPT)] + base)
    f0, _ = generate(["-e", model_file, "--prompt-ids", ids_arg(PROMPT), "--kv-cache", "0"] + base)
    ck, out2 = generate(["-o", o, "-y", "--prompt-ids", ids_arg(PROMPT)] + base)
    check(f1 is not None and f1 == f0, "llm.c model file: the cache equals the recompute" +
          ("" if f1 else ": " + out.strip()[-300:]))
    check(ck is not None and ck == f1, "the checkpoint (-o DIR -y) gives the model file's ids" +
          ("" if ck else ": " + out2.strip()[-300:]))
    rc, out, err = run(["-o", o, "-y", "-e", "L=2,C=32,NH=2,V=257,T=64", "--prompt-ids", "1"])
    check(rc == 2 and "flag -e" in err and "checkpoint" in err, "-y with another model's -e is refused: " +
          err.strip()[-200:])


def test_text_prompts(tmp):
    """--generate TEXT: AutoTokenizer's ids, then transformers' greedy ids (fp64)."""
    from transformers import AutoTokenizer
    cases = [("gpt2 text", "L=2,C=32,NH=2,V=300,T=64", "Hello world, it's 2024! café 日本<|endoftext|> done"),
             ("llama text", "arch=llama,L=2,C=32,NH=4,NKV=2,F=64,V=420,T=64", "Hello world, it's 2024! café 日本")]
    for name, spec, text in cases:
        d = os.path.join(tmp, name.replace(" ", "_"))
        model = hf_model(spec, 99)
        model.save_pretrained(d, safe_serialization=True)
        if "llama" in name:
            hft.make_llama(d, 420)
        else:
            hft.make_bytelevel(os.path.join(d, "tokenizer.json"), 300)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                           "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f)
        prompt = AutoTokenizer.from_pretrained(d)(text)["input_ids"]
        model.double()
        want = hf_greedy(model, prompt, NEW)
        ids, out = generate(["-e", d, "--generate", text, "--max-new-tokens", str(NEW), "--temperature", "0",
                             "--ignore-eos", "--dtype", "fp64"])
        check(ids is not None and ids[:len(prompt)] == prompt,
              f"{name}: the prompt encodes to AutoTokenizer's {len(prompt)} ids" +
              (f" (ours {ids[:len(prompt) + 3]}, theirs {prompt})" if ids else ": " + out.strip()[-300:]))
        check(ids == want, f"{name}: {NEW} greedy ids after it equal transformers' float64 generate")
        check(("llama" not in name) or prompt[0] == 1, f"{name}: <s> starts Llama's prompt")


def test_errors(tmp, hf_dir):
    spec = "L=2,C=32,NH=2,V=257,T=48"

    def refused(args, words, what, cmd=None):
        rc, out, err = run(args, cmd=cmd)
        # One line from train_gpt (mpirun adds its own banner after it).
        lines = [l for l in err.splitlines() if l.startswith("train_gpt:")]
        ok = rc in (1, 2) and len(lines) == 1 and lines[0].startswith("train_gpt: error:") and \
            all(w in lines[0] for w in words) and not out.strip()
        check(ok, f"{what}: {lines[0] if lines else err.strip()[-300:]} (rc {rc})")

    refused(["-e", spec, "--prompt-ids", ids_arg([1] * 49)], ["flag --prompt-ids", "prompt has 49 tokens", "maxT of 48"],
            "a prompt longer than maxT")
    refused(["-e", spec, "--prompt-ids", "1,300"], ["--prompt-ids", "300", "257"], "an id past the vocabulary")
    refused(["-e", spec, "--prompt-ids", "1,x"], ["--prompt-ids", "'x'"], "an id that is not a number")
    refused(["-e", spec, "--generate", "hi", "--tp", "2"], ["flag --tp", "one process"], "--generate with --tp 2")
    refused(["-e", spec, "--generate", "hi", "--prompt-ids", "1"], ["not both"], "text and ids at once")
    # A tokenizer.json whose split pattern is not implemented cannot encode text.
    tj = os.path.join(tmp, "tok.json")
    pattern = r"\p{L}+|\s+|."
    hft.make_bytelevel(tj, 280)
    hft.edit_json(tj, tj, lambda j: j.update(pre_tokenizer=hft.split_then_bytelevel(pattern)))
    refused(["-e", spec, "--tokenizer", tj, "--generate", "hi"], ["--prompt-ids", "tok.json", json.dumps(pattern)],
            "text for a tokenizer that cannot encode names the file, the pattern and --prompt-ids")
    if shutil.which("mpirun"):
        refused(["-np", "2", TRAIN, "-e", spec, "--generate", "hi", "--device", "cpu"], ["one process", "mpirun"],
                "--generate under mpirun -np 2", cmd=["mpirun"])


def main():
    if not os.path.exists(TRAIN):
        check(False, "train_gpt is built (make train_gpt)")
    else:
        rh.import_transformers()
        tmp = tempfile.mkdtemp(prefix="test_generate_")
        try:
            d = test_against_transformers(tmp, "gpt2", "L=3,C=48,NH=3,V=97,T=64")
            test_against_transformers(tmp, "llama_gqa2", "arch=llama,L=3,C=48,NH=4,NKV=2,F=72,V=101,T=64,theta=500")
            test_against_transformers(tmp, "llama_gqa4_tied",
                                      "arch=llama,L=2,C=64,NH=8,NKV=2,F=100,V=97,T=64,tied=1,eps=1e-6")
            test_against_transformers(tmp, "qwen2_gqa2", "arch=qwen2,L=3,C=48,NH=4,NKV=2,F=72,V=101,T=64,theta=1e6")
            test_against_transformers(tmp, "mixtral_e4k2",
                                      "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=101,T=64,theta=500")
            test_sources(tmp)
            test_text_prompts(tmp)
            test_errors(tmp, d)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
