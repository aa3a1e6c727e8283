// llmc/io/checkpoint_legacy.cpp: the earlier one-file checkpoint format
// (llmc/io/checkpoint_legacy.h).
#include "llmc/io/checkpoint_legacy.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "llmc/base/fileio.h"

std::string legacy_state_path(const std::string& dir, int step) {
    char name[32];
    std::snprintf(name, sizeof(name), "state_%08d.bin", step);
    return dir + "/" + name;
}

static bool read_state_header(const std::string& path, int* h, std::string* err) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = "checkpoint " + path + ": cannot open";
        return false;
    }
    bool ok = std::fread(h, 4, kHeaderInts, f) == (size_t)kHeaderInts;
    std::fclose(f);
    if (!ok) {
        *err = "checkpoint " + path + ": truncated header";
        return false;
    }
    if (h[0] != kStateMagic || h[1] != 1) {
        *err = "checkpoint " + path + ": bad magic/version " + std::to_string(h[0]) + "/" + std::to_string(h[1]);
        return false;
    }
    return true;
}

static GPTConfig header_config(const int* h) {
    GPTConfig c;
    c.max_seq_len = h[5];
    c.vocab_size = h[6];
    c.num_layers = h[7];
    c.num_heads = h[8];
    c.channels = h[9];
    c.padded_vocab_size = h[10];
    return c;
}

static bool float_dtype(int t) { return t == (int)DType::F32 || t == (int)DType::F64 || t == (int)DType::BF16; }

bool load_legacy_state(const std::string& path, GPT& model, TrainState* st, std::string* err) {
    int h[kHeaderInts];
    if (!read_state_header(path, h, err)) return false;
    if (header_config(h) != model.config()) {
        *err = "checkpoint " + path + ": shape " + config_string(header_config(h)) + " does not match the model " +
               config_string(model.config());
        return false;
    }
    if (!float_dtype(h[3]) || !float_dtype(h[4])) {
        *err = "checkpoint " + path + ": bad dtype fields";
        return false;
    }
    DType wt = (DType)h[3], ot = (DType)h[4];
    size_t P = model.table().file_params;
    long long expect = kHeaderInts * 4LL + (long long)(P * (dtype_size(wt) + 2 * dtype_size(ot)));
    if (file_size(path) != expect) {
        *err = "checkpoint " + path + ": size " + std::to_string(file_size(path)) + " bytes, expected " +
               std::to_string(expect) + " (truncated or corrupt)";
        return false;
    }
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f || std::fseek(f.get(), kHeaderInts * 4, SEEK_SET) != 0) {
        *err = "checkpoint " + path + ": cannot read";
        return false;
    }
    std::vector<char> buf(P * dtype_size(wt));
    bool ok = std::fread(buf.data(), 1, buf.size(), f.get()) == buf.size();
    if (ok) model.set_weights_file_order(buf.data(), wt);
    buf.resize(P * dtype_size(ot));
    const Precision& p = model.precision();
    ok = ok && std::fread(buf.data(), 1, buf.size(), f.get()) == buf.size();
    if (ok) model.set_file_order(model.adam_m(), model.sharding().optimizer, p.opt, buf.data(), ot);
    ok = ok && std::fread(buf.data(), 1, buf.size(), f.get()) == buf.size();
    if (ok) model.set_file_order(model.adam_v(), model.sharding().optimizer, p.opt, buf.data(), ot);
    if (!ok) {
        *err = "checkpoint " + path + ": cannot read payload";
        return false;
    }
    st->step = h[2];
    st->rng_state = get_u64(h, 11);
    st->rows_consumed = get_u64(h, 13);
    return true;
}

bool read_legacy_config(const std::string& path, GPTConfig* cfg, std::string* err) {
    int h[kHeaderInts];
    if (!read_state_header(path, h, err)) return false;
    GPTConfig c = header_config(h);
    std::string why;
    if (!validate_config(c, &why)) {
        *err = "checkpoint " + path + ": bad shape: " + why;
        return false;
    }
    *cfg = c;
    return true;
}
