"""scripts/shards.py: reading and writing llm.c token shards from Python.

A shard is a header of 256 little-endian int32 followed by the tokens:
  [0]=20240520 [1]=1 [2]=count, then count uint16 tokens   (vocab <= 65536)
  [0]=20240801 [1]=7 [2]=count, then count uint32 tokens   (larger vocabs)
  [3]=1 + the id that opens a document (<s>), 0: none or not recorded
  [4]=1 + the id that ends one (</s>, GPT-2's <|endoftext|>), 0: the same
llm.c leaves [3..255] zero and never reads them. This is the format
llmc/io/dataloader.cpp reads (see docs/design.md section 1).

write_shard picks the narrowest format the vocabulary allows and writes
through a temporary file renamed into place, so a reader (or a crash) never
sees half a shard. read_shard validates a header the way the C++ loader does.
"""
import os
import sys

try:
    import numpy as np
except ImportError:  # say what to do instead of a bare traceback
    sys.exit("shards.py needs numpy: install python3-numpy (Debian: /usr/bin/python3 has it) or pip install numpy")

MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


def write_shard(path, tokens, vocab_size, doc_start=None, doc_end=None):
    """Write tokens (any integer sequence) as a shard; ids must be < vocab_size.
    doc_start, doc_end: the ids that open and end a document, recorded in the
    header (None: not recorded)."""
    toks = np.asarray(tokens)
    if toks.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {toks.shape}")
    if toks.size == 0:
        raise ValueError(f"{path}: a shard needs at least one token")
    if toks.size >= 2**31:
        raise ValueError(f"{path}: {toks.size} tokens do not fit the int32 count of the header")
    if not np.issubdtype(toks.dtype, np.integer):
        raise ValueError(f"{path}: tokens must be integers, got {toks.dtype}")
    if vocab_size <= 0 or vocab_size > 2**32:
        raise ValueError(f"{path}: bad vocab size {vocab_size}")
    lo, hi = int(toks.min()), int(toks.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{path}: token ids span [{lo}, {hi}], outside the vocab of {vocab_size}")
    if vocab_size <= 2**16:
        magic, version, dtype = MAGIC_U16, VERSION_U16, "<u2"
    else:
        magic, version, dtype = MAGIC_U32, VERSION_U32, "<u4"
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = magic, version, toks.size
    for slot, tid in ((3, doc_start), (4, doc_end)):
        if tid is not None:
            if not 0 <= tid < vocab_size:
                raise ValueError(f"{path}: document token {tid} outside the vocab of {vocab_size}")
            header[slot] = tid + 1
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(toks.astype(dtype).tobytes())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_shard(path):
    """Return the tokens of a shard as a numpy array (uint16 or uint32)."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: short header: file has {size} bytes, a header needs {HEADER_BYTES}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic == MAGIC_U16:
        want_version, dtype, width = VERSION_U16, "<u2", 2
    elif magic == MAGIC_U32:
        want_version, dtype, width = VERSION_U32, "<u4", 4
    else:
        raise ValueError(f"{path}: bad magic {magic} (expected {MAGIC_U16} or {MAGIC_U32})")
    if version != want_version:
        raise ValueError(f"{path}: wrong version {version} for magic {magic} (expected {want_version})")
    if count <= 0:
        raise ValueError(f"{path}: token count {count} in header")
    expected = HEADER_BYTES + count * width
    if size != expected:
        what = "truncated" if size < expected else "trailing bytes"
        raise ValueError(f"{path}: {what}: file has {size} bytes, expected {expected}")
    return np.fromfile(path, dtype=dtype, count=count, offset=HEADER_BYTES)


def read_doc_ids(path):
    """The (start, end) document ids a shard's header records (None where none)."""
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    return tuple(int(header[i]) - 1 if header[i] > 0 else None for i in (3, 4))
