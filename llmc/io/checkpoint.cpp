// llmc/io/checkpoint.cpp: sharded checkpoints (llmc/io/checkpoint.h), the
// writing side: the shard image and payload, the index (JSON, written with
// nlohmann-json), finding and cleaning checkpoints. Reading and verifying
// them is llmc/io/checkpoint_read.cpp.
#include "llmc/io/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::string checkpoint_dir(const std::string& dir, int step) {
    char name[32];
    std::snprintf(name, sizeof(name), "ckpt_%08d", step);
    return dir + "/" + name;
}

std::string done_path(const std::string& dir, int step) {
    char name[32];
    std::snprintf(name, sizeof(name), "DONE_%08d", step);
    return dir + "/" + name;
}

static std::string shard_name(int rank) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05d.bin", rank);
    return name;
}

// ---- pieces: runs of model-file elements ------------------------------------------------------

struct OwnedRuns {
    std::vector<Piece> pieces;
    std::vector<std::pair<size_t, size_t>> runs;  // (buffer offset, n) in payload order
    size_t elems = 0;
};

static OwnedRuns owned_runs(const GPT& model, bool sharded, const Ownership& own) {
    OwnedRuns r;
    auto add = [&](size_t f, size_t o, size_t n) {
        r.runs.push_back({o, n});
        r.elems += n;
        if (!r.pieces.empty()) {
            Piece& p = r.pieces.back();
            if (p.len == n && p.count == 1 && f > p.off) {
                p.stride = f - p.off;
                p.count = 2;
                return;
            }
            if (p.len == n && p.count > 1 && f == p.off + p.count * p.stride) {
                p.count++;
                return;
            }
        }
        r.pieces.push_back({f, n, n, 1});
    };
    for_each_owned(model.table(), model.sharding(), sharded, own.whole_owner, own.replicated_owner, own.expert_owner, add);
    return r;
}

// ---- writing ---------------------------------------------------------------------------------

ShardImage shard_image(const std::string& dir, int step, GPT& model, const Ownership& own) {
    const int rank = own.world ? own.world->rank() : 0, world = own.world ? own.world->size() : 1;
    const DType wt = model.weights_dtype(), ot = model.precision().opt;
    const OwnedRuns w = owned_runs(model, model.weights_sharded(), own);
    const OwnedRuns o = owned_runs(model, model.sharding().optimizer, own);
    int h[kHeaderInts] = {0};
    h[0] = kShardMagic;
    h[1] = 1;
    h[2] = rank;
    h[3] = world;
    h[4] = (int)wt;
    h[5] = (int)ot;
    put_u64(h, 6, w.pieces.size());
    put_u64(h, 8, o.pieces.size());
    ShardImage im;
    im.path = checkpoint_dir(dir, step) + "/" + shard_name(rank);
    im.head.assign(reinterpret_cast<const char*>(h), reinterpret_cast<const char*>(h) + sizeof(h));
    for (const OwnedRuns* r : {&w, &o})
        for (const Piece& pc : r->pieces) {
            const uint64_t q[4] = {pc.off, pc.len, pc.stride, pc.count};
            im.head.insert(im.head.end(), reinterpret_cast<const char*>(q), reinterpret_cast<const char*>(q) + sizeof(q));
        }
    im.sections = piece_bytes(w.pieces, o.pieces, dtype_size(wt), dtype_size(ot));
    im.payload_bytes = w.elems * dtype_size(wt) + 2 * o.elems * dtype_size(ot);
    return im;
}

// Calls put(host bytes, n) for this rank's payload, run by run: its own
// part, never more, through one run-sized host buffer.
template <class Put>
static void stream_payload(GPT& model, const Ownership& own, Put put) {
    const DType wt = model.weights_dtype(), ot = model.precision().opt;
    const OwnedRuns w = owned_runs(model, model.weights_sharded(), own);
    const OwnedRuns o = owned_runs(model, model.sharding().optimizer, own);
    std::vector<char> host;
    auto section = [&](const OwnedRuns& r, const void* buf, DType t) {
        for (const auto& run : r.runs) {
            host.resize(run.second * dtype_size(t));
            model.backend().download(host.data(), t, elem_ptr(buf, t, run.first), t, run.second);
            put(host.data(), host.size());
        }
    };
    section(w, model.weights(), wt);
    section(o, model.adam_m(), ot);
    section(o, model.adam_v(), ot);
}

void copy_shard_payload(GPT& model, const Ownership& own, char* host) {
    size_t at = 0;
    stream_payload(model, own, [&](const char* p, size_t n) {
        std::memcpy(host + at, p, n);
        at += n;
    });
}

static void write_trailer(AtomicWriter& f, const PieceHasher& hasher) {
    const uint64_t trailer[2] = {kTrailerMagic, (uint64_t)hasher.sums().size()};
    f.write(trailer, sizeof(trailer));
    f.write(hasher.sums().data(), hasher.sums().size() * sizeof(uint64_t));
}

bool write_shard_image(const ShardImage& im, const char* payload, std::string* err,
                       const std::function<void()>& before_commit) {
    AtomicWriter f;
    if (!f.open(im.path, err)) return false;
    f.write(im.head.data(), im.head.size());
    PieceHasher hasher(im.sections);
    // In blocks, so the hash and the write share each block while it is in cache.
    constexpr size_t kBlock = size_t(1) << 22;
    for (size_t at = 0; at < im.payload_bytes; at += kBlock) {
        const size_t n = std::min(kBlock, im.payload_bytes - at);
        f.write(payload + at, n);
        hasher.feed(payload + at, n);
    }
    write_trailer(f, hasher);
    if (before_commit) before_commit();
    return f.commit(err);
}

static bool write_shard(const std::string& dir, int step, GPT& model, const Ownership& own, std::string* err) {
    const ShardImage im = shard_image(dir, step, model, own);
    AtomicWriter f;
    if (!f.open(im.path, err)) return false;
    f.write(im.head.data(), im.head.size());
    PieceHasher hasher(im.sections);
    stream_payload(model, own, [&](const char* p, size_t n) {
        f.write(p, n);
        hasher.feed(p, n);
    });
    write_trailer(f, hasher);
    return f.commit(err);
}

std::string checkpoint_index_text(GPT& model, int world, const TrainState& st, const RunInfo& run) {
    const GPTConfig& c = model.config();
    const Precision& p = model.precision();
    json j;
    j["format"] = "llmc-checkpoint";
    j["version"] = 1;
    j["step"] = st.step;
    j["model"] = {{"maxT", c.max_seq_len}, {"V", c.vocab_size}, {"Vp", c.padded_vocab_size},
                  {"L", c.num_layers}, {"NH", c.num_heads}, {"C", c.channels}};
    if (c.llama()) {
        j["model"]["arch"] = arch_name(c.arch);  // llama, mixtral or qwen2
        j["model"]["NKV"] = c.kv_heads();
        j["model"]["F"] = c.hidden();
        j["model"]["theta"] = c.rope_theta;
        j["model"]["eps"] = c.norm_eps;
        j["model"]["tied"] = c.tied;
        if (c.moe()) {
            j["model"]["E"] = c.experts;
            j["model"]["K"] = c.top_k;
            j["model"]["aux"] = c.aux_coef;
        }
    }
    j["params"] = model.table().file_params;
    j["weights_dtype"] = dtype_name(model.weights_dtype());
    j["adam_dtype"] = dtype_name(p.opt);
    j["rng_state"] = st.rng_state;
    j["rows_consumed"] = st.rows_consumed;
    j["skips"] = st.skips;
    j["loss_mean"] = st.loss_mean;
    j["loss_count"] = st.loss_count;
    if (!st.moe_bias.empty()) j["moe_bias"] = st.moe_bias;
    if (!st.fp8_history.empty()) j["fp8_amax_history"] = st.fp8_history;
    j["run"] = {{"max_steps", run.max_steps}, {"total_batch", run.total_batch}, {"B", run.B}, {"T", run.T},
                {"world", run.world}, {"pp", run.pp}, {"vpp", run.vpp}, {"dp", run.dp}, {"cp", run.cp},
                {"tp", run.tp}, {"sp", run.sp}, {"zero", run.zero}, {"recompute", run.recompute},
                {"data", run.data}};
    json shards = json::array();
    for (int r = 0; r < world; r++) shards.push_back(shard_name(r));
    j["shards"] = shards;
    return j.dump(2) + "\n";
}

bool write_file_atomic(const std::string& path, const std::string& text, std::string* err) {
    AtomicWriter f;
    if (!f.open(path, err)) return false;
    f.write(text.data(), text.size());  // a failed write fails the commit, which names the file
    return f.commit(err);
}

bool save_checkpoint(const std::string& dir, GPT& model, const Ownership& own, const TrainState& st,
                     const RunInfo& run, std::string* err) {
    const int rank = own.world ? own.world->rank() : 0, world = own.world ? own.world->size() : 1;
    const std::string cdir = checkpoint_dir(dir, st.step);
    bool ok = rank != 0 || make_dirs(cdir, err);
    if (!all_ranks_ok(ok, err)) return false;
    ok = write_shard(dir, st.step, model, own, err);
    if (!all_ranks_ok(ok, err)) return false;
    if (rank == 0)
        ok = write_file_atomic(cdir + "/index.json", checkpoint_index_text(model, world, st, run), err) &&
             write_file_atomic(done_path(dir, st.step), "", err);
    return all_ranks_ok(ok, err);
}

// ---- finding and cleaning --------------------------------------------------------------------

static std::vector<std::string> list_dir(const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d))
            if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
        closedir(d);
    }
    return names;
}

int latest_checkpoint(const std::string& dir) {
    const std::vector<int> all = complete_checkpoints(dir);
    return all.empty() ? -1 : all.front();
}

std::vector<int> complete_checkpoints(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& n : list_dir(dir)) {
        int s = -1;
        char tail = 0;
        if (std::sscanf(n.c_str(), "DONE_%d%c", &s, &tail) == 1 && s >= 0) steps.push_back(s);
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
}


// Removes a checkpoint directory and its files (one level deep).
static void remove_tree(const std::string& p) {
    for (const std::string& n : list_dir(p)) std::remove((p + "/" + n).c_str());
    rmdir(p.c_str());
}

int clean_checkpoints(const std::string& dir, int keep) {
    int removed = 0;
    std::vector<int> complete;
    for (const std::string& n : list_dir(dir)) {
        const std::string p = dir + "/" + n;
        int s = -1;
        char tail = 0;
        if (n.find(".tmp.") != std::string::npos) {  // a file being written when the run died
            removed += std::remove(p.c_str()) == 0;
        } else if (std::sscanf(n.c_str(), "ckpt_%d%c", &s, &tail) == 1 && is_dir(p)) {
            if (file_size(done_path(dir, s)) < 0) {  // torn: never finished
                remove_tree(p);
                removed++;
            } else {
                complete.push_back(s);
            }
        }
    }
    if (keep <= 0) return removed;
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + keep < complete.size(); i++) {
        const int s = complete[i];
        // DONE first: a crash half-way leaves a torn checkpoint, cleaned next time.
        std::remove(done_path(dir, s).c_str());
        if (is_dir(checkpoint_dir(dir, s))) remove_tree(checkpoint_dir(dir, s));
        char name[32];
        std::snprintf(name, sizeof(name), "/model_%08d.bin", s);
        std::remove((dir + name).c_str());
        removed++;
    }
    return removed;
}
