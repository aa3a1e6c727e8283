#!/usr/bin/env python3
# tests/reference/test_hf.py: Hugging Face checkpoints end to end, against transformers
# and tokenizers (run with build/hfenv/bin/python, which scripts/setup.sh
# makes):
#   - export round trip: a random GPT2LMHeadModel (tests/reference/reference_hf.py)
#     trained a few steps by train_gpt (-e DIR), exported with --export-hf,
#     loads in transformers and gives the logits of the trained model (read
#     from its checkpoint by test_gpt --write-logits) within 1e-10 in fp64;
#     one process and under mpirun (tp 2 with a vocabulary tp does not
#     divide, dp 2 with ZeRO-3, pp 2); the trainer picks DIR/tokenizer.json
#     and the export carries it; the same for a LlamaForCausalLM (GQA 2:1,
#     untied), Qwen2ForCausalLMs (GQA 2:1 untied, GQA 4:1 tied; random
#     nonzero Q, K, V biases) and a MixtralForCausalLM (4 experts, top 2;
#     also under expert parallelism, ep 2 with ZeRO-1);
#   - Llama, Qwen2 and Mixtral tensor maps: random LlamaForCausalLM and
#     Qwen2ForCausalLM checkpoints (GQA 2:1 untied fp32, GQA 4:1 tied bf16 in
#     shards) and a MixtralForCausalLM (bf16 in shards) loaded by llmc/io/hf.cpp equal
#     transformers' tensors in model file order, and their export loads in
#     transformers with every tensor equal (tests/reference/reference_hf.py
#     --check-weights);
#   - tokenizer.json: a byte-level BPE trained with the `tokenizers` package
#     decodes in C++ (build/test_hf --decode) to the bytes tokenizers gives;
#   - prepare_data.py with a tokenizer.json of more than 65536 ids writes
#     uint32 shards (magic 20240801) holding tokenizers' ids, which
#     train_gpt trains on, decoding samples with that tokenizer.json;
#   - the rest of a directory: token ids, tokenizer_config.json,
#     special_tokens_map.json and generation_config.json come back in the
#     export as they were (or are written from the run's tokenizer for a
#     model that did not come from a directory); --export-dtype bf16;
#     AutoTokenizer + generate work on both exports; a Llama directory with
#     its own bos/eos fine-tuned and a checkpoint converted with --convert
#     alone keeps them;
#   - errors: a truncated checkpoint and refused configs (rope_scaling,
#     Qwen2's use_sliding_window) end train_gpt with one line naming the
#     file and the tensor or field, exit status 2.
# Last line: "N passed, N failed".
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train_gpt")
TEST_GPT = os.path.join(ROOT, "build", "test_gpt")
TEST_HF = os.path.join(ROOT, "build", "test_hf")
REF = os.path.join(ROOT, "tests", "reference", "reference_hf.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import hf_tokenizers as hft  # noqa: E402  (tokenizers made with the `tokenizers` package)
PY = sys.executable
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if ok:
        passed += 1
    else:
        failed += 1
    return ok


def run(cmd, timeout=300):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=MPI_ENV)
    return p.returncode, p.stdout + p.stderr


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def make_tokenizer(path, vocab_size):
    """A byte-level BPE (GPT-2's scheme) trained here, with <|endoftext|>."""
    return hft.make_bytelevel(path, vocab_size, texts=[
        "The quick brown fox jumps over the lazy dog. Überall “quotes” — and ünïcödé, 日本語 too.\n"])


def test_tokenizer(tmp):
    path = os.path.join(tmp, "tokenizer.json")
    tok = make_tokenizer(path, 300)
    rc, out = run([TEST_HF, "--decode", path])
    if not check(rc == 0, f"test_hf --decode {path}: " + last_line(out)):
        return
    ours = {}
    for line in out.splitlines():
        parts = line.split(" ")
        if parts[0] == "eot":
            eot = int(parts[1])
        else:
            ours[int(parts[0])] = bytes.fromhex(parts[1]) if len(parts) > 1 else b""
    n = tok.get_vocab_size(with_added_tokens=True)
    check(len(ours) == n, f"C++ vocabulary {len(ours)} tokens, tokenizers' {n}")
    check(eot == tok.token_to_id("<|endoftext|>"), f"start token {eot} is <|endoftext|>")
    # Every token that decodes to whole characters decodes to the same bytes.
    same = diff = partial = 0
    for i in range(n):
        s = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in s:
            partial += 1  # half a character: tokenizers shows U+FFFD, we keep the bytes
            continue
        if ours.get(i) == s.encode("utf-8"):
            same += 1
        else:
            diff += 1
    check(diff == 0 and same > 100, f"token bytes equal tokenizers' decode: {same} equal, {diff} differ, "
                                    f"{partial} partial characters skipped")
    # A text encoded by tokenizers decodes back to its exact bytes.
    text = "Überall the lazy dog, 日本語 — “quotes”\n\nand a new word: zyxwvut!"
    ids = tok.encode(text).ids
    got = b"".join(ours[i] for i in ids)
    check(got == text.encode("utf-8"), f"{len(ids)} ids of a text decode to its bytes")


def trained_logits(tmp, name, model_dir, launch, extra):
    """train_gpt 3 steps from model_dir, export; returns (export dir, logits file) or None."""
    out, exp, logits = (os.path.join(tmp, name + s) for s in ("_out", "_hf", "_logits.bin"))
    cmd = launch + [TRAIN, "-e", model_dir, "-b", "2", "-t", "32", "-x", "3", "-v", "0", "-s", "3", "-g", "8",
                    "-l", "3e-3", "-u", "0", "-o", out, "-n", "3", "--export-hf", exp, "--device", "cpu"] + extra
    stale = ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model.safetensors.tmp.77"]
    if name.endswith("_single"):  # an earlier sharded export and a killed one's leftovers, to be removed
        os.makedirs(exp, exist_ok=True)
        for f in stale:
            with open(os.path.join(exp, f), "w") as fh:
                fh.write("{}")
    rc, text = run(cmd)
    if name.endswith("_single"):
        left = [f for f in stale if os.path.exists(os.path.join(exp, f))]
        check(not left, f"{name}: --export-hf removes a stale index, shards and temporaries: {left} left")
    if not check(rc == 0 and os.path.isfile(os.path.join(exp, "model.safetensors")),
                 f"{name}: train_gpt -e DIR ... --export-hf: rc {rc} " + (last_line(text) if rc else "")):
        print(text[-3000:])
        return None
    if name.endswith("_single"):
        check(os.path.join(model_dir, "tokenizer.json") in text, "train_gpt takes DIR/tokenizer.json by default")
        check("---- sample ----" in text, "samples decoded with it")
        with open(os.path.join(model_dir, "tokenizer.json"), "rb") as a, open(os.path.join(exp, "tokenizer.json"), "rb") as b:
            check(a.read() == b.read(), "the export carries tokenizer.json")
    rc, text = run([TEST_GPT, "--model", out, "--write-logits", logits, "--B", "2", "--T", "24"])
    if not check(rc == 0, f"{name}: test_gpt --write-logits from the checkpoint: " + last_line(text)):
        return None
    return exp, logits


def test_round_trip(tmp, arch, spec):
    a = os.path.join(tmp, arch)
    rc, text = run([PY, REF, "--spec", spec, "--save-dir", a, "--steps", "0"])
    if not check(rc == 0, f"reference_hf.py makes a {arch} model: " + last_line(text)):
        return
    make_tokenizer(os.path.join(a, "tokenizer.json"), 280)
    layouts = [("single", [], [])]
    if shutil.which("mpirun"):
        mpi = ["mpirun", "-np", "2"]
        layouts += [("tp2", mpi, ["--tp", "2"]), ("zero3", mpi, ["-z", "3"]),
                    ("pp2", mpi, ["--pp", "2", "-d", "128"])]
        if arch == "mixtral":  # the experts split over the two ranks: loaded by piece, exported by their owners
            layouts += [("ep2_zero1", mpi, ["--ep", "2", "-z", "1"])]
    first = None
    for name, launch, extra in layouts:
        name = arch + "_" + name
        r = trained_logits(tmp, name, a, launch, extra)
        if not r:
            continue
        exp, logits = r
        rc, text = run([PY, REF, "--compare", exp, "--logits", logits])
        check(rc == 0, f"{name}: transformers on the export gives the trained model's logits: " +
              next((l for l in text.splitlines() if "rel err" in l), last_line(text)))
        if first is None:
            first = logits
            # Fields for training elsewhere as the source had them (Mixtral's
            # output_router_logits, the dropouts), not the export's own.
            import json
            src_cfg, exp_cfg = (json.load(open(os.path.join(d, "config.json"))) for d in (a, exp))
            keys = [k for k in ("output_router_logits", "router_jitter_noise", "resid_pdrop", "attention_dropout")
                    if k in src_cfg]
            check(keys and all(exp_cfg.get(k) == src_cfg[k] for k in keys),
                  f"{name}: the export keeps the source's {keys}: {[(exp_cfg.get(k), src_cfg[k]) for k in keys]}")
    # The control: the untrained model's logits differ from the export's.
    if first:
        l0 = os.path.join(tmp, "untrained_logits.bin")
        run([TEST_GPT, "--model", a, "--write-logits", l0, "--B", "2", "--T", "24"])
        rc, text = run([PY, REF, "--compare", os.path.join(tmp, arch + "_single_hf"), "--logits", l0])
        check(rc != 0, f"{arch} control: the untrained model's logits do not match the trained export")


def generate_ok(d, name):
    """AutoTokenizer and AutoModelForCausalLM load d; greedy generate runs and
    stays in the vocabulary (it failed with an IndexError when config.json
    kept transformers' default token ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(d)
        model = AutoModelForCausalLM.from_pretrained(d)
        ids = tok("The quick brown fox", return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=model.config.eos_token_id)
        text = tok.decode(out[0])
        ok = out.shape[1] > ids.shape[1] and int(out.max()) < model.config.vocab_size and text.startswith("The quick")
        return check(ok, f"{name}: AutoTokenizer + generate on the export: {text!r}")
    except Exception as e:  # noqa: BLE001 (any failure is the finding)
        return check(False, f"{name}: AutoTokenizer + generate on the export: {type(e).__name__}: {e}")


def test_default_export(tmp):
    """The default run (the embedded data's byte-level tokenizer, an llm.c
    file) exports a tokenizer.json made from it: AutoTokenizer loads the
    directory, a text's ids are its UTF-8 bytes, <|endoftext|> is the
    special token 256, decode gives the text back, generate runs."""
    from transformers import AutoTokenizer
    d = os.path.join(tmp, "default_run")
    exp = os.path.join(d, "hf")
    rc, text = run([TRAIN, "-x", "2", "-v", "0", "-s", "0", "-o", d, "--export-hf", exp])
    if not check(rc == 0 and os.path.isfile(os.path.join(exp, "tokenizer.json")),
                 "the default run's --export-hf writes a tokenizer.json: " + last_line(text)):
        return
    tok = AutoTokenizer.from_pretrained(exp)
    s = "Hello, wörld! 日本 🙂 x"
    ids = tok(s)["input_ids"]
    check(ids == list(s.encode("utf-8")), f"AutoTokenizer on the default export: bytes as ids ({ids[:12]})")
    check(tok("a<|endoftext|>b")["input_ids"] == [97, 256, 98] and tok.decode(ids) == s and
          tok.eos_token == "<|endoftext|>", "its end-of-text token is the special 256; decode gives the text back")
    generate_ok(exp, "export of the default run")


def test_export_meta(tmp):
    """What a Hugging Face directory holds besides the weights comes back in
    the export: token ids, tokenizer and generation files as they were;
    --export-dtype sets the weights' type; a model that did not come from a
    directory gets them from the run's tokenizer."""
    import json
    from transformers import GenerationConfig, PreTrainedTokenizerFast
    src = os.path.join(tmp, "meta_src")
    rc, text = run([PY, REF, "--spec", "L=2,C=32,NH=2,V=301,T=64", "--save-dir", src, "--steps", "0"])
    if not check(rc == 0, "reference_hf.py makes a model: " + last_line(text)):
        return
    tk = make_tokenizer(os.path.join(src, "tokenizer.json"), 280)
    eot = tk.token_to_id("<|endoftext|>")
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(src, "tokenizer.json"), bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=64)
    fast.save_pretrained(src)
    GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, max_new_tokens=7).save_pretrained(src)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, resid_pdrop=0.1, attn_pdrop=0.1)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)
    exp = os.path.join(tmp, "meta_hf")
    rc, text = run([TRAIN, "-e", src, "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "--device", "cpu",
                    "--export-hf", exp, "--export-dtype", "bf16"])
    if not check(rc == 0, "train_gpt -e DIR --export-hf --export-dtype bf16: " + last_line(text)):
        return
    side = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
    same = []
    for f in side:
        with open(os.path.join(src, f), "rb") as a:
            same.append(os.path.isfile(os.path.join(exp, f)) and open(os.path.join(exp, f), "rb").read() == a.read())
    check(all(same), f"the export carries the source's {side} as they were: {same}")
    with open(os.path.join(exp, "config.json")) as f:
        got = json.load(f)
    check(all(got.get(k) == eot for k in ("bos_token_id", "eos_token_id", "pad_token_id")),
          f"config.json keeps the token ids: {[got.get(k) for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')]}")
    # Fields for training elsewhere come back as the source had them
    # (dropouts of 0.1), not the export's own 0.
    drops = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")
    check(all(got.get(k) == cfg.get(k) for k in drops) and cfg.get("resid_pdrop") == 0.1,
          f"config.json keeps the source's dropouts: {[(got.get(k), cfg.get(k)) for k in drops]}")
    with open(os.path.join(exp, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    check(dtypes == {"BF16"} and got.get("torch_dtype") == "bfloat16", f"--export-dtype bf16: {dtypes}, {got.get('torch_dtype')}")
    generate_ok(exp, "export of an HF directory")
    # Not from a directory: random weights of the same shape, the run's tokenizer.json.
    exp2 = os.path.join(tmp, "meta_hf2")
    rc, text = run([TRAIN, "-e", "L=2,C=32,NH=2,V=301,Vp=301,T=64", "--tokenizer", os.path.join(src, "tokenizer.json"),
                    "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "--device", "cpu", "--export-hf", exp2])
    if not check(rc == 0, "train_gpt -e SIZES --tokenizer tokenizer.json --export-hf: " + last_line(text)):
        return
    with open(os.path.join(exp2, "config.json")) as f:
        got = json.load(f)
    with open(os.path.join(exp2, "tokenizer_config.json")) as f:
        tc = json.load(f)
    check(got.get("bos_token_id") == eot and got.get("eos_token_id") == eot and tc.get("eos_token") == "<|endoftext|>"
          and os.path.isfile(os.path.join(exp2, "generation_config.json")),
          f"ids and tokenizer files from the run's tokenizer: {got.get('bos_token_id')}, {tc}")
    generate_ok(exp2, "export of a model made from sizes")


def test_llama_journey(tmp):
    """A Llama directory with its own tokenizer (bos <s>, eos </s>, named in
    tokenizer_config.json, no special_tokens_map.json): fine-tuned with
    checkpoints, then a checkpoint converted with --convert alone (the run's
    -e and tokenizer come from its run_config.json): AutoTokenizer on the
    export has the source's bos and eos, and generate runs."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    src = os.path.join(tmp, "journey_src")
    tok = hft.make_llama(src, 300)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                      eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(src, safe_serialization=True)
    data = os.path.join(tmp, "journey_data")
    text = os.path.join(tmp, "journey.txt")
    with open(text, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog.\n\n" * 200)
    rc, out = run([PY, os.path.join(ROOT, "scripts/prepare_data.py"), "--input", text, "--out", data, "--name", "j",
                   "--tokenizer", os.path.join(src, "tokenizer.json"), "--split-blank-lines"])
    if not check(rc == 0, "prepare_data with the Llama tokenizer: " + last_line(out)):
        return
    # Documents as the tokenizer's convention: <s> opens each, </s> ends it,
    # and the shards' header says so.
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from shards import read_doc_ids, read_shard
    shard = os.path.join(data, "j_train_000001.bin")
    toks = read_shard(shard)
    starts, ends = [i for i, t in enumerate(toks) if t == 1], [i for i, t in enumerate(toks) if t == 2]
    check(read_doc_ids(shard) == (1, 2) and len(starts) == len(ends) == 198 and toks[0] == 1 and toks[-1] == 2 and
          all(e + 1 == s for e, s in zip(ends, starts[1:])),
          f"prepare_data: each document <s> ... </s>, the header records (1, 2): {read_doc_ids(shard)}, "
          f"{len(starts)} <s>, {len(ends)} </s>")
    run_dir, exp = os.path.join(tmp, "journey_run"), os.path.join(tmp, "journey_hf")
    rc, out = run([TRAIN, "-e", src, "-i", os.path.join(data, "j_train_*.bin"), "-j", "", "-b", "2", "-x", "4",
                   "-n", "2", "-s", "0", "--device", "cpu", "-o", run_dir])
    if not check(rc == 0 and "tokenized with" not in out, "fine-tune the Llama directory: " + last_line(out)):
        return
    rc, out = run([TRAIN, "--convert", os.path.join(run_dir, "ckpt_00000002"), "--export-hf", exp])
    if not check(rc == 0 and "as the run had them" in out, "--convert alone: " + last_line(out)):
        return
    try:
        t = AutoTokenizer.from_pretrained(exp)
    except OSError as e:
        check(False, f"AutoTokenizer loads the converted export: {e}")
        return
    want = AutoTokenizer.from_pretrained(src)
    check((t.bos_token, t.eos_token) == (want.bos_token, want.eos_token) == ("<s>", "</s>"),
          f"the converted export's special tokens {(t.bos_token, t.eos_token)} are the source's")
    model = LlamaForCausalLM.from_pretrained(exp)
    ids = t("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=t.eos_token_id)
    check(ids[0, 0] == 1 and got.shape[1] > ids.shape[1] and
          t.decode(got[0], skip_special_tokens=True).startswith("The quick"),
          f"--convert of a Llama run: AutoTokenizer (with <s>) + generate: {t.decode(got[0])!r}")
    # Trained on those documents (the mask takes <s> and </s> from the
    # shards), the model learns to end one: generation stops at </s>, ours
    # and transformers' on the export.
    run_dir, exp = os.path.join(tmp, "journey_fit"), os.path.join(tmp, "journey_fit_hf")
    rc, out = run([TRAIN, "-e", src, "-i", os.path.join(data, "j_train_*.bin"), "-j", "", "-b", "4", "-t", "64",
                   "-x", "150", "-l", "1e-2", "-u", "10", "-s", "0", "-v", "0", "--document-mask", "1", "--device",
                   "cpu", "-o", run_dir, "--export-hf", exp])
    if not check(rc == 0 and "documents: 2 (</s>) ends a document, 1 (<s>) opens one (the shards' header)" in out,
                 "train on the Llama documents with --document-mask 1: " + last_line(out)):
        return
    rc, out = run([TRAIN, "-e", exp, "--generate", "The quick", "--max-new-tokens", "60", "--temperature", "0",
                   "--device", "cpu"])
    check(rc == 0 and "stopped at the end-of-text token" in out and "lazy dog." in out,
          "--generate on the trained export stops at </s>: " + last_line(out))
    t = AutoTokenizer.from_pretrained(exp)
    model = LlamaForCausalLM.from_pretrained(exp)
    ids = t("The quick", return_tensors="pt").input_ids
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=60, do_sample=False, pad_token_id=t.eos_token_id)
    check(int(got[0, -1]) == 2 and got.shape[1] < ids.shape[1] + 60 and "lazy dog." in t.decode(got[0]),
          f"transformers' generate on the export stops at </s> too: {t.decode(got[0])!r}")


def test_llama_maps(tmp):
    for name, spec, extra in [
            ("gqa2_untied_fp32", "arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16,theta=500", []),
            ("gqa4_tied_bf16_sharded", "arch=llama,L=3,C=64,NH=4,NKV=1,F=40,V=37,T=12,tied=1,eps=1e-6",
             ["--save-dtype", "bf16", "--shard-size", "10KB"]),
            ("qwen2_gqa2_untied_fp32", "arch=qwen2,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16,theta=1000000", []),
            ("qwen2_gqa4_tied_bf16_sharded", "arch=qwen2,L=3,C=64,NH=4,NKV=1,F=40,V=37,T=12,tied=1",
             ["--save-dtype", "bf16", "--shard-size", "10KB"]),
            ("mixtral_e4k2_bf16_sharded", "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=101,T=16,aux=0.02",
             ["--save-dtype", "bf16", "--shard-size", "20KB"])]:
        d, w, e = (os.path.join(tmp, name + s) for s in ("", ".w", "_exp"))
        rc, text = run([PY, REF, "--spec", spec, "--save-dir", d, "--steps", "0"] + extra)
        if not check(rc == 0, f"{name}: reference_hf.py saves the model: " + last_line(text)):
            continue
        rc, text = run([TEST_GPT, "--model", d, "--write-weights", w, "--export-hf", e])
        if not check(rc == 0, f"{name}: test_gpt loads and exports it: " + last_line(text)):
            continue
        rc, text = run([PY, REF, "--check-weights", d, "--weights", w, "--exported", e])
        check(rc == 0, f"{name}: tensor maps against transformers: " + last_line(text))
        if rc:
            print(text)


def test_prepare_data(tmp):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["Ġt"] = len(vocab)
    vocab["he"] = len(vocab)
    while len(vocab) < 70000:  # past 65536 ids: the shards need uint32
        vocab[f"filler{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t"), ("h", "e")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = os.path.join(tmp, "big_tokenizer.json")
    tok.save(path)
    eot = tok.token_to_id("<|endoftext|>")
    docs = ["the theme of the day\n" * 40, "another text, the end — ünïcode\n" * 30]
    inp = os.path.join(tmp, "docs.txt")
    with open(inp, "w") as f:
        f.write("\n\n".join(docs))
    out = os.path.join(tmp, "bigdata")
    rc, text = run([PY, os.path.join(ROOT, "scripts", "prepare_data.py"), "--input", inp, "--out", out, "--name", "big",
                    "--tokenizer", path, "--split-blank-lines", "--val-fraction", "0.5"])
    if not check(rc == 0, "prepare_data.py --tokenizer FILE.json: " + last_line(text)):
        print(text)
        return
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import numpy as np
    from shards import MAGIC_U32, read_shard
    train = os.path.join(out, "big_train_000001.bin")
    magic = int(np.fromfile(train, dtype="<i4", count=1)[0])
    check(magic == MAGIC_U32, f"vocabulary {eot + 1} > 65536: uint32 shard (magic {magic})")
    want = [eot] + tok.encode(docs[1].strip("\n") + "\n", add_special_tokens=False).ids
    got = read_shard(train).tolist()
    check(got == want, f"the shard holds tokenizers' ids ({len(got)} tokens, separator {eot} first)")
    check(os.path.isfile(os.path.join(out, "tokenizer.json")), "the tokenizer.json is copied beside the shards")
    rc, text = run([TRAIN, "-e", f"L=1,C=16,NH=2,V={eot + 1},T=32", "-i", train, "-j", "", "-b", "2", "-t", "32",
                    "-x", "2", "-s", "2", "-g", "8", "--tokenizer", os.path.join(out, "tokenizer.json"),
                    "--device", "cpu"])
    check(rc == 0 and "---- sample ----" in text, "train_gpt trains on the uint32 shards and samples: " +
          last_line(text))


def test_errors(tmp):
    a = os.path.join(tmp, "gpt2")
    bad = os.path.join(tmp, "truncated")
    shutil.copytree(a, bad)
    st = os.path.join(bad, "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(os.path.getsize(st) - 100)
    rc, text = run([TRAIN, "-e", bad, "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "--device", "cpu"])
    lines = [l for l in text.splitlines() if "error" in l]
    check(rc == 2 and len(lines) == 1 and st in lines[0] and "tensor transformer." in lines[0],
          "truncated checkpoint: " + (lines[0] if lines else text[-300:]))
    cfg = os.path.join(tmp, "rope")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "config.json"), "w") as f:
        f.write('{"architectures":["LlamaForCausalLM"],"hidden_size":48,"num_attention_heads":4,"intermediate_size":72,'
                '"num_hidden_layers":2,"vocab_size":300,"rope_scaling":{"type":"dynamic","factor":2.0}}')
    rc, text = run([TRAIN, "-e", cfg, "-x", "1", "-v", "0", "-s", "0", "--device", "cpu"])
    check(rc == 2 and "rope_scaling" in text and "config.json" in text, "rope_scaling refused: " + last_line(text))
    win = os.path.join(tmp, "qwen2_window")
    shutil.copytree(os.path.join(tmp, "qwen2"), win)
    with open(os.path.join(win, "config.json")) as f:
        cfg = f.read()
    with open(os.path.join(win, "config.json"), "w") as f:
        f.write(cfg.replace('"use_sliding_window": false', '"use_sliding_window": true'))
    rc, text = run([TRAIN, "-e", win, "-x", "1", "-v", "0", "-s", "0", "--device", "cpu"])
    lines = [l for l in text.splitlines() if "error" in l]
    check(rc == 2 and len(lines) == 1 and "use_sliding_window" in lines[0] and "config.json" in lines[0],
          "Qwen2 use_sliding_window true refused: " + last_line(text))


def main():
    for exe in (TRAIN, TEST_GPT, TEST_HF):
        if not os.path.exists(exe):
            print(f"missing {exe} (run make and make tests)\n0 passed, 1 failed")
            return 1
    tmp = tempfile.mkdtemp(prefix="test_hf_py_")
    try:
        test_tokenizer(tmp)
        test_round_trip(tmp, "gpt2", "L=2,C=32,NH=2,V=301,T=64")
        test_round_trip(tmp, "llama", "arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=301,T=64,theta=500")
        test_round_trip(tmp, "qwen2", "arch=qwen2,L=2,C=48,NH=4,NKV=2,F=72,V=301,T=64,theta=1000000")
        test_round_trip(tmp, "qwen2_tied", "arch=qwen2,L=2,C=64,NH=8,NKV=2,F=40,V=301,T=64,tied=1")
        test_round_trip(tmp, "mixtral", "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=301,T=64,theta=500")
        test_export_meta(tmp)
        test_default_export(tmp)
        test_llama_journey(tmp)
        test_llama_maps(tmp)
        test_prepare_data(tmp)
        test_errors(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
