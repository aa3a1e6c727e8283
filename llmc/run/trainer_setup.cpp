// llmc/run/trainer_setup.cpp: setting up a run (llmc/run/trainer.h): the
// flags against the world and the model, the backend, the process grid,
// the data, the model and its parallel modes (counted first: the memory
// check), the weights, the outputs.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <tuple>

#include "llmc/backend/backend_measure.h"
#include "llmc/backend/backend_profile.h"
#include "llmc/backend/backends.h"
#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"
#include "llmc/comm/watchdog.h"
#include "llmc/io/hf.h"
#include "llmc/io/model_io.h"
#include "llmc/run/report.h"
#include "llmc/run/model_source.h"
#include "llmc/run/startup.h"
#include "llmc/run/trace_file.h"
#include "llmc/run/trainer.h"

void Trainer::setup(const ArgParser& parser) {
    threads = choose_threads();
    Recompute rc_mode = Recompute::none;
    parse_recompute(cfg.recompute, &rc_mode);  // the parser allows only its names
    cfg.recompute = recompute_name(rc_mode);   // "1" reads as "gelu" from here on
    setup_check(!cfg.resume || !cfg.output_dir.empty(), "flag -y: resuming needs an output directory (-o)");
    setup_check(cfg.total_batch == -1 || cfg.total_batch > 0,
                "flag -d: " + std::to_string(cfg.total_batch) + " tokens per step (give a positive count, or -1 for B*T)");
    setup_check(cfg.max_steps != 0 || !cfg.export_hf.empty() || !cfg.export_model.empty(),
                "flag -x: 0 optimizer steps (give a positive count, or -1 for one epoch; -x 0 with --export-hf or "
                "--export-model writes -e's weights untrained)");
    setup_check(cfg.eps > 0, "flag --eps: AdamW's epsilon must be positive (0 divides by zero where v is 0)");
    if (main_rank && cfg.checkpoint_every > 0 && cfg.output_dir.empty())
        std::fprintf(stderr, "train_gpt: warning: -n %d without -o: no checkpoints will be written\n",
                     cfg.checkpoint_every);
    be.reset(make_backend(cfg.device, cfg.dtype, dist_local_rank(), &err));
    setup_check(be != nullptr, err);
    if (std::string(be->name()) == "cpu") cpu_threads.start(omp_get_max_threads(), dist_local_size());
    setup_check(cfg.optimizer_dtype != "fp32" || be->precision().opt == DType::F32,
                "flag --optimizer-dtype: an fp64 run keeps AdamW's m and v in fp64 (auto) or bf16, not fp32");
    be->set_memory_budget((size_t)(cfg.memory_budget * 1024 * 1024));
    // The layout, made and checked once; the grid's groups come from it.
    setup_check(layout_from_flags(cfg, dist_world_size(), &lay, &err), err);
    setup_check(make_process_grid(lay, cfg.comm, *be, &grid, &err), err);

    // --convert (a checkpoint or a model file), or -x 0 with an export (-e's
    // weights): no training (the run's directory is read, never written: no
    // metrics, no -o files; the data is not needed).
    const bool converting = !cfg.convert.empty() || cfg.max_steps == 0;
    const std::string how = cfg.convert.empty() ? "-x 0" : "--convert";
    std::string ckpt_root = cfg.output_dir;
    if (converting) {
        setup_check(!cfg.export_hf.empty() || !cfg.export_model.empty(),
                    "flag --convert: give --export-hf DIR and/or --export-model FILE to say what to write");
        setup_check(cfg.output_dir.empty() && !cfg.resume && cfg.resume_from.empty(),
                    "flag " + how + ": -o, -y and --resume-from do not apply (nothing is trained)");
    }
    if (!cfg.convert.empty()) {
        std::string model_file;
        setup_check(convert_source(cfg.convert, &ckpt_root, &resume_step, &model_file, &err), err);
        const std::string took = inherit_run_flags(ckpt_root, parser, cfg);
        if (main_rank && !took.empty())
            std::printf("convert: as the run had them (%s/run_config.json): %s\n", ckpt_root.c_str(), took.c_str());
        if (!model_file.empty()) cfg.model = model_file;  // its weights, in place of the run's -e
    }
    if (converting && resume_step < 0) cfg.max_steps = 0;  // a model file's (or -e's) weights: no step
    // Model shape: from a resumed checkpoint, a model file, or sizes.
    if (!cfg.resume_from.empty()) {
        setup_check(!cfg.output_dir.empty(), "flag --resume-from: resuming needs an output directory (-o)");
        setup_check(named_checkpoint(cfg.output_dir, cfg.resume_from, &resume_step, &err), err);
    } else if (cfg.resume) {
        resume_step = newest_sound_checkpoint(cfg.output_dir, main_rank, &err);
        setup_check(resume_step >= 0 || err.empty(), err);
        if (resume_step < 0 && main_rank)
            std::fprintf(stderr, "train_gpt: warning: -y 1: no complete checkpoint in %s, starting fresh\n",
                         cfg.output_dir.c_str());
    }
    bool ok = true;
    if (resume_step >= 0) {
        ok = read_checkpoint_config(ckpt_root, resume_step, &mc, &err);
        // A model named on the command line must be the checkpoint's.
        GPTConfig named;
        std::string why;
        const bool named_ok = ok && parser.given("model") && model_config(cfg, &named, &why);
        if (named_ok && cfg.moe_balance == "bias") named.aux_coef = 0;  // as a bias run's checkpoint records it (below)
        if (named_ok && named != mc) {
            ok = false;
            err = "flag -e: " + cfg.model + " is " + config_string(named) + ", but the checkpoint in " +
                  ckpt_root + " is " + config_string(mc) + " (resume with the checkpoint's model, or drop -e)";
        }
    } else {
        ok = model_config(cfg, &mc, &err);
    }
    setup_check(ok, err);
    // No -t: the model's context (capped; llmc/run/train_config.h).
    t_from_model = cfg.T == 0;
    if (t_from_model) cfg.T = default_seq_len(mc);
    lay.T = cfg.T;
    setup_check(!cfg.fp8 || be->fp8(), std::string("flag --fp8: the ") + be->name() +
                                           " device has no FP8 tensor cores (compute capability 8.9 or later; the "
                                           "CPU emulates them exactly: --device cpu)");
    // A Mixtral step keeps its routing on the device (GPT::keep_moe_on_device)
    // but for two exchanges that need sizes or sums on the host.
    setup_check(!(cfg.sync_free && mc.moe() && lay.ep > 1),
                "flag --sync-free: expert parallelism sizes each block's all-to-all from its row counts on the "
                "host, which the sync-free step does not read (drop --ep " + std::to_string(lay.ep) +
                    " or --sync-free)");
    // (--fp8-layers: fc and fcproj name the experts')
    const bool fp8_experts = cfg.fp8 && (linear_layer_in(lay.fp8_layers, 2) || linear_layer_in(lay.fp8_layers, 3));
    setup_check(!(cfg.sync_free && mc.moe() && fp8_experts),
                "flag --sync-free: --fp8 1 scales a mixture of experts' products block by block, sized from their row "
                "counts on the host, which the sync-free step does not read (drop --fp8 1, leave fc and fcproj out "
                "of --fp8-layers, or drop --sync-free)");
    setup_check(!(cfg.sync_free && mc.moe() && lay.pp > 1),
                "flag --sync-free: a mixture of experts split into pipeline stages sums its routing statistics over "
                "the stages on the host, which the sync-free step does not read (drop --pp " + std::to_string(lay.pp) +
                    " or --sync-free)");
    setup_check(cfg.moe_balance != "bias" || mc.moe(),
                "flag --moe-balance: bias balances the experts of a mixture-of-experts model (arch=mixtral), and the "
                "model is " + config_string(mc));
    setup_check(!(mc.llama() && !cfg.export_model.empty()),
                "flag --export-model: llm.c model files hold GPT-2 only, and the model is " + config_string(mc));
    // Converting: the smallest batch any layout takes (one row, at most the
    // model's context, one micro-batch per pipeline stage): nothing is trained.
    if (converting) {
        lay.B = cfg.B = 1;
        lay.T = cfg.T = std::min(cfg.T, mc.max_seq_len);
        lay.total_batch = cfg.total_batch = (long long)lay.T * lay.dp() * lay.pp;
    }
    // The layout against the model: sequence, heads, batch, pipeline.
    setup_check(check_layout(&lay, mc, &err), err);
    T_local = lay.T_local();
    cfg.total_batch = lay.total_batch;
    accum = lay.micro_batches();
    rows_per_step = cfg.total_batch / cfg.T;

    // The embedded dataset comes from `make` (not from `make train_gpt` alone): say so when it is missing.
    auto data_err = [&](const std::string& pat) {
        const bool embedded = pat.rfind("data/tiny/", 0) == 0 && err.find("no file matches") != std::string::npos;
        return embedded ? err + " (the embedded dataset: `make` builds it beside train_gpt)" : err;
    };
    ok = converting || data.train.open(cfg.train_data, cfg.T, mc.vocab_size, &err);
    setup_check(ok, data_err(cfg.train_data));
    data.use_val = !converting && !cfg.val_data.empty() && cfg.val_every > 0;
    ok = !data.use_val || data.val.open(cfg.val_data, cfg.T, mc.vocab_size, &err);
    setup_check(ok, data_err(cfg.val_data));
    // Validation rows: -m micro-batches of B rows (llm.c's count), else
    // --val-tokens in whole rows, so the figure is the same for every -b
    // and layout. More rows than the files hold wrap and count some twice.
    data.val_rows = cfg.val_steps > 0 ? (long long)cfg.val_steps * cfg.B : (cfg.val_tokens + cfg.T - 1) / cfg.T;
    if (data.use_val && main_rank && (size_t)data.val_rows > data.val.rows_per_epoch())
        std::fprintf(stderr, "train_gpt: warning: validation reads %lld rows of T=%d, but -j '%s' holds %zu: the rows "
                             "wrap and some count twice (lower %s)\n", data.val_rows, cfg.T, cfg.val_data.c_str(),
                     data.val.rows_per_epoch(), cfg.val_steps > 0 ? "-m" : "--val-tokens");
    // What is written only at the end must be writable now.
    for (const auto& out : {std::make_tuple("--export-model", cfg.export_model, false),
                            std::make_tuple("--export-hf", cfg.export_hf, true),
                            std::make_tuple("--trace", cfg.trace, false)}) {
        const std::string& path = std::get<1>(out);
        const std::string why = path.empty() || !main_rank ? "" : output_path_problem(path, std::get<2>(out));
        setup_check(why.empty(), std::string("flag ") + std::get<0>(out) + " '" + path + "': " + why);
    }
    if (!converting) data.fingerprint = check_same_data(data.train, "-i", cfg.train_data);
    if (data.use_val) check_same_data(data.val, "-j", cfg.val_data);
    setup_tokenizer(parser, cfg, &data.tok);
    if (!converting) warn_tokenizer_mismatch(cfg, data.tok);
    if (main_rank && data.tok.vocab_size() < mc.vocab_size && cfg.sample_every > 0)
        std::fprintf(stderr, "train_gpt: warning: tokenizer %s has %d tokens, the model %d: samples print ids past "
                             "it as <?>\n", cfg.tokenizer.empty() ? "(byte-level)" : cfg.tokenizer.c_str(),
                     data.tok.vocab_size(), mc.vocab_size);
    if (cfg.max_steps < 0 && !converting)
        cfg.max_steps = (int)std::max<long long>(1, (long long)data.train.rows_per_epoch() / rows_per_step);

    // Documents: the tokens that end and open one, each a token of the model.
    const std::string doc_source = data.document_tokens(&cfg.eot_token, &cfg.bos_token);
    for (auto f : {std::make_pair("eot-token", cfg.eot_token), std::make_pair("bos-token", cfg.bos_token)})
        setup_check(!(cfg.document_mask || parser.given(f.first)) || f.second < mc.vocab_size,
                    std::string("flag --") + f.first + ": " + std::to_string(f.second) +
                        " is not below the model's vocabulary size " + std::to_string(mc.vocab_size) +
                        " (give the id of the token that " + (f.first[0] == 'e' ? "ends" : "opens") + " a document)");
    if (cfg.document_mask && !converting) warn_document_tokens(doc_source);

    // The parallel modes and the model, first counted, then built.
    check_memory();
    build(*be, &s);
    {  // LLMC_BREAKDOWN=1: what tells the model's products apart (llmc/backend/backend_profile.h)
        const TensorTable& t = s.model->table();
        ProfileShapes ps;
        ps.C = mc.channels;
        ps.attn_in = t.heads * mc.head_size();
        ps.qkv_out = (t.heads + 2 * t.kv_heads) * mc.head_size();
        ps.fcproj_in = t.hidden;
        ps.fc_out = t.hidden * (mc.llama() ? 2 : 1);
        ps.head_rows = t.vocab_rows;
        ps.experts = mc.moe() ? mc.experts : 0;
        set_profile_shapes(*be, ps);
        // --fp8 1 where the FP8 products take only some shapes (cuBLASLt's:
        // K and N multiples of 16): every FP8 layer's widths on this rank,
        // and the micro-batch's rows (the weight gradient's K). A Mixtral's
        // experts take any row count (the backend pads K), and their widths
        // are checked with the MLP's. Only --fp8-layers' layers' widths count.
        const int q = cfg.fp8 ? be->fp8() : 1;
        auto on = [&](int k) { return linear_layer_in(lay.fp8_layers, k); };
        std::vector<std::pair<std::string, long long>> dims = {
            {"C", ps.C}, {"B x T per rank (-b " + std::to_string(lay.B) + ", -t " + std::to_string(lay.T) + ")",
                          (long long)lay.B * lay.T_local()}};
        if (on(1)) dims.push_back({"the attention's width on this rank", ps.attn_in});
        if (on(0)) dims.push_back({"QKV's width on this rank", ps.qkv_out});
        const std::string mlp = mc.moe() ? "an expert's" : "the MLP's";
        if (on(3)) dims.push_back({mlp + " hidden width on this rank", ps.fcproj_in});
        if (on(2)) dims.push_back({mlp + " up width on this rank", ps.fc_out});
        for (const auto& d : dims)
            setup_check(q <= 1 || d.second % q == 0,
                        std::string("flag --fp8: the ") + be->name() + " backend's FP8 products need widths that " +
                            "are multiples of " + std::to_string(q) + ", and " + d.first + " is " +
                            std::to_string(d.second));
    }
    if (cfg.document_mask) {
        s.model->set_document_mask();
        s.cp->set_document_mask();
    }

    // Weights: a checkpoint, a model file, or the seeded initialisation.
    rng = Rng((uint64_t)cfg.seed);
    if (resume_step >= 0) {
        RunInfo saved;
        ok = load_checkpoint(ckpt_root, resume_step, *s.model, &st, &saved, &err);
        // -y 1: a checkpoint whose payload fails as it loads (a checksum, a
        // NaN) gives way to the next older sound one of the same model, as a
        // damaged header or size does before (newest_sound_checkpoint).
        std::string why;
        while (cfg.resume && cfg.resume_from.empty() && !converting && !dist_all_ok(ok, err, &why)) {
            const int older = older_sound_checkpoint(ckpt_root, resume_step, mc);
            if (older < 0) break;
            if (main_rank)
                std::fprintf(stderr, "train_gpt: warning: -y 1: %s fails as it loads (%s); resuming from %s instead "
                                     "(nothing was deleted)\n",
                             checkpoint_dir(ckpt_root, resume_step).c_str(), why.c_str(),
                             checkpoint_dir(ckpt_root, older).c_str());
            resume_step = older;
            ok = load_checkpoint(ckpt_root, resume_step, *s.model, &st, &saved, &err);
        }
        rng.state = st.rng_state;
        if (ok && !converting) report_resume(saved);
        if (converting) cfg.max_steps = st.step;  // the loop trains nothing; finish() exports
    } else if (is_hf_dir(cfg.model)) {
        ok = load_hf(cfg.model, *s.model, &err);
    } else if (spec_is_file(cfg.model)) {
        ok = load_model(cfg.model, *s.model, &err);
    } else {
        s.model->init_random((uint64_t)cfg.seed);
    }
    setup_check(ok, err);
    // --fp8-history: the amax history a resumed run left (else it starts empty).
    if (lay.fp8_history > 0 && !st.fp8_history.empty()) {
        const size_t want = (size_t)s.model->fp8_slots() * lay.fp8_history;
        setup_check(st.fp8_history.size() == want,
                    "flag --fp8-history " + std::to_string(lay.fp8_history) + ": the checkpoint's amax history holds " +
                        std::to_string(st.fp8_history.size()) + " values, and this model's " +
                        std::to_string(s.model->fp8_slots()) + " operands over " + std::to_string(lay.fp8_history) +
                        " steps are " + std::to_string(want));
        s.model->set_fp8_history(st.fp8_history);
    }
    // --sync-free: a Mixtral's routing figures stay on the device.
    if (cfg.sync_free && cfg.convert.empty() && mc.moe()) s.model->keep_moe_on_device();
    // --moe-balance bias: the routing bias (a resumed run's, else zero) in
    // place of the load-balancing loss, whose coefficient the run sets to 0
    // (so its checkpoints and exports record aux=0).
    if (cfg.moe_balance == "bias") {
        if (st.moe_bias.size() != (size_t)mc.num_layers * mc.experts)
            st.moe_bias.assign((size_t)mc.num_layers * mc.experts, 0.0);
        s.model->set_moe_bias(st.moe_bias);
        s.model->set_aux_coef(0.0);
        mc.aux_coef = 0;
    }

    // --sync-free: the step's figures, a few doubles in backend memory.
    if (cfg.sync_free && cfg.convert.empty()) figures = be->alloc(step_figure::count * sizeof(double));
    // The whole step as one recorded region, where nothing in it comes back
    // to the host or goes to another rank (llmc/run/step_graph.h).
    step_graph_off = StepGraph::why_not(be->region_stats().on, figures != nullptr, lay.world);
    if (step_graph_off.empty() && cfg.max_steps > 0)
        step_graph.start(be.get(), accum, cfg.B, T_local, cfg.document_mask != 0);
    print_settings(parser);
    std::fflush(stdout);
    // The snapshot buffer of --async-checkpoint, allocated once (with -o:
    // a signal checkpoints even without -n).
    if (cfg.async_checkpoint && !cfg.output_dir.empty())
        ckpt.async = std::make_unique<AsyncCheckpointer>(cfg.output_dir, *s.model, owner());
    print_rank_lines(memory_line("start", rank, *s.model, s.comm_bytes(), grid.pp_rank, lay.pp,
                                 ckpt.host_bytes()));

    ok = true;
    if (main_rank && !cfg.output_dir.empty()) {
        ok = make_dirs(cfg.output_dir, &err) &&
             progress.metrics.open(cfg.output_dir + "/metrics.jsonl", resume_step >= 0 ? st.step : -1, &err);
        // The run's flags beside its metrics, as given and as resolved:
        // `--config` reads back the given ones (ArgParser::run_json).
        AtomicWriter rc;
        const std::string flags = parser.run_json(training_flag);
        ok = ok && rc.open(cfg.output_dir + "/run_config.json", &err) && rc.write(flags.data(), flags.size()) &&
             rc.commit(&err);
        // What a killed run left: temporaries and checkpoints never finished.
        if (ok) {
            const int n = clean_checkpoints(cfg.output_dir, 0);
            if (n > 0) std::printf("removed %d leftover(s) of an interrupted run from %s\n", n, cfg.output_dir.c_str());
        }
    }
    setup_check(ok, err);
    if (cfg.convert.empty()) tuning.start(*be, cfg.matmul_tune, cfg.output_dir, main_rank);
    stragglers.configure(cfg.straggler_every, cfg.straggler_factor, lay.world);
    if (!cfg.trace.empty()) {
        const std::string label = "rank " + std::to_string(rank) + ": stage " + std::to_string(grid.pp_rank) + ", dp " +
                                  std::to_string(grid.dp_rank) + ", cp " + std::to_string(grid.cp_rank) + ", tp " +
                                  std::to_string(grid.tp_rank);
        trace::start(cfg.trace, *grid.world, label, be.get());
    }

    oc.lr = cfg.lr;
    oc.beta1 = cfg.beta1;
    oc.beta2 = cfg.beta2;
    oc.eps = cfg.eps;
    oc.weight_decay = cfg.weight_decay;
    oc.grad_clip = cfg.grad_clip;
    oc.warmup_steps = cfg.warmup;
    oc.final_lr_frac = cfg.final_lr_frac;
    oc.max_steps = cfg.max_steps;
    oc.stochastic_rounding = cfg.optimizer_rounding == "stochastic";
    oc.round_seed = (unsigned long long)cfg.seed;
    const size_t BT = (size_t)cfg.B * cfg.T;
    data.size_rows(BT, cfg.document_mask);
}

// The model and its parallel modes on backend b (llmc/parallel/model_stack.h).
// --document-mask: one line naming the tokens that end and open a document
// and where they came from; a warning when one never occurs in the first
// 16M tokens of the training data (then it marks nothing), or when there is
// none (each row is then one document).
void Trainer::warn_document_tokens(const std::string& source) {
    if (!main_rank) return;
    auto name = [&](int id) { return std::to_string(id) + " (" + Tokenizer::printable(data.tok.decode(id)) + ")"; };
    std::string line;
    if (cfg.eot_token >= 0) line += name(cfg.eot_token) + " ends a document";
    if (cfg.bos_token >= 0) line += std::string(line.empty() ? "" : ", ") + name(cfg.bos_token) + " opens one";
    std::printf("documents: %s (%s)\n", line.empty() ? "no token ends or opens one" : line.c_str(), source.c_str());
    if (line.empty())
        std::fprintf(stderr, "train_gpt: warning: --document-mask: no token ends or opens a document (give "
                             "--eot-token or --bos-token): each row is one document\n");
    const size_t n = (size_t)1 << 24;
    for (auto f : {std::make_pair("--eot-token", cfg.eot_token), std::make_pair("--bos-token", cfg.bos_token)}) {
        if (f.second < 0) continue;
        std::string err;
        const long long c = data.train.count_id(f.second, n, &err);
        if (c == 0)
            std::fprintf(stderr, "train_gpt: warning: --document-mask: %s %s never occurs in the first %zu tokens of "
                                 "%s: it marks no document there\n", f.first, name(f.second).c_str(),
                         std::min(n, data.train.total_tokens()), cfg.train_data.c_str());
    }
}

void Trainer::build(Backend& b, ModelStack* stack) {
    bool ok = true;
    try {
        build_stack(b, mc, lay, grid.groups(), stack);
    } catch (const std::invalid_argument& e) {
        ok = false;
        err = e.what();
    }
    setup_check(ok, err);
}

// What this rank will hold, counted on a backend that allocates nothing (the
// same buffers, so the memory line's accounting), against --memory-budget or
// the device's free memory: a clear line instead of the OOM killer.
void Trainer::check_memory() {
    const size_t budget = (size_t)(cfg.memory_budget * 1024 * 1024);
    const size_t avail = budget ? budget : be->free_memory(dist_local_size());
    const std::string where = budget ? "--memory-budget " + human_bytes((double)budget)
                               : std::string("the ") + be->name() + " device's free memory, " + human_bytes((double)avail) +
                                     (std::string(be->name()) == "cpu" ? " (available RAM shared by the node's ranks)" : "");
    // Before anything is built (a model of 10^8 layers would exhaust the
    // host building its tensor table): a floor no layout goes below, every
    // rank's part of the query and output projections (2·L·C² at least, in
    // any architecture) and the embedding, in bf16, over all ranks. In
    // double: such shapes overflow a size_t.
    const double floor_bytes = 2.0 *
        (2.0 * mc.num_layers * (double)mc.channels * mc.channels + (double)mc.padded_vocab_size * mc.channels) /
        dist_world_size();
    setup_check(avail == 0 || floor_bytes <= (double)avail,
                "out of memory: flag -e '" + cfg.model + "': each of the " + std::to_string(dist_world_size()) +
                    " rank(s) would hold at least " + human_bytes(floor_bytes) + " of weights, more than " + where);
    MeasureBackend mb(*be);
    std::string held;
    size_t snapshot = 0;  // --async-checkpoint's host copy of the shard
    {
        ModelStack counted;
        build(mb, &counted);
        if (cfg.async_checkpoint && !cfg.output_dir.empty())
            snapshot = AsyncCheckpointer::host_bytes_for(*counted.model, owner());
        held = memory_line("needed", rank, *counted.model, counted.comm_bytes(), grid.pp_rank, lay.pp, snapshot);
    }
    // The CPU backend's memory is the host's: the snapshot comes out of the
    // same RAM. A GPU's free memory does not hold it.
    const size_t need = mb.bytes_peak() + (std::string(be->name()) == "cpu" ? snapshot : 0);
    setup_check(avail == 0 || need <= avail, "out of memory: rank " + std::to_string(rank) + " would hold " +
                                                 human_bytes((double)need) + ", more than " + where + " [" +
                                                 held.substr(held.find(':') + 2) + "]");
}

// The settings table (every flag as the run took it), the device, the
// model, the layout and the data, on rank 0.
void Trainer::print_settings(const ArgParser& parser) {
    if (!main_rank) return;
    std::printf("+---------------------------+--------------------------------------------------+\n");
    // The flags that apply to training (not those of the other modes).
    for (const Option& o : parser.options())
        if (training_flag(o.name)) std::printf("| %-25s | %-48s |\n", o.name, option_value_string(o).c_str());
    std::printf("| %-25s | %-48s |\n", "threads per rank", threads.c_str());
    std::printf("| %-25s | %-48s |\n", "threads follow the load", cpu_threads.text().c_str());
    std::printf("| %-25s | %-48s |\n", "OpenMP waits", openmp_wait_text().c_str());
    std::printf("+---------------------------+--------------------------------------------------+\n");
    const std::string cp_words = lay.cp_hybrid() ? " (hybrid: all-to-all over " + std::to_string(lay.cp_a2a) +
                                                       ", ring over " + std::to_string(lay.cp / lay.cp_a2a) + ")"
                                 : lay.cp_a2a > 1 ? " (all-to-all)"
                                                  : " (ring)";
    std::printf("device %s, params %s, grads %s, activations %s, Adam m/v %s%s; world %d = pp %d x dp %d x cp "
                "%d%s x tp %d%s, ZeRO %d\n",
                be->name(), dtype_name(s.model->precision().param), dtype_name(s.model->precision().grad),
                dtype_name(s.model->precision().act), dtype_name(s.model->precision().opt),
                cfg.optimizer_rounding == "stochastic" ? " (stochastic rounding)" : "", lay.world, lay.pp, lay.dp(), lay.cp,
                lay.cp > 1 ? cp_words.c_str() : "", lay.tp,
                cfg.sp ? " (sequence parallel)" : "", cfg.zero);
    if (!be->compute_path().empty()) std::printf("compute: %s\n", be->compute_path().c_str());
    std::printf("model %s, %zu parameters (%zu on this rank's stage and tensor-parallel slice)\n",
                config_string(mc).c_str(), s.model->table().file_params, s.model->table().params);
    if (lay.pp > 1)
        std::printf("pipeline: %d stages x %d chunk(s) of %d block(s), %s schedule, %d micro-batches per step\n",
                    lay.pp, lay.vpp, mc.num_layers / (lay.pp * lay.vpp), pipe_order_name(lay.pp_order, lay.vpp),
                    accum);
    if (!cfg.convert.empty() || cfg.max_steps == 0) {
        if (resume_step >= 0)
            std::printf("convert: the checkpoint of step %d in %s, nothing trained\n", resume_step,
                        cfg.convert.c_str());
        else
            std::printf("convert: the weights of %s, nothing trained\n", cfg.model.c_str());
        return;
    }
    std::printf("train data: %zu tokens in %zu shard(s); %lld rows/step = %d micro-step(s) x B=%d x dp=%d; "
                "T=%d (%d per rank); %d steps\n",
                data.train.total_tokens(), data.train.files().size(), rows_per_step, accum, cfg.B, lay.dp(), cfg.T, T_local,
                cfg.max_steps);
    if (t_from_model)
        std::printf("T=%d: no -t, so the model's context (maxT %d%s)\n", cfg.T, mc.max_seq_len,
                    mc.max_seq_len > cfg.T ? ", capped" : "");
    if (data.use_val)
        std::printf("validation: %lld rows of T=%d (%lld tokens) every %d steps, micro-batches of B=%d over dp=%d\n",
                    data.val_rows, cfg.T, data.val_rows * cfg.T, cfg.val_every, cfg.B, lay.dp());
}
