// tests/unit/test_hf.cpp: the safetensors reader and writer, Hugging Face
// config.json and checkpoint loading errors, and tokenizer.json decoding,
// each against an independent truth: values written by hand, the IEEE
// binary16 formula, headers that lie in one way each (the error must be one
// line naming the file and the tensor), and GPT-2's published bytes<->unicode
// examples.
// With --decode FILE.json it prints "id hex-bytes" per token instead (for
// tests/reference/test_hf.py, which compares with the `tokenizers` package).
// Last line: "N passed, N failed".
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backends.h"
#include "llmc/base/fileio.h"
#include "llmc/model/gpt.h"
#include "llmc/io/hf.h"
#include "llmc/io/safetensors.h"
#include "llmc/io/tokenizer.h"
#include "tests/lib/check.h"

static std::string g_dir;

static void write_text(const std::string& path, const std::string& s) {
    std::ofstream o(path, std::ios::binary);
    o << s;
}

// A safetensors file with a header written by hand (lies included) and
// `data` bytes of payload.
static void write_raw(const std::string& path, const std::string& header, size_t data, uint64_t len_override = 0) {
    std::string out(8, '\0');
    const uint64_t n = len_override ? len_override : header.size();
    for (int i = 0; i < 8; i++) out[i] = (char)(n >> (8 * i));
    out += header;
    out += std::string(data, '\x01');
    write_text(path, out);
}

// The error of opening path, which must fail with one line naming the file
// and (when given) the tensor, and containing `what`.
static void expect_open_error(const std::string& name, const std::string& path, const std::string& tensor,
                              const std::string& what) {
    SafetensorsFile f;
    std::string err;
    const bool ok = f.open(path, &err);
    CHECK(!ok, "%s: opened a lying file", name.c_str());
    CHECK(err.find(path) != std::string::npos, "%s: error does not name the file: %s", name.c_str(), err.c_str());
    CHECK(tensor.empty() || err.find("tensor " + tensor) != std::string::npos, "%s: error does not name tensor %s: %s",
          name.c_str(), tensor.c_str(), err.c_str());
    CHECK(err.find(what) != std::string::npos, "%s: error lacks '%s': %s", name.c_str(), what.c_str(), err.c_str());
    CHECK(err.find('\n') == std::string::npos, "%s: error is not one line: %s", name.c_str(), err.c_str());
    std::printf("  %s -> %s\n", name.c_str(), err.c_str());
}

// ---- fp16 ---------------------------------------------------------------------------------------

static void test_f16() {
    int bad = 0, bad_back = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        double want;
        if (e == 31) want = m ? NAN : INFINITY;
        else if (e == 0) want = std::ldexp((double)m, -24);  // subnormal: m * 2^-14 / 1024
        else want = std::ldexp(1.0 + m / 1024.0, e - 15);
        if (s) want = -want;
        const float got = f16_to_f32((uint16_t)h);
        if (std::isnan(want) ? !std::isnan(got) : (double)got != want) bad++;
        if (!std::isnan(want) && f32_to_f16(got) != (uint16_t)h) bad_back++;
    }
    CHECK(bad == 0, "f16_to_f32 differs from the binary16 formula for %d patterns", bad);
    CHECK(bad_back == 0, "f32_to_f16 does not invert f16_to_f32 for %d patterns", bad_back);
    // Rounding: halfway between 1 and 1+2^-10 goes to even (1); 65520 overflows.
    CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00, "tie to even");
    CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02, "tie to even (up)");
    CHECK(f32_to_f16(65520.0f) == 0x7c00 && f32_to_f16(65519.0f) == 0x7bff, "overflow at 65520");
}

// ---- reader and writer --------------------------------------------------------------------------

static void test_round_trip() {
    const std::string path = g_dir + "/rt.safetensors";
    const float a[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
    const double b[3] = {0.1, -1e300, 3.141592653589793};
    const uint16_t c[4] = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f), f32_to_bf16(256.0f), f32_to_bf16(3.0f)};
    const uint16_t d[2] = {f32_to_f16(0.25f), f32_to_f16(-1024.0f)};
    SafetensorsWriter w;
    std::string err;
    std::vector<SafetensorsWriter::Entry> entries;
    entries.push_back({"a", "F32", {2, 3}});
    entries.push_back({"b.x", "F64", {3}});
    entries.push_back({"c", "BF16", {2, 2}});
    entries.push_back({"d", "F16", {2}});
    bool ok = w.open(path, entries, {{"format", "pt"}}, &err) &&
              w.write(a, sizeof(a), &err) && w.write(b, sizeof(b), &err) && w.write(c, sizeof(c), &err) &&
              w.write(d, sizeof(d), &err) && w.commit(&err);
    CHECK(ok, "write: %s", err.c_str());
    SafetensorsFile f;
    ok = f.open(path, &err);
    CHECK(ok, "open: %s", err.c_str());
    if (!ok) return;
    CHECK(f.tensors().size() == 4 && f.metadata().size() == 1 && f.metadata().at("format") == "pt", "tensors, metadata");
    // The header length keeps the data 8-byte aligned; offsets are contiguous.
    FILE* fp = std::fopen(path.c_str(), "rb");
    uint64_t n = 0;
    CHECK(std::fread(&n, 8, 1, fp) == 1 && n % 8 == 0, "header length %llu a multiple of 8", (unsigned long long)n);
    std::fclose(fp);
    const StTensor* ta = f.find("a");
    const StTensor* tb = f.find("b.x");
    CHECK(ta && tb && ta->begin == 0 && ta->end == 24 && tb->begin == 24 && tb->end == 48 &&
              ta->shape == std::vector<uint64_t>({2, 3}),
          "offsets and shape");
    std::vector<double> x(6);
    ok = f.read(*ta, x.data(), DType::F64, &err);
    bool same = ok;
    for (int i = 0; i < 6; i++) same = same && x[i] == (double)a[i];
    CHECK(same, "F32 -> F64 values: %s", err.c_str());
    std::vector<float> y(3);
    ok = f.read(*tb, y.data(), DType::F32, &err);
    CHECK(ok && y[0] == 0.1f && std::isinf(y[1]) && y[2] == (float)b[2], "F64 -> F32 values");
    ok = f.read(*f.find("c"), x.data(), DType::F64, &err);
    CHECK(ok && x[0] == 1.0 && x[1] == -0.5 && x[2] == 256.0 && x[3] == 3.0, "BF16 -> F64 values");
    ok = f.read(*f.find("d"), y.data(), DType::F32, &err);
    CHECK(ok && y[0] == 0.25f && y[1] == -1024.0f, "F16 -> F32 values");
    // The writer refuses a tensor of the wrong size, and unknown dtypes.
    SafetensorsWriter w2;
    err.clear();
    const std::vector<SafetensorsWriter::Entry> one = {{"t", "F32", {4}}}, bad = {{"t", "F17", {4}}};
    ok = w2.open(g_dir + "/w2.safetensors", one, {}, &err) && w2.write(a, 12, &err);
    CHECK(!ok && err.find("tensor t") != std::string::npos, "short write refused: %s", err.c_str());
    SafetensorsWriter w3;
    err.clear();
    CHECK(!w3.open(g_dir + "/w3.safetensors", bad, {}, &err) && err.find("F17") != std::string::npos,
          "writer: unknown dtype: %s", err.c_str());
    CHECK(file_size(g_dir + "/w2.safetensors") < 0, "no file left by a failed write");
}

static void test_lies() {
    const std::string d = g_dir;
    // Offsets past the end of the data.
    write_raw(d + "/past.st", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12);
    expect_open_error("offsets past the end", d + "/past.st", "w", "past the end");
    // Two tensors sharing bytes.
    write_raw(d + "/overlap.st",
              R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
              16);
    expect_open_error("overlapping tensors", d + "/overlap.st", "b", "overlap");
    // A shape whose element count does not match the byte range.
    write_raw(d + "/shape.st", R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", 16);
    expect_open_error("shape vs bytes", d + "/shape.st", "w", "span 16");
    // An unknown dtype.
    write_raw(d + "/dtype.st", R"({"w":{"dtype":"F17","shape":[4],"data_offsets":[0,16]}})", 16);
    expect_open_error("unknown dtype", d + "/dtype.st", "w", "unknown dtype");
    // A truncated file: a valid header whose data was cut short.
    write_raw(d + "/trunc.st",
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[8],"data_offsets":[8,24]}})",
              20);
    expect_open_error("truncated", d + "/trunc.st", "b", "truncated");
    // Header lengths that lie: longer than the file, and absurd.
    write_raw(d + "/len.st", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 4096);
    expect_open_error("header length past the file", d + "/len.st", "", "bad header length 4096");
    write_raw(d + "/len2.st", R"({})", 0, 1ull << 62);
    expect_open_error("absurd header length", d + "/len2.st", "", "bad header length");
    write_text(d + "/short.st", "abc");
    expect_open_error("shorter than the length field", d + "/short.st", "", "truncated");
    // Not JSON; begin after end; a negative dimension; offsets not a pair.
    write_raw(d + "/json.st", R"({"w":{"dtype":"F32",)", 0);
    expect_open_error("header not JSON", d + "/json.st", "", "not valid JSON");
    write_raw(d + "/order.st", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8);
    expect_open_error("begin after end", d + "/order.st", "w", "end before begin");
    write_raw(d + "/neg.st", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
    expect_open_error("negative dimension", d + "/neg.st", "w", "shape");
    write_raw(d + "/pair.st", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4);
    expect_open_error("offsets not a pair", d + "/pair.st", "w", "data_offsets");
    // A shape whose count overflows 64 bits must not wrap to a small number.
    write_raw(d + "/ovf.st", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
    expect_open_error("shape overflow", d + "/ovf.st", "w", "2^64");
    // A valid file with an integer tensor: opens, but is not read as weights.
    write_raw(d + "/int.st", R"({"i":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
    SafetensorsFile f;
    std::string err;
    CHECK(f.open(d + "/int.st", &err), "I64 file opens: %s", err.c_str());
    std::vector<float> x(2);
    CHECK(!f.read(*f.find("i"), x.data(), DType::F32, &err) && err.find("tensor i") != std::string::npos &&
              err.find("I64") != std::string::npos,
          "I64 not read as weights: %s", err.c_str());
}

// ---- config.json --------------------------------------------------------------------------------

static void expect_config_error(const std::string& name, const std::string& json, const std::string& what) {
    const std::string dir = g_dir + "/cfg_" + name;
    mkdir(dir.c_str(), 0755);
    write_text(dir + "/config.json", json);
    GPTConfig c;
    std::string err;
    CHECK(!read_hf_config(dir, &c, &err), "%s: config accepted", name.c_str());
    CHECK(err.find(dir + "/config.json") != std::string::npos && err.find(what) != std::string::npos &&
              err.find('\n') == std::string::npos,
          "%s: error '%s' lacks the file or '%s'", name.c_str(), err.c_str(), what.c_str());
    std::printf("  %s -> %s\n", name.c_str(), err.c_str());
}

static void test_config() {
    const std::string llama =
        R"("architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":48,"num_attention_heads":4,)"
        R"("num_key_value_heads":2,"intermediate_size":72,"num_hidden_layers":3,"vocab_size":101,)"
        R"("max_position_embeddings":64,"rope_theta":500000.0,"rms_norm_eps":1e-6)";
    const std::string dir = g_dir + "/cfg_llama";
    mkdir(dir.c_str(), 0755);
    write_text(dir + "/config.json", "{" + llama + "}");
    GPTConfig c;
    std::string err;
    bool ok = read_hf_config(dir, &c, &err);
    CHECK(ok && c.llama() && c.channels == 48 && c.num_heads == 4 && c.kv_heads() == 2 && c.hidden() == 72 &&
              c.num_layers == 3 && c.vocab_size == 101 && c.padded_vocab_size == 101 && c.max_seq_len == 64 &&
              c.rope_theta == 500000.0 && c.norm_eps == 1e-6 && !c.tied,
          "llama config read: %s (%s)", err.c_str(), config_string(c).c_str());
    const std::string gdir = g_dir + "/cfg_gpt2";
    mkdir(gdir.c_str(), 0755);
    write_text(gdir + "/config.json", R"({"model_type":"gpt2","n_embd":48,"n_head":3,"n_layer":2,"vocab_size":97,"n_positions":24})");
    ok = read_hf_config(gdir, &c, &err);
    CHECK(ok && !c.llama() && c.channels == 48 && c.num_heads == 3 && c.num_layers == 2 && c.vocab_size == 97 &&
              c.padded_vocab_size == 97 && c.max_seq_len == 24 && c.tied,
          "gpt2 config read: %s", err.c_str());
    // Mixtral: the experts' keys, and transformers' defaults where absent.
    const std::string mixtral =
        R"("architectures":["MixtralForCausalLM"],"model_type":"mixtral","hidden_size":48,"num_attention_heads":4,)"
        R"("num_key_value_heads":2,"intermediate_size":40,"num_hidden_layers":2,"vocab_size":101,)"
        R"("max_position_embeddings":64,"num_local_experts":6,"num_experts_per_tok":3,"router_aux_loss_coef":0.02,)"
        R"("sliding_window":null)";
    const std::string mdir = g_dir + "/cfg_mixtral";
    mkdir(mdir.c_str(), 0755);
    write_text(mdir + "/config.json", "{" + mixtral + "}");
    ok = read_hf_config(mdir, &c, &err);
    CHECK(ok && c.moe() && c.llama() && c.experts == 6 && c.top_k == 3 && c.aux_coef == 0.02 && c.hidden() == 40 &&
              c.max_seq_len == 64 && !c.tied,
          "mixtral config read: %s (%s)", err.c_str(), config_string(c).c_str());
    write_text(mdir + "/config.json", R"({"model_type":"mixtral","hidden_size":48,"num_attention_heads":4,)"
                                      R"("intermediate_size":40,"num_hidden_layers":2,"vocab_size":101})");
    ok = read_hf_config(mdir, &c, &err);
    CHECK(ok && c.moe() && c.experts == 8 && c.top_k == 2 && c.aux_coef == 0.001 && c.max_seq_len == 131072,
          "mixtral defaults: %s (%s)", err.c_str(), config_string(c).c_str());
    // Qwen2: Llama's keys with the Q, K, V biases implied; Qwen2Config's
    // defaults where absent (eps 1e-6, theta 1e4, a context of 32768,
    // untied); the sliding window off unless use_sliding_window says so.
    const std::string qwen2 =
        R"("architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":48,"num_attention_heads":4,)"
        R"("num_key_value_heads":2,"intermediate_size":72,"num_hidden_layers":3,"vocab_size":101,)"
        R"("sliding_window":16,"max_window_layers":2)";
    const std::string qdir = g_dir + "/cfg_qwen2";
    mkdir(qdir.c_str(), 0755);
    write_text(qdir + "/config.json",
               "{" + qwen2 + R"(,"use_sliding_window":false,"tie_word_embeddings":true,"rope_theta":1000000.0})");
    ok = read_hf_config(qdir, &c, &err);
    CHECK(ok && c.arch == Arch::qwen2 && c.llama() && !c.moe() && c.qkv_bias() && c.kv_heads() == 2 &&
              c.hidden() == 72 && c.max_seq_len == 32768 && c.norm_eps == 1e-6 && c.rope_theta == 1e6 && c.tied,
          "qwen2 config read: %s (%s)", err.c_str(), config_string(c).c_str());
    write_text(qdir + "/config.json", R"({"model_type":"qwen2","hidden_size":48,"num_attention_heads":4,)"
                                      R"("intermediate_size":72,"num_hidden_layers":2,"vocab_size":101})");
    ok = read_hf_config(qdir, &c, &err);
    CHECK(ok && c.arch == Arch::qwen2 && c.kv_heads() == 4 && c.rope_theta == 10000 && !c.tied &&
              config_string(c).rfind("qwen2 L=2 C=48", 0) == 0,
          "qwen2 by model_type, defaults: %s (%s)", err.c_str(), config_string(c).c_str());
    expect_config_error("qwen2_window", "{" + qwen2 + R"(,"use_sliding_window":true})", "use_sliding_window");
    expect_config_error("qwen2_rope", "{" + qwen2 + R"(,"rope_scaling":{"type":"yarn","factor":4.0}})", "rope_scaling");
    expect_config_error("mixtral_window", "{" + mixtral + R"(,"sliding_window":32})", "sliding_window");
    expect_config_error("mixtral_jitter", "{" + mixtral + R"(,"router_jitter_noise":0.1})", "router_jitter_noise");
    expect_config_error("mixtral_k", "{" + mixtral + R"(,"num_experts_per_tok":7})", "K <= E");
    expect_config_error("rope_scaling", "{" + llama + R"(,"rope_scaling":{"type":"linear","factor":2.0}})", "rope_scaling");
    expect_config_error("attention_bias", "{" + llama + R"(,"attention_bias":true})", "attention_bias");
    expect_config_error("mlp_bias", "{" + llama + R"(,"mlp_bias":true})", "mlp_bias");
    expect_config_error("hidden_act", "{" + llama + R"(,"hidden_act":"gelu"})", "hidden_act");
    expect_config_error("head_dim", "{" + llama + R"(,"head_dim":16})", "head_dim");
    expect_config_error("nkv", R"({"model_type":"llama","hidden_size":48,"num_attention_heads":4,"num_key_value_heads":3,)"
                               R"("intermediate_size":72,"num_hidden_layers":3,"vocab_size":101})",
                        "NKV");
    expect_config_error("missing", R"({"model_type":"llama","hidden_size":48})", "missing num_attention_heads");
    expect_config_error("arch", R"({"architectures":["MistralForCausalLM"],"model_type":"mistral"})", "MistralForCausalLM");
    expect_config_error("gpt2_eps", R"({"model_type":"gpt2","layer_norm_epsilon":1e-6})", "layer_norm_epsilon");
    expect_config_error("gpt2_act", R"({"model_type":"gpt2","activation_function":"relu"})", "activation_function");
    expect_config_error("gpt2_inner", R"({"model_type":"gpt2","n_embd":48,"n_head":3,"n_inner":100})", "n_inner");
    expect_config_error("notjson", R"({"model_type":)", "not valid JSON");
    const std::string nodir = g_dir + "/cfg_none";
    mkdir(nodir.c_str(), 0755);
    CHECK(!read_hf_config(nodir, &c, &err) && err.find("config.json: cannot open") != std::string::npos,
          "no config.json: %s", err.c_str());
}

// ---- checkpoints --------------------------------------------------------------------------------

// Rewrites src's model.safetensors into dir (with src's config.json),
// changed by edit(name, entry) which may rename, reshape or drop (return
// false) each tensor; `extra` adds a tensor.
template <typename Edit>
static void rewrite(const std::string& src, const std::string& dir, Edit edit, const SafetensorsWriter::Entry* extra = nullptr) {
    mkdir(dir.c_str(), 0755);
    std::ifstream in(src + "/config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_text(dir + "/config.json", cfg);
    SafetensorsFile f;
    std::string err;
    if (!f.open(src + "/model.safetensors", &err)) return;
    std::vector<SafetensorsWriter::Entry> entries;
    std::vector<std::vector<char>> data;
    for (const StTensor& t : f.tensors()) {
        SafetensorsWriter::Entry e{t.name, t.dtype, t.shape};
        std::vector<char> raw(t.numel() * 4);
        f.read(t, raw.data(), DType::F32, &err);
        e.dtype = "F32";
        if (!edit(&e)) continue;
        uint64_t n = 1;
        for (uint64_t x : e.shape) n *= x;
        raw.resize(n * st_dtype_size(e.dtype), 0);
        entries.push_back(e);
        data.push_back(raw);
    }
    if (extra) {
        entries.push_back(*extra);
        data.push_back(std::vector<char>(4 * 3, 0));
    }
    SafetensorsWriter w;
    w.open(dir + "/model.safetensors", entries, {{"format", "pt"}}, &err);
    for (auto& d : data) w.write(d.data(), d.size(), &err);
    w.commit(&err);
}

static void expect_load_error(Backend* be, const GPTConfig& c, const std::string& name, const std::string& dir,
                              const std::string& tensor, const std::string& what) {
    GPT m(be, c, {1, 8});
    std::string err;
    CHECK(!load_hf(dir, m, &err), "%s: loaded", name.c_str());
    CHECK(err.find(dir) != std::string::npos && err.find("tensor " + tensor) != std::string::npos &&
              err.find(what) != std::string::npos && err.find('\n') == std::string::npos,
          "%s: error '%s' lacks the file, tensor %s or '%s'", name.c_str(), err.c_str(), tensor.c_str(), what.c_str());
    std::printf("  %s -> %s\n", name.c_str(), err.c_str());
}

static void test_checkpoints() {
    std::string err;
    std::unique_ptr<Backend> be(make_backend("cpu", "fp32", 0, &err));
    GPTConfig c;
    parse_model_spec("L=2,C=32,NH=2,V=67,Vp=67,T=16", &c, &err);
    // A model exported and loaded back holds the same weights.
    const std::string src = g_dir + "/gpt2";
    GPT a(be.get(), c, {1, 8});
    a.init_random(5);
    bool ok = export_hf(src, a, Ownership(), &err);
    CHECK(ok, "export: %s", err.c_str());
    GPTConfig read;
    ok = read_hf_config(src, &read, &err);
    CHECK(ok && read == c, "exported config.json reads back as the model's shape: %s", err.c_str());
    GPT b(be.get(), c, {1, 8});
    ok = load_hf(src, b, &err);
    CHECK(ok, "load: %s", err.c_str());
    const size_t P = a.table().file_params;
    std::vector<float> wa(P), wb(P);
    a.get_file_order(wa.data(), DType::F32, a.weights(), false, a.weights_dtype());
    b.get_file_order(wb.data(), DType::F32, b.weights(), false, b.weights_dtype());
    CHECK(wa == wb, "weights equal after export and load");
    // The exported Conv1D weight is the transpose of qkvw: element (i, j) of
    // c_attn.weight is qkvw row j, column i.
    SafetensorsFile f;
    ok = f.open(src + "/model.safetensors", &err);
    const StTensor* t = ok ? f.find("transformer.h.1.attn.c_attn.weight") : nullptr;
    CHECK(t && t->shape == std::vector<uint64_t>({32, 96}), "c_attn.weight shape (in, out)");
    if (t) {
        std::vector<float> x(t->numel());
        f.read(*t, x.data(), DType::F32, &err);
        const size_t q = a.table().get(Param::qkvw, 1).file_offset;
        bool tr = true;
        for (size_t i = 0; i < 32; i++)
            for (size_t j = 0; j < 96; j++) tr = tr && x[i * 96 + j] == wa[q + j * 32 + i];
        CHECK(tr, "c_attn.weight is qkvw transposed");
    }
    // What a checkpoint must not do.
    rewrite(src, g_dir + "/miss", [](SafetensorsWriter::Entry* e) { return e->name != "transformer.h.1.mlp.c_fc.bias"; });
    expect_load_error(be.get(), c, "missing tensor", g_dir + "/miss", "transformer.h.1.mlp.c_fc.bias", "missing");
    rewrite(src, g_dir + "/shape", [](SafetensorsWriter::Entry* e) {
        if (e->name == "transformer.h.0.attn.c_proj.weight") e->shape = {32, 31};
        return true;
    });
    expect_load_error(be.get(), c, "wrong shape", g_dir + "/shape", "transformer.h.0.attn.c_proj.weight",
                      "shape [32, 31], expected [32, 32]");
    rewrite(src, g_dir + "/transposed", [](SafetensorsWriter::Entry* e) {
        if (e->name == "transformer.h.0.mlp.c_fc.weight") e->shape = {128, 32};  // stored (out, in): not Conv1D's
        return true;
    });
    expect_load_error(be.get(), c, "Linear layout where Conv1D is expected", g_dir + "/transposed",
                      "transformer.h.0.mlp.c_fc.weight", "expected [32, 128]");
    SafetensorsWriter::Entry extra{"transformer.h.0.attn.q_proj.bias", "F32", {3}};
    rewrite(src, g_dir + "/extra", [](SafetensorsWriter::Entry*) { return true; }, &extra);
    expect_load_error(be.get(), c, "unexpected tensor", g_dir + "/extra", "transformer.h.0.attn.q_proj.bias", "unexpected");
    rewrite(src, g_dir + "/i32", [](SafetensorsWriter::Entry* e) {
        if (e->name == "transformer.wpe.weight") e->dtype = "I32";
        return true;
    });
    expect_load_error(be.get(), c, "integer weights", g_dir + "/i32", "transformer.wpe.weight", "dtype I32");
    // The shape in config.json must be the model's.
    GPTConfig other = c;
    other.num_layers = 3;
    GPT m3(be.get(), other, {1, 8});
    CHECK(!load_hf(src, m3, &err) && err.find("config.json describes") != std::string::npos, "shape mismatch: %s",
          err.c_str());
    // A sharded checkpoint whose index names a tensor its file lacks.
    const std::string sh = g_dir + "/sharded";
    mkdir(sh.c_str(), 0755);
    write_text(sh + "/config.json", "{\"model_type\":\"gpt2\",\"n_embd\":32,\"n_head\":2,\"n_layer\":2,\"vocab_size\":67,\"n_positions\":16}");
    std::ifstream in(src + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_text(sh + "/model-00001-of-00001.safetensors", bytes);
    write_text(sh + "/model.safetensors.index.json",
               R"({"metadata":{},"weight_map":{"transformer.wte.weight":"model-00001-of-00001.safetensors","transformer.h.9.ln_1.weight":"model-00001-of-00001.safetensors"}})");
    GPT m4(be.get(), c, {1, 8});
    CHECK(!load_hf(sh, m4, &err) && err.find("tensor transformer.h.9.ln_1.weight") != std::string::npos &&
              err.find("model-00001-of-00001.safetensors") != std::string::npos,
          "index names a tensor the shard lacks: %s", err.c_str());
    std::printf("  index lies -> %s\n", err.c_str());
    // A shard that is missing altogether.
    write_text(sh + "/model.safetensors.index.json",
               R"({"weight_map":{"transformer.wte.weight":"model-00002-of-00002.safetensors"}})");
    CHECK(!load_hf(sh, m4, &err) && err.find("model-00002-of-00002.safetensors") != std::string::npos,
          "missing shard: %s", err.c_str());
}

// ---- tokenizer.json -----------------------------------------------------------------------------

static std::string load_tok(Tokenizer* t, const std::string& name, const std::string& json) {
    const std::string path = g_dir + "/" + name;
    write_text(path, json);
    std::string err;
    return t->load(path, &err) ? "" : err;
}

static void test_tokenizer() {
    // GPT-2's table (published examples): U+0120 'Ġ' is the space byte,
    // U+010A 'Ċ' newline, U+0100 'Ā' byte 0, U+0143 'Ń' byte 0xAD, 'ÿ' 0xFF;
    // "âĢĻ" is the three bytes of U+2019.
    Tokenizer t;
    std::string err = load_tok(&t, "bl.json", R"({"added_tokens":[{"id":7,"content":"<|endoftext|>","special":true}],
        "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},"decoder":{"type":"ByteLevel"},
        "model":{"type":"BPE","vocab":{"Ġhello":0,"Ċ":1,"âĢĻ":2,"a":3,"Ā":4,"Ń":5,"ÿ":6},"merges":[]}})");
    CHECK(err.empty(), "byte-level tokenizer.json: %s", err.c_str());
    CHECK(t.vocab_size() == 8 && t.eot() == 7, "vocab %d eot %d", t.vocab_size(), t.eot());
    CHECK(t.decode(0) == " hello" && t.decode(1) == "\n" && t.decode(2) == "\xE2\x80\x99" && t.decode(3) == "a",
          "byte-level decode");
    CHECK(t.decode(4) == std::string(1, '\0') && t.decode(5) == "\xAD" && t.decode(6) == "\xFF", "bytes 0, 0xAD, 0xFF");
    CHECK(t.decode(7) == "<|endoftext|>" && t.decode(8) == "<?>", "added token literal, id past the vocab");
    // Llama 3: a Sequence pre-tokenizer holding ByteLevel; start token.
    err = load_tok(&t, "l3.json", R"({"added_tokens":[{"id":3,"content":"<|begin_of_text|>"},{"id":4,"content":"<|end_of_text|>"}],
        "pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split"},{"type":"ByteLevel"}]},"decoder":null,
        "model":{"type":"BPE","vocab":{"Ġworld":0,"!":1,"ĊĊ":2}}})");
    CHECK(err.empty() && t.eot() == 3 && t.decode(0) == " world" && t.decode(2) == "\n\n" &&
              t.decode(3) == "<|begin_of_text|>",
          "llama 3 style: %s eot %d", err.c_str(), t.eot());
    // SentencePiece style with byte fallback.
    err = load_tok(&t, "sp.json", R"({"added_tokens":[{"id":1,"content":"<s>"}],
        "decoder":{"type":"Sequence","decoders":[{"type":"Replace"},{"type":"ByteFallback"}]},
        "model":{"type":"BPE","byte_fallback":true,"vocab":{"<unk>":0,"<s>":1,"▁the":2,"<0x0A>":3,"cat":4}}})");
    CHECK(err.empty() && t.eot() == 1 && t.decode(2) == " the" && t.decode(3) == "\n" && t.decode(4) == "cat",
          "sentencepiece style: %s", err.c_str());
    // Errors name the file.
    err = load_tok(&t, "bad.json", R"({"model":{"type":"BPE"}})");
    CHECK(err.find("bad.json") != std::string::npos && err.find("model.vocab") != std::string::npos, "%s", err.c_str());
    // An id far past the tokens: named, not a billion-entry table.
    err = load_tok(&t, "huge.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"c":1000000000}}})");
    CHECK(err.find("huge.json") != std::string::npos && err.find("token id 1000000000 is far past the 3 tokens") !=
              std::string::npos, "%s", err.c_str());
    err = load_tok(&t, "gap.json", R"({"added_tokens":[{"id":60000,"content":"<|x|>"}],"model":{"type":"BPE","vocab":{"a":0}}})");
    CHECK(err.empty() && t.decode(60000) == "<|x|>", "an added token past a small vocabulary: %s", err.c_str());
    err = load_tok(&t, "bad2.json", R"({"model":)");
    CHECK(err.find("bad2.json") != std::string::npos && err.find("not valid JSON") != std::string::npos &&
              err.find('\n') == std::string::npos,
          "%s", err.c_str());
}

static int decode_main(const std::string& path) {
    Tokenizer t;
    std::string err;
    if (!t.load(path, &err)) {
        std::fprintf(stderr, "test_hf: %s\n", err.c_str());
        return 1;
    }
    for (int i = 0; i < t.vocab_size(); i++) {
        std::string s = t.decode(i), hex;
        char b[3];
        for (unsigned char ch : s) {
            std::snprintf(b, sizeof(b), "%02x", ch);
            hex += b;
        }
        std::printf("%d %s\n", i, hex.c_str());
    }
    std::printf("eot %d\n", t.eot());
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--decode") return decode_main(argv[2]);
    char tmpl[] = "/tmp/test_hf_XXXXXX";
    if (!mkdtemp(tmpl)) {
        std::printf("cannot make a temporary directory\n0 passed, 1 failed\n");
        return 1;
    }
    g_dir = tmpl;
    test_f16();
    test_round_trip();
    test_lies();
    test_config();
    test_checkpoints();
    test_tokenizer();
    std::string cmd = "rm -rf '" + g_dir + "'";
    if (std::system(cmd.c_str()) != 0) std::printf("(could not remove %s)\n", g_dir.c_str());
    return check_summary();
}
