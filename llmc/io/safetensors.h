// llmc/io/safetensors.h: reading and writing safetensors files (the format of
// Hugging Face checkpoints, docs/design.md section 9):
//   8 bytes    little-endian uint64 N, the header's length;
//   N bytes    JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
//              "__metadata__": {string: string}} (padded with spaces);
//   the rest   the tensors' raw little-endian bytes; offsets are relative to
//              the end of the header.
// The reader checks everything the header promises before any tensor is
// used (offsets inside the file, no two tensors overlapping, byte ranges that
// match shape x dtype, known dtypes) and reads one tensor at a time, in
// chunks, converting to the host type asked for; it never holds the whole
// file. Every error is one line naming the file and, where there is one, the
// tensor.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "llmc/base/dtype.h"

struct StTensor {
    std::string name;
    std::string dtype;             // "F32", "BF16", "F16", "F64", or another safetensors dtype
    std::vector<uint64_t> shape;
    uint64_t begin = 0, end = 0;   // byte range, relative to the end of the header
    uint64_t numel() const;
};

// Bytes per element of a safetensors dtype name, or 0 when the name is not
// one the format defines.
size_t st_dtype_size(const std::string& dtype);
// Whether read() converts this dtype (the floating types weights come in).
bool st_dtype_readable(const std::string& dtype);
// "[2, 3]": a shape for messages.
std::string st_shape_text(const std::vector<uint64_t>& shape);
// The safetensors name of a DType ("F32", "F64", "BF16"); I32 is "I32".
const char* st_dtype_name(DType t);

class SafetensorsFile {
  public:
    // Reads and checks the header. False with a one-line *err naming the file
    // (and the tensor at fault).
    bool open(const std::string& path, std::string* err);
    const std::string& path() const { return path_; }
    const std::vector<StTensor>& tensors() const { return tensors_; }
    const StTensor* find(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // Reads a tensor of this file into out, numel() elements of host type dt
    // (F32, F64 or BF16), converting from the file's F32, F64, BF16 or F16.
    bool read(const StTensor& t, void* out, DType dt, std::string* err) const;

  private:
    std::string path_;
    uint64_t data_start_ = 0;  // 8 + N
    std::vector<StTensor> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file tensor by tensor: the header (every name, dtype
// and shape, given up front, laid out in that order) first, then each
// tensor's bytes in the same order through write(). The file appears under
// its name only on commit() (a temporary file renamed into place).
class SafetensorsWriter {
  public:
    struct Entry {
        std::string name;
        std::string dtype;  // "F32", "F64", "BF16", "F16", ...
        std::vector<uint64_t> shape;
    };
    bool open(const std::string& path, const std::vector<Entry>& entries,
              const std::map<std::string, std::string>& metadata, std::string* err);
    // The next tensor's raw little-endian bytes (exactly its size).
    bool write(const void* data, size_t bytes, std::string* err);
    bool commit(std::string* err);
    ~SafetensorsWriter();

  private:
    std::string path_, tmp_;
    FILE* f_ = nullptr;
    std::vector<Entry> entries_;
    std::vector<uint64_t> sizes_;
    size_t next_ = 0;
};

// fp16 (IEEE binary16) <-> fp32.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even; overflow to infinity
