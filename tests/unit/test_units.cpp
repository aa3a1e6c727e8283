// tests/unit/test_units.cpp: unit tests of the library pieces that the PyTorch
// comparison does not reach, each against an independent truth: the
// parameter-count formula of docs/design.md section 1, the llm.c file layout,
// the schedule formula, statistics of the GPT-2 initialisation, and the
// error paths (one message naming the file or flag, nothing half-written).
// Last line: "N passed, N failed".
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/base/args.h"
#include "llmc/backend/backend_cpu.h"
#include "llmc/backend/cpu_moe.h"
#include "llmc/io/checkpoint.h"
#include "llmc/model/config.h"
#include "llmc/base/fileio.h"
#include "llmc/model/gpt.h"
#include "llmc/io/model_io.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/tensors.h"
#include "llmc/run/train_config.h"
#include "tests/lib/check.h"

static bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

static void test_config_and_table() {
    GPTConfig c;
    std::string err;
    CHECK(parse_model_spec("d12", &c, &err), "d12: %s", err.c_str());
    CHECK(c.num_layers == 12 && c.channels == 768 && c.num_heads == 12 && c.vocab_size == 50257 &&
              c.padded_vocab_size == 50304 && c.max_seq_len == 1024,
          "d12 shape %s", config_string(c).c_str());
    TensorTable t12(c);
    // GPT-2 124M: 124,475,904 parameters with Vp = 50304 (llm.c's count).
    CHECK(t12.total == 124475904ull && t12.total == gpt2_param_count(c), "d12 params %zu", t12.total);
    // llm.c's MFU count at T=1024: 6 per parameter plus 6·L·C·T.
    CHECK(train_flops_per_token(c, 1024) == 6.0 * 124475904 + 6.0 * 12 * 768 * 1024, "d12 flops/token %.0f",
          train_flops_per_token(c, 1024));
    CHECK(parse_model_spec("d24", &c, &err) && c.channels == 1536 && c.num_heads == 24, "d24");
    CHECK(parse_model_spec("L=3,C=48,NH=3,V=97,T=24", &c, &err) && c.padded_vocab_size == 128, "odd spec");
    {   // Heads: GPT-2 tied; Llama untied unless tied=1 (transformers' LlamaConfig default).
        GPTConfig g, l, lt;
        CHECK(parse_model_spec("L=3,C=48,NH=3,V=97,T=24", &g, &err) && g.tied, "gpt-2 spec tied");
        CHECK(parse_model_spec("arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16", &l, &err) && !l.tied &&
                  l.num_kv_heads == 2 && l.ffn == 72 && l.padded_vocab_size == 101,
              "llama spec: untied by default, NKV, F, Vp = V");
        CHECK(parse_model_spec("tied=1,arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16", &lt, &err) && lt.tied,
              "llama spec tied=1 before arch");
        // Training FLOPs by hand (6 per weight of a product, 6·L·C·T): each
        // block's norms (2C), QKV (C·(C + 2·Ckv), Ckv = NKV·C/NH = 24),
        // o_proj (C²), gate/up/down (3·C·F); the final norm (C); the head
        // V·C. The untied embedding is a lookup, left out; tied, wte is the
        // head and counts once.
        const double llama_block = 2 * 48 + 48 * (48 + 2 * 24) + 48 * 48 + 3 * 48 * 72;
        const double llama_mm = 2 * llama_block + 48 + 101 * 48;
        CHECK(train_flops_per_token(l, 16) == 6 * llama_mm + 6 * 2 * 48 * 16 &&
                  model_param_count(l) == llama_mm + 101 * 48,
              "llama untied flops/token %.0f (want %.0f): the embedding lookup is no product",
              train_flops_per_token(l, 16), 6 * llama_mm + 6 * 2 * 48 * 16);
        CHECK(train_flops_per_token(lt, 16) == 6 * llama_mm + 6 * 2 * 48 * 16 &&
                  model_param_count(lt) == llama_mm,
              "llama tied flops/token %.0f: wte is the head, counted once", train_flops_per_token(lt, 16));
        // Qwen2: Llama with qkvb, C + 2·Ckv = 96 biases per block; eps 1e-6
        // unless given (Qwen2Config's default); untied unless tied=1.
        GPTConfig q, qt, qe;
        CHECK(parse_model_spec("arch=qwen2,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16", &q, &err) &&
                  q.arch == Arch::qwen2 && q.llama() && q.qkv_bias() && !l.qkv_bias() && !q.tied &&
                  q.norm_eps == 1e-6 && q.rope_theta == 10000 && q.padded_vocab_size == 101 &&
                  config_string(q).rfind("qwen2 L=2 C=48 NH=4 NKV=2 F=72", 0) == 0,
              "qwen2 spec: %s (%s)", err.c_str(), config_string(q).c_str());
        CHECK(parse_model_spec("arch=qwen2,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16,tied=1,eps=1e-5", &qt, &err) &&
                  qt.tied && qt.norm_eps == 1e-5 && !parse_model_spec("arch=qwen2,L=2,C=48,NH=4,NKV=2,V=101,T=16", &qe, &err),
              "qwen2 spec tied=1, eps given; F required");
        const double qwen_block = llama_block + (48 + 2 * 24), qwen_mm = 2 * qwen_block + 48 + 101 * 48;
        CHECK(train_flops_per_token(q, 16) == 6 * qwen_mm + 6 * 2 * 48 * 16 &&
                  model_param_count(q) == qwen_mm + 101 * 48,
              "qwen2 untied flops/token %.0f (want %.0f): the QKV biases count, the embedding lookup not",
              train_flops_per_token(q, 16), 6 * qwen_mm + 6 * 2 * 48 * 16);
        CHECK(train_flops_per_token(qt, 16) == 6 * qwen_mm + 6 * 2 * 48 * 16 && model_param_count(qt) == qwen_mm,
              "qwen2 tied flops/token %.0f: wte is the head, counted once", train_flops_per_token(qt, 16));
        // Under tp 2 each rank's qkvb holds its whole heads of Q, K and V
        // (HS = 12: Q rows [24r, 24r + 24), K [48 + 12r, ..), V [72 + 12r, ..)),
        // the same row runs as its qkvw.
        for (int r = 0; r < 2; r++) {
            TableSplit sp;
            sp.tp = 2, sp.tp_rank = r;
            const TensorTable tq(q, sp);
            const TensorEntry &b = tq.get(Param::qkvb, 1), &w = tq.get(Param::qkvw, 1);
            const size_t want[3][3] = {{0, 24 * (size_t)r, 24}, {24, 48 + 12 * (size_t)r, 12}, {36, 72 + 12 * (size_t)r, 12}};
            bool runs_ok = b.runs.size() == 3 && w.runs.size() == 3;
            for (size_t i = 0; runs_ok && i < 3; i++)
                runs_ok = b.runs[i].local == want[i][0] && b.runs[i].global == want[i][1] &&
                          b.runs[i].count == want[i][2] && w.runs[i].local == b.runs[i].local &&
                          w.runs[i].global == b.runs[i].global && w.runs[i].count == b.runs[i].count;
            // The rank's parameters: half of each block's QKV (and its
            // biases), o_proj, gate/up/down; 51 of the 101 vocabulary rows of
            // wte and lm_head; the norms whole.
            const size_t block = 48 + 48 * 48 + 48 + 24 * 48 + 48 + 3 * 48 * 36;
            CHECK(runs_ok && b.rows == 48 && b.cols == 1 && b.file_rows == 96 && b.split && !b.decay &&
                      tq.params == 2 * 51 * 48 + 2 * block + 48,
                  "qwen2 tp rank %d of 2: qkvb rows of its Q, K, V heads, as qkvw's; %zu parameters", r, tq.params);
        }
        // Mixtral: E, K, aux (default 0.01); the expert kinds in the table,
        // w1/w3 of each expert column-split and w2 row-split under tp.
        GPTConfig m;
        CHECK(parse_model_spec("arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=101,T=16", &m, &err) && m.moe() &&
                  m.llama() && m.experts == 4 && m.top_k == 2 && m.aux_coef == 0.01 && !m.tied,
              "mixtral spec: %s", err.c_str());
        // A table's cut by its degrees (llmc/model/tensors.h TableSplit).
        auto cut = [](int shards, int tp, int tp_rank, int ep, int ep_rank, int expert_shards) {
            TableSplit t;
            t.shards = shards, t.tp = tp, t.tp_rank = tp_rank, t.ep = ep, t.ep_rank = ep_rank;
            t.expert_shards = expert_shards;
            return t;
        };
        TensorTable tm(m), tm1(m, cut(1, 2, 1, 1, 0, 1));
        const size_t block = 48 + (4 + 2 * 2) * 12 * 48 + 48 * 48 + 48 + 4 * 48 + 4 * 3 * 48 * 40;
        CHECK(tm.total == model_param_count(m) && tm.total == 2 * 101 * 48 + 2 * block + 48 &&
                  !tm.has(Param::fcw, 0) && tm.get(Param::moe_fc, 1).rows == 4 * 80 &&
                  tm.get(Param::moe_proj, 1).rows == 4 * 48,
              "mixtral table: %zu elements", tm.total);
        // Training FLOPs count what a token goes through: the router whole
        // and K=2 of the E=4 experts (3·C·F each), by the formula here.
        const double active_block = 48 + (4 + 2 * 2) * 12 * 48 + 48 * 48 + 48 + 4 * 48 + 2 * 3 * 48 * 40;
        const double active = 2 * 101 * 48 + 2 * active_block + 48;
        // Untied: the embedding lookup is no product (the head's V·C is).
        CHECK(active_param_count(m) == active &&
                  train_flops_per_token(m, 16) == 6 * (active - 101 * 48) + 6 * 2 * 48 * 16,
              "mixtral active params %.0f (want %.0f), flops/token %.0f", active_param_count(m), active,
              train_flops_per_token(m, 16));
        CHECK(active_param_count(l) == (double)model_param_count(l), "llama: every parameter active");
        const TensorEntry& fc = tm1.get(Param::moe_fc, 0);
        CHECK(fc.rows == 4 * 40 && fc.runs.size() == 8 && fc.runs[1].global == 40 + 20 && fc.runs[2].global == 80 + 20 &&
                  tm1.get(Param::moe_proj, 0).cols == 20 && tm1.get(Param::moe_proj, 0).col_begin == 20 &&
                  !tm1.get(Param::moe_gate, 0).split,
              "mixtral tp rank 1 of 2: w1/w3 halves of each expert, w2's columns, the router whole");
        // Expert parallel: ep rank j of 2 holds experts 2j, 2j+1: moe_fc's
        // file rows [160j, 160j + 160), moe_proj's [96j, 96j + 96); with tp 2
        // the halves of its experts' w1/w3 and w2's columns; the router whole.
        for (int j = 0; j < 2; j++) {
            TensorTable te(m, cut(1, 1, 0, 2, j, 1)), tt(m, cut(1, 2, 1, 2, j, 1));
            const TensorEntry &f = te.get(Param::moe_fc, 1), &w2 = te.get(Param::moe_proj, 1);
            const TensorEntry &ft = tt.get(Param::moe_fc, 1), &w2t = tt.get(Param::moe_proj, 1);
            size_t covered = 0;
            for (const RowRun& rr : f.runs) covered += rr.count;
            CHECK(te.experts == 2 && te.expert_begin == 2 * j && f.rows == 160 && covered == 160 &&
                      f.runs.front().global == 160 * (size_t)j && f.runs.back().global + f.runs.back().count == 160 * (size_t)j + 160 &&
                      w2.rows == 96 && w2.runs.size() == 1 && w2.runs[0].global == 96 * (size_t)j &&
                      te.get(Param::moe_gate, 1).rows == 4 && te.total == tm.total - 2 * (2 * 80 * 48 + 2 * 48 * 40) &&
                      ft.rows == 80 && ft.runs.size() == 4 && ft.runs[1].global == 160 * (size_t)j + 40 + 20 &&
                      w2t.rows == 96 && w2t.cols == 20 && w2t.runs[0].global == 96 * (size_t)j,
                  "mixtral ep rank %d of 2: its experts' rows (tp 1 and tp rank 1 of 2), the router whole", j);
        }
        // Segments: with ep 2 a block unit is its dense tensors (padded to
        // the 4 dp shards) then its experts (padded to the 3 expert-data
        // shards); the other units one segment; a rank's shard of a unit is
        // its slice of each.
        TensorTable ts(m, cut(4, 1, 0, 2, 1, 3));
        bool segs_ok = ts.segments.size() == 4 && ts.segments[0].size() == 1 && ts.segments[3].size() == 1;
        size_t shard_sum = 0;
        for (int u = 0; u < ts.num_units(); u++) {
            const std::vector<UnitSegment>& sg = ts.segments[u];
            size_t at = ts.unit_begin[u];
            for (const UnitSegment& g : sg) {
                segs_ok = segs_ok && g.begin == at && g.size % g.shards == 0 && g.shards == (g.experts ? 3 : 4) &&
                          g.shard_begin == shard_sum;
                at += g.size, shard_sum += g.slice_size();
            }
            segs_ok = segs_ok && at == ts.unit_begin[u + 1];
        }
        for (int l = 0; l < 2; l++) {
            const std::vector<UnitSegment>& sg = ts.segments[block_unit(l)];
            const TensorEntry &gate = ts.get(Param::moe_gate, l), &w13 = ts.get(Param::moe_fc, l),
                              &w2 = ts.get(Param::moe_proj, l);
            segs_ok = segs_ok && sg.size() == 2 && !sg[0].experts && sg[1].experts && w13.offset == sg[1].begin &&
                      w2.offset + w2.numel <= sg[1].begin + sg[1].size && gate.offset + gate.numel <= sg[0].begin + sg[0].size &&
                      &ts.segment_of(block_unit(l), w2.offset) == &sg[1] && ts.ep_split(w13) && !ts.ep_split(gate);
        }
        CHECK(segs_ok && shard_sum == ts.shard_total, "mixtral ep 2: block units in a dense and an expert segment");
        for (const char* bad : {"arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,V=101,T=16",
                                "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=2,K=3,V=101,T=16",
                                "arch=llama,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=101,T=16",
                                "arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=101,T=16,aux=-1"})
            CHECK(!parse_model_spec(bad, &m, &err) && err.find('\n') == std::string::npos, "refused: %s", bad);
    }
    TensorTable t(c);
    CHECK(t.total == gpt2_param_count(c), "odd params %zu vs %zu", t.total, gpt2_param_count(c));
    // Memory offsets tile the buffer; file offsets are a permutation of it.
    size_t off = 0;
    std::vector<char> covered(t.total, 0);
    bool tiled = true, perm = true;
    for (const TensorEntry& e : t.entries) {
        tiled &= e.offset == off;
        off += e.numel;
        for (size_t i = 0; i < e.numel; i++) {
            perm &= !covered[e.file_offset + i];
            covered[e.file_offset + i] = 1;
        }
    }
    CHECK(tiled && off == t.total, "memory offsets do not tile the buffer");
    CHECK(perm, "file offsets overlap");
    // Units: embeddings, one per block, final LayerNorm; each contiguous.
    CHECK(t.num_units() == c.num_layers + 2, "units %d", t.num_units());
    bool units_ok = true;
    for (const TensorEntry& e : t.entries)
        units_ok &= e.offset >= t.unit_begin[e.unit] && e.offset + e.numel <= t.unit_begin[e.unit + 1];
    CHECK(units_ok, "tensor outside its unit");
    // File order of llm.c: qkvw of layer 1 follows qkvw of layer 0.
    CHECK(t.get(Param::qkvw, 1).file_offset == t.get(Param::qkvw, 0).file_offset + t.get(Param::qkvw, 0).numel,
          "qkvw stacking");
    CHECK(t.get(Param::wte).file_offset == 0 && t.get(Param::wpe).file_offset == 128 * 48, "wte/wpe file offsets");
    CHECK(t.get(Param::qkvw, 2).decay && !t.get(Param::qkvb, 2).decay && !t.get(Param::ln1w, 0).decay &&
              t.get(Param::wpe).decay,
          "decay flags");
    const char* bad[] = {"d0", "dx", "L=2,C=48,NH=5,V=97,T=8", "L=2,C=48,NH=3,V=97", "L=2,C=48,NH=3,V=97,T=8,Q=1",
                         "L=2,C=48,NH=3,V=97,T=8,Vp=64", "L=-1,C=48,NH=3,V=97,T=8"};
    for (const char* s : bad) {
        err.clear();
        CHECK(!parse_model_spec(s, &c, &err) && !err.empty(), "spec '%s' accepted", s);
    }
}

// Parses words as train_gpt's command line.
static bool parse_words(ArgParser& p, std::vector<std::string> args, std::string* err) {
    std::vector<char*> argv{(char*)"train_gpt"};
    for (std::string& a : args) argv.push_back(&a[0]);
    bool help;
    return p.parse((int)argv.size(), argv.data(), &help, err);
}

static void test_args() {
    TrainConfig cfg;
    ArgParser p("train_gpt", "test");
    add_train_options(p, cfg);
    std::string usage = p.usage();
    for (const Option& o : p.options()) {
        CHECK(contains(usage, std::string("--") + o.name), "usage lacks --%s", o.name);
        if (o.letter) CHECK(contains(usage, std::string("-") + o.letter + ","), "usage lacks -%c", o.letter);
    }
    const char* letters = "ijeobtdxluqcvmsgnyzra";
    for (const char* l = letters; *l; l++) {
        bool found = false;
        for (const Option& o : p.options()) found |= o.letter == *l;
        CHECK(found, "llm.c letter -%c missing", *l);
    }
    auto run = [&](std::vector<std::string> args, std::string* err) { return parse_words(p, args, err); };
    std::string err;
    CHECK(run({"-b", "3", "--seq-len=64", "--lr", "2e-4", "--device", "cpu"}, &err) && cfg.B == 3 && cfg.T == 64 &&
              cfg.lr == 2e-4 && cfg.device == "cpu",
          "good flags: %s", err.c_str());
    struct Bad {
        std::vector<std::string> args;
        const char* must_name;
    } bads[] = {{{"-b", "x"}, "-b"},          {{"--batch-size", "0"}, "--batch-size"}, {{"--nope", "1"}, "--nope"},
                {{"-t"}, "-t"},               {{"--device", "tpu"}, "tpu"},            {{"-l", "1e999"}, "-l"},
                {{"-y", "2"}, "-y"},          {{"-q", "1.5"}, "-q"},
                // negative numbers are values (refused for their range), and a
                // string flag does not swallow the next flag
                {{"-y", "-5"}, "'-5' is outside"}, {{"--sp", "-5"}, "--sp: '-5'"}, {{"-a", "-5"}, "-a: '-5'"},
                {{"-o", "-x", "3"}, "flag -o: missing value"}, {{"-o", "-a"}, "flag -o: missing value"},
                {{"--output-dir", "--lr"}, "--output-dir=VALUE"}};
    for (Bad& b : bads) {
        err.clear();
        CHECK(!run(b.args, &err) && contains(err, b.must_name) && err.find('\n') == std::string::npos,
              "bad flags accepted or message '%s' lacks '%s'", err.c_str(), b.must_name);
    }
}

static void test_args_values() {
    TrainConfig cfg;
    ArgParser p("train_gpt", "test");
    add_train_options(p, cfg);
    auto run = [&](std::vector<std::string> args, std::string* err) { return parse_words(p, args, err); };
    std::string err;
    CHECK(run({"--output-dir=-odd", "--sp", "-b", "2"}, &err) && cfg.output_dir == "-odd" && cfg.sp == 1 && cfg.B == 2,
          "a value starting with '-' in the --name=VALUE form; a bare on/off flag before another flag: %s",
          err.c_str());
    CHECK(run({"--lr", "-1e-3"}, &err) || contains(err, "--lr: '-1e-3'"), "a negative number reaches the range check: %s",
          err.c_str());
    CHECK(run({"--plan", ""}, &err) && cfg.plan.empty(), "--plan \"\", the default --help shows, is accepted: %s",
          err.c_str());
    err.clear();
    CHECK(!run({"--plan", "x"}, &err) && contains(err, "--plan"), "--plan x refused: %s", err.c_str());
}

static void test_schedule() {
    OptimConfig o;
    o.lr = 1e-3;
    o.warmup_steps = 4;
    o.final_lr_frac = 0.1;
    o.max_steps = 20;
    CHECK(std::fabs(lr_at(o, 0) - 2.5e-4) < 1e-18 && std::fabs(lr_at(o, 3) - 1e-3) < 1e-18, "warmup");
    CHECK(std::fabs(lr_at(o, 4) - 1e-3) < 1e-15, "cosine start");
    double mid = 1e-4 + 0.5 * (1 + std::cos(M_PI * 8.0 / 16.0)) * (1e-3 - 1e-4);
    CHECK(std::fabs(lr_at(o, 12) - mid) < 1e-15, "cosine middle %g vs %g", lr_at(o, 12), mid);
    o.final_lr_frac = 1.0;
    CHECK(lr_at(o, 17) == 1e-3, "q=1 keeps lr constant");
}

// Statistics of the GPT-2 initialisation on a model big enough to measure.
static void test_init() {
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F64));
    GPTConfig c;
    std::string err;
    parse_model_spec("L=4,C=64,NH=4,V=500,T=64", &c, &err);
    GPT m(be.get(), c, {1, 8});
    m.init_random(7);
    auto stats = [&](Param p, int layer, double* mean, double* sd) {
        const TensorEntry& e = m.table().get(p, layer);
        const double* x = (const double*)m.param(p, layer);
        size_t n = p == Param::wte ? (size_t)c.vocab_size * c.channels : e.numel;
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) s += x[i], s2 += x[i] * x[i];
        *mean = s / n;
        *sd = std::sqrt(s2 / n - *mean * *mean);
    };
    double mean, sd;
    stats(Param::wte, 0, &mean, &sd);
    CHECK(std::fabs(sd - 0.02) < 0.001 && std::fabs(mean) < 0.001, "wte sd %g", sd);
    stats(Param::fcw, 1, &mean, &sd);
    CHECK(std::fabs(sd - 0.02) < 0.001, "fcw sd %g", sd);
    stats(Param::fcprojw, 2, &mean, &sd);
    CHECK(std::fabs(sd - 0.02 / std::sqrt(8.0)) < 0.0005, "fcprojw sd %g (want %g)", sd, 0.02 / std::sqrt(8.0));
    stats(Param::attprojw, 3, &mean, &sd);
    CHECK(std::fabs(sd - 0.02 / std::sqrt(8.0)) < 0.0008, "attprojw sd %g", sd);
    stats(Param::ln1w, 1, &mean, &sd);
    CHECK(mean == 1.0 && sd == 0.0, "ln1w not ones");
    stats(Param::qkvb, 0, &mean, &sd);
    CHECK(mean == 0.0 && sd == 0.0, "qkvb not zero");
    {   // Qwen2: its QKV biases start at zero too, the weights N(0, 0.02).
        GPTConfig qc;
        parse_model_spec("arch=qwen2,L=2,C=64,NH=4,NKV=2,F=96,V=500,T=64", &qc, &err);
        GPT qm(be.get(), qc, {1, 8});
        qm.init_random(7);
        const TensorEntry &b = qm.table().get(Param::qkvb, 1), &w = qm.table().get(Param::qkvw, 1);
        const double *xb = (const double*)qm.param(Param::qkvb, 1), *xw = (const double*)qm.param(Param::qkvw, 1);
        double bmax = 0, s2 = 0;
        for (size_t i = 0; i < b.numel; i++) bmax = std::max(bmax, std::fabs(xb[i]));
        for (size_t i = 0; i < w.numel; i++) s2 += xw[i] * xw[i];
        CHECK(b.numel == 128 && bmax == 0.0 && std::fabs(std::sqrt(s2 / w.numel) - 0.02) < 0.001,
              "qwen2 init: qkvb zero (max %g), qkvw sd %g", bmax, std::sqrt(s2 / w.numel));
    }
    const double* wte = (const double*)m.param(Param::wte);
    bool pad_zero = true;
    for (size_t i = (size_t)c.vocab_size * c.channels; i < (size_t)c.padded_vocab_size * c.channels; i++)
        pad_zero &= wte[i] == 0.0;
    CHECK(pad_zero, "padded wte rows not zero");
    GPT m2(be.get(), c, {1, 8}), m3(be.get(), c, {1, 8});
    m2.init_random(7);
    m3.init_random(8);
    size_t bytes = m.table().total * sizeof(double);
    CHECK(std::memcmp(m.params(), m2.params(), bytes) == 0, "same seed, different init");
    CHECK(std::memcmp(m.params(), m3.params(), bytes) != 0, "different seeds, same init");
}

static std::string tmpdir() {
    char tmpl[] = "/tmp/llmc_units_XXXXXX";
    return mkdtemp(tmpl);
}

static void write_bytes(const std::string& path, const std::vector<char>& b) {
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
}
static std::vector<char> read_bytes(const std::string& path) {
    std::vector<char> b(file_size(path) > 0 ? file_size(path) : 0);
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f) {
        size_t got = std::fread(b.data(), 1, b.size(), f);
        b.resize(got);
        std::fclose(f);
    }
    return b;
}

static void test_model_io_and_checkpoint() {
    std::string dir = tmpdir(), err;
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F32));
    GPTConfig c;
    parse_model_spec("L=2,C=48,NH=3,V=97,T=16", &c, &err);
    GPT m(be.get(), c, {2, 8});
    m.init_random(3);
    std::string path = dir + "/m.bin";
    CHECK(save_model(path, m, 3, &err), "save: %s", err.c_str());
    std::vector<char> bytes = read_bytes(path);
    CHECK(bytes.size() == 1024 + 4 * m.table().total, "model file size %zu", bytes.size());
    // Header fields and the file order of a tensor, checked by hand.
    const int* h = (const int*)bytes.data();
    CHECK(h[0] == 20240326 && h[1] == 3 && h[2] == 16 && h[3] == 97 && h[4] == 2 && h[5] == 3 && h[6] == 48 &&
              h[7] == 128,
          "header");
    const float* payload = (const float*)(bytes.data() + 1024);
    const TensorEntry& q1 = m.table().get(Param::qkvw, 1);
    CHECK(std::memcmp(payload + q1.file_offset, m.param(Param::qkvw, 1), q1.numel * 4) == 0, "qkvw[1] in file");
    GPT m2(be.get(), c, {2, 8});
    CHECK(load_model(path, m2, &err) && std::memcmp(m.params(), m2.params(), m.table().total * 4) == 0,
          "round trip: %s", err.c_str());
    // bf16 version: values within bf16 rounding.
    std::string p5 = dir + "/m5.bin";
    CHECK(save_model(p5, m, 5, &err) && file_size(p5) == (long long)(1024 + 2 * m.table().total), "v5 save");
    GPT m5(be.get(), c, {2, 8});
    CHECK(load_model(p5, m5, &err), "v5 load: %s", err.c_str());
    double maxrel = 0;
    for (size_t i = 0; i < m.table().total; i++) {
        float a = ((float*)m.params())[i], b = ((float*)m5.params())[i];
        if (a != 0) maxrel = std::max(maxrel, (double)std::fabs((a - b) / a));
    }
    CHECK(maxrel <= 1.0 / 256, "bf16 rounding %g", maxrel);
    // Corrupt files: each error names the file.
    struct Corrupt {
        const char* name;
        std::vector<char> data;
    };
    std::vector<char> badmagic = bytes, badver = bytes, trunc(bytes.begin(), bytes.end() - 10), shorth(bytes.begin(), bytes.begin() + 100);
    ((int*)badmagic.data())[0] = 1234;
    ((int*)badver.data())[1] = 4;
    std::vector<char> badshape = bytes;
    ((int*)badshape.data())[5] = 5;  // NH=5 does not divide C=48
    Corrupt cs[] = {{"magic", badmagic}, {"version", badver}, {"trunc", trunc}, {"short", shorth}, {"shape", badshape}};
    for (Corrupt& k : cs) {
        std::string p = dir + "/bad_" + k.name + ".bin";
        write_bytes(p, k.data);
        err.clear();
        GPTConfig cc;
        int v;
        CHECK(!read_model_header(p, &cc, &v, &err) && contains(err, p), "corrupt %s accepted (%s)", k.name, err.c_str());
    }
    err.clear();
    GPTConfig other;
    parse_model_spec("L=2,C=48,NH=3,V=98,T=16", &other, &err);
    GPT mo(be.get(), other, {1, 4});
    CHECK(!load_model(path, mo, &err) && contains(err, "does not match"), "shape mismatch accepted");

    // Checkpoint round trip, including Adam state and the RNG.
    for (size_t i = 0; i < m.table().total; i++) ((float*)m.adam_m())[i] = 0.001f * (float)i, ((float*)m.adam_v())[i] = 1e-6f * (float)i;
    TrainState st;
    st.step = 7, st.rng_state = 0x123456789abcdefull, st.rows_consumed = 4242;
    std::string ck = dir + "/ck";
    RunInfo run;
    run.max_steps = 11;
    run.total_batch = 64;
    CHECK(save_checkpoint(ck, m, Ownership(), st, run, &err), "checkpoint: %s", err.c_str());
    CHECK(latest_checkpoint(ck) == 7, "latest %d", latest_checkpoint(ck));
    GPT m3(be.get(), c, {2, 8});
    TrainState st3;
    RunInfo run3;
    CHECK(load_checkpoint(ck, 7, m3, &st3, &run3, &err), "load checkpoint: %s", err.c_str());
    CHECK(run3.max_steps == 11 && run3.total_batch == 64, "checkpoint run info");
    size_t P = m.table().total;
    CHECK(std::memcmp(m.params(), m3.params(), P * 4) == 0 && std::memcmp(m.adam_m(), m3.adam_m(), P * 4) == 0 &&
              std::memcmp(m.adam_v(), m3.adam_v(), P * 4) == 0,
          "checkpoint payload");
    CHECK(st3.step == 7 && st3.rng_state == st.rng_state && st3.rows_consumed == 4242, "checkpoint state");
    // A torn checkpoint (no DONE file) is never resumed from.
    std::remove(done_path(ck, 7).c_str());
    CHECK(latest_checkpoint(ck) == -1, "torn checkpoint taken");
    // A truncated shard is refused with its name.
    std::string sp = checkpoint_dir(ck, 7) + "/shard_00000.bin";
    std::vector<char> sb = read_bytes(sp);
    sb.resize(sb.size() - 4);
    write_bytes(sp, sb);
    err.clear();
    CHECK(!load_checkpoint(ck, 7, m3, &st3, &run3, &err) && contains(err, sp), "truncated shard accepted (%s)",
          err.c_str());
    // A corrupt index is refused with its name.
    write_bytes(checkpoint_dir(ck, 7) + "/index.json", std::vector<char>{'{', 'x'});
    err.clear();
    CHECK(!load_checkpoint(ck, 7, m3, &st3, &run3, &err) && contains(err, "index.json"), "corrupt index accepted (%s)",
          err.c_str());
    // No temporary files are left behind; the torn checkpoint is cleaned.
    CHECK(std::system(("ls " + dir + " " + ck + " | grep -q '[.]tmp[.]'").c_str()) != 0, "temporary files left");
    CHECK(clean_checkpoints(ck, 0) == 1 && access(checkpoint_dir(ck, 7).c_str(), F_OK) != 0, "torn checkpoint not cleaned");
    std::system(("rm -rf " + dir).c_str());
}

// --moe-balance bias: the routing's choice by probability + bias, the
// weights from the probabilities alone; the update b_e += rate·sign(mean -
// load_e) per layer; the imbalance max/mean - 1, averaged over layers.
static void test_moe_bias() {
    // logits ln(4, 3, 2, 1): p = 0.4, 0.3, 0.2, 0.1. Without a bias the top 2
    // are experts 0 and 1; a bias of 0.15 on expert 2 (0.35 > 0.3) takes 2.
    const double logits[4] = {std::log(4.0), std::log(3.0), std::log(2.0), std::log(1.0)};
    const double no_bias[4] = {0, 0, 0, 0}, bias[4] = {0, 0, 0.15, 0};
    for (int with = 0; with < 2; with++) {
        double probs[4], topw[2];
        int topi[2], off[5], perm[2], inv[2];
        cpu::moe_route(probs, topw, topi, off, perm, inv, logits, 1, 4, 2, with ? bias : no_bias);
        const int second = with ? 2 : 1;
        const double w0 = 0.4 / (0.4 + (with ? 0.2 : 0.3));
        CHECK(topi[0] == 0 && topi[1] == second && std::fabs(topw[0] - w0) < 1e-15 &&
                  std::fabs(topw[1] - (1 - w0)) < 1e-15 && off[1] == 1 && off[second + 1] - off[second] == 1,
              "moe route %s bias: top 2 = %d %d, weights %.6f %.6f", with ? "with" : "without", topi[0], topi[1],
              topw[0], topw[1]);
    }
    // Two layers of 4 experts: loads (6, 2, 4, 4) (mean 4) and (4, 4, 4, 4).
    std::vector<double> b = {0.5, 0, 0, 0, 0, 0, 0, 0}, loads = {6, 2, 4, 4, 4, 4, 4, 4};
    moe_bias_update(&b, loads, 4, 0.25);
    const std::vector<double> want = {0.25, 0.25, 0, 0, 0, 0, 0, 0};
    CHECK(b == want, "moe bias update: %g %g %g %g", b[0], b[1], b[2], b[3]);
    CHECK(std::fabs(moe_max_violation(loads, 4) - 0.25) < 1e-15, "moe max violation: (6/4 - 1 + 0) / 2 = 0.25, got %g",
          moe_max_violation(loads, 4));
}

int main() {
    test_moe_bias();
    test_config_and_table();
    test_args();
    test_args_values();
    test_schedule();
    test_init();
    test_model_io_and_checkpoint();
    return check_summary();
}
