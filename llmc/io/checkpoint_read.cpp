// llmc/io/checkpoint_read.cpp: sharded checkpoints (llmc/io/checkpoint.h),
// the reading side: the index (JSON, read with nlohmann-json), each shard's
// tables and checksums verified, and the load into a model of any layout.
#include "llmc/io/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"
#include "llmc/io/checkpoint_format.h"
#include "llmc/io/checksum.h"

using json = nlohmann::json;

// ---- reading ---------------------------------------------------------------------------------

namespace {

struct Index {
    GPTConfig cfg;
    int step = 0;
    DType wt = DType::F32, ot = DType::F32;
    TrainState st;
    RunInfo run;
    std::vector<std::string> shards;
};

bool dtype_from_name(const std::string& n, DType* t) {
    for (DType c : {DType::F32, DType::F64, DType::BF16})
        if (n == dtype_name(c)) {
            *t = c;
            return true;
        }
    return false;
}

// An integer field of the index within [lo, hi]: nlohmann would otherwise
// wrap a negative number into an unsigned one (a data position of -1 read
// as 2^64-1) or truncate a float; the message names the field.
static long long index_int(const json& o, const char* key, long long lo, long long hi) {
    const json& v = o.at(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)hi) ||
        (!v.is_number_unsigned() && (v.get<long long>() < lo || v.get<long long>() > hi)))
        throw std::runtime_error(std::string("field '") + key + "' = " + v.dump() + ": expected an integer in [" +
                                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v.get<long long>();
}

bool read_index(const std::string& dir, int step, Index* ix, std::string* err) {
    const std::string path = checkpoint_dir(dir, step) + "/index.json";
    std::ifstream in(path);
    if (!in) {
        *err = "checkpoint " + path + ": cannot open";
        return false;
    }
    try {
        json j = json::parse(in);
        if (j.at("format") != "llmc-checkpoint" || j.at("version") != 1)
            throw std::runtime_error("not an llmc checkpoint index of version 1");
        const json& m = j.at("model");
        ix->cfg.max_seq_len = m.at("maxT");
        ix->cfg.vocab_size = m.at("V");
        ix->cfg.padded_vocab_size = m.at("Vp");
        ix->cfg.num_layers = m.at("L");
        ix->cfg.num_heads = m.at("NH");
        ix->cfg.channels = m.at("C");
        const std::string arch = m.value("arch", std::string("gpt2"));  // absent: GPT-2 (indexes before Llama)
        if (!arch_from_name(arch, &ix->cfg.arch)) throw std::runtime_error("unknown model arch " + arch);
        if (ix->cfg.llama()) {  // Llama, Mixtral and Qwen2
            if (ix->cfg.moe()) {
                ix->cfg.experts = m.at("E");
                ix->cfg.top_k = m.at("K");
                ix->cfg.aux_coef = m.at("aux");
            }
            ix->cfg.num_kv_heads = m.at("NKV");
            ix->cfg.ffn = m.at("F");
            ix->cfg.rope_theta = m.at("theta");
            ix->cfg.norm_eps = m.at("eps");
            ix->cfg.tied = m.at("tied");
        }
        constexpr long long kInt = 2147483647;
        ix->step = (int)index_int(j, "step", 0, kInt);
        if (!dtype_from_name(j.at("weights_dtype"), &ix->wt) || !dtype_from_name(j.at("adam_dtype"), &ix->ot))
            throw std::runtime_error("unknown dtype");
        ix->st.step = ix->step;
        ix->st.rng_state = j.at("rng_state");
        ix->st.rows_consumed = (uint64_t)index_int(j, "rows_consumed", 0, std::numeric_limits<long long>::max());
        // Bad-step state (absent in indexes written before it existed).
        if (j.contains("skips")) {
            ix->st.skips = (int)index_int(j, "skips", 0, kInt);
            ix->st.loss_count = (int)index_int(j, "loss_count", 0, kInt);
            ix->st.loss_mean = j.at("loss_mean").get<double>();
        }
        if (j.contains("fp8_amax_history")) {  // --fp8-history: [L, 4 layers, 3 operands, N steps] (+ experts')
            ix->st.fp8_history = j.at("fp8_amax_history").get<std::vector<double>>();
            const size_t per = (size_t)ix->cfg.num_layers * ix->cfg.fp8_slots_per_layer();
            if (ix->st.fp8_history.empty() || ix->st.fp8_history.size() % per != 0)
                throw std::runtime_error("fp8_amax_history is not [layers, " +
                                         std::to_string(ix->cfg.fp8_slots_per_layer()) + " operands, steps]");
        }
        if (j.contains("moe_bias")) {  // --moe-balance bias: one per layer and expert
            ix->st.moe_bias = j.at("moe_bias").get<std::vector<double>>();
            if (ix->st.moe_bias.size() != (size_t)ix->cfg.num_layers * ix->cfg.experts)
                throw std::runtime_error("moe_bias is not one per layer and expert");
        }
        const json& r = j.at("run");
        RunInfo& ri = ix->run;
        ri.max_steps = (int)index_int(r, "max_steps", -1, kInt);
        ri.total_batch = index_int(r, "total_batch", 1, std::numeric_limits<long long>::max());
        ri.B = (int)index_int(r, "B", 1, kInt);
        ri.T = (int)index_int(r, "T", 1, kInt);
        ri.world = (int)index_int(r, "world", 1, kInt);
        ri.pp = (int)index_int(r, "pp", 1, kInt);
        ri.vpp = (int)index_int(r, "vpp", 1, kInt);
        ri.dp = (int)index_int(r, "dp", 1, kInt);
        ri.cp = (int)index_int(r, "cp", 1, kInt);
        ri.tp = (int)index_int(r, "tp", 1, kInt);
        ri.sp = (int)index_int(r, "sp", 0, 1);
        ri.zero = (int)index_int(r, "zero", 0, 3);
        ri.recompute = r.at("recompute");
        ri.data = r.value("data", std::string());
        for (const json& s : j.at("shards")) ix->shards.push_back(s.get<std::string>());
        if (ix->step != step) throw std::runtime_error("step " + std::to_string(ix->step) + " in the index");
        std::string why;
        if (!validate_config(ix->cfg, &why)) throw std::runtime_error("bad model shape: " + why);
    } catch (const std::exception& e) {
        *err = "checkpoint " + path + ": " + e.what();
        return false;
    }
    return true;
}

// One shard's header and piece tables; the file stays open for reading.
struct Shard {
    std::string path;
    std::unique_ptr<FILE, int (*)(FILE*)> f{nullptr, &std::fclose};
    std::vector<Piece> w, o;
    long long w_at = 0, o_at = 0;  // payload starts: weights, then m (v follows m)
    uint64_t o_elems = 0;
    bool checked = false;  // the shard carries checksums
};

// Reads a shard's payload through once, recomputing its checksums against
// the trailer; a difference names the shard, the section and the tensor of
// the piece (the first tensor it touches).
bool verify_shard(Shard& sh, const Index& ix, const TensorTable& table, std::string* err) {
    if (!sh.checked) return true;
    const size_t ws = dtype_size(ix.wt), os = dtype_size(ix.ot);
    const std::vector<uint64_t> bounds = piece_bytes(sh.w, sh.o, ws, os);
    uint64_t total = 0;
    for (uint64_t b : bounds) total += b;
    PieceHasher hasher(bounds);
    std::vector<char> buf(1 << 20);
    std::vector<uint64_t> want(bounds.size());
    uint64_t head[2];
    bool ok = std::fseek(sh.f.get(), sh.w_at, SEEK_SET) == 0;
    for (uint64_t left = total; ok && left > 0;) {
        const size_t n = (size_t)std::min<uint64_t>(left, buf.size());
        ok = std::fread(buf.data(), 1, n, sh.f.get()) == n;
        hasher.feed(buf.data(), n);
        left -= n;
    }
    ok = ok && std::fread(head, 8, 2, sh.f.get()) == 2 && head[0] == kTrailerMagic && head[1] == bounds.size() &&
         std::fread(want.data(), 8, want.size(), sh.f.get()) == want.size();
    if (!ok) {
        *err = "checkpoint shard " + sh.path + ": cannot read its payload and checksums";
        return false;
    }
    for (size_t k = 0; k < want.size(); k++) {
        if (hasher.sums()[k] == want[k]) continue;
        const size_t nw = sh.w.size(), no = sh.o.size();
        const Piece& p = k < nw ? sh.w[k] : sh.o[(k - nw) % no];
        const char* section = k < nw ? "weights" : k < nw + no ? "Adam m" : "Adam v";
        std::string tensor = "?";
        for (const TensorEntry& e : table.entries)
            if (p.off >= e.file_offset && p.off < e.file_offset + (uint64_t)e.file_rows * e.file_cols) {
                tensor = e.name();
                break;
            }
        *err = "checkpoint shard " + sh.path + ": checksum mismatch in the " + section + " of tensor " + tensor +
               " (the file changed after it was written)";
        return false;
    }
    return true;
}

// The shard at position `rank` of the index's list, of `world` shards: its
// header must say so (the checksums cover the payload only).
bool open_shard(const std::string& path, const Index& ix, int rank, int world, Shard* sh, std::string* err) {
    sh->path = path;
    sh->f.reset(std::fopen(path.c_str(), "rb"));
    int h[kHeaderInts];
    if (!sh->f || std::fread(h, 4, kHeaderInts, sh->f.get()) != (size_t)kHeaderInts) {
        *err = "checkpoint shard " + path + ": cannot read its header";
        return false;
    }
    if (h[0] != kShardMagic || h[1] != 1 || h[4] != (int)ix.wt || h[5] != (int)ix.ot) {
        *err = "checkpoint shard " + path + ": bad magic, version or dtypes";
        return false;
    }
    if (h[2] != rank || h[3] != world) {
        *err = "checkpoint shard " + path + ": its header says shard " + std::to_string(h[2]) + " of " +
               std::to_string(h[3]) + ", the index lists it as " + std::to_string(rank) + " of " +
               std::to_string(world);
        return false;
    }
    const uint64_t nw = get_u64(h, 6), no = get_u64(h, 8);
    const long long size = file_size(path);
    if (nw + no > (uint64_t)size / 32) {
        *err = "checkpoint shard " + path + ": piece counts past the end of the file";
        return false;
    }
    uint64_t elems[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        std::vector<Piece>& v = k == 0 ? sh->w : sh->o;
        v.resize(k == 0 ? nw : no);
        for (Piece& p : v) {
            uint64_t q[4];
            if (std::fread(q, 8, 4, sh->f.get()) != 4) {
                *err = "checkpoint shard " + path + ": truncated piece table";
                return false;
            }
            p = {q[0], q[1], q[2], q[3]};
            const size_t P = model_param_count(ix.cfg);
            if (p.len == 0 || p.count == 0 || p.off + (p.count - 1) * p.stride + p.len > P) {
                *err = "checkpoint shard " + path + ": a piece past the model's " + std::to_string(P) + " parameters";
                return false;
            }
            elems[k] += p.len * p.count;
        }
    }
    sh->w_at = kHeaderInts * 4LL + 32LL * (long long)(nw + no);
    sh->o_at = sh->w_at + (long long)(elems[0] * dtype_size(ix.wt));
    sh->o_elems = elems[1];
    const long long want = sh->o_at + (long long)(2 * elems[1] * dtype_size(ix.ot));
    // Checksums follow the payload (shards written before them end there).
    const long long sums = 16 + 8 * (long long)(nw + 2 * no);
    sh->checked = size == want + sums;
    if (size != want && !sh->checked) {
        *err = "checkpoint shard " + path + ": size " + std::to_string(size) + " bytes, its tables promise " +
               std::to_string(want) + " (truncated or corrupt)";
        return false;
    }
    return true;
}

// Copies the elements of [fo, fo + n) that the pieces hold from the payload
// starting at byte `at` (elements of size es) into dst; counts them.
bool read_range(Shard& sh, const std::vector<Piece>& pieces, long long at, size_t es, uint64_t fo, uint64_t n,
                char* dst, uint64_t* filled) {
    uint64_t base = 0;  // payload element of the current piece's first row
    for (const Piece& p : pieces) {
        const uint64_t end = p.off + (p.count - 1) * p.stride + p.len;
        if (p.off < fo + n && end > fo) {
            for (uint64_t i = 0; i < p.count; i++) {
                const uint64_t r0 = p.off + i * p.stride, b = std::max(r0, fo), e = std::min(r0 + p.len, fo + n);
                if (b >= e) continue;
                const long long pos = at + (long long)((base + i * p.len + (b - r0)) * es);
                if (std::fseek(sh.f.get(), pos, SEEK_SET) != 0 ||
                    std::fread(dst + (b - fo) * es, es, e - b, sh.f.get()) != e - b)
                    return false;
                *filled += e - b;
            }
        }
        base += p.len * p.count;
    }
    return true;
}

// Every element finite (and, with non_negative, not below 0).
bool all_finite(const void* p, DType t, size_t n, bool non_negative = false) {
    for (size_t i = 0; i < n; i++) {
        const double x = t == DType::F64 ? static_cast<const double*>(p)[i]
                         : t == DType::F32 ? static_cast<const float*>(p)[i]
                                           : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
        if (!std::isfinite(x) || (non_negative && x < 0)) return false;
    }
    return true;
}

}  // namespace

// The earlier one-file format (DIR/state_SSSSSSSS.bin beside DONE_SSSSSSSS,
// without checksums) is no longer read: a directory that holds one as its
// latest checkpoint is refused by name rather than started afresh.
static bool earlier_format(const std::string& dir, int step, std::string* err) {
    char name[32];
    std::snprintf(name, sizeof(name), "/state_%08d.bin", step);
    if (is_dir(checkpoint_dir(dir, step)) || file_size(dir + name) < 0) return false;
    *err = "checkpoint " + dir + name + ": the earlier one-file format, no longer read (resume it with the version "
           "that wrote it, or give another -o)";
    return true;
}

std::string checkpoint_problem(const std::string& dir, int step) {
    std::string err;
    if (earlier_format(dir, step, &err)) return err;
    Index ix;
    if (!read_index(dir, step, &ix, &err)) return err;
    const std::string cdir = checkpoint_dir(dir, step);
    for (size_t i = 0; i < ix.shards.size(); i++) {
        Shard sh;
        if (!open_shard(cdir + "/" + ix.shards[i], ix, (int)i, (int)ix.shards.size(), &sh, &err)) return err;
    }
    return "";
}

bool read_checkpoint_config(const std::string& dir, int step, GPTConfig* cfg, std::string* err) {
    if (earlier_format(dir, step, err)) return false;
    Index ix;
    if (!read_index(dir, step, &ix, err)) return false;
    *cfg = ix.cfg;
    return true;
}

bool load_checkpoint(const std::string& dir, int step, GPT& model, TrainState* st, RunInfo* run, std::string* err) {
    if (earlier_format(dir, step, err)) return false;
    Index ix;
    if (!read_index(dir, step, &ix, err)) return false;
    const std::string cdir = checkpoint_dir(dir, step);
    if (ix.cfg != model.config()) {
        *err = "checkpoint " + cdir + ": shape " + config_string(ix.cfg) + " does not match the model " +
               config_string(model.config());
        return false;
    }
    std::vector<Shard> shards(ix.shards.size());
    // Each rank checks the checksums of every world-th shard (the caller's
    // agreement on errors tells the others).
    for (size_t i = 0; i < shards.size(); i++)
        if (!open_shard(cdir + "/" + ix.shards[i], ix, (int)i, (int)shards.size(), &shards[i], err) ||
            ((int)i % dist_world_size() == dist_world_rank() && !verify_shard(shards[i], ix, model.table(), err)))
            return false;
    // Tensor by tensor: each tensor this rank holds any part of, whole, from
    // the shards that hold its pieces, then this rank's part into its buffers.
    const Precision& p = model.precision();
    const size_t ws = dtype_size(ix.wt), os = dtype_size(ix.ot);
    std::vector<char> w, m, v;
    std::vector<uint64_t> seen;
    for (const TensorEntry& e : model.table().entries) {
        const uint64_t fo = e.file_offset, n = e.file_rows * e.file_cols;
        if (std::find(seen.begin(), seen.end(), fo) != seen.end()) continue;
        seen.push_back(fo);
        w.assign(n * ws, 0);
        m.assign(n * os, 0);
        v.assign(n * os, 0);
        uint64_t got_w = 0, got_m = 0, got_v = 0;
        for (Shard& sh : shards) {
            const bool ok = read_range(sh, sh.w, sh.w_at, ws, fo, n, w.data(), &got_w) &&
                            read_range(sh, sh.o, sh.o_at, os, fo, n, m.data(), &got_m) &&
                            read_range(sh, sh.o, sh.o_at + (long long)(sh.o_elems * os), os, fo, n, v.data(), &got_v);
            if (!ok) {
                *err = "checkpoint shard " + sh.path + ": cannot read tensor " + e.name();
                return false;
            }
        }
        const std::string tensor = e.name();
        if (got_w != n || got_m != n || got_v != n) {
            *err = "checkpoint " + cdir + ": tensor " + tensor + " has " + std::to_string(got_w) + " of its " +
                   std::to_string(n) + " weights in the shards (missing or overlapping pieces)";
            return false;
        }
        if (!all_finite(w.data(), ix.wt, n)) {
            *err = "checkpoint " + cdir + ": tensor " + tensor + " holds NaN or infinite weights";
            return false;
        }
        // Adam's state too: NaN there, or a negative second moment, would
        // surface steps later as a loss that is not finite.
        if (!all_finite(m.data(), ix.ot, n) || !all_finite(v.data(), ix.ot, n, true)) {
            *err = "checkpoint " + cdir + ": tensor " + tensor + " holds NaN, infinite or (second moment) negative " +
                   "Adam state";
            return false;
        }
        model.set_weights_file_range(w.data(), ix.wt, fo, fo + n);
        if (!model.adam_m()) continue;  // a model without training state (--generate) takes the weights only
        const bool opt_sharded = model.sharding().optimizer;
        upload_file_range(model.backend(), model.table(), model.sharding(), model.adam_m(), opt_sharded, p.opt,
                          m.data(), ix.ot, fo, fo + n);
        upload_file_range(model.backend(), model.table(), model.sharding(), model.adam_v(), opt_sharded, p.opt,
                          v.data(), ix.ot, fo, fo + n);
    }
    *st = ix.st;
    *run = ix.run;
    return true;
}
