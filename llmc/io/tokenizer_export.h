// llmc/io/tokenizer_export.h: a tokenizer.json (the Hugging Face `tokenizers`
// format) for a tokenizer that has none: an llm.c tokenizer file or the
// byte-level tokenizer of the embedded dataset, so that an exported
// directory loads in AutoTokenizer. Its tokens become a byte-level BPE, as
// GPT-2's own tokenizer.json is: each token's bytes written through GPT-2's
// bytes->unicode table, ByteLevel pre-tokenizer (GPT-2's split pattern),
// decoder and post-processor, the end-of-text token an added special
// token, and the merges those of the tiktoken rule the C++ encoder applies
// to such a file (llmc/io/bpe.h: merge the pair whose concatenation is the
// token of lowest id): token i's merge is the last step of that rule run on
// its own bytes over the tokens below i. So the file encodes text to the
// same ids (text that holds the end-of-text token's own characters aside,
// which the llm.c file never makes special).
#pragma once
#include <string>

class Tokenizer;

// The tokenizer.json text of tok (loaded from an llm.c file or init_bytes),
// or false with *why: a vocabulary that is not a byte-level BPE (a byte
// without its own token, two tokens with the same bytes, a token that no
// merge of lower tokens makes).
bool tokenizer_json_of(const Tokenizer& tok, std::string* text, std::string* why);
