// llmc/checkpoint.cpp: see checkpoint.h.
#include "checkpoint.h"

#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "fileio.h"
#include "model_io.h"

std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%08d%s", kind, step, std::strcmp(kind, "DONE") == 0 ? "" : ".bin");
    return dir + "/" + name;
}

static void put_u64(int* h, int at, uint64_t x) {
    h[at] = (int)(uint32_t)(x & 0xffffffffu);
    h[at + 1] = (int)(uint32_t)(x >> 32);
}
static uint64_t get_u64(const int* h, int at) { return (uint64_t)(uint32_t)h[at] | ((uint64_t)(uint32_t)h[at + 1] << 32); }

void gather_file_order(GPT& model, Comm& world, const void* buf, bool sharded, DType buf_t, void* host, DType t,
                       bool whole_owner, bool replicated_owner) {
    const size_t P = model.table().file_params;
    std::memset(host, 0, P * dtype_size(t));
    if (sharded || whole_owner)
        model.get_file_order(host, t, buf, sharded, buf_t, replicated_owner ? GPT::Tensors::all : GPT::Tensors::split);
    if (world.size() == 1) return;
    Backend& be = model.backend();
    CommCounts saved = world.counts();
    void* tmp = be.alloc(P * dtype_size(t));
    be.upload(tmp, t, host, t, P);
    world.all_reduce(tmp, P, t, ReduceOp::Sum);
    be.download(host, t, tmp, t, P);
    be.release(tmp);
    world.counts() = saved;
}

bool write_checkpoint(const std::string& dir, const CheckpointData& d, const TrainState& st, std::string* err) {
    if (!make_dirs(dir, err)) return false;
    const GPTConfig& c = d.cfg;
    if (!write_model_file(checkpoint_path(dir, "model", st.step), c, d.weights, d.weights_dtype, d.model_version, err))
        return false;
    int h[kHeaderInts] = {0};
    h[0] = kStateMagic;
    h[1] = 1;
    h[2] = st.step;
    h[3] = (int)d.weights_dtype;
    h[4] = (int)d.opt_dtype;
    h[5] = c.max_seq_len;
    h[6] = c.vocab_size;
    h[7] = c.num_layers;
    h[8] = c.num_heads;
    h[9] = c.channels;
    h[10] = c.padded_vocab_size;
    put_u64(h, 11, st.rng_state);
    put_u64(h, 13, st.rows_consumed);
    size_t P = gpt2_param_count(c);
    AtomicWriter w;
    if (!w.open(checkpoint_path(dir, "state", st.step), err)) return false;
    w.write(h, sizeof(h));
    w.write(d.weights, P * dtype_size(d.weights_dtype));
    w.write(d.m, P * dtype_size(d.opt_dtype));
    w.write(d.v, P * dtype_size(d.opt_dtype));
    if (!w.commit(err)) return false;
    AtomicWriter done;
    if (!done.open(checkpoint_path(dir, "DONE", st.step), err)) return false;
    return done.commit(err);
}

bool save_checkpoint(const std::string& dir, GPT& model, const TrainState& st, std::string* err) {
    if (model.sharding().optimizer || model.sharding().params)
        throw std::logic_error("save_checkpoint: buffers are sharded; gather them and call write_checkpoint");
    const Precision& p = model.precision();
    size_t P = model.table().file_params;
    std::vector<char> w(P * dtype_size(model.weights_dtype())), m(P * dtype_size(p.opt)), v(P * dtype_size(p.opt));
    model.get_file_order(w.data(), model.weights_dtype(), model.weights(), false, model.weights_dtype());
    model.get_file_order(m.data(), p.opt, model.adam_m(), false, p.opt);
    model.get_file_order(v.data(), p.opt, model.adam_v(), false, p.opt);
    CheckpointData d{model.config(), w.data(), model.weights_dtype(), m.data(), v.data(), p.opt,
                     p.param == DType::BF16 ? 5 : 3};
    return write_checkpoint(dir, d, st, err);
}

int latest_checkpoint(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (!d) return -1;
    int best = -1;
    while (dirent* e = readdir(d)) {
        int s = -1;
        char tail = 0;
        if (std::sscanf(e->d_name, "DONE_%d%c", &s, &tail) == 1 && s > best) best = s;
    }
    closedir(d);
    return best;
}

// Reads and validates the header of state_S.bin.
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

bool read_checkpoint_config(const std::string& dir, int step, GPTConfig* cfg, std::string* err) {
    int h[kHeaderInts];
    std::string path = checkpoint_path(dir, "state", step);
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

bool load_checkpoint(const std::string& dir, int step, GPT& model, TrainState* st, std::string* err) {
    std::string path = checkpoint_path(dir, "state", step);
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
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f || std::fseek(f, kHeaderInts * 4, SEEK_SET) != 0) {
        if (f) std::fclose(f);
        *err = "checkpoint " + path + ": cannot read";
        return false;
    }
    std::vector<char> buf(P * dtype_size(wt));
    bool ok = std::fread(buf.data(), 1, buf.size(), f) == buf.size();
    if (ok) model.set_weights_file_order(buf.data(), wt);
    buf.resize(P * dtype_size(ot));
    const Precision& p = model.precision();
    ok = ok && std::fread(buf.data(), 1, buf.size(), f) == buf.size();
    if (ok) model.set_file_order(model.adam_m(), model.sharding().optimizer, p.opt, buf.data(), ot);
    ok = ok && std::fread(buf.data(), 1, buf.size(), f) == buf.size();
    if (ok) model.set_file_order(model.adam_v(), model.sharding().optimizer, p.opt, buf.data(), ot);
    std::fclose(f);
    if (!ok) {
        *err = "checkpoint " + path + ": cannot read payload";
        return false;
    }
    st->step = h[2];
    st->rng_state = get_u64(h, 11);
    st->rows_consumed = get_u64(h, 13);
    return true;
}
