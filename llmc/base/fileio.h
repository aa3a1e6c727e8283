// llmc/base/fileio.h: small file helpers shared by model, checkpoint and state
// files: reading a 256-int32 header with a size check, and atomic writes
// (write a temporary file in the same directory, fsync, rename), so a crash
// never leaves a half-written file under the final name.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

constexpr int kHeaderInts = 256;

// Size of a file in bytes, or -1 when it cannot be opened.
long long file_size(const std::string& path);

// A whole file's bytes into *out; false when it cannot be opened.
bool read_text(const std::string& path, std::string* out);

// An output file that appears under its final name only on commit().
class AtomicWriter {
  public:
    // Returns false (with *err) when the temporary file cannot be created.
    bool open(const std::string& path, std::string* err);
    bool write(const void* data, size_t bytes);
    // Flushes, syncs and renames; false with *err on any failure.
    bool commit(std::string* err);
    ~AtomicWriter();  // removes the temporary file if not committed

  private:
    std::string path_, tmp_;
    FILE* f_ = nullptr;
    bool ok_ = true;
};

bool make_dirs(const std::string& dir, std::string* err);
