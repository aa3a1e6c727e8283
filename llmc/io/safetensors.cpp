// llmc/io/safetensors.cpp: see safetensors.h. The header is JSON, parsed with
// nlohmann-json.
#include "llmc/io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "llmc/base/fileio.h"

using json = nlohmann::json;

// The reference implementation refuses headers past 100 MB; so do we (a
// bigger length is a corrupt file, not a model).
static constexpr uint64_t kMaxHeader = 100ull << 20;
static constexpr size_t kChunkBytes = 8u << 20;  // read and convert in pieces of this size

uint64_t StTensor::numel() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
}

size_t st_dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
}

bool st_dtype_readable(const std::string& d) { return d == "F32" || d == "F64" || d == "BF16" || d == "F16"; }

const char* st_dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::I32: return "I32";
    }
    return "?";
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);  // infinity or NaN
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
    } else if (man == 0) {
        u = sign;  // zero
    } else {       // subnormal: man * 2^-24, exact in fp32
        float f = std::ldexp((float)man, -24);
        std::memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, infinity
    if (a >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504: infinity
    if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero) of fp16
        const float mag = std::fabs(f) * 16777216.0f;  // in units of 2^-24, exact
        return sign | (uint16_t)std::nearbyint(mag);   // round to nearest even (default mode)
    }
    // Normal: drop 13 mantissa bits with round to nearest even.
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

static std::string where(const std::string& path) { return "safetensors file " + path + ": "; }

std::string st_shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); i++) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

bool SafetensorsFile::open(const std::string& path, std::string* err) {
    path_ = path;
    tensors_.clear();
    index_.clear();
    metadata_.clear();
    const std::string w = where(path);
    const long long size = file_size(path);
    if (size < 0) {
        *err = w + "cannot open";
        return false;
    }
    if (size < 8) {
        *err = w + "truncated: " + std::to_string(size) + " bytes, less than the 8-byte header length";
        return false;
    }
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = w + "cannot open: " + std::strerror(errno);
        return false;
    }
    unsigned char nb[8];
    bool ok = std::fread(nb, 1, 8, f) == 8;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | nb[i];
    if (ok && (n < 2 || n > kMaxHeader || n > (uint64_t)size - 8)) {
        std::fclose(f);
        *err = w + "bad header length " + std::to_string(n) + " (the file has " + std::to_string(size) + " bytes)";
        return false;
    }
    std::string text(ok ? n : 0, '\0');
    ok = ok && std::fread(&text[0], 1, n, f) == n;
    std::fclose(f);
    if (!ok) {
        *err = w + "cannot read the header";
        return false;
    }
    json h;
    try {
        h = json::parse(text);
    } catch (const json::exception& e) {
        std::string m = e.what();
        std::replace(m.begin(), m.end(), '\n', ' ');
        *err = w + "header is not valid JSON (" + m + ")";
        return false;
    }
    if (!h.is_object()) {
        *err = w + "header is not a JSON object";
        return false;
    }
    data_start_ = 8 + n;
    const uint64_t data_bytes = (uint64_t)size - data_start_;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string& name = it.key();
        const json& v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) {
                *err = w + "__metadata__ is not an object";
                return false;
            }
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string()) {
                    *err = w + "__metadata__ value of '" + m.key() + "' is not a string";
                    return false;
                }
                metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const std::string tw = w + "tensor " + name + ": ";
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
            *err = tw + "entry needs dtype, shape and data_offsets";
            return false;
        }
        StTensor t;
        t.name = name;
        const json &dt = v["dtype"], &sh = v["shape"], &off = v["data_offsets"];
        if (!dt.is_string() || st_dtype_size(dt.get<std::string>()) == 0) {
            *err = tw + "unknown dtype " + dt.dump();
            return false;
        }
        t.dtype = dt.get<std::string>();
        if (!sh.is_array()) {
            *err = tw + "shape is not an array";
            return false;
        }
        // The element count, with overflow caught: a lying shape must not wrap.
        uint64_t numel = 1;
        bool overflow = false;
        for (const json& d : sh) {
            if (!d.is_number_unsigned()) {
                *err = tw + "shape " + sh.dump() + " holds something other than non-negative integers";
                return false;
            }
            const uint64_t x = d.get<uint64_t>();
            t.shape.push_back(x);
            if (x && numel > UINT64_MAX / x) overflow = true;
            numel *= x;
        }
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
            *err = tw + "data_offsets " + off.dump() + " is not [begin, end]";
            return false;
        }
        t.begin = off[0].get<uint64_t>();
        t.end = off[1].get<uint64_t>();
        if (t.begin > t.end) {
            *err = tw + "data_offsets " + off.dump() + " end before begin";
            return false;
        }
        if (t.end > data_bytes) {
            *err = tw + "data_offsets " + off.dump() + " run past the end of the file (" + std::to_string(data_bytes) +
                   " bytes of data after the header; truncated?)";
            return false;
        }
        const size_t es = st_dtype_size(t.dtype);
        if (overflow || numel > UINT64_MAX / es || numel * es != t.end - t.begin) {
            *err = tw + "shape " + st_shape_text(t.shape) + " of " + t.dtype + " needs " +
                   (overflow ? std::string("more than 2^64") : std::to_string(numel) + " x " + std::to_string(es)) +
                   " bytes, but data_offsets " + off.dump() + " span " + std::to_string(t.end - t.begin);
            return false;
        }
        index_[name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }
    // No two tensors may share bytes (empty tensors take none).
    std::vector<const StTensor*> by_begin;
    for (const StTensor& t : tensors_)
        if (t.end > t.begin) by_begin.push_back(&t);
    std::sort(by_begin.begin(), by_begin.end(),
              [](const StTensor* a, const StTensor* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_begin.size(); i++) {
        if (by_begin[i]->begin < by_begin[i - 1]->end) {
            *err = w + "tensor " + by_begin[i]->name + ": data_offsets [" + std::to_string(by_begin[i]->begin) + ", " +
                   std::to_string(by_begin[i]->end) + "] overlap tensor " + by_begin[i - 1]->name + "'s [" +
                   std::to_string(by_begin[i - 1]->begin) + ", " + std::to_string(by_begin[i - 1]->end) + "]";
            return false;
        }
    }
    return true;
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

bool SafetensorsFile::read(const StTensor& t, void* out, DType dt, std::string* err) const {
    const std::string tw = where(path_) + "tensor " + t.name + ": ";
    if (!st_dtype_readable(t.dtype)) {
        *err = tw + "dtype " + t.dtype + " is not a floating type this reader converts (F32, F64, BF16, F16)";
        return false;
    }
    if (dt != DType::F32 && dt != DType::F64 && dt != DType::BF16) {
        *err = tw + "cannot convert to " + dtype_name(dt);
        return false;
    }
    FILE* f = std::fopen(path_.c_str(), "rb");
    if (!f) {
        *err = tw + "cannot open: " + std::strerror(errno);
        return false;
    }
    const size_t es = st_dtype_size(t.dtype);
    const uint64_t n = t.numel();
    bool ok = fseeko(f, (off_t)(data_start_ + t.begin), SEEK_SET) == 0;
    std::vector<unsigned char> raw;
    std::vector<float> f32;
    const uint64_t chunk = kChunkBytes / es;
    for (uint64_t i = 0; ok && i < n; i += chunk) {
        const size_t k = (size_t)std::min<uint64_t>(chunk, n - i);
        raw.resize(k * es);
        if (std::fread(raw.data(), 1, raw.size(), f) != raw.size()) {
            ok = false;
            break;
        }
        void* dst = elem_ptr(out, dt, i);
        if (t.dtype == "F16") {  // dtype.h has no fp16: through fp32, which holds every fp16 exactly
            f32.resize(k);
            const uint16_t* h = reinterpret_cast<const uint16_t*>(raw.data());
            for (size_t j = 0; j < k; j++) f32[j] = f16_to_f32(h[j]);
            convert_host(dst, dt, f32.data(), DType::F32, k);
        } else {
            const DType st = t.dtype == "F32" ? DType::F32 : t.dtype == "F64" ? DType::F64 : DType::BF16;
            convert_host(dst, dt, raw.data(), st, k);
        }
    }
    std::fclose(f);
    if (!ok) {
        *err = tw + "short read (the file is truncated or changed while reading)";
        return false;
    }
    return true;
}

// ---- writer --------------------------------------------------------------------------------------

bool SafetensorsWriter::open(const std::string& path, const std::vector<Entry>& entries,
                             const std::map<std::string, std::string>& metadata, std::string* err) {
    path_ = path;
    tmp_ = path + ".tmp." + std::to_string((long long)getpid());
    entries_ = entries;
    sizes_.clear();
    next_ = 0;
    json h = json::object();
    if (!metadata.empty()) {
        json m = json::object();
        for (const auto& kv : metadata) m[kv.first] = kv.second;
        h["__metadata__"] = m;
    }
    uint64_t off = 0;
    for (const Entry& e : entries) {
        const size_t es = st_dtype_size(e.dtype);
        if (es == 0) {
            *err = where(path) + "tensor " + e.name + ": unknown dtype " + e.dtype;
            return false;
        }
        if (e.name == "__metadata__" || h.contains(e.name)) {
            *err = where(path) + "tensor " + e.name + ": name used twice";
            return false;
        }
        uint64_t n = 1;
        for (uint64_t d : e.shape) n *= d;
        sizes_.push_back(n * es);
        h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + n * es}}};
        off += n * es;
    }
    std::string text = h.dump();
    // Pad with spaces so the data starts 8-byte aligned (as the reference
    // writer does): readers may then map tensors in place.
    while ((8 + text.size()) % 8) text += ' ';
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) {
        *err = "cannot write " + tmp_ + ": " + std::strerror(errno);
        return false;
    }
    unsigned char nb[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; i++) nb[i] = (unsigned char)(n >> (8 * i));
    if (std::fwrite(nb, 1, 8, f_) != 8 || std::fwrite(text.data(), 1, text.size(), f_) != text.size()) {
        *err = "cannot write " + tmp_ + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

bool SafetensorsWriter::write(const void* data, size_t bytes, std::string* err) {
    if (!f_ || next_ >= entries_.size()) {
        *err = where(path_) + "more tensors written than declared";
        return false;
    }
    const Entry& e = entries_[next_];
    if (bytes != sizes_[next_]) {
        *err = where(path_) + "tensor " + e.name + ": " + std::to_string(bytes) + " bytes given, its shape needs " +
               std::to_string(sizes_[next_]);
        return false;
    }
    next_++;
    if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) {
        *err = "cannot write " + tmp_ + ": " + std::strerror(errno);
        return false;
    }
    return true;
}

bool SafetensorsWriter::commit(std::string* err) {
    if (!f_) {
        *err = where(path_) + "commit of an unopened file";
        return false;
    }
    if (next_ != entries_.size()) {
        *err = where(path_) + "tensor " + entries_[next_].name + " declared but not written";
        return false;
    }
    bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    ok = std::fclose(f_) == 0 && ok;
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        *err = "cannot write " + path_ + ": " + std::strerror(errno);
        std::remove(tmp_.c_str());
        return false;
    }
    return true;
}

SafetensorsWriter::~SafetensorsWriter() {
    if (f_) {
        std::fclose(f_);
        std::remove(tmp_.c_str());
    }
}
