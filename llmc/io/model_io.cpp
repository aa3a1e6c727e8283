// llmc/io/model_io.cpp: read and write llm.c model files.
#include "llmc/io/model_io.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

#include "llmc/base/fileio.h"

bool read_model_header(const std::string& path, GPTConfig* cfg, int* version, std::string* err) {
    long long size = file_size(path);
    if (size < 0) {
        *err = "model file " + path + ": cannot open";
        return false;
    }
    if (size < (long long)kHeaderInts * 4) {
        *err = "model file " + path + ": truncated header (" + std::to_string(size) + " bytes)";
        return false;
    }
    int h[kHeaderInts];
    FILE* f = std::fopen(path.c_str(), "rb");
    bool ok = f && std::fread(h, 4, kHeaderInts, f) == (size_t)kHeaderInts;
    if (f) std::fclose(f);
    if (!ok) {
        *err = "model file " + path + ": cannot read header";
        return false;
    }
    if (h[0] != kModelMagic) {
        *err = "model file " + path + ": bad magic " + std::to_string(h[0]) + " (expected " +
               std::to_string(kModelMagic) + ")";
        return false;
    }
    if (h[1] != 3 && h[1] != 5) {
        *err = "model file " + path + ": unsupported version " + std::to_string(h[1]) + " (expected 3 or 5)";
        return false;
    }
    GPTConfig c;
    c.max_seq_len = h[2];
    c.vocab_size = h[3];
    c.num_layers = h[4];
    c.num_heads = h[5];
    c.channels = h[6];
    c.padded_vocab_size = h[7];
    std::string why;
    if (!validate_config(c, &why)) {
        *err = "model file " + path + ": bad header: " + why;
        return false;
    }
    size_t bytes = model_param_count(c) * (h[1] == 3 ? 4 : 2);
    if ((unsigned long long)size != kHeaderInts * 4ull + bytes) {
        *err = "model file " + path + ": size " + std::to_string(size) + " bytes, header promises " +
               std::to_string(kHeaderInts * 4ull + bytes) + " (truncated or corrupt)";
        return false;
    }
    *cfg = c;
    *version = h[1];
    return true;
}

// The name of the tensor holding element i of a model file's payload, and
// the element's index within it.
static std::string tensor_at(const GPTConfig& c, size_t i) {
    const TensorTable whole(c);
    for (const TensorEntry& e : whole.entries) {
        const size_t n = e.file_rows * e.file_cols;
        if (i >= e.file_offset && i < e.file_offset + n)
            return e.name() + " (element " + std::to_string(i - e.file_offset) + ")";
    }
    return "element " + std::to_string(i);
}

bool check_finite(const std::string& what, const GPTConfig& c, const void* host, DType t, size_t n, std::string* err) {
    for (size_t i = 0; i < n; i++) {
        double x = t == DType::F64 ? static_cast<const double*>(host)[i]
                   : t == DType::F32 ? static_cast<const float*>(host)[i]
                                     : bf16_to_f32(static_cast<const uint16_t*>(host)[i]);
        if (!std::isfinite(x)) {
            *err = what + ": tensor " + tensor_at(c, i) + " is " + (std::isnan(x) ? "NaN" : "infinite");
            return false;
        }
    }
    return true;
}

bool load_model(const std::string& path, GPT& model, std::string* err) {
    GPTConfig c;
    int version = 0;
    if (!read_model_header(path, &c, &version, err)) return false;
    if (c != model.config()) {
        *err = "model file " + path + ": shape " + config_string(c) + " does not match the model " +
               config_string(model.config());
        return false;
    }
    DType t = version == 3 ? DType::F32 : DType::BF16;
    size_t P = model.table().file_params;
    std::vector<char> buf(P * dtype_size(t));
    FILE* f = std::fopen(path.c_str(), "rb");
    bool ok = f && std::fseek(f, kHeaderInts * 4, SEEK_SET) == 0 && std::fread(buf.data(), 1, buf.size(), f) == buf.size();
    if (f) std::fclose(f);
    if (!ok) {
        *err = "model file " + path + ": cannot read parameters";
        return false;
    }
    if (!check_finite("model file " + path, c, buf.data(), t, P, err)) return false;
    model.set_weights_file_order(buf.data(), t);
    return true;
}

std::vector<int> model_file_header(const GPTConfig& c, int version) {
    std::vector<int> h(kHeaderInts, 0);
    h[0] = kModelMagic;
    h[1] = version;
    h[2] = c.max_seq_len;
    h[3] = c.vocab_size;
    h[4] = c.num_layers;
    h[5] = c.num_heads;
    h[6] = c.channels;
    h[7] = c.padded_vocab_size;
    return h;
}

bool write_model_file(const std::string& path, const GPTConfig& c, const void* host, DType t, int version,
                      std::string* err) {
    const std::vector<int> h = model_file_header(c, version);
    DType ft = version == 5 ? DType::BF16 : DType::F32;
    size_t P = model_param_count(c);
    std::vector<char> buf(P * dtype_size(ft));
    convert_host(buf.data(), ft, host, t, P);
    AtomicWriter w;
    if (!w.open(path, err)) return false;
    w.write(h.data(), h.size() * sizeof(int));
    w.write(buf.data(), buf.size());
    return w.commit(err);
}

bool save_model(const std::string& path, GPT& model, int version, std::string* err) {
    if (model.weights_sharded()) throw std::logic_error("save_model: weights are sharded; gather them first");
    std::vector<char> host(model.table().file_params * dtype_size(model.weights_dtype()));
    model.get_file_order(host.data(), model.weights_dtype(), model.weights(), false, model.weights_dtype());
    return write_model_file(path, model.config(), host.data(), model.weights_dtype(), version, err);
}

bool export_model(const std::string& path, GPT& model, const Ownership& own, int version, std::string* err) {
    const int rank = own.world ? own.world->rank() : 0;
    const GPTConfig& c = model.config();
    const DType wt = model.weights_dtype(), ft = version == 5 ? DType::BF16 : DType::F32;
    AtomicWriter f;
    bool ok = true;
    if (rank == 0) {
        const std::vector<int> h = model_file_header(c, version);
        ok = f.open(path, err) && f.write(h.data(), h.size() * sizeof(int));
    }
    if (!all_ranks_ok(ok, err)) return false;
    // The whole model's tensors in file order, one at a time: every rank
    // writes what it owns of the tensor into a zeroed buffer, a sum over the
    // world assembles it (each element has one owner), rank 0 appends it.
    const TensorTable whole(c);
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : whole.entries) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](const TensorEntry* x, const TensorEntry* y) { return x->file_offset < y->file_offset; });
    std::vector<char> out;
    WeightGather gather(model, own);
    for (const TensorEntry* e : order) {
        const size_t n = e->file_rows * e->file_cols;
        const std::vector<char>& host = gather.gather(e->file_offset, n);
        if (rank == 0 && ok) {
            out.resize(n * dtype_size(ft));
            convert_host(out.data(), ft, host.data(), wt, n);
            ok = f.write(out.data(), out.size());
        }
    }
    if (rank == 0) {
        if (!ok && err->empty()) *err = "cannot write " + path;
        ok = ok ? f.commit(err) : false;
    }
    return all_ranks_ok(ok, err);
}
