// llmc/io/checkpoint_format.h: the inside of a checkpoint shard that its
// writer (llmc/io/checkpoint.cpp) and its reader (llmc/io/checkpoint_read.cpp)
// share: the pieces (runs of model-file elements) its tables list, and the
// checksum trailer that follows the payload. The file layout itself is in
// llmc/io/checkpoint.h.
#pragma once
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// `count` runs of `len` elements starting at file offset `off`, `stride`
// apart. Runs a rank owns come one per row for column slices (tp), so
// consecutive runs of the same length at a fixed distance coalesce.
struct Piece {
    uint64_t off, len, stride, count;
};

// ---- checksums: one FNV-1a 64 per piece and section ------------------------------------------
// A shard's payload is its sections (weights, Adam m, Adam v), each the
// pieces' elements in piece order. Hashing the bytes as they stream by,
// switching to the next hash at each piece's end, gives one checksum per
// (section, piece); they follow the payload as a trailer (kTrailerMagic,
// their count, the hashes), and the load recomputes them, so a changed byte
// is found and named by its shard, section and tensor.
constexpr uint64_t kTrailerMagic = 0x6c6c6d632d73756dull;  // "llmc-sum"

// The byte length of every (section, piece) of a shard, in payload order.
inline std::vector<uint64_t> piece_bytes(const std::vector<Piece>& w, const std::vector<Piece>& o, size_t ws,
                                         size_t os) {
    std::vector<uint64_t> b;
    for (const Piece& p : w) b.push_back(p.len * p.count * ws);
    for (int k = 0; k < 2; k++)
        for (const Piece& p : o) b.push_back(p.len * p.count * os);
    return b;
}

// Whether a path is a directory (a checkpoint's, ckpt_SSSSSSSS).
inline bool is_dir(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
