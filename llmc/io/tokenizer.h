// llmc/io/tokenizer.h: Tokenizer, for printing samples and generated text.
//
// The trainer turns sampled ids back into bytes (the shards hold token ids
// already); train_gpt --generate encodes its text prompt with encode(), a
// BpeEncoder (llmc/io/bpe.h) built from the same file. Two sources:
//   load()        an llm.c tokenizer file: 256 little-endian int32 header,
//                 [0]=20240328 [1]=2 [2]=vocab size [3]=EOT id, then per
//                 token a uint8 length and that many bytes. Version 1 has no
//                 EOT field; GPT-2's 50256 is assumed.
//   load() of a   a Hugging Face tokenizer.json (a name ending in .json, or
//   JSON file     a file starting with '{'): model.vocab maps token strings
//                 to ids (an array of [token, score] for Unigram models),
//                 added_tokens add more (decoded as their content). With a
//                 ByteLevel decoder or pre-tokenizer (GPT-2, Llama 3) token
//                 strings are GPT-2's bytes->unicode table applied to the
//                 bytes, and are mapped back; otherwise (SentencePiece
//                 style) U+2581 is a space and <0xNN> a byte. The start
//                 token eot() is the first of <|endoftext|>,
//                 <|begin_of_text|>, <s> present (else id 0).
//                 Encoding follows the file's normalizer, pre-tokenizer,
//                 merges and post-processor where bpe.h implements them
//                 (GPT-2, Llama 3 and SentencePiece-style Llama files); for
//                 a Llama tokenizer_config.json beside it, its add_bos_token
//                 and add_eos_token, as transformers. An llm.c file encodes
//                 as tiktoken encodes GPT-2 (bpe.cpp, from_token_bytes).
//   init_bytes()  the byte-level tokenizer of the embedded dataset: ids
//                 0..255 are the bytes themselves, 256 is EOT (vocab 257).
#pragma once
#include <memory>
#include <string>
#include <vector>

class BpeEncoder;

class Tokenizer {
public:
    // On failure returns false, sets *err to a one-line message naming the
    // file, and leaves the tokenizer as it was.
    bool load(const std::string& path, std::string* err);
    void init_bytes();
    bool load_json(const std::string& path, std::string* err);

    // The bytes of one token; EOT -> "<|endoftext|>" (a tokenizer.json: the
    // start token's own text), an id outside the
    // vocabulary (or any id before load/init) -> "<?>".
    std::string decode(int id) const;
    // The text of a sequence of ids, as Hugging Face's tokenizers decode it
    // (special tokens kept): the tokens' bytes joined, as valid UTF-8. A
    // SentencePiece-style file's byte-fallback tokens (<0xNN>) join into
    // characters run by run, a run that is not UTF-8 giving one U+FFFD per
    // byte (its ByteFallback decoder), and a Strip step after Fuse takes its
    // leading spaces off the text; byte-level text (GPT-2, Llama 3, an llm.c
    // file, the byte tokenizer) with each ill-formed sequence (a maximal
    // subpart, as Python's errors="replace") as one U+FFFD.
    std::string decode_text(const std::vector<int>& ids) const;
    int eot() const { return eot_; }
    int vocab_size() const { return (int)tokens_.size(); }

    // Whether encode() can work: an llm.c file where every byte has a token,
    // or a tokenizer.json whose every encoding step is implemented.
    bool can_encode() const;
    // text (UTF-8) -> ids, with the post-processor's special tokens (Llama's
    // <s>) unless !with_special; false with *err (one line: why this
    // tokenizer does not encode, or the text is not UTF-8).
    bool encode(const std::string& text, std::vector<int>* ids, std::string* err, bool with_special = true) const;

    // s with bytes that could upset a terminal written as \xNN: control
    // characters other than newline and tab, DEL, and bytes that are not part
    // of valid UTF-8 (GPT-2 tokens often hold half a character). Printable
    // ASCII and complete UTF-8 characters pass through.
    static std::string printable(const std::string& s);

private:
    std::vector<std::string> tokens_;
    std::vector<char> byte_token_;  // per id: a byte-fallback token (<0xNN> of a SentencePiece-style file)
    int strip_start_ = 0;           // leading spaces a Strip decoder step takes off the text
    int eot_ = -1;
    std::string eot_text_;  // what decode(eot) prints
    std::shared_ptr<const BpeEncoder> bpe_;  // null: cannot encode, no_encode_ says why
    std::string no_encode_;
    void set_encoder_from_bytes(const std::string& where);
};

// Writes the byte-level tokenizer (vocab 257, EOT 256) in the llm.c file
// format, through a temporary file renamed into place.
bool write_byte_tokenizer(const std::string& path, std::string* err);
