// llmc/run/trainer_end.cpp: what a run leaves behind (llmc/run/trainer.h):
// checkpoints, the final weights as llm.c and Hugging Face files, what a
// resume reports, and the checks at the end of a run.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "llmc/base/trace.h"
#include "llmc/comm/dist.h"
#include "llmc/io/hf.h"
#include "llmc/io/model_io.h"
#include "llmc/io/tokenizer_export.h"
#include "llmc/run/report.h"
#include "llmc/run/startup.h"
#include "llmc/run/signals.h"
#include "llmc/run/trace_file.h"
#include "llmc/run/trainer.h"

// Which elements this rank writes to checkpoints and exports: each has one owner.
Ownership Trainer::owner() const {
    const bool first = grid.dpcp_group->rank() == 0;
    return {grid.world.get(), first, grid.tp_rank == 0, grid.edp_group ? grid.edp_group->rank() == 0 : first};
}

RunInfo Trainer::run_info() const {
    RunInfo r;
    r.max_steps = cfg.max_steps;
    r.total_batch = cfg.total_batch;
    r.B = cfg.B;
    r.T = cfg.T;
    r.world = lay.world;
    r.pp = lay.pp;
    r.vpp = lay.vpp;
    r.dp = lay.dp();
    r.cp = lay.cp;
    r.tp = lay.tp;
    r.sp = cfg.sp;
    r.data = data.fingerprint;
    r.zero = cfg.zero;
    r.recompute = cfg.recompute;
    return r;
}

// What a resume changes: the schedule (-x) or the batch (-d) deserve a
// warning; another layout trains the same model, which is worth a line.
void Trainer::report_resume(const RunInfo& saved) {
    if (!main_rank || saved.world == 0) return;  // nothing recorded (earlier format)
    const RunInfo now = run_info();
    if (saved.max_steps != now.max_steps)
        std::fprintf(stderr, "train_gpt: warning: resuming with -x %d where the checkpoint's run had -x %d: the learning-rate "
                             "schedule (warmup, cosine decay to the last step) changes from here on\n",
                     now.max_steps, saved.max_steps);
    if (saved.total_batch != now.total_batch)
        std::fprintf(stderr, "train_gpt: warning: resuming with -d %lld where the checkpoint's run had -d %lld: each step "
                             "now takes another number of rows of the data\n",
                     now.total_batch, saved.total_batch);
    // The data position is kept in rows of T tokens: other data, or another
    // T, makes it point elsewhere. Said clearly; the run goes on (a change
    // of data may be meant, say fine-tuning on from a pretraining run).
    if (!saved.data.empty() && saved.data != now.data)
        std::fprintf(stderr, "train_gpt: warning: resuming with -i %s, other data than the checkpoint's run (%s now, %s "
                             "then): training goes on at row %llu of this data\n",
                     cfg.train_data.c_str(), now.data.c_str(), saved.data.c_str(), (unsigned long long)st.rows_consumed);
    if (saved.T != now.T)
        std::fprintf(stderr, "train_gpt: warning: resuming with -t %d where the checkpoint's run had -t %d: the data "
                             "position is kept in rows, so training goes on at token %llu instead of %llu\n",
                     now.T, saved.T, (unsigned long long)st.rows_consumed * (unsigned long long)now.T,
                     (unsigned long long)st.rows_consumed * (unsigned long long)saved.T);
    if (saved.layout() != now.layout() || saved.T != now.T)
        std::printf("resume: checkpoint of step %d written at %s (T=%d); continuing at %s (T=%d)\n", st.step,
                    saved.layout().c_str(), saved.T, now.layout().c_str(), now.T);
    else
        std::printf("resume: %s, step %d, in the same layout (%s)\n", checkpoint_dir(cfg.output_dir, st.step).c_str(),
                    st.step, now.layout().c_str());
}

// Every rank writes its own shard; rank 0 the index, then DONE
// (llmc/run/run_checkpoints.h).
void Trainer::checkpoint() {
    st.rng_state = rng.state;
    if (cfg.moe_balance == "bias" && s.model->moe().on_device()) st.moe_bias = s.model->moe_bias();  // moved there
    if (s.model->fp8_slots()) {  // --fp8-history: every stage's layers (zero elsewhere), the same on every rank
        st.fp8_history = s.model->fp8_history();
        grid.world->host_all_reduce_n(st.fp8_history.data(), st.fp8_history.size(), ReduceOp::Max);
    }
    ckpt.write(cfg.output_dir, *s.model, owner(), st, run_info(), cfg.keep_checkpoints, main_rank);
}

void Trainer::complete_checkpoint(bool wait) {
    ckpt.complete(wait, cfg.output_dir, cfg.keep_checkpoints, st.step, main_rank);
}

int Trainer::agreed_stop_signal() {
    return (int)grid.world->host_all_reduce((double)stop_signal(), ReduceOp::Max);
}

int Trainer::stop_on_signal(int sig) {
    const bool save = !cfg.output_dir.empty();
    if (save && ckpt.last_step != st.step) checkpoint();
    complete_checkpoint(true);  // the run ends only with its checkpoint on disk
    if (main_rank) {
        std::printf("stopped by signal %d after step %d: %s\n", sig, st.step,
                    save ? ("checkpoint " + checkpoint_dir(cfg.output_dir, st.step) + "; resume with -y 1").c_str()
                         : "no checkpoint (no -o)");
        std::fflush(stdout);
    }
    return 128 + sig;
}

// The final weights, tensor by tensor: with -o, always in a form the
// trainer and others load (GPT-2: llm.c's model_SSSSSSSS.bin; Llama, which
// llm.c's files cannot hold: a Hugging Face directory hf_SSSSSSSS); and to
// --export-model (llm.c file) and --export-hf (Hugging Face directory).
void Trainer::export_weights() {
    const int version = s.model->precision().param == DType::BF16 ? 5 : 3;
    std::vector<std::string> paths, hf_paths;
    char name[32];
    if (!cfg.output_dir.empty()) {
        const bool llama = s.model->config().llama();
        std::snprintf(name, sizeof(name), llama ? "/hf_%08d" : "/model_%08d.bin", st.step);
        (llama ? hf_paths : paths).push_back(cfg.output_dir + name);
    }
    if (!cfg.export_model.empty()) paths.push_back(cfg.export_model);
    if (!cfg.export_hf.empty()) hf_paths.push_back(cfg.export_hf);
    for (const std::string& p : paths) {
        if (!export_model(p, *s.model, owner(), version, &err)) end_job(err);
        if (main_rank) std::printf("model: %s\n", p.c_str());
        progress.weights_written.push_back(p);
    }
    // With the run's tokenizer.json, if it has one, and what the Hugging Face
    // directory the run loaded had besides the weights (llmc/io/hf_meta.h).
    const bool json = cfg.tokenizer.size() > 5 && cfg.tokenizer.compare(cfg.tokenizer.size() - 5, 5, ".json") == 0;
    HfExtras extras;
    extras.tokenizer_json = json ? cfg.tokenizer : "";
    // An llm.c tokenizer file, or the byte-level one: a tokenizer.json made
    // from it, so that AutoTokenizer loads the export (tokenizer_export.h).
    std::string why;
    if (!json && !hf_paths.empty() && !tokenizer_json_of(data.tok, &extras.tokenizer_json_text, &why) && main_rank)
        std::fprintf(stderr, "train_gpt: warning: the Hugging Face export has no tokenizer.json: the run's tokenizer "
                             "%s is not a byte-level BPE (%s)\n", cfg.tokenizer.empty() ? "(bytes)" : cfg.tokenizer.c_str(),
                     why.c_str());
    extras.source_dir = is_hf_dir(cfg.model) ? cfg.model : "";
    extras.eot = data.tok.eot() >= 0 && data.tok.eot() < mc.vocab_size ? data.tok.eot() : -1;
    extras.dtype = cfg.export_dtype;
    if (main_rank && !hf_paths.empty() && cfg.moe_balance == "bias")
        std::fprintf(stderr, "train_gpt: warning: --moe-balance bias: a MixtralForCausalLM has no routing bias; the "
                             "Hugging Face export chooses experts by the router's probabilities alone\n");
    for (const std::string& p : hf_paths) {
        if (!export_hf(p, *s.model, owner(), &err, extras)) end_job(err);
        if (main_rank) std::printf("hugging face model: %s\n", p.c_str());
        progress.weights_written.push_back(p);
    }
}

// End of the run: the replicas' agreement, the model export, the trace and
// its bubble, memory, the summary.
void Trainer::finish() {
    complete_checkpoint(true);  // the last checkpoint on disk before anything else
    // Replicas of the tensor-parallel-replicated parameters must agree.
    if (lay.tp > 1) {
        GPT& m = *s.model;
        double c = sum_squares(m.backend(), m.table(), m.sharding(), m.params(), m.sharding().params,
                               m.precision().param, Tensors::replicated);
        double hi = grid.tp_group->host_all_reduce(c, ReduceOp::Max);
        double lo = -grid.tp_group->host_all_reduce(-c, ReduceOp::Max);
        if (main_rank) std::printf("tp replicas of LayerNorm, wpe and row-parallel biases: %s\n", hi == lo ? "identical" : "DIFFER");
        if (hi != lo) end_job("replicated parameters differ across the tensor-parallel group");
    }
    // The two copies of the tied embeddings (first and last stage) must agree.
    if (lay.pp > 1 && mc.tied) {
        const bool same = s.pipe->tied_embeddings_agree(*s.model);
        if (main_rank) std::printf("pp tied embeddings (first and last stage): %s\n", same ? "identical" : "DIFFER");
        if (!same) end_job("the tied embeddings of the first and the last pipeline stage differ");
    }
    export_weights();
    if (!cfg.trace.empty()) {
        std::vector<double> bubble = s.pipe->measured_bubble();
        if (main_rank && lay.pp > 1 && !bubble.empty()) {
            std::printf("pipeline bubble (idle / busy, steps 2..%d, from the trace):", cfg.max_steps);
            for (size_t s = 0; s < bubble.size(); s++) std::printf(" stage %zu %.3f", s, bubble[s]);
            std::printf("; formula %s = %.3f\n",
                        lay.pp_order == PipeOrder::zb_h1 ? "(pp-1)/(3m)"
                        : lay.pp_order == PipeOrder::zbv ? "(pp-1)/(6m)"
                                                         : "(pp-1)/(m*vpp)",
                        s.pipe->bubble_formula());
        }
        bool ok = trace::finish(*grid.world, &err);
        if (!ok) end_job(err);
        if (main_rank) std::printf("trace: %s\n", cfg.trace.c_str());
    }
    // Recorded regions (LLMC_CUDA_GRAPH / LLMC_CPU_GRAPH, docs/design.md 2.9).
    const Backend::RegionStats rs = be->region_stats();
    if (rs.on && main_rank) {
        std::printf("step graphs: %d recorded, %lld replays%s\n", rs.recorded, rs.replays,
                    rs.recorded ? "" : " (ZeRO-2/3, tp and cp communicate inside the forward and backward: no regions)");
        // The whole step as one region (step_graph.h), or why not.
        if (step_graph.on())
            std::printf("whole step as one graph: %d recorded, %lld replays, %lld steps run without\n",
                        step_graph.recorded(), step_graph.replays(), step_graph.plain());
        else
            std::printf("whole step as one graph: no (%s)\n", step_graph_off.c_str());
    }
    print_rank_lines(memory_line("end", rank, *s.model, s.comm_bytes(), grid.pp_rank, lay.pp,
                                 ckpt.host_bytes()));
    progress.print_summary(main_rank);
}
