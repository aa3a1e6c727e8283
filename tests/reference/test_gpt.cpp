// tests/reference/test_gpt.cpp: checks the trainer against the PyTorch reference.
//
// tests/reference/reference_gpt.py writes a model file and a debug state (inputs,
// targets, the logits, loss and every gradient of the initial model, and the
// losses of S AdamW steps on that batch); tests/reference/reference_hf.py writes the
// same state for a Hugging Face directory (transformers' LlamaForCausalLM or
// GPT2LMHeadModel). This program loads the same model into a backend, runs
// the same forward, backward and S steps, and compares each quantity by
// relative error ‖a-b‖/‖b‖ against a tolerance per dtype: fp64 1e-10, fp32
// 1e-5 (CPU); bf16 see docs/gpu-results.md.
//
// usage: test_gpt --model M --state S.bin [--device cpu|cuda]
//                 [--dtype fp32|fp64|bf16] [--tol X] [--document-mask EOT] [--fp8 1 [--fp8-history N]]
//        test_gpt --model M --write-logits OUT [--B 2 --T 16 --data-seed 1]
//        test_gpt --model M [--write-weights OUT] [--export-hf DIR]
// M: an llm.c model file, a Hugging Face directory (config.json), or an
// output directory with checkpoints (its latest). --write-logits writes
// random inputs and the model's logits for them (header int32 20241201, B,
// T, V; inputs int32[B*T]; logits fp64[B*T*V]) for
// tests/reference/reference_hf.py --compare (the export round trip).
// --write-weights writes the loaded weights in model file order (fp64) and
// --export-hf the model as a Hugging Face directory, for
// tests/reference/reference_hf.py --check-weights (the loader's and the exporter's
// tensor maps against transformers' own tensors).
// Last line: "N passed, N failed"; exit status 1 when any check failed.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/base/args.h"
#include "llmc/backend/backends.h"
#include "llmc/io/checkpoint.h"
#include "llmc/base/fileio.h"
#include "llmc/model/gpt.h"
#include "llmc/io/hf.h"
#include "llmc/io/model_io.h"
#include "llmc/model/optimizer.h"
#include "llmc/base/rng.h"
#include "tests/lib/tolerances.h"

constexpr int kDebugStateMagic = 20240327;

// What the reference wrote (see the header comment of tests/reference/reference_gpt.py).
struct DebugState {
    int B = 0, T = 0, steps = 0;
    OptimConfig opt;
    std::vector<int> inputs, targets;
    std::vector<double> logits, grads, step_losses;
    double loss = 0;
};

static bool read_state(const std::string& path, const GPTConfig& c, size_t P, DebugState* s, std::string* err) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = "state file " + path + ": cannot open";
        return false;
    }
    int h[kHeaderInts];
    bool ok = std::fread(h, 4, kHeaderInts, f) == (size_t)kHeaderInts;
    if (!ok || h[0] != kDebugStateMagic || (h[1] != 2 && h[1] != 3)) {
        std::fclose(f);
        *err = "state file " + path + ": bad header";
        return false;
    }
    s->B = h[2];
    s->T = h[3];
    s->steps = h[4];
    s->opt.warmup_steps = h[5];
    double hp[7];
    std::memcpy(hp, &h[8], sizeof(hp));
    s->opt.lr = hp[0];
    s->opt.beta1 = hp[1];
    s->opt.beta2 = hp[2];
    s->opt.eps = hp[3];
    s->opt.weight_decay = hp[4];
    s->opt.grad_clip = hp[5];
    s->opt.final_lr_frac = hp[6];
    s->opt.max_steps = s->steps;
    DType ft = h[1] == 3 ? DType::F64 : DType::F32;
    size_t N = (size_t)s->B * s->T, V = c.vocab_size;
    auto read_floats = [&](std::vector<double>& out, size_t n) {
        std::vector<char> raw(n * dtype_size(ft));
        if (std::fread(raw.data(), 1, raw.size(), f) != raw.size()) return false;
        out.resize(n);
        convert_host(out.data(), DType::F64, raw.data(), ft, n);
        return true;
    };
    s->inputs.resize(N);
    s->targets.resize(N);
    std::vector<double> loss;
    ok = std::fread(s->inputs.data(), 4, N, f) == N && std::fread(s->targets.data(), 4, N, f) == N &&
         read_floats(s->logits, N * V) && read_floats(loss, 1) && read_floats(s->grads, P) &&
         read_floats(s->step_losses, s->steps);
    std::fclose(f);
    if (!ok) {
        *err = "state file " + path + ": truncated";
        return false;
    }
    s->loss = loss[0];
    return true;
}

struct Checker {
    int passed = 0, failed = 0;
    void check(const std::string& what, const double* a, const double* b, size_t n, double tol) {
        double diff = 0, ref = 0;
        for (size_t i = 0; i < n; i++) {
            diff += (a[i] - b[i]) * (a[i] - b[i]);
            ref += b[i] * b[i];
        }
        double rel = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
        bool ok = rel <= tol;  // also false for NaN
        (ok ? passed : failed)++;
        std::printf("%s %-28s rel err %.3e (tol %.0e)\n", ok ? "PASS" : "FAIL", what.c_str(), rel, tol);
        // The same as a "figure" line (scripts/gpu/check.sh records these).
        std::string name = what;
        for (char& ch : name)
            if (ch == ' ') ch = '_';
        std::printf("figure %s %.6e rel\n", name.c_str(), rel);
    }
};

// Where a model comes from (see the header comment).
enum class Source { file, hf, checkpoint };

static bool model_shape(const std::string& path, Source* src, GPTConfig* c, std::string* err) {
    if (is_hf_dir(path) && file_size(path + "/config.json") < 0 && latest_checkpoint(path) >= 0) {
        *src = Source::checkpoint;
        return read_checkpoint_config(path, latest_checkpoint(path), c, err);
    }
    if (is_hf_dir(path)) {
        *src = Source::hf;
        return read_hf_config(path, c, err);
    }
    *src = Source::file;
    int version;
    return read_model_header(path, c, &version, err);
}

static bool load_weights(const std::string& path, Source src, GPT& model, std::string* err) {
    if (src == Source::hf) return load_hf(path, model, err);
    if (src == Source::checkpoint) {
        TrainState st;
        RunInfo run;
        return load_checkpoint(path, latest_checkpoint(path), model, &st, &run, err);
    }
    return load_model(path, model, err);
}

constexpr int kLogitsMagic = 20241201;

// --write-logits: random inputs and the model's logits for them.
static int write_logits(GPT& model, const std::string& out, int B, int T, uint64_t seed) {
    const GPTConfig& c = model.config();
    const size_t N = (size_t)B * T, V = c.vocab_size;
    std::vector<int> inputs(N);
    Rng rng(seed);
    for (size_t i = 0; i < N; i++) inputs[i] = std::min((int)V - 1, (int)(rng.uniform() * V));
    model.forward(inputs.data(), nullptr, B, T);
    std::vector<double> logits(N * V);
    for (size_t n = 0; n < N; n++) model.logits_row((int)(n / T), (int)(n % T), &logits[n * V], DType::F64);
    const int h[4] = {kLogitsMagic, B, T, (int)V};
    AtomicWriter w;
    std::string err;
    bool ok = w.open(out, &err);
    if (ok) {
        w.write(h, sizeof(h));
        w.write(inputs.data(), N * 4);
        w.write(logits.data(), N * V * 8);
        ok = w.commit(&err);
    }
    if (!ok) {
        std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
        return 1;
    }
    std::printf("test_gpt: logits of %s for %dx%d random inputs written to %s\n", config_string(c).c_str(), B, T,
                out.c_str());
    return 0;
}

int main(int argc, char** argv) {
    std::string model_path, state_path, device = "cpu", dtype = "fp64", logits_out, weights_out, export_dir;
    double tol = -1;
    int lB = 2, lT = 16, eot = -1;
    long long data_seed = 1;
    ArgParser p("test_gpt", "Compares the trainer with the PyTorch reference's debug state.");
    p.add({0, "model", Option::String, &model_path,
           "model file (reference_gpt.py), Hugging Face directory (reference_hf.py) or checkpoint directory"});
    p.add({0, "state", Option::String, &state_path, "debug state written by reference_gpt.py"});
    p.add({0, "device", Option::String, &device, "backend", 0, 0, {"cpu", "cuda"}});
    p.add({0, "dtype", Option::String, &dtype, "precision", 0, 0, {"fp32", "fp64", "bf16"}});
    p.add({0, "tol", Option::Double, &tol, "relative tolerance (-1: by dtype)", -1, 1});
    p.add({0, "write-logits", Option::String, &logits_out, "write random inputs and their logits here (no checks)"});
    p.add({0, "write-weights", Option::String, &weights_out, "write the loaded weights (fp64, file order) here"});
    p.add({0, "export-hf", Option::String, &export_dir, "export the loaded model as a Hugging Face directory"});
    p.add({0, "document-mask", Option::Int, &eot,
           "attention within documents ending with this token id (the reference's --document-mask; -1: off)", -1,
           1 << 30});
    int fp8 = 0;
    p.add({0, "fp8", Option::Int, &fp8, "1: the four linear layers on FP8 operands (the reference's --fp8)", 0, 1});
    int fp8_history = 0;
    p.add({0, "fp8-history", Option::Int, &fp8_history,
           "with --fp8 1: delayed scaling over N steps, pushed after each step (the reference's --fp8-history)", 0,
           1 << 20});
    std::string fp8_layers = "all";
    p.add({0, "fp8-layers", Option::String, &fp8_layers,
           "with --fp8 1: the linear layers on FP8 operands (the reference's --fp8-layers)"});
    p.add({0, "B", Option::Int, &lB, "rows for --write-logits", 1, 1 << 16});
    p.add({0, "T", Option::Int, &lT, "sequence length for --write-logits", 1, 1 << 20});
    p.add({0, "data-seed", Option::Long, &data_seed, "seed of the --write-logits inputs", 0, 9e18});
    bool help = false;
    std::string err;
    if (!p.parse(argc, argv, &help, &err) || model_path.empty() ||
        (state_path.empty() && logits_out.empty() && weights_out.empty() && export_dir.empty())) {
        std::fprintf(stderr, "test_gpt: error: %s\n%s",
                     err.empty() ? "--model and --state (or --write-logits) are required" : err.c_str(),
                     p.usage().c_str());
        return 1;
    }
    if (help) {
        std::printf("%s", p.usage().c_str());
        return 0;
    }
    // Tolerances: logits/loss/grads, and the step losses (bf16 drifts more).
    double tol_fwd = tol, tol_grad = tol, tol_steps = tol;
    if (tol < 0) {
        // tests/lib/tolerances.h holds every figure (bf16: provisional).
        if (dtype == "fp64") tol_fwd = tol_grad = tol_steps = tol::kCpuFp64;
        else if (dtype == "fp32") tol_fwd = tol_grad = tol_steps = device == "cuda" ? tol::kFp32 : tol::kCpuFp32;
        else if (device == "cpu")
            tol_fwd = tol::kCpuBf16Forward, tol_grad = tol::kCpuBf16Grad, tol_steps = tol::kCpuBf16Steps;
        else tol_fwd = tol::kBf16Forward, tol_grad = tol::kBf16Grad, tol_steps = tol::kBf16Steps;
    }
    std::unique_ptr<Backend> be(make_backend(device, dtype, 0, &err));
    if (!be) {
        std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
        return 1;
    }
    GPTConfig c;
    Source src;
    if (!model_shape(model_path, &src, &c, &err)) {
        std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
        return 1;
    }
    if (state_path.empty()) {  // the file modes: no checks here
        lT = std::min(lT, c.max_seq_len);
        GPT model(be.get(), c, {lB, lT});
        bool ok = load_weights(model_path, src, model, &err);
        if (ok && !weights_out.empty()) {
            std::vector<double> w(model.table().file_params);
            model.get_file_order(w.data(), DType::F64, model.weights(), false, model.weights_dtype());
            AtomicWriter f;
            ok = f.open(weights_out, &err);
            if (ok) {
                f.write(w.data(), w.size() * 8);
                ok = f.commit(&err);
            }
        }
        if (ok && !export_dir.empty()) ok = export_hf(export_dir, model, Ownership(), &err);
        if (!ok) {
            std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
            return 1;
        }
        return logits_out.empty() ? 0 : write_logits(model, logits_out, lB, lT, (uint64_t)data_seed);
    }
    TensorTable table(c);  // one process: no shard padding
    DebugState s;
    if (!read_state(state_path, c, table.file_params, &s, &err)) {
        std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
        return 1;
    }
    ModelOptions mo(s.B, s.T);
    mo.fp8 = fp8 != 0;
    mo.fp8_history = fp8 ? fp8_history : 0;
    if (!linear_layers_from_names(fp8_layers, &mo.fp8_layers, &err)) {
        std::fprintf(stderr, "test_gpt: error: flag --fp8-layers: %s\n", err.c_str());
        return 1;
    }
    GPT model(be.get(), c, mo);
    if (!load_weights(model_path, src, model, &err)) {
        std::fprintf(stderr, "test_gpt: error: %s\n", err.c_str());
        return 1;
    }
    std::printf("test_gpt: %s %s, model %s, B=%d T=%d, %d steps\n", device.c_str(), dtype.c_str(),
                config_string(c).c_str(), s.B, s.T, s.steps);
    std::vector<int> docs;  // the document mask: every forward takes the rows' document starts
    if (eot >= 0) {
        docs.resize((size_t)s.B * s.T);
        GPT::document_starts(s.inputs.data(), s.B, s.T, eot, docs.data());
        model.set_document_mask();
        int n = 0;
        for (int x : s.inputs) n += x == eot;
        std::printf("document mask: EOT %d, %d documents ended in %d rows\n", eot, n, s.B);
    }
    const int* dc = docs.empty() ? nullptr : docs.data();
    Checker ck;
    const size_t N = (size_t)s.B * s.T, V = c.vocab_size, P = table.file_params;

    // Forward: logits and loss of the initial model.
    // Mixtral: the objective, as transformers' loss with output_router_logits:
    // the cross-entropy plus the load-balancing loss times its coefficient.
    auto objective = [&](double ce) { return c.moe() ? ce + c.aux_coef * model.moe().aux_loss() : ce; };
    double loss = objective(model.forward(s.inputs.data(), s.targets.data(), s.B, s.T, 0.0, dc));
    if (c.moe()) std::printf("load-balancing loss %.12f\n", model.moe().aux_loss());
    std::vector<double> logits(N * V);
    for (size_t n = 0; n < N; n++) model.logits_row((int)(n / s.T), (int)(n % s.T), &logits[n * V], DType::F64);
    ck.check("logits", logits.data(), s.logits.data(), logits.size(), tol_fwd);
    ck.check("loss", &loss, &s.loss, 1, tol_fwd);

    // Backward: every gradient tensor (each kind over all its layers).
    model.zero_grad();
    model.forward(s.inputs.data(), s.targets.data(), s.B, s.T, 1.0 / (double)N, dc);
    model.backward();
    std::vector<double> grads(P);
    model.get_file_order(grads.data(), DType::F64, model.grads(), false, model.precision().grad);
    for (int k = 0; k < (int)Param::count; k++) {
        if (!kind_in_model(c, (Param)k)) continue;  // e.g. GPT-2 has no lm_head, Llama no biases
        const TensorEntry& first = table.get((Param)k, 0);
        size_t n = first.numel * (param_kind((Param)k).per_layer ? c.num_layers : 1);
        ck.check(std::string("grad ") + param_kind((Param)k).name, &grads[first.file_offset],
                 &s.grads[first.file_offset], n, tol_grad);
    }

    // S optimizer steps on the same batch: the loss before each update.
    std::vector<double> losses(s.steps);
    for (int step = 0; step < s.steps; step++) {
        model.zero_grad();
        losses[step] = objective(model.forward(s.inputs.data(), s.targets.data(), s.B, s.T, 1.0 / (double)N, dc));
        model.backward();
        adamw_step(model, s.opt, step);
        model.fp8_push(nullptr, false);  // --fp8-history: one process, no dp x cp max to take first
        std::printf("  step %2d loss %.12f (reference %.12f)\n", step, losses[step], s.step_losses[step]);
    }
    ck.check("step losses", losses.data(), s.step_losses.data(), losses.size(), tol_steps);
    std::printf("%d passed, %d failed\n", ck.passed, ck.failed);
    return ck.failed ? 1 : 0;
}
