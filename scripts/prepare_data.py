#!/usr/bin/env python3
"""scripts/prepare_data.py: turns your own text into train/val token shards.

The trainer reads llm.c token shards (scripts/shards.py has the format). This
script tokenizes text files into them, so any corpus can be trained on:

  prepare_data.py --input FILE [FILE ...] --out DIR --name NAME
                  [--tokenizer bytes|gpt2|FILE.json] [--val-fraction 0.01]
                  [--shard-tokens 100000000] [--split-blank-lines | --jsonl]
                  [--overwrite]

Documents: each input file is one document; with --split-blank-lines every
run of lines between blank lines is one; with --jsonl every line of the
input is a JSON object whose "text" field is one (--jsonl-field to change).
Each document is marked as its tokenizer's convention says, so the model
sees where one text ends and the next begins:
  - a tokenizer whose post-processor opens a text with a start token
    (Llama's <s>, Llama 3's <|begin_of_text|>): that start, the text, and
    its end-of-sequence token (tokenizer_config.json's eos_token beside the
    file, else the first of </s>, <|end_of_text|>, <|endoftext|>,
    <|im_end|> it has), so the model learns to stop;
  - otherwise (GPT-2, bytes, Qwen2): the end-of-text token before each
    document, as in llm.c's shards (it ends the one before).
The shards' headers record the ids that open and end a document
(scripts/shards.py); train_gpt takes them for --document-mask and
--eot-token.

Tokenizers:
  bytes  byte-level: ids 0..255 are the bytes, EOT = 256, vocab 257. Needs
         nothing. Also writes DIR/tokenizer.bin for decoding samples.
  gpt2   GPT-2 BPE through the `tiktoken` package (pip install tiktoken),
         EOT = 50256, vocab 50257; also writes DIR/tokenizer.bin (GPT-2).
  FILE.json  a Hugging Face tokenizer.json (a Llama or GPT-2 checkpoint's)
         through the `tokenizers` package (pip install tokenizers; the
         build/hfenv of scripts/setup.sh has it); documents as above; the
         vocabulary counts added tokens. The file is copied to
         DIR/tokenizer.json for train_gpt --tokenizer.

Shards hold uint16 tokens (magic 20240520) while the vocabulary fits, and
uint32 tokens (magic 20240801, version 7) past 65536 ids, as llm.c does.

Split: the first --val-fraction of the documents (at least one) go to
NAME_val_000000.bin, ..., the rest to NAME_train_000001.bin, ... (the llm.c
naming). A single document is split by tokens instead: its first fraction is
the validation text. Each shard holds at most --shard-tokens tokens.

Preparing a real corpus (on a machine with internet access):

  TinyShakespeare (1 MB):
    curl -L -o input.txt \\
      https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
    python3 scripts/prepare_data.py --input input.txt --out data/shakespeare \\
      --name shakespeare --tokenizer gpt2 --split-blank-lines
    (or --tokenizer bytes for a character-level model with no dependency)
  then train on data/shakespeare/shakespeare_train_*.bin and validate on
  data/shakespeare/shakespeare_val_*.bin.

  FineWeb (any number of documents; pip install datasets tiktoken):
    python3 - <<'EOF'
    import itertools, json
    from datasets import load_dataset
    ds = load_dataset("HuggingFaceFW/fineweb", name="sample-10BT", split="train", streaming=True)
    with open("fineweb.jsonl", "w") as f:
        for doc in itertools.islice(ds, 1_000_000):   # ~1B tokens
            f.write(json.dumps({"text": doc["text"]}) + "\\n")
    EOF
    python3 scripts/prepare_data.py --jsonl --input fineweb.jsonl --out data/fineweb \\
      --name fineweb --tokenizer gpt2 --val-fraction 0.01
  Shards made by llm.c's own dev/data scripts are read as they are.

Memory stays bounded by one shard plus one document, so large corpora work.
"""
import argparse
import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shards import write_shard  # noqa: E402  (first: it explains a missing numpy)

import numpy as np  # noqa: E402

TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2


def fail(msg):
    print(f"prepare_data: {msg}", file=sys.stderr)
    sys.exit(1)


def iter_documents(paths, split_blank_lines, jsonl, field):
    """Yield each non-empty document as bytes, in input order."""
    for path in paths:
        if jsonl:
            with open(path, "rb") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)[field]
                    except (ValueError, KeyError, TypeError) as e:
                        fail(f"{path}:{lineno}: not a JSON object with a '{field}' field ({e})")
                    doc = text.encode("utf-8")
                    if doc.strip():
                        yield doc
        elif split_blank_lines:
            with open(path, "rb") as f:
                lines = []
                for line in f:
                    if line.strip():
                        lines.append(line)
                    elif lines:
                        yield b"".join(lines)
                        lines = []
                if lines:
                    yield b"".join(lines)
        else:
            with open(path, "rb") as f:
                doc = f.read()
            if doc.strip():
                yield doc


class ByteTokenizer:
    name, vocab_size, eot = "bytes", 257, 256
    start, end = None, 256  # the end-of-text token before each document ends the one before

    def document(self, doc):
        return np.concatenate([np.array([self.eot], dtype=np.uint32), self.encode(doc)])

    def encode(self, doc):
        return np.frombuffer(doc, dtype=np.uint8).astype(np.uint32)

    def token_bytes(self):
        return [bytes([b]) for b in range(256)] + [b"<|endoftext|>"]


class Gpt2Tokenizer:
    name, vocab_size, eot = "gpt2", 50257, 50256
    start, end = None, 50256
    document = ByteTokenizer.document

    def __init__(self):
        try:
            import tiktoken
        except ImportError:
            fail("--tokenizer gpt2 needs the 'tiktoken' Python package, which is not installed.\n"
                 "  Install it (pip install tiktoken; it downloads the GPT-2 vocabulary on first use)\n"
                 "  or use --tokenizer bytes, which needs nothing.")
        self.enc = tiktoken.get_encoding("gpt2")

    def encode(self, doc):
        # errors="replace": a stray invalid byte must not stop a long run.
        return np.asarray(self.enc.encode_ordinary(doc.decode("utf-8", errors="replace")), dtype=np.uint32)

    def token_bytes(self):
        return [self.enc.decode_single_token_bytes(i) for i in range(self.vocab_size)]


class JsonTokenizer:
    """A Hugging Face tokenizer.json through the `tokenizers` package."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail("--tokenizer FILE.json needs the 'tokenizers' Python package, which is not installed.\n"
                 "  Install it (pip install tokenizers) or run with build/hfenv/bin/python (scripts/setup.sh).")
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the package raises its own exception types
            fail(f"--tokenizer {path}: not a tokenizer.json ({e})")
        self.path, self.name = path, os.path.basename(path)
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        # The post-processor's own marks: what encoding with them adds
        # before and after a text (Llama: <s> before).
        plain = self.tok.encode("a", add_special_tokens=False).ids
        full = self.tok.encode("a", add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
        self.prefix, self.suffix = full[:at], full[at + len(plain):]
        # The end-of-sequence token: tokenizer_config.json's, else a known name.
        eos = None
        cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
        if os.path.isfile(cfg):
            try:
                e = json.load(open(cfg, encoding="utf-8")).get("eos_token")
                eos = vocab.get(e.get("content") if isinstance(e, dict) else e)
            except (ValueError, AttributeError):
                eos = None
        if eos is None:
            eos = next((vocab[t] for t in ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>") if t in vocab), None)
        if self.prefix:
            # A start token opens each document; the end-of-sequence token ends it.
            self.start, self.end = self.prefix[0], eos
            self.eot = self.prefix[0]
        else:
            self.eot = next((vocab[t] for t in ("<|endoftext|>", "<|begin_of_text|>", "<s>") if t in vocab), eos)
            self.start, self.end = None, self.eot
        if self.eot is None:
            fail(f"--tokenizer {path}: none of <|endoftext|>, <|begin_of_text|>, <s> is a token and no "
                 "end-of-sequence token is named (a document separator is needed)")

    def document(self, doc):
        ids = self.encode(doc)
        if self.start is None:
            return np.concatenate([np.array([self.eot], dtype=np.uint32), ids])
        tail = list(self.suffix)
        if self.end is not None and self.end not in tail:
            tail.append(self.end)
        return np.concatenate([np.asarray(self.prefix, dtype=np.uint32), ids, np.asarray(tail, dtype=np.uint32)])

    def encode(self, doc):
        ids = self.tok.encode(doc.decode("utf-8", errors="replace"), add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.uint32)


def write_tokenizer(path, tokens, eot):
    """The llm.c tokenizer file: header, then per token a uint8 length and its bytes."""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2], header[3] = TOKENIZER_MAGIC, TOKENIZER_VERSION, len(tokens), eot
    body = bytearray()
    for i, t in enumerate(tokens):
        if not 1 <= len(t) <= 255:
            fail(f"token {i} has {len(t)} bytes; the tokenizer format allows 1..255")
        body.append(len(t))
        body += t
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(bytes(body))
    os.replace(tmp, path)


class ShardWriter:
    """Cuts a token stream into shards of exactly shard_tokens (the last may be shorter)."""

    def __init__(self, out, name, split, first_index, shard_tokens, vocab_size, doc_start=None, doc_end=None):
        self.out, self.name, self.split = out, name, split
        self.doc_start, self.doc_end = doc_start, doc_end
        self.index, self.shard_tokens, self.vocab_size = first_index, shard_tokens, vocab_size
        self.parts, self.count = [], 0
        self.paths, self.total = [], 0

    def add(self, toks):
        while toks.size:
            take = min(toks.size, self.shard_tokens - self.count)
            self.parts.append(toks[:take])
            self.count += take
            toks = toks[take:]
            if self.count == self.shard_tokens:
                self.flush()

    def flush(self):
        if self.count == 0:
            return
        path = os.path.join(self.out, f"{self.name}_{self.split}_{self.index:06d}.bin")
        write_shard(path, np.concatenate(self.parts), self.vocab_size, self.doc_start, self.doc_end)
        print(f"  {path}: {self.count} tokens")
        self.paths.append(path)
        self.total += self.count
        self.index += 1
        self.parts, self.count = [], 0


def main():
    ap = argparse.ArgumentParser(description="Tokenize text files into llm.c train/val shards.")
    ap.add_argument("--input", nargs="+", required=True, metavar="FILE", help="text files (or JSONL with --jsonl)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    ap.add_argument("--name", required=True, help="shard name prefix: NAME_train_000001.bin, NAME_val_000000.bin")
    ap.add_argument("--tokenizer", default="bytes", help="bytes, gpt2, or a Hugging Face tokenizer.json")
    ap.add_argument("--val-fraction", type=float, default=0.01)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--split-blank-lines", action="store_true", help="blank lines separate documents")
    mode.add_argument("--jsonl", action="store_true", help="each input line is a JSON object; its text is a document")
    ap.add_argument("--jsonl-field", default="text", help="the JSON field holding the text (default: text)")
    ap.add_argument("--overwrite", action="store_true", help="delete this NAME's existing shards in DIR first")
    args = ap.parse_args()

    if not 0.0 <= args.val_fraction < 1.0:
        fail(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.shard_tokens < 1 or args.shard_tokens >= 2**31:
        fail(f"--shard-tokens must be in [1, 2^31), got {args.shard_tokens}")
    if not args.name or os.sep in args.name or any(c in args.name for c in "*?["):
        fail(f"bad --name '{args.name}'")
    for path in args.input:
        if not os.path.isfile(path):
            fail(f"input '{path}' is not a readable file")

    if args.tokenizer == "gpt2":
        tok = Gpt2Tokenizer()
    elif args.tokenizer == "bytes":
        tok = ByteTokenizer()
    elif args.tokenizer.endswith(".json") and os.path.isfile(args.tokenizer):
        tok = JsonTokenizer(args.tokenizer)
    else:
        fail(f"--tokenizer '{args.tokenizer}': bytes, gpt2, or an existing tokenizer.json file")
    os.makedirs(args.out, exist_ok=True)

    # Old shards of the same name would join the new ones in a glob.
    old = sorted(glob.glob(os.path.join(glob.escape(args.out), glob.escape(args.name) + "_train_*.bin")) +
                 glob.glob(os.path.join(glob.escape(args.out), glob.escape(args.name) + "_val_*.bin")))
    if old and not args.overwrite:
        fail(f"{len(old)} shard(s) named '{args.name}' already in '{args.out}' (e.g. {old[0]}); "
             "pass --overwrite to replace them or choose another --name")
    for path in old:
        os.remove(path)

    def docs():
        return iter_documents(args.input, args.split_blank_lines, args.jsonl, args.jsonl_field)

    # First pass counts documents, so the split is known before writing.
    ndocs = sum(1 for _ in docs())
    if ndocs == 0:
        fail("the input holds no text")

    train = ShardWriter(args.out, args.name, "train", 1, args.shard_tokens, tok.vocab_size, tok.start, tok.end)
    val = ShardWriter(args.out, args.name, "val", 0, args.shard_tokens, tok.vocab_size, tok.start, tok.end)
    marks = (f"<{tok.start}> opens a document, <{tok.end}> ends it" if tok.start is not None
             else f"<{tok.end}> before each document")
    print(f"prepare_data: {ndocs} document(s), tokenizer {tok.name}; {marks}")

    if ndocs == 1 and args.val_fraction > 0:
        # One document: its tokens split, each half marked as a document.
        toks = tok.encode(next(iter(docs())))
        if toks.size < 2:
            fail("the single document is too short to split into train and val")
        k = min(toks.size - 1, max(1, round(args.val_fraction * toks.size)))
        head = tok.document(b"")  # the marks around an empty text
        n_pre = len(getattr(tok, "prefix", [])) if tok.start is not None else 1
        for writer, part in ((val, toks[:k]), (train, toks[k:])):
            writer.add(np.concatenate([head[:n_pre], part, head[n_pre:]]))
        val_docs = 1
    else:
        val_docs = 0 if args.val_fraction == 0 else min(ndocs - 1, max(1, round(args.val_fraction * ndocs)))
        for i, doc in enumerate(docs()):
            (val if i < val_docs else train).add(tok.document(doc))
    val.flush()
    train.flush()

    if isinstance(tok, JsonTokenizer):
        tok_path = os.path.join(args.out, "tokenizer.json")
        if os.path.abspath(tok_path) != os.path.abspath(tok.path):
            shutil.copyfile(tok.path, tok_path)
    else:
        tok_path = os.path.join(args.out, "tokenizer.bin")
        write_tokenizer(tok_path, tok.token_bytes(), tok.eot)

    print(f"prepare_data: train {train.total} tokens in {len(train.paths)} shard(s), "
          f"val {val.total} tokens in {len(val.paths)} shard(s) ({val_docs} document(s)), vocab {tok.vocab_size}")
    print(f"  train: {os.path.join(args.out, args.name + '_train_*.bin')}")
    if val.paths:
        print(f"  val:   {os.path.join(args.out, args.name + '_val_*.bin')}")
    print(f"  tokenizer: {tok_path}")


if __name__ == "__main__":
    main()
