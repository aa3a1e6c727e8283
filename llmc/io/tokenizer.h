// llmc/io/tokenizer.h: Tokenizer, for printing samples and generated text.
//
// The trainer never encodes text (the shards hold token ids already); it
// turns sampled ids back into bytes. Only a byte-level vocabulary encodes
// (train_gpt --generate's prompt): BPE merges are not implemented, so other
// tokenizers take the prompt as ids. Two sources:
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
//   init_bytes()  the byte-level tokenizer of the embedded dataset: ids
//                 0..255 are the bytes themselves, 256 is EOT (vocab 257).
#pragma once
#include <string>
#include <vector>

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
    int eot() const { return eot_; }
    int vocab_size() const { return (int)tokens_.size(); }

    // Whether encode() can work: every byte has a one-byte token (the
    // byte-level tokenizer, or a file or tokenizer.json that holds exactly
    // such a vocabulary besides its special tokens). A vocabulary with longer
    // tokens would need its BPE merges to encode as it was trained.
    bool can_encode() const;
    // text -> ids (each byte its token); false with *err when !can_encode().
    bool encode(const std::string& text, std::vector<int>* ids, std::string* err) const;

    // s with bytes that could upset a terminal written as \xNN: control
    // characters other than newline and tab, DEL, and bytes that are not part
    // of valid UTF-8 (GPT-2 tokens often hold half a character). Printable
    // ASCII and complete UTF-8 characters pass through.
    static std::string printable(const std::string& s);

private:
    std::vector<std::string> tokens_;
    int eot_ = -1;
    std::string eot_text_;  // what decode(eot) prints
};

// Writes the byte-level tokenizer (vocab 257, EOT 256) in the llm.c file
// format, through a temporary file renamed into place.
bool write_byte_tokenizer(const std::string& path, std::string* err);
