// llmc/model/tensors.cpp: builds the tensor table from a model config.
#include "llmc/model/tensors.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

static constexpr Param kNone = Param::count;
static const ParamKind kKinds[] = {
    {Param::wte, "wte", false, false, true, kNone},
    {Param::wpe, "wpe", false, false, true, kNone},
    {Param::ln1w, "ln1w", true, false, false, Param::ln1b},
    {Param::ln1b, "ln1b", true, false, false, kNone},
    {Param::qkvw, "qkvw", true, false, true, Param::qkvb},
    {Param::qkvb, "qkvb", true, false, false, kNone},
    {Param::attprojw, "attprojw", true, false, true, Param::attprojb},
    {Param::attprojb, "attprojb", true, false, false, kNone},
    {Param::ln2w, "ln2w", true, false, false, Param::ln2b},
    {Param::ln2b, "ln2b", true, false, false, kNone},
    {Param::fcw, "fcw", true, false, true, Param::fcb},
    {Param::fcb, "fcb", true, false, false, kNone},
    {Param::fcprojw, "fcprojw", true, false, true, Param::fcprojb},
    {Param::fcprojb, "fcprojb", true, false, false, kNone},
    // Mixtral's router and experts: 2-D weights in Hugging Face's model
    // (the router, each expert's w1, w2, w3), so weight decay applies.
    {Param::moe_gate, "moe_gate", true, false, true, kNone},
    {Param::moe_fc, "moe_fc", true, true, true, kNone},
    {Param::moe_proj, "moe_proj", true, true, true, kNone},
    {Param::lnfw, "lnfw", false, false, false, Param::lnfb},
    {Param::lnfb, "lnfb", false, false, false, kNone},
    {Param::lm_head, "lm_head", false, false, true, kNone},
};
static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == (size_t)Param::count, "one ParamKind per Param");

const ParamKind& param_kind(Param p) { return kKinds[(int)p]; }

std::string TensorEntry::name() const {
    const ParamKind& k = param_kind(kind);
    if (!k.per_layer) return k.name;
    return "h" + std::to_string(layer) + "." + k.name;
}

bool kind_in_model(const GPTConfig& c, Param p) {
    if (!c.llama()) return p != Param::lm_head && p != Param::moe_gate && p != Param::moe_fc && p != Param::moe_proj;
    switch (p) {
        case Param::wte: case Param::ln1w: case Param::qkvw: case Param::attprojw: case Param::ln2w:
        case Param::lnfw:
            return true;
        case Param::qkvb: return c.qkv_bias();  // Qwen2's Q, K and V biases
        case Param::fcw: case Param::fcprojw: return !c.moe();  // Mixtral's MLP is the MoE block
        case Param::moe_gate: case Param::moe_fc: case Param::moe_proj: return c.moe();
        case Param::lm_head: return !c.tied;
        default: return false;  // positions, LayerNorm biases and the other Linear biases are GPT-2's
    }
}

// Global shape of one tensor of a kind (per layer for block tensors).
static void kind_shape(const GPTConfig& c, Param p, size_t* rows, size_t* cols) {
    const size_t C = c.channels, Vp = c.padded_vocab_size, T = c.max_seq_len, HS = c.head_size();
    const size_t qkv = (c.num_heads + 2 * (size_t)c.kv_heads()) * HS, H = c.hidden();
    switch (p) {
        case Param::wte: case Param::lm_head: *rows = Vp; *cols = C; return;
        case Param::wpe: *rows = T; *cols = C; return;
        case Param::qkvw: *rows = qkv; *cols = C; return;
        case Param::qkvb: *rows = qkv; *cols = 1; return;
        case Param::attprojw: *rows = C; *cols = c.num_heads * HS; return;
        case Param::fcw: *rows = c.llama() ? 2 * H : H; *cols = C; return;
        case Param::fcb: *rows = H; *cols = 1; return;
        case Param::fcprojw: *rows = C; *cols = H; return;
        case Param::moe_gate: *rows = c.experts; *cols = C; return;
        case Param::moe_fc: *rows = (size_t)c.experts * 2 * H; *cols = C; return;
        case Param::moe_proj: *rows = (size_t)c.experts * C; *cols = H; return;
        default: *rows = C; *cols = 1; return;  // norms' weights and biases, C-sized biases
    }
}

// How a kind is split over tensor-parallel ranks: whole rows of parts
// (column-parallel: each part cut evenly, the rank keeping its piece of
// each), input columns (row-parallel), vocabulary rows, or replicated.
enum class Split { replicated, parts, columns, vocab };
static Split kind_split(Param p) {
    switch (p) {
        case Param::wte: case Param::lm_head: return Split::vocab;
        case Param::qkvw: case Param::qkvb: case Param::fcw: case Param::fcb: case Param::moe_fc: return Split::parts;
        case Param::attprojw: case Param::fcprojw: case Param::moe_proj: return Split::columns;
        default: return Split::replicated;
    }
}

// The row parts of a column-parallel kind (tensors.h: Q, K, V heads; gate
// and up; or one part).
static std::vector<size_t> kind_parts(const GPTConfig& c, Param p) {
    const size_t HS = c.head_size();
    if (p == Param::qkvw || p == Param::qkvb) return {c.num_heads * HS, c.kv_heads() * HS, c.kv_heads() * HS};
    if (p == Param::fcw && c.llama()) return {(size_t)c.hidden(), (size_t)c.hidden()};
    if (p == Param::moe_fc) return std::vector<size_t>(2 * (size_t)c.experts, (size_t)c.hidden());  // w1, w3 of each expert
    return {(size_t)c.hidden()};
}

TensorTable::TensorTable(const GPTConfig& c, const TableSplit& sp)
    : cfg(c), tp(sp.tp), tp_rank(sp.tp_rank), ep(sp.ep), ep_rank(sp.ep_rank), expert_shards(sp.expert_shards),
      shards(sp.shards), stage(sp.stage) {
    const int nshards = shards;
    if (nshards < 1 || expert_shards < 1 || tp < 1 || tp_rank < 0 || tp_rank >= tp)
        throw std::invalid_argument("tensor table: bad shard or tensor-parallel numbers");
    if (ep < 1 || ep_rank < 0 || ep_rank >= ep || (ep > 1 && (!c.moe() || c.experts % ep != 0)))
        throw std::invalid_argument("tensor table: bad expert-parallel numbers (ep must divide the experts)");
    experts = c.experts / ep;
    expert_begin = ep_rank * experts;
    if (!stage.held.empty() && (int)stage.held.size() != c.num_layers + 2)
        throw std::invalid_argument("tensor table: one held flag per unit");
    if (c.num_heads % tp != 0 || c.kv_heads() % tp != 0 || c.hidden() % tp != 0)
        throw std::invalid_argument("tensor table: heads, key/value heads or MLP width do not divide by tp");
    const int L = c.num_layers, K = (int)Param::count;
    heads = c.num_heads / tp;
    kv_heads = c.kv_heads() / tp;
    hidden = c.hidden() / tp;
    vocab_rows = (c.padded_vocab_size + tp - 1) / tp;
    vocab_begin = tp_rank * vocab_rows;
    file_params = model_param_count(c);
    index_.assign((size_t)K * L, -1);
    // File offsets: tensor-major, each per-layer kind stacked over L.
    std::vector<size_t> kind_file_offset(K);
    size_t foff = 0;
    for (int k = 0; k < K; k++) {
        if (!kind_in_model(c, (Param)k)) continue;
        size_t r, cl;
        kind_shape(c, (Param)k, &r, &cl);
        kind_file_offset[k] = foff;
        foff += r * cl * (kKinds[k].per_layer ? L : 1);
    }
    // Memory: unit-major, each segment of a unit padded to a multiple of
    // its shard count (one segment per unit, but for ep's expert tensors).
    std::vector<UnitSegment> open;  // the unit's segments so far
    size_t used = 0;                // elements of the unit's tensors
    auto close_segment = [&](bool ex) {
        UnitSegment g;
        g.begin = open.empty() ? unit_begin.back() : open.back().begin + open.back().size;
        g.shards = ex ? expert_shards : nshards;
        g.experts = ex;
        g.size = (total - g.begin + g.shards - 1) / g.shards * g.shards;
        g.shard_begin = shard_total;
        shard_total += g.slice_size();
        total = g.begin + g.size;
        open.push_back(g);
    };
    auto close_unit = [&](bool ex) {
        close_segment(ex);
        unit_used.push_back(used);
        used = 0;
        shard_begin.push_back(open.front().shard_begin);
        segments.push_back(open);
        open.clear();
        unit_begin.push_back(total);
    };
    auto add = [&](Param p, int layer, int unit) {
        if (!held(unit) || !kind_in_model(c, p)) return;  // another stage's, or another architecture's
        TensorEntry e;
        e.kind = p;
        e.layer = layer;
        e.unit = unit;
        size_t grows, gcols;
        kind_shape(c, p, &grows, &gcols);
        e.file_rows = grows;
        e.file_cols = gcols;
        e.col_begin = 0;
        e.rows = grows;
        e.cols = gcols;
        const size_t t = tp, r = tp_rank;
        // Expert parallel first: an expert kind keeps the rows of this
        // rank's experts, [first, first + whole) of the file's; tp then cuts
        // each of them as it cuts all E.
        const bool ex = param_kind(p).experts;
        if (ex && ep > 1 && open.empty()) close_segment(false);  // the block's dense tensors end here
        const size_t per_expert = ex ? grows / c.experts : 0, first = ex ? expert_begin * per_expert : 0,
                     whole = ex ? experts * per_expert : grows;
        e.rows = whole;
        switch (kind_split(p)) {
            case Split::replicated: e.runs = {{0, 0, grows}}; break;
            case Split::parts: {  // this rank's piece of each part (heads of Q, K, V; gate and up; of its experts)
                e.rows = 0;
                size_t start = 0;
                for (size_t part : kind_parts(c, p)) {
                    if (start < first || start >= first + whole) {  // another ep rank's expert
                        start += part;
                        continue;
                    }
                    const size_t piece = part / t;
                    e.runs.push_back({e.rows, start + r * piece, piece});
                    e.rows += piece;
                    start += part;
                }
                break;
            }
            case Split::columns: e.cols = gcols / t; e.col_begin = r * e.cols; e.runs = {{0, first, whole}}; break;
            case Split::vocab: {
                e.rows = vocab_rows;
                size_t first = r * e.rows, held = first < grows ? std::min(e.rows, grows - first) : 0;
                e.runs = {{0, first, held}};
                break;
            }
        }
        e.split = tp > 1 && kind_split(p) != Split::replicated;
        e.tied_copy = unit == 0 && stage.embedding_copy;
        e.numel = e.rows * e.cols;
        e.offset = total;
        e.file_offset = kind_file_offset[(int)p] + (param_kind(p).per_layer ? (size_t)layer * grows * gcols : 0);
        e.decay = param_kind(p).decay;
        index_[(size_t)p * L + layer] = (int)entries.size();
        entries.push_back(e);
        total += e.numel;
        used += e.numel;
        params += e.numel;
    };
    unit_begin.push_back(0);
    add(Param::wte, 0, 0);
    add(Param::wpe, 0, 0);
    close_unit(false);
    for (int l = 0; l < L; l++) {
        for (int k = (int)Param::ln1w; k <= (int)Param::moe_proj; k++) add((Param)k, l, l + 1);
        close_unit(!open.empty());  // an expert segment follows a closed dense one
    }
    add(Param::lnfw, 0, L + 1);
    add(Param::lnfb, 0, L + 1);
    add(Param::lm_head, 0, L + 1);
    close_unit(false);
    if (foff != file_params) throw std::logic_error("tensor table: file size differs from the formula");
}

size_t TensorTable::shard_size(int u) const {
    size_t n = 0;
    for (const UnitSegment& g : segments[u]) n += g.slice_size();
    return n;
}

const UnitSegment& TensorTable::segment_of(int u, size_t i) const {
    for (const UnitSegment& g : segments[u])
        if (i < g.begin + g.size) return g;
    return segments[u].back();
}

const TensorEntry& TensorTable::get(Param p, int layer) const {
    if (!has(p, layer)) throw std::out_of_range("tensor table: no such tensor on this stage");
    return entries[index_[(size_t)p * cfg.num_layers + layer]];
}

bool TensorTable::has(Param p, int layer) const {
    return layer >= 0 && layer < cfg.num_layers && index_[(size_t)p * cfg.num_layers + layer] >= 0;
}

// Calls f(kind, elements) for each kind of the model, elements over all layers.
template <class F>
static void for_each_kind(const GPTConfig& c, F f) {
    for (int k = 0; k < (int)Param::count; k++) {
        if (!kind_in_model(c, (Param)k)) continue;
        size_t r, cl;
        kind_shape(c, (Param)k, &r, &cl);
        f(k, r * cl * (kKinds[k].per_layer ? c.num_layers : 1));
    }
}

size_t model_param_count(const GPTConfig& c) {
    size_t n = 0;
    for_each_kind(c, [&](int, size_t elems) { n += elems; });
    return n;
}

double active_param_count(const GPTConfig& c) {
    double n = 0;
    // A token runs through K of the E experts (an expert kind's rows are E
    // equal blocks), so only K/E of those weights do work for it.
    for_each_kind(c, [&](int k, size_t elems) {
        n += kKinds[k].experts ? (double)elems * c.top_k / c.experts : (double)elems;
    });
    return n;
}

double matmul_param_count(const GPTConfig& c) {
    double n = active_param_count(c);
    if (!c.tied) {  // the token embedding is a lookup; the LM head (lm_head) is the product
        size_t r, cl;
        kind_shape(c, Param::wte, &r, &cl);
        n -= (double)r * cl;
    }
    return n;
}

double train_flops_per_token(const GPTConfig& c, int T) {
    return 6.0 * matmul_param_count(c) + 6.0 * c.num_layers * (double)c.channels * T;
}

size_t gpt2_param_count(const GPTConfig& c) {
    size_t L = c.num_layers, C = c.channels;
    return 12 * L * C * C + 13 * L * C + ((size_t)c.padded_vocab_size + c.max_seq_len) * C + 2 * C;
}
