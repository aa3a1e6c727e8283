#!/usr/bin/env python3
"""scripts/gpu/llmq_tokens.py: this trainer's token shard as llm.q's token file.

llm.q (https://github.com/IST-DASLab/llmq, src/training/dataloader.cpp and
scripts/tokenize_data.py) reads "BIN.TOK" files: a 1024-byte header, the
8 bytes "BIN.TOK\\n" then int32 [version=2, bytes_per_token=4, n_tokens,
vocab_size, has_masks=0], the rest of the header unused; then n_tokens
little-endian int32 tokens. This trainer's shard (scripts/shards.py) has a
1024-byte header too, then uint32 tokens for vocabularies over 65536 (a
Qwen2.5 shard: the same bytes, only the header differs) or uint16 ones
(widened here). The tokens are copied unchanged, in chunks.

  usage: scripts/gpu/llmq_tokens.py SHARD OUT [--vocab V] [--head N]
    --vocab V  the vocabulary size written into the header (llm.q refuses a
               file whose vocabulary is larger than the model's); default:
               the largest token + 1
    --head N   only the first N tokens (a small evaluation file: llm.q
               evaluates the whole of it at the end of a run)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import numpy as np  # noqa: E402
import shards  # noqa: E402  (scripts/shards.py)

MAGIC = b"BIN.TOK\n"
HEADER_BYTES = 1024


def read_llmq_header(path):
    """(version, bytes_per_token, n_tokens, vocab_size, has_masks), checked as llm.q checks them."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:8] != MAGIC:
        raise ValueError(f"{path}: not a BIN.TOK file")
    return tuple(int(x) for x in np.frombuffer(head[8:28], dtype="<i4"))


def convert(shard, out, vocab=None, head=None, chunk=1 << 24):
    arr = shards.read_shard(shard)
    n = arr.size if head is None else min(head, arr.size)
    if vocab is None:
        vocab = int(arr[:n].max()) + 1
    if n >= 2**31 or vocab >= 2**31:
        raise ValueError(f"{shard}: {n} tokens, vocab {vocab}: llm.q's header holds int32")
    header = bytearray(HEADER_BYTES)
    header[:8] = MAGIC
    header[8:28] = np.array([2, 4, n, vocab, 0], dtype="<i4").tobytes()
    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for i in range(0, n, chunk):
                part = arr[i:min(n, i + chunk)]
                if part.size and int(part.max()) >= vocab:
                    raise ValueError(f"{shard}: token {int(part.max())} outside the vocab of {vocab}")
                f.write(part.astype("<i4").tobytes())
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return n, vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shard")
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--head", type=int)
    a = ap.parse_args()
    n, vocab = convert(a.shard, a.out, a.vocab, a.head)
    print(f"{a.out}: {n} tokens, vocab {vocab} (llm.q BIN.TOK v2)")


if __name__ == "__main__":
    main()
