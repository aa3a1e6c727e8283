// llmc/tensors.cpp: builds the tensor table from a model config.
#include "tensors.h"

#include <cstdio>
#include <stdexcept>

static const ParamKind kKinds[] = {
    {Param::wte, "wte", false, true},          {Param::wpe, "wpe", false, true},
    {Param::ln1w, "ln1w", true, false},        {Param::ln1b, "ln1b", true, false},
    {Param::qkvw, "qkvw", true, true},         {Param::qkvb, "qkvb", true, false},
    {Param::attprojw, "attprojw", true, true}, {Param::attprojb, "attprojb", true, false},
    {Param::ln2w, "ln2w", true, false},        {Param::ln2b, "ln2b", true, false},
    {Param::fcw, "fcw", true, true},           {Param::fcb, "fcb", true, false},
    {Param::fcprojw, "fcprojw", true, true},   {Param::fcprojb, "fcprojb", true, false},
    {Param::lnfw, "lnfw", false, false},       {Param::lnfb, "lnfb", false, false},
};
static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == (size_t)Param::count, "one ParamKind per Param");

const ParamKind& param_kind(Param p) { return kKinds[(int)p]; }

std::string TensorEntry::name() const {
    const ParamKind& k = param_kind(kind);
    if (!k.per_layer) return k.name;
    return "h" + std::to_string(layer) + "." + k.name;
}

// Shape of one tensor of a kind (per layer for block tensors).
static void kind_shape(const GPTConfig& c, Param p, size_t* rows, size_t* cols) {
    size_t C = c.channels, Vp = c.padded_vocab_size, T = c.max_seq_len;
    switch (p) {
        case Param::wte: *rows = Vp; *cols = C; return;
        case Param::wpe: *rows = T; *cols = C; return;
        case Param::qkvw: *rows = 3 * C; *cols = C; return;
        case Param::qkvb: *rows = 3 * C; *cols = 1; return;
        case Param::attprojw: *rows = C; *cols = C; return;
        case Param::fcw: *rows = 4 * C; *cols = C; return;
        case Param::fcb: *rows = 4 * C; *cols = 1; return;
        case Param::fcprojw: *rows = C; *cols = 4 * C; return;
        default: *rows = C; *cols = 1; return;  // LayerNorm weights/biases, C-sized biases
    }
}

TensorTable::TensorTable(const GPTConfig& c, int nshards) : cfg(c), shards(nshards) {
    if (nshards < 1) throw std::invalid_argument("tensor table: shards must be >= 1");
    const int L = c.num_layers, K = (int)Param::count;
    index_.assign((size_t)K * L, -1);
    // File offsets: tensor-major, each per-layer kind stacked over L.
    std::vector<size_t> kind_file_offset(K);
    size_t foff = 0;
    for (int k = 0; k < K; k++) {
        size_t r, cl;
        kind_shape(c, (Param)k, &r, &cl);
        kind_file_offset[k] = foff;
        foff += r * cl * (kKinds[k].per_layer ? L : 1);
    }
    // Memory: unit-major, each unit padded to a multiple of the shard count.
    auto close_unit = [&]() {
        size_t begin = unit_begin.back();
        unit_used.push_back(total - begin);
        size_t padded = (total - begin + nshards - 1) / nshards * nshards;
        shard_begin.push_back(shard_total);
        shard_total += padded / nshards;
        total = begin + padded;
        unit_begin.push_back(total);
    };
    auto add = [&](Param p, int layer, int unit) {
        TensorEntry e;
        e.kind = p;
        e.layer = layer;
        e.unit = unit;
        kind_shape(c, p, &e.rows, &e.cols);
        e.numel = e.rows * e.cols;
        e.offset = total;
        e.file_offset = kind_file_offset[(int)p] + (param_kind(p).per_layer ? (size_t)layer * e.numel : 0);
        e.decay = param_kind(p).decay;
        index_[(size_t)p * L + layer] = (int)entries.size();
        entries.push_back(e);
        total += e.numel;
        params += e.numel;
    };
    unit_begin.push_back(0);
    add(Param::wte, 0, 0);
    add(Param::wpe, 0, 0);
    close_unit();
    for (int l = 0; l < L; l++) {
        for (int k = (int)Param::ln1w; k <= (int)Param::fcprojb; k++) add((Param)k, l, l + 1);
        close_unit();
    }
    add(Param::lnfw, 0, L + 1);
    add(Param::lnfb, 0, L + 1);
    close_unit();
    if (foff != params) throw std::logic_error("tensor table: file and memory sizes differ");
}

const TensorEntry& TensorTable::get(Param p, int layer) const {
    int i = index_[(size_t)p * cfg.num_layers + layer];
    if (i < 0 || layer < 0 || layer >= cfg.num_layers) throw std::out_of_range("tensor table: no such tensor");
    return entries[i];
}

size_t gpt2_param_count(const GPTConfig& c) {
    size_t L = c.num_layers, C = c.channels;
    return 12 * L * C * C + 13 * L * C + ((size_t)c.padded_vocab_size + c.max_seq_len) * C + 2 * C;
}
