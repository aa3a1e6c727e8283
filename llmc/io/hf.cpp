// llmc/io/hf.cpp: Hugging Face checkpoints (see hf.h): the tensor map, the
// weights in and out. The shard index is read with nlohmann-json; config.json
// is llmc/io/hf_config.cpp's.
#include "llmc/io/hf.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"
#include "llmc/io/hf_meta.h"
#include "llmc/io/safetensors.h"

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

bool is_hf_dir(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string hf_tokenizer_path(const std::string& dir) {
    const std::string p = dir + "/tokenizer.json";
    return file_size(p) >= 0 ? p : std::string();
}

// ---- the tensor map -------------------------------------------------------------------------------

namespace {
struct HfTensor {
    std::string name;              // Hugging Face's name
    std::vector<uint64_t> shape;   // as stored there
    size_t file_begin;             // first element in our model file order
    bool transpose;                // stored (in, out) (GPT-2's Conv1D): ours is its transpose
    uint64_t numel() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        return n;
    }
};

// Every tensor of the Hugging Face model of shape c, in our file order.
// prefix: "transformer." or "" for GPT-2 (checkpoints come both ways).
std::vector<HfTensor> hf_tensors(const GPTConfig& c, const std::string& prefix) {
    const TensorTable t(c);
    const uint64_t C = c.channels, V = c.vocab_size, HS = c.head_size();
    const uint64_t Q = c.num_heads * HS, KV = c.kv_heads() * HS, F = c.hidden(), L = c.num_layers;
    auto at = [&](Param p, int l = 0) { return t.get(p, l).file_offset; };
    std::vector<HfTensor> v;
    if (c.llama()) {
        v.push_back({"model.embed_tokens.weight", {V, C}, at(Param::wte), false});
        for (uint64_t l = 0; l < L; l++) {
            const std::string p = "model.layers." + std::to_string(l) + ".";
            const int li = (int)l;
            v.push_back({p + "input_layernorm.weight", {C}, at(Param::ln1w, li), false});
            v.push_back({p + "self_attn.q_proj.weight", {Q, C}, at(Param::qkvw, li), false});
            v.push_back({p + "self_attn.k_proj.weight", {KV, C}, at(Param::qkvw, li) + Q * C, false});
            v.push_back({p + "self_attn.v_proj.weight", {KV, C}, at(Param::qkvw, li) + (Q + KV) * C, false});
            if (c.qkv_bias()) {  // Qwen2: the same rows of qkvb
                v.push_back({p + "self_attn.q_proj.bias", {Q}, at(Param::qkvb, li), false});
                v.push_back({p + "self_attn.k_proj.bias", {KV}, at(Param::qkvb, li) + Q, false});
                v.push_back({p + "self_attn.v_proj.bias", {KV}, at(Param::qkvb, li) + Q + KV, false});
            }
            v.push_back({p + "self_attn.o_proj.weight", {C, Q}, at(Param::attprojw, li), false});
            v.push_back({p + "post_attention_layernorm.weight", {C}, at(Param::ln2w, li), false});
            if (c.moe()) {  // the router, then each expert's w1 (gate), w3 (up), w2 (down): tensors.h
                const std::string m = p + "block_sparse_moe.";
                v.push_back({m + "gate.weight", {(uint64_t)c.experts, C}, at(Param::moe_gate, li), false});
                for (uint64_t e = 0; e < (uint64_t)c.experts; e++) {
                    const std::string x = m + "experts." + std::to_string(e) + ".";
                    v.push_back({x + "w1.weight", {F, C}, at(Param::moe_fc, li) + e * 2 * F * C, false});
                    v.push_back({x + "w2.weight", {C, F}, at(Param::moe_proj, li) + e * C * F, false});
                    v.push_back({x + "w3.weight", {F, C}, at(Param::moe_fc, li) + (e * 2 + 1) * F * C, false});
                }
                continue;
            }
            v.push_back({p + "mlp.gate_proj.weight", {F, C}, at(Param::fcw, li), false});
            v.push_back({p + "mlp.up_proj.weight", {F, C}, at(Param::fcw, li) + F * C, false});
            v.push_back({p + "mlp.down_proj.weight", {C, F}, at(Param::fcprojw, li), false});
        }
        v.push_back({"model.norm.weight", {C}, at(Param::lnfw), false});
        if (!c.tied) v.push_back({"lm_head.weight", {V, C}, at(Param::lm_head), false});
    } else {
        const uint64_t T = c.max_seq_len;
        v.push_back({prefix + "wte.weight", {V, C}, at(Param::wte), false});
        v.push_back({prefix + "wpe.weight", {T, C}, at(Param::wpe), false});
        for (uint64_t l = 0; l < L; l++) {
            const std::string p = prefix + "h." + std::to_string(l) + ".";
            const int li = (int)l;
            v.push_back({p + "ln_1.weight", {C}, at(Param::ln1w, li), false});
            v.push_back({p + "ln_1.bias", {C}, at(Param::ln1b, li), false});
            v.push_back({p + "attn.c_attn.weight", {C, 3 * C}, at(Param::qkvw, li), true});
            v.push_back({p + "attn.c_attn.bias", {3 * C}, at(Param::qkvb, li), false});
            v.push_back({p + "attn.c_proj.weight", {C, C}, at(Param::attprojw, li), true});
            v.push_back({p + "attn.c_proj.bias", {C}, at(Param::attprojb, li), false});
            v.push_back({p + "ln_2.weight", {C}, at(Param::ln2w, li), false});
            v.push_back({p + "ln_2.bias", {C}, at(Param::ln2b, li), false});
            v.push_back({p + "mlp.c_fc.weight", {C, 4 * C}, at(Param::fcw, li), true});
            v.push_back({p + "mlp.c_fc.bias", {4 * C}, at(Param::fcb, li), false});
            v.push_back({p + "mlp.c_proj.weight", {4 * C, C}, at(Param::fcprojw, li), true});
            v.push_back({p + "mlp.c_proj.bias", {C}, at(Param::fcprojb, li), false});
        }
        v.push_back({prefix + "ln_f.weight", {C}, at(Param::lnfw), false});
        v.push_back({prefix + "ln_f.bias", {C}, at(Param::lnfb), false});
    }
    return v;
}

// Names a checkpoint may hold that are not weights of ours: buffers older
// transformers saved (GPT-2's causal mask, Llama's inverse frequencies), and
// the tied LM head when a writer kept it.
bool ignorable(const GPTConfig& c, const std::string& name) {
    auto ends = [&](const std::string& s) {
        return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (c.llama()) return ends("rotary_emb.inv_freq") || (c.tied && name == "lm_head.weight");
    return ends(".attn.bias") || ends(".attn.masked_bias") || name == "lm_head.weight";
}

// out (cols x rows) = transpose of in (rows x cols), elements of es bytes.
void transpose_bytes(void* out, const void* in, size_t rows, size_t cols, size_t es) {
    const char* s = static_cast<const char*>(in);
    char* d = static_cast<char*>(out);
    const size_t blk = 32;  // blocks keep both sides in cache
    for (size_t i0 = 0; i0 < rows; i0 += blk)
        for (size_t j0 = 0; j0 < cols; j0 += blk)
            for (size_t i = i0; i < std::min(rows, i0 + blk); i++)
                for (size_t j = j0; j < std::min(cols, j0 + blk); j++)
                    std::memcpy(d + (j * rows + i) * es, s + (i * cols + j) * es, es);
}

}  // namespace

// ---- load -------------------------------------------------------------------------------------------

bool load_hf(const std::string& dir, GPT& model, std::string* err) {
    GPTConfig c;
    if (!read_hf_config(dir, &c, err)) return false;
    if (c != model.config()) {
        *err = dir + ": config.json describes " + config_string(c) + ", not the model " +
               config_string(model.config());
        return false;
    }
    // The files: one, or the shards the index lists.
    std::vector<SafetensorsFile> files;
    std::map<std::string, std::pair<size_t, const StTensor*>> where;  // name -> (file, tensor)
    const std::string index_path = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
    std::map<std::string, std::string> weight_map;
    if (file_size(index_path) >= 0) {
        json j;
        if (!read_json_object(index_path, &j, err)) return false;
        if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
            *err = index_path + ": no weight_map object";
            return false;
        }
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string() || it.value().get<std::string>().find('/') != std::string::npos) {
                *err = index_path + ": tensor " + it.key() + ": file " + it.value().dump() + " is not a file name";
                return false;
            }
            weight_map[it.key()] = it.value().get<std::string>();
        }
    } else if (file_size(single) < 0) {
        *err = dir + ": no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are read)";
        return false;
    }
    std::vector<std::string> names;  // the files, in a fixed order
    if (weight_map.empty()) names.push_back("model.safetensors");
    for (const auto& kv : weight_map)
        if (std::find(names.begin(), names.end(), kv.second) == names.end()) names.push_back(kv.second);
    files.resize(names.size());
    for (size_t i = 0; i < names.size(); i++)
        if (!files[i].open(dir + "/" + names[i], err)) return false;
    if (weight_map.empty()) {
        for (const StTensor& t : files[0].tensors()) where[t.name] = {0, &t};
    } else {
        for (const auto& kv : weight_map) {
            const size_t fi = std::find(names.begin(), names.end(), kv.second) - names.begin();
            const StTensor* t = files[fi].find(kv.first);
            if (!t) {
                *err = files[fi].path() + ": tensor " + kv.first + ": listed in model.safetensors.index.json but not in the file";
                return false;
            }
            where[kv.first] = {fi, t};
        }
    }
    // GPT-2 checkpoints name tensors with or without "transformer.".
    const std::string prefix = !c.llama() && where.count("transformer.wte.weight") ? "transformer." : "";
    const std::vector<HfTensor> expect = hf_tensors(c, prefix);
    const std::string files_text = weight_map.empty() ? single : dir + "/model-*.safetensors";
    std::set<std::string> expected;
    for (const HfTensor& h : expect) {
        expected.insert(h.name);
        auto it = where.find(h.name);
        if (it == where.end()) {
            *err = files_text + ": tensor " + h.name + " is missing (" + hf_architecture(c) + ", " + config_string(c) + ")";
            return false;
        }
        const StTensor& t = *it->second.second;
        const std::string tw = files[it->second.first].path() + ": tensor " + h.name + ": ";
        if (t.shape != h.shape) {
            *err = tw + "shape " + st_shape_text(t.shape) + ", expected " + st_shape_text(h.shape) + " for config.json's " +
                   config_string(c);
            return false;
        }
        if (!st_dtype_readable(t.dtype)) {
            *err = tw + "dtype " + t.dtype + " (weights must be F32, BF16, F16 or F64)";
            return false;
        }
    }
    for (const auto& kv : where) {
        if (!expected.count(kv.first) && !ignorable(c, kv.first)) {
            *err = files[kv.second.first].path() + ": tensor " + kv.first + ": unexpected (not a weight of " +
                   hf_architecture(c) + " as config.json describes it)";
            return false;
        }
    }
    // One tensor at a time, in the host type that loses nothing for the model.
    const DType ht = model.weights_dtype() == DType::F64 ? DType::F64 : DType::F32;
    const size_t es = dtype_size(ht);
    std::vector<char> host, tr;
    for (const HfTensor& h : expect) {
        const auto& loc = where[h.name];
        const size_t n = (size_t)h.numel();
        // A pipeline stage reads only the tensors it holds.
        bool held = false;
        for (const TensorEntry& e : model.table().entries)
            held = held || (e.file_offset < h.file_begin + n && h.file_begin < e.file_offset + e.file_rows * e.file_cols);
        if (!held) continue;
        host.resize(n * es);
        if (!files[loc.first].read(*loc.second, host.data(), ht, err)) return false;
        for (size_t i = 0; i < n; i++) {
            const double x = ht == DType::F64 ? reinterpret_cast<const double*>(host.data())[i]
                                              : reinterpret_cast<const float*>(host.data())[i];
            if (!std::isfinite(x)) {
                *err = files[loc.first].path() + ": tensor " + h.name + ": element " + std::to_string(i) + " is " +
                       (std::isnan(x) ? "NaN" : "infinite");
                return false;
            }
        }
        const void* src = host.data();
        if (h.transpose) {
            tr.resize(n * es);
            transpose_bytes(tr.data(), host.data(), h.shape[0], h.shape[1], es);
            src = tr.data();
        }
        model.set_weights_file_range(src, ht, h.file_begin, h.file_begin + n);
    }
    return true;
}

// ---- export -----------------------------------------------------------------------------------------

// Every rank's verdict, the same on all (the lowest failing rank's message).
static bool agree(bool ok, std::string* err) {
    std::string msg = ok ? std::string() : *err;
    return dist_all_ok(ok, msg, err);
}

// What an earlier export (ours or another tool's) may have left in the
// directory that would shadow the one file just written: a sharded model's
// index and shards (loaders read the index first, so -e DIR would load the
// stale weights) and the temporary files of an export that was killed.
static bool remove_stale_hf_files(const std::string& dir, std::string* err) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
        const bool shard = starts("model-") && name.find("-of-") != std::string::npos &&
                           name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
        bool tmp = starts("model.safetensors.tmp.") || starts("config.json.tmp.") || starts("tokenizer.json.tmp.");
        for (int i = 0; i < kHfSideFileCount; i++) tmp = tmp || starts((std::string(kHfSideFiles[i]) + ".tmp.").c_str());
        if (name == "model.safetensors.index.json" || shard || tmp) stale.push_back(it->path());
    }
    for (const fs::path& p : stale)
        if (!fs::remove(p, ec) || ec) {
            *err = "--export-hf " + dir + ": cannot remove the stale " + p.filename().string() + ": " + ec.message();
            return false;
        }
    return true;
}

bool export_hf(const std::string& dir, GPT& model, const Ownership& own, std::string* err, const HfExtras& extras) {
    const int rank = own.world ? own.world->rank() : 0;
    const GPTConfig& c = model.config();
    const DType wt = model.weights_dtype();
    // The file's type: --export-dtype, or (auto) the parameters' own
    // precision (bf16), or the weights' (fp32, fp64).
    DType ft = model.precision().param == DType::BF16 ? DType::BF16 : wt == DType::F64 ? DType::F64 : DType::F32;
    if (extras.dtype == "fp32") ft = DType::F32;
    if (extras.dtype == "bf16") ft = DType::BF16;
    if (extras.dtype == "fp64") ft = DType::F64;
    const char* torch_dtype = ft == DType::BF16 ? "bfloat16" : ft == DType::F64 ? "float64" : "float32";
    const std::vector<HfTensor> tensors = hf_tensors(c, "transformer.");
    SafetensorsWriter w;
    bool ok = true;
    if (rank == 0) {
        std::vector<SafetensorsWriter::Entry> entries;
        for (const HfTensor& h : tensors) entries.push_back({h.name, st_dtype_name(ft), h.shape});
        AtomicWriter cj;
        ojson config = hf_config_json(c, torch_dtype);
        hf_token_ids(config, extras);
        hf_keep_source_fields(config, extras);
        const std::string text = config.dump(2) + "\n";
        ok = make_dirs(dir, err) && cj.open(dir + "/config.json", err) && cj.write(text.data(), text.size()) &&
             cj.commit(err) && w.open(dir + "/model.safetensors", entries, {{"format", "pt"}}, err);
        if (!ok && err->empty()) *err = "cannot write " + dir + "/config.json";
    }
    if (!agree(ok, err)) return false;
    // Each tensor: every rank writes what it owns of the range into a zeroed
    // buffer, a sum over the world assembles it (each element has one
    // owner), rank 0 transposes, converts and appends it.
    std::vector<char> tr, out;
    WeightGather gather(model, own);
    const size_t ws = dtype_size(wt);
    for (const HfTensor& h : tensors) {
        const size_t n = (size_t)h.numel();
        const std::vector<char>& host = gather.gather(h.file_begin, n);
        if (rank == 0 && ok) {
            const char* src = host.data();
            if (h.transpose) {  // ours is (out, in); Conv1D stores (in, out) = shape
                tr.resize(n * ws);
                transpose_bytes(tr.data(), host.data(), h.shape[1], h.shape[0], ws);
                src = tr.data();
            }
            out.resize(n * dtype_size(ft));
            convert_host(out.data(), ft, src, wt, n);
            ok = w.write(out.data(), out.size(), err);
        }
    }
    if (rank == 0 && ok) {
        ok = w.commit(err);
        if (ok) ok = hf_write_side_files(dir, extras, c.max_seq_len, err);
        if (ok) ok = remove_stale_hf_files(dir, err);
    }
    return agree(ok, err);
}
