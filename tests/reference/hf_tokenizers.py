# tests/reference/hf_tokenizers.py: tokenizers made here with the `tokenizers`
# package (run with build/hfenv/bin/python), shared by the tests that check
# the C++ encoder and decoder against it (test_tokenize.py, test_generate.py,
# test_hf.py), and the texts they encode:
#   make_bytelevel   a byte-level BPE (GPT-2's scheme: ByteLevel with GPT-2's
#                    split pattern) with <|endoftext|>, or the same vocabulary
#                    split with Llama 3's pattern;
#   make_llama       a SentencePiece-style Llama tokenizer as transformers'
#                    LlamaConverter writes one (normalizer: Prepend U+2581,
#                    Replace " " -> U+2581; no pre-tokenizer; BPE with
#                    byte_fallback <0xNN> tokens, unk fused; <s> first from the
#                    post-processor), with a tokenizer_config.json for
#                    LlamaTokenizerFast;
#   write_llmc       a vocabulary as an llm.c tokenizer file.
import json
import os
import struct

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Texts to encode: prose, code, numbers, white space of every kind (runs,
# trailing, newlines, Unicode spaces), contractions, accented Latin, Greek,
# Cyrillic, CJK, emoji (with joiners and modifiers), combining marks, digits
# of other scripts, and special tokens inside text.
CORPUS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "",
    " ", "a", "  leading", "trailing spaces   ", "a  b   c    d", "\n\n\nnewlines\n", "tabs\t\tand\r\nwindows\r\n",
    "   \n  \n", "mixed \t \n\t end", "x \n y", "\r\r\n\n \r", " \n",
    "def f(x):\n    return x**2 + 1  # square\n\tif (a && b) { c->d[i] = 0x1F; }\n",
    "for (int i = 0; i < n; ++i) sum += a[i] * b[i];  // dot",
    "In 2024, 3.14159 and 1,000,000 people; 12345678901234 tokens, 007 and -42.",
    "I'm sure you'll see they've we're it's he'd don't", "I'M SHOUTING, THEY'LL WE'RE IT'S", "'s'll'd're've'm't",
    "rock'n'roll 'twas", "l'été", "'ſ 'ſt", "IT'ST 'ſt", "'ſt", "x'ſt y'S", "O'Neil's",
    "café naïve résumé façade Ångström Øre Straße", "e\u0301 cafe\u0301 n\u0303",
    "Ελληνικά: γεια σου κόσμε", "Привет, мир! Как дела?", "日本語のテキストと中文文本，还有标点。", "한국어 텍스트",
    "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷", "mixed: Привет мир, hello 世界 123 ٣٤٥ १२३ Ⅻ ½ ²",
    "nbsp\u00a0here", "ideographic\u3000space", "line\u2028sep\u2029para", "nel\u0085x", "zwsp\u200bx",
    "mongolian\u180ex", "\x1c\x1dcontrol\x1f", "em\u2003space\u2003 x", "\u00a0\u00a0lead",
    "before<|endoftext|>after", "<|endoftext|><|endoftext|>", "a <|endoftext|> b", "x<|endoftext", "<|endoftext|>",
    "<s>hello</s> <unk>", " <s> x",
    "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun. "
    "One day, she saw a big, red ball!\n\nShe said, \"Can I play?\" Her mom smiled: 'Yes, you can.'\n",
]

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. Überall “quotes” — and ünïcödé, 日本語 too.\n",
    "Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park.\n",
    "def main():\n    for i in range(10):\n        print(i, i * 2)  # numbers 0123456789\n",
    "I'm happy you're here; they'll say it's fine and we've done what he'd do.\n",
    "Γεια σου κόσμε. Привет мир. 你好，世界。café résumé naïve.\n",
    # Characters whose class decides the split (White_Space or not, letter
    # or not): merges across them make a wrong class show in the ids.
    "nbsp\u00a0here ideographic\u3000space \x1c\x1dctl\x1f\x1c zw\u200bsp em\u2003space mongolian\u180ex "
    "\u2028\u0085x ſ 'ſ 'ſt 'ſt IT'ST IT'ST ½² ٣٤٥\n",
]


def make_bytelevel(path, vocab_size, texts=None, repeat=50):
    """A byte-level BPE (GPT-2's scheme) trained here, with <|endoftext|> (id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((texts or TRAIN_TEXT) * repeat, trainer)
    tok.save(path)
    return tok


def edit_json(src, dst, edit):
    """tokenizer.json src, changed by edit(dict), saved as dst; returns tokenizers' Tokenizer of it."""
    from tokenizers import Tokenizer
    with open(src, encoding="utf-8") as f:
        j = json.load(f)
    edit(j)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return Tokenizer.from_file(dst)


def split_then_bytelevel(pattern):
    """The pre-tokenizer of Llama 3's files: Split(pattern, Isolated), then ByteLevel without its own split."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def make_llama(d, vocab_size, add_bos=True, add_eos=False):
    """A SentencePiece-style Llama tokenizer in directory d (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    os.makedirs(d, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT * 50, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    tok.save(os.path.join(d, "tokenizer.json"))
    # As Llama's converted files: the byte tokens are vocabulary entries, not added tokens.
    edit_json(os.path.join(d, "tokenizer.json"), os.path.join(d, "tokenizer.json"),
              lambda j: j.update(added_tokens=[a for a in j["added_tokens"] if not a["content"].startswith("<0x")]))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": add_bos, "add_eos_token": add_eos, "legacy": True}, f)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def byte_decoder():
    """GPT-2's byte-level alphabet, code point -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def write_llmc(path, token_bytes, eot):
    """An llm.c tokenizer file (version 2): header, then per token a length byte and its bytes."""
    header = [20240328, 2, len(token_bytes), eot] + [0] * 252
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for t in token_bytes:
            f.write(bytes([len(t)]) + t)
