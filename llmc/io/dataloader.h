// llmc/io/dataloader.h: DataLoader, the reader of llm.c token shards.
//
// A shard is a 1024-byte header of 256 little-endian int32 followed by its
// tokens: [0]=20240520 [1]=1 for uint16 tokens, or [0]=20240801 [1]=7 for
// uint32 tokens; [2]=number of tokens. The shards named by a path or a glob,
// sorted by name, form one token stream. Row i of that stream is the T+1
// tokens starting at position i*T (rows overlap by one token); its first T
// tokens are the inputs and its last T the targets. Positions wrap: after
// the last token of the last shard comes the first token of the first.
//
// The loader holds no position: the trainer says which rows a step uses, so a
// checkpoint needs nothing from here and every data-parallel layout can read
// exactly the rows it owns. Headers are validated at open(); tokens are read
// on demand with pread (shards can be many GB) and checked against the vocab
// size as they are read.
//
// Not thread-safe: read_rows() updates the cache of open file descriptors.
// Use one DataLoader per thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

class DataLoader {
public:
    DataLoader() = default;
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;
    DataLoader(DataLoader&& other) noexcept;
    DataLoader& operator=(DataLoader&& other) noexcept;

    // Finds the shards (a path, or a glob(3) pattern; matches sorted by name)
    // and validates every header. T is the sequence length, vocab_size the
    // bound every token id must stay below. On failure returns false, leaves
    // the loader closed and sets *err to a one-line message naming the file.
    bool open(const std::string& pattern, int T, int vocab_size, std::string* err);
    void close();
    bool is_open() const { return !shards_.empty(); }

    // Rows first_row .. first_row+nrows-1: inputs[r*T + t] and
    // targets[r*T + t] for r < nrows, t < T. Any first_row is valid (the
    // stream wraps). Returns false with *err set on an I/O error or a token
    // id >= vocab_size (the message names the shard and the token's offset in
    // it); the outputs are then unspecified.
    bool read_rows(size_t first_row, int nrows, int* inputs, int* targets, std::string* err);

    // n consecutive tokens of the stream starting at position pos (taken
    // modulo total_tokens()), with the same checks as read_rows.
    bool read_tokens(size_t pos, size_t n, int* out, std::string* err);

    // What identifies the data, for ranks to compare (they must train on the
    // same stream): shard count, tokens, and an FNV-1a digest of every
    // shard's token count and width and of its first and last 256 tokens.
    // Returns false with *err set when those tokens cannot be read.
    bool fingerprint(std::string* out, std::string* err);

    // Reads every token of the shards whose index i has i % parts == part
    // (ranks split the work: each reads 1/parts of the data once, at start)
    // and checks each id is below the vocab size, so that a bad id stops the
    // run before the first step rather than when the stream reaches it.
    // Shards of uint16 tokens under a vocabulary of 65536 or more cannot
    // hold one and are not read. Returns false with *err naming the shard,
    // the token's offset and its id.
    bool check_ids(size_t part, size_t parts, std::string* err);

    // The document tokens the first shard's header records (scripts/shards.py:
    // header[3] = 1 + the id that opens a document, header[4] = 1 + the id
    // that ends one; llm.c leaves them 0): -1 where none is recorded.
    int doc_start() const { return doc_start_; }
    int doc_end() const { return doc_end_; }
    // How many of the first n tokens of the stream equal id (n capped at
    // the stream), or -1 with *err on a read error.
    long long count_id(int id, size_t n, std::string* err);

    size_t total_tokens() const { return total_tokens_; }
    size_t rows_per_epoch() const { return T_ > 0 ? total_tokens_ / (size_t)T_ : 0; }
    const std::vector<std::string>& files() const { return files_; }
    int seq_len() const { return T_; }
    int vocab_size() const { return vocab_size_; }

private:
    struct Shard {
        std::string path;
        size_t num_tokens = 0;
        size_t token_bytes = 0;    // 2 (uint16) or 4 (uint32)
        size_t stream_start = 0;   // stream position of its first token
        int fd = -1;               // cached descriptor, -1 when closed
        uint64_t last_use = 0;     // for evicting the least recently used fd
    };

    // Many shards can exceed the process's descriptor limit, so at most this
    // many stay open; the least recently used is closed to make room.
    static constexpr int kMaxOpenFds = 64;
    // Bytes read per pread, so a huge request never needs a huge buffer.
    static constexpr size_t kChunkBytes = size_t(1) << 20;

    bool ensure_open(size_t shard, std::string* err);
    void close_fd(Shard& s);
    size_t shard_at(size_t pos) const;
    bool read_from_shard(size_t shard, size_t offset, size_t n, int* out, std::string* err);

    std::vector<Shard> shards_;
    std::vector<std::string> files_;
    size_t total_tokens_ = 0;
    int T_ = 0;
    int vocab_size_ = 0;
    int doc_start_ = -1, doc_end_ = -1;
    int open_fds_ = 0;
    uint64_t use_clock_ = 0;
    std::vector<unsigned char> bytes_;  // raw chunk buffer
    std::vector<int> span_;             // the nrows*T+1 tokens of read_rows
};
