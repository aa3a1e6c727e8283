#!/usr/bin/env python3
# tests/reference/test_tokenize.py: the C++ BPE encoder (llmc/io/bpe.h, through
# build/dump_rows --encode) against the `tokenizers` package, id for id, on
# hf_tokenizers.CORPUS (run with build/hfenv/bin/python):
#   (a) a byte-level BPE trained here (ByteLevel, GPT-2's split pattern),
#       as saved, with add_prefix_space, and split by Llama 3's pattern
#       (Split + ByteLevel without its own split, with ignore_merges: Llama
#       3's files);
#   (b) the same vocabulary as an llm.c tokenizer file (ids -> bytes, no
#       merges), encoded by the tiktoken rule (the rank of a merge is the id
#       of the token it makes): first the check that the trained vocabulary
#       has that property, then the ids against tokenizers' with the added
#       tokens taken out (an llm.c file makes no special token from text);
#   (c) a SentencePiece-style Llama tokenizer.json (normalizer Prepend and
#       Replace, byte fallback, <s> from the post-processor), also with a
#       Metaspace pre-tokenizer instead of the normalizer, and against
#       transformers' AutoTokenizer with add_bos_token / add_eos_token;
#   - the split patterns alone (dump_rows --split): GPT-2's and Llama 3's
#     pieces equal tokenizers' Split pre-tokenizer's, text for text (this
#     sees a wrong split even where no merge crosses it), also around every
#     37th code point (the Unicode table's classes) and the white space;
#   - decoding (dump_rows --decode: Tokenizer::decode_text, what --generate
#     and the training samples print) against tokenizers' decode, special
#     tokens kept, text for text: the corpus's ids and every prefix of its
#     emoji and accented texts (sequences cut inside a character), and
#     random id sequences (runs of byte-fallback tokens that are not UTF-8:
#     one U+FFFD per byte; byte-level bytes that are not: one per maximal
#     ill-formed subpart), for the byte-level BPE, the Llama file (also
#     against transformers' AutoTokenizer.decode) and the llm.c file
#     (against Python's errors="replace");
#   - refusals: a split pattern not implemented gives one line naming the
#     file and the pattern;
#   - the Unicode table (llmc/io/unicode_table.cpp) equals what
#     scripts/gen_unicode_table.py makes from this Python's unicodedata
#     (when its Unicode version is the table's).
# Last line: "N passed, N failed".
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DUMP = os.path.join(ROOT, "build", "dump_rows")
sys.path.insert(0, HERE)
import hf_tokenizers as hft  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from checks import Checks  # noqa: E402

check = Checks()


def ours(path, texts, tmp, mode="--encode"):
    """dump_rows --encode: a list (ids, or the error line) per text."""
    tf = os.path.join(tmp, "texts.hex")
    with open(tf, "w") as f:
        for t in texts:
            f.write(t.encode("utf-8").hex() + "\n")
    p = subprocess.run([DUMP, mode, path, tf], capture_output=True, text=True)
    if mode == "--split":
        return [[bytes.fromhex(x).decode("utf-8") for x in line[7:].split(",") if x]
                for line in p.stdout.splitlines() if line.startswith("pieces ")]
    out = []
    for line in p.stdout.splitlines():
        out.append([int(x) for x in line[4:].split(",") if x] if line.startswith("ids ") else line)
    return out if len(out) == len(texts) else [p.stdout + p.stderr] * len(texts)


def compare(name, path, want_of, tmp, texts=hft.CORPUS):
    """Every text's ids from path equal want_of(text); one check, the first differences shown."""
    got = ours(path, texts, tmp)
    bad = [(t, g, want_of(t)) for t, g in zip(texts, got) if g != want_of(t)]
    for t, g, w in bad[:3]:
        print(f"  {name}: {t!r}\n    ours:       {g}\n    tokenizers: {w}")
    check(not bad, f"{name}: {len(texts) - len(bad)} of {len(texts)} texts encode to tokenizers' ids")
    return got


def test_bytelevel(tmp):
    path = os.path.join(tmp, "bl.json")
    tok = hft.make_bytelevel(path, 520)
    got = compare("byte-level BPE (GPT-2 split)", path, lambda t: tok.encode(t).ids, tmp)
    n_merged = sum(1 for g in got if isinstance(g, list) for i in g if len(tok.id_to_token(i)) > 1)
    check(n_merged > 100, f"the corpus uses merged tokens ({n_merged}), not just bytes")
    check(any(0 in g for g in got if isinstance(g, list)), "<|endoftext|> inside text is its id")

    def prefix(j):
        j["pre_tokenizer"]["add_prefix_space"] = True
    p2 = os.path.join(tmp, "bl_prefix.json")
    t2 = hft.edit_json(path, p2, prefix)
    compare("byte-level, add_prefix_space", p2, lambda t: t2.encode(t).ids, tmp)

    def llama3(j):
        j["pre_tokenizer"] = hft.split_then_bytelevel(hft.LLAMA3_PATTERN)
        j["model"]["ignore_merges"] = True
    p3 = os.path.join(tmp, "l3.json")
    t3 = hft.edit_json(path, p3, llama3)
    compare("Llama 3 split + ByteLevel, ignore_merges", p3, lambda t: t3.encode(t).ids, tmp)
    p4 = os.path.join(tmp, "gpt2split.json")
    t4 = hft.edit_json(path, p4, lambda j: j.update(pre_tokenizer=hft.split_then_bytelevel(hft.GPT2_PATTERN)))
    compare("GPT-2 pattern as a Split", p4, lambda t: t4.encode(t).ids, tmp)

    # A pattern not implemented: one line naming the file and the pattern.
    other = r"\p{L}+|\s+|."
    p5 = os.path.join(tmp, "other.json")
    hft.edit_json(path, p5, lambda j: j.update(pre_tokenizer=hft.split_then_bytelevel(other)))
    g = ours(p5, ["hi"], tmp)[0]
    check(isinstance(g, str) and g.startswith("error:") and "other.json" in g and json.dumps(other) in g,
          f"a pattern not implemented is refused: {g}")
    return path, tok


def test_splits(tmp):
    from tokenizers import Regex, pre_tokenizers
    # "x Cy1" cuts differently for C a letter, a number, white space or
    # other: every 37th code point (the table's classes against
    # tokenizers' regex engine), and white space and its lookalikes.
    probe = [0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x200A, 0x200B,
             0x2028, 0x2029, 0x202F, 0x205F, 0x2060, 0x3000, 0xFEFF, 0x17F]
    probe += [c for c in range(0x80, 0x30000, 37) if not 0xD800 <= c < 0xE000]
    texts = hft.CORPUS + hft.TRAIN_TEXT + ["x \u180ey", "1234567 ١٢٣٤"] + [f"x {chr(c)}y1" for c in probe]
    for name, pattern in (("gpt2", hft.GPT2_PATTERN), ("llama3", hft.LLAMA3_PATTERN)):
        split = pre_tokenizers.Split(Regex(pattern), "isolated")
        want = [[p for p, _ in split.pre_tokenize_str(t)] for t in texts]
        got = ours(name, texts, tmp, mode="--split")
        bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w] + ([("count", len(got), len(want))]
                                                                             if len(got) != len(want) else [])
        for t, g, w in bad[:3]:
            print(f"  {name}: {t!r}\n    ours:       {g}\n    tokenizers: {w}")
        check(not bad, f"{name} split pattern: {len(texts) - len(bad)} of {len(texts)} texts cut as tokenizers' Split")


def decoded(path, seqs, tmp):
    """dump_rows --decode: the text of each id sequence."""
    f = os.path.join(tmp, "ids.txt")
    with open(f, "w") as out:
        for s in seqs:
            out.write(",".join(str(i) for i in s) + "\n")
    p = subprocess.run([DUMP, "--decode", path, f], capture_output=True, text=True)
    got = [bytes.fromhex(l[5:]).decode("utf-8") for l in p.stdout.splitlines() if l.startswith("text ")]
    return got if len(got) == len(seqs) else [p.stdout + p.stderr] * len(seqs)


def decode_sequences(encode, vocab_size, seed):
    """The corpus's ids, every prefix of the ids of texts with multi-byte
    characters (cut inside one), and random sequences."""
    import random
    rng = random.Random(seed)
    seqs = [encode(t) for t in hft.CORPUS]
    for t in ("Grüße 🙂 日本 café", "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧", "Привет 世界 ½"):
        ids = encode(t)
        seqs += [ids[:k] for k in range(1, len(ids) + 1)]
    seqs += [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    return seqs


def compare_decode(name, path, want, seqs, tmp):
    got = decoded(path, seqs, tmp)
    bad = [(s, g, want(s)) for s, g in zip(seqs, got) if g != want(s)]
    for s, g, w in bad[:3]:
        print(f"  {name}: {s}\n    ours:       {g!r}\n    tokenizers: {w!r}")
    check(not bad, f"{name}: {len(seqs) - len(bad)} of {len(seqs)} id sequences decode to tokenizers' text")


def test_decode(tmp, bytelevel_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(bytelevel_path)
    n = tok.get_vocab_size()
    seqs = decode_sequences(lambda t: tok.encode(t).ids, n, 1)
    compare_decode("decode, byte-level BPE", bytelevel_path, lambda s: tok.decode(s, skip_special_tokens=False),
                   seqs, tmp)
    # The llm.c file of the same vocabulary: its bytes, then Python's replace.
    bd = hft.byte_decoder()
    vocab = json.load(open(bytelevel_path, encoding="utf-8"))["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    tb = [bytes(bd[c] for c in by_id[i]) if by_id[i] != "<|endoftext|>" else b"<|endoftext|>" for i in range(n)]
    path = os.path.join(tmp, "dec.bin")
    hft.write_llmc(path, tb, vocab["<|endoftext|>"])
    compare_decode("decode, llm.c file", path, lambda s: b"".join(tb[i] for i in s).decode("utf-8", "replace"),
                   seqs, tmp)
    d = os.path.join(tmp, "llama_dec")
    lt = hft.make_llama(d, 420)
    path = os.path.join(d, "tokenizer.json")
    seqs = decode_sequences(lambda t: lt.encode(t).ids, lt.get_vocab_size(), 2)
    # Runs of byte tokens alone: <0xC3><0xBC> is "ü", <0xC3> alone is not UTF-8.
    byte = {int(t[3:5], 16): i for t, i in lt.get_vocab().items() if len(t) == 6 and t.startswith("<0x")}
    seqs += [[byte[0xC3], byte[0xBC]], [byte[0xC3]], [byte[0xC3], byte[0xBC], byte[0xC3]],
             [lt.token_to_id("▁a") or 5, byte[0xF0], byte[0x9F], byte[0x99], byte[0x82], 1]]
    check(sum(1 for s in seqs for i in s if i in byte.values()) > 100, "the sequences hold byte-fallback tokens")
    compare_decode("decode, Llama (SentencePiece style, byte fallback)", path,
                   lambda s: lt.decode(s, skip_special_tokens=False), seqs, tmp)
    from transformers import AutoTokenizer
    at = AutoTokenizer.from_pretrained(d)
    compare_decode("decode, Llama: transformers' AutoTokenizer.decode", path,
                   lambda s: at.decode(s, clean_up_tokenization_spaces=False), seqs, tmp)


def test_llmc_file(tmp, json_path, tok):
    """(b): the trained vocabulary as an llm.c file, encoded by the tiktoken rule."""
    with open(json_path, encoding="utf-8") as f:
        j = json.load(f)
    vocab, merges = j["model"]["vocab"], j["model"]["merges"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in merges]
    # The property the rule needs: merge r makes a new token whose id rises
    # with r (BpeTrainer numbers the special token, the alphabet, then each
    # merge's token in order), and every longer token is made by a merge.
    made = [vocab[a + b] for a, b in merges]
    singles = [i for t, i in vocab.items() if len(t) == 1]
    ok = made == sorted(made) and len(set(made)) == len(made) and len(made) + len(singles) + 1 == len(vocab)
    check(ok, f"the trained vocabulary is in merge order: merge r makes id {made[0]} + r "
          f"({len(made)} merges, {len(singles)} single bytes)")
    bd = hft.byte_decoder()
    by_id = {i: t for t, i in vocab.items()}
    token_bytes = [bytes(bd[c] for c in by_id[i]) if by_id[i] != "<|endoftext|>" else b"<|endoftext|>"
                   for i in range(len(by_id))]
    path = os.path.join(tmp, "tok.bin")
    hft.write_llmc(path, token_bytes, vocab["<|endoftext|>"])
    plain = hft.edit_json(json_path, os.path.join(tmp, "plain.json"), lambda x: x.update(added_tokens=[]))
    compare("llm.c file (tiktoken rule)", path, lambda t: plain.encode(t).ids, tmp)
    # The tokenizer.json an export writes for it (tokenizer_export.h): its
    # merges are the rule's, so tokenizers encodes with it to the same ids
    # (texts with the end-of-text token's characters aside: special there).
    from tokenizers import Tokenizer
    out = os.path.join(tmp, "from_llmc.json")
    p = subprocess.run([DUMP, "--hf-json", path, out], capture_output=True, text=True)
    if not check(p.returncode == 0, f"dump_rows --hf-json: {p.stdout} {p.stderr}"):
        return
    made = Tokenizer.from_file(out)
    texts = [t for t in hft.CORPUS if "<|endoftext|>" not in t] + hft.TRAIN_TEXT
    bad = [t for t in texts if made.encode(t).ids != plain.encode(t).ids]
    check(not bad and len(json.load(open(out))["model"]["merges"]) == len(merges),
          f"the tokenizer.json made from the llm.c file encodes {len(texts) - len(bad)} of {len(texts)} texts to the "
          f"original's ids, with its {len(merges)} merges (first differing: {bad[:1]})")
    check(made.decode(made.encode("<|endoftext|>x").ids, skip_special_tokens=False) == "<|endoftext|>x" and
          made.encode("<|endoftext|>").ids == [vocab["<|endoftext|>"]], "its end-of-text token is special")


def test_llama(tmp):
    d = os.path.join(tmp, "llama")
    tok = hft.make_llama(d, 420)
    path = os.path.join(d, "tokenizer.json")
    got = compare("Llama (SentencePiece style)", path, lambda t: tok.encode(t).ids, tmp)
    fallback = sum(1 for g in got if isinstance(g, list) for i in g if tok.id_to_token(i).startswith("<0x"))
    check(fallback > 20, f"the corpus takes the byte fallback ({fallback} byte tokens)")
    check(all(isinstance(g, list) and g[:1] == [1] for g in got), "every text starts with <s>")
    from transformers import AutoTokenizer
    for bos, eos in ((True, False), (False, False), (True, True)):
        hft.make_llama(d, 420, add_bos=bos, add_eos=eos)
        at = AutoTokenizer.from_pretrained(d)
        compare(f"Llama: transformers' AutoTokenizer, add_bos_token {bos}, add_eos_token {eos}", path,
                lambda t: at(t)["input_ids"], tmp)
    for scheme, split in (("always", True), ("first", False), ("first", True), ("never", True)):
        def metaspace(j):
            j["normalizer"] = None
            j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}
        p = os.path.join(tmp, f"ms_{scheme}_{split}.json")
        t = hft.edit_json(path, p, metaspace)
        compare(f"Llama with Metaspace (prepend_scheme {scheme}, split {split})", p, lambda x: t.encode(x).ids, tmp)


def test_unicode_table():
    import unicodedata
    with open(os.path.join(ROOT, "llmc", "io", "unicode_table.cpp"), encoding="utf-8") as f:
        src = f.read()
    if f'"{unicodedata.unidata_version}"' not in src:
        print(f"(the table's Unicode version differs from this Python's {unicodedata.unidata_version}: not compared)")
        return
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_unicode_table.py"), "--check"],
                       capture_output=True, text=True)
    check(p.returncode == 0, "llmc/io/unicode_table.cpp: " + p.stdout.strip())


def main():
    if not os.path.exists(DUMP):
        check(False, "build/dump_rows is built (make tests)")
        return check.summary()
    tmp = tempfile.mkdtemp(prefix="test_tokenize_")
    try:
        test_splits(tmp)
        path, tok = test_bytelevel(tmp)
        test_llmc_file(tmp, path, tok)
        test_llama(tmp)
        test_decode(tmp, path)
        test_unicode_table()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
