// llmc/run/trainer_step.cpp: a training step, validation and samples
// (llmc/run/trainer.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "llmc/backend/backend_profile.h"
#include "llmc/backend/backend_recorder.h"
#include "llmc/backend/backends.h"
#include "llmc/backend/step_figures.h"
#include "llmc/base/test_hooks.h"
#include "llmc/base/trace.h"
#include "llmc/run/report.h"
#include "llmc/run/startup.h"
#include "llmc/run/trainer.h"

// Draws a token from the softmax of logits with one uniform number.
static int sample_token(const std::vector<float>& logits, double u) {
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max(mx, (double)x);
    for (float x : logits) sum += std::exp((double)x - mx);
    double acc = 0, target = u * sum;
    for (size_t i = 0; i < logits.size(); i++) {
        acc += std::exp((double)logits[i] - mx);
        if (acc > target) return (int)i;
    }
    return (int)logits.size() - 1;
}

// One optimizer step: the pipeline schedule runs the forwards and backwards
// of the step's micro-batches (without pp: forward, backward, one after the
// other), then the optimizer. issue_step queues it (reading the host-read
// step's figures as they come); finish_step reports it.
PendingStep Trainer::issue_step(int step) {
    if (test_hooks::crash_now(step, rank)) std::raise(SIGKILL);  // a rank that dies (test_hooks.h)
    if (const int ms = test_hooks::slow_rank_ms(rank)) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    tuning.before_step(*be, main_rank);  // --matmul-tune: before the run's second step
    PendingStep p;
    p.step = step;
    p.t0 = std::chrono::steady_clock::now();
    std::vector<double> before;
    take_op_times(*be, &before);  // LLMC_BREAKDOWN=1: this step's ops alone (not validation's)
    take_host_reads(*be);         // LLMC_TEST_HOST_READS: this step's reads alone
    trace::set_step(step);
    const test_hooks::NanHook& nan = test_hooks::nan_hook();  // the tests' bad steps (test_hooks.h)
    const float nan_f = std::nanf("");
    const bool hooked = nan.at(step, rank, test_hooks::NanHook::grad_pre) ||
                        nan.at(step, rank, test_hooks::NanHook::loss) || nan.at(step, rank, test_hooks::NanHook::grad);
    const uint64_t rows0 = st.rows_consumed;
    // Rank r's micro-step k takes rows (k·dp + r)·B of the step's rows.
    auto read = [&](int micro) {
        uint64_t first = cfg.overfit ? (uint64_t)grid.dp_rank * cfg.B
                                     : rows0 + ((uint64_t)micro * lay.dp() + grid.dp_rank) * cfg.B;
        data.read_micro_batch(data.train, first, cfg.B, cfg.T, cfg.eot_token, *s.cp, cfg.bos_token);
    };
    std::function<void(int, const int**, const int**, const int**)> load;
    if (step_graph.on()) {
        // The whole step as one region (step_graph.h): every micro-batch is
        // in backend memory before it, and its forwards copy them there.
        for (int k = 0; k < accum; k++) {
            read(k);
            step_graph.stage(k, data.inputs.data(), data.targets.data(), data.docs_or_null());
        }
        load = [&](int micro, const int** in, const int** tg, const int** dc) {
            *in = step_graph.inputs(micro), *tg = step_graph.targets(micro), *dc = step_graph.docs(micro);
        };
    } else {
        load = [&](int micro, const int** in, const int** tg, const int** dc) {
            read(micro);
            *in = data.inputs.data(), *tg = data.targets.data(), *dc = data.docs_or_null();
        };
    }
    s.model->moe().take_aux_sum();  // what validation and samples left
    s.model->moe().count_loads(true);  // the experts' loads of this step's training forwards
    if (figures && figures_fresh) {
        // The running mean's state and the counts go to the device at the
        // first step and after a resume, and stay there from step to step.
        double init[step_figure::count] = {};
        init[step_figure::loss_mean] = st.loss_mean;
        init[step_figure::loss_count] = st.loss_count;
        init[step_figure::updates] = step - st.skips;
        init[step_figure::step] = step - 1;  // the step's start (phase 3) counts it
        be->upload(figures, DType::F64, init, DType::F64, step_figure::count);
        figures_fresh = false;
    }
    double loss = 0, norm = 0;
    bool skipped = false;
    // The step's work on the device, from zero_grad to the update: with
    // --sync-free nothing in it comes back to the host, and a step that
    // communicates nothing runs as one recorded region.
    auto work = [&] {
        s.model->zero_grad();
        if (nan.at(step, rank, test_hooks::NanHook::grad_pre))
            be->upload(s.model->grads(), s.model->precision().grad, &nan_f, DType::F32, 1);
        if (figures) {
            // The step's start: its loss's sum from 0, its number counted.
            StepVerdict start;
            start.phase = 3;
            be->step_verdict(figures, start);
            s.model->set_loss_figure(elem_ptr(figures, DType::F64, step_figure::loss),
                                     elem_ptr(figures, DType::F64, step_figure::aux));
        }
        s.model->set_batch_on_device(step_graph.on());
        loss = s.pipe->train_step(*s.model, load, cfg.B, T_local, 1.0 / (double)cfg.total_batch);
        s.model->set_batch_on_device(false);
        s.model->set_loss_figure(nullptr);
        // Mixtral's load-balancing loss, the mean over the step's micro-batches
        // (each the same on the ranks of its cp group) as the loss; not part of
        // `loss`, which stays the cross-entropy (docs/moe.md). Pipeline stages
        // form it only with aux > 0 (their forward-only pass of the statistics).
        if (mc.moe() && !figures && (lay.pp == 1 || mc.aux_coef > 0)) {
            p.aux = grid.dpcp_group->host_all_reduce(s.model->moe().take_aux_sum(), ReduceOp::Sum) /
                    (accum * grid.dpcp_group->size());
            p.aux = s.pipe->sum_over_stages(grid.pp_rank == s.pipe->head_stage() ? p.aux : 0.0);
        }
        // The loss's verdict: on the host (bad), or on the device (--sync-free:
        // the optimizer step reads it there).
        bool bad = false;
        if (nan.at(step, rank, test_hooks::NanHook::loss)) {
            if (figures) be->upload(elem_ptr(figures, DType::F64, step_figure::loss), DType::F64, &nan_f, DType::F32, 1);
            loss = nan_f;
        }
        if (figures) reduce_loss_figure();
        else loss = step_loss(loss, &bad);
        // Test hook (llmc/base/test_hooks.h, docs/design.md section 2.8): a rank
        // sets one gradient element to NaN before this step's optimizer step, so
        // the tests can check that the bad step is skipped on every rank. After
        // the gradients' reductions: a reduction still in flight would overwrite
        // it (ZeRO 1-2's reduce-scatter into the same buffer).
        s.dp->finish_reductions();
        if (nan.at(step, rank, test_hooks::NanHook::grad))
            be->upload(s.model->grads(), s.model->precision().grad, &nan_f, DType::F32, 1);
        trace::Scope span("optimizer", "optimizer");
        // The update's number: the steps before it less those skipped (a
        // skipped step never happened, for the schedule and Adam's t; with
        // --sync-free the device keeps the count).
        norm = s.step(oc, step, step - st.skips, bad, &skipped, figures);
        // --fp8-history: the step's amaxes over the dp x cp ranks (each saw
        // its own micro-batches), into the history unless the step was skipped.
        if (s.model->fp8_slots()) {
            if (grid.dpcp_group->size() > 1)
                grid.dpcp_group->all_reduce(s.model->fp8_step_amax(), s.model->fp8_slots(), DType::F64, ReduceOp::Max);
            s.model->fp8_push(figures, skipped);
        }
    };
    step_graph.run(work, hooked);
    // (Here, not in work: a replayed step does not run work's host code.)
    s.model->moe().count_loads(false);
    // Mixtral: the step's loads over the whole batch (every rank counted its
    // own tokens for its stage's layers; the tp ranks of a group the same
    // ones), their imbalance, and --moe-balance bias's update (not on a
    // skipped step: nothing is updated then).
    if (mc.moe() && figures) {  // the same on the device: the loads summed there, the figures' skip read there
        if (grid.world->size() > 1)
            grid.world->all_reduce(s.model->moe_loads_device(), (size_t)mc.num_layers * mc.experts, DType::F64,
                                   ReduceOp::Sum);
        s.model->moe_balance(figures, lay.tp, cfg.moe_balance == "bias" ? cfg.moe_bias_rate : 0.0);
    } else if (mc.moe()) {
        std::vector<double> loads = s.model->moe().take_loads();
        dist_sum(&loads);
        for (double& x : loads) x /= lay.tp;
        p.maxvio = moe_max_violation(loads, mc.experts);
        if (cfg.moe_balance == "bias" && !skipped) {
            moe_bias_update(&st.moe_bias, loads, mc.experts, cfg.moe_bias_rate);
            s.model->set_moe_bias(st.moe_bias);
        }
    }
    // The step's one read (--sync-free): its figures, queued behind its work.
    if (figures) be->download_late(step % 2, figures, step_figure::count), p.late = true;
    p.loss = loss, p.norm = norm, p.skipped = skipped;
    if (test_hooks::host_reads())
        std::printf("host reads[%d] step %d: %s\n", rank, step + 1, take_host_reads(*be).c_str());
    p.comm_text = comm_summary(grid, &p.comm_json);  // the traffic this step issued
    st.rows_consumed += (uint64_t)rows_per_step;
    st.step = step + 1;
    return p;
}

// Whether main() may issue step + 1 before reporting `step`: a --sync-free
// step after which nothing reads the model or the training state (no
// validation, sample or checkpoint due, not the last step) and no per-step
// timing is asked for. The same on every rank (flags and the step alone),
// so every rank issues the same collectives in the same order.
bool Trainer::overlap_next(int step) const {
    if (!figures || step + 1 >= cfg.max_steps || std::getenv("LLMC_BREAKDOWN")) return false;
    if (data.use_val && due(cfg.val_every, step)) return false;
    if (due(cfg.sample_every, step)) return false;
    return cfg.output_dir.empty() || !due(cfg.checkpoint_every, step);
}

StepMetrics Trainer::finish_step(PendingStep& p, bool overlapped) {
    const int step = p.step;
    std::vector<double> op_ms;
    if (p.late) {
        be->wait_late(step % 2, p.figures);
        p.loss = p.figures[step_figure::loss];
        p.norm = p.figures[step_figure::norm];
        p.skipped = p.figures[step_figure::skip] != 0.0;
        st.loss_mean = p.figures[step_figure::loss_mean];
        st.loss_count = (int)p.figures[step_figure::loss_count];
        if (mc.moe()) p.aux = p.figures[step_figure::aux], p.maxvio = p.figures[step_figure::moe_maxvio];
    }
    // The step's time: to its end (a synchronisation), or with the next step
    // already queued, since the previous report (the device ran them back to back).
    if (!overlapped) be->synchronize();
    const auto now = std::chrono::steady_clock::now();
    const auto from = overlapped && last_report > p.t0 ? last_report : p.t0;
    const double ms = std::chrono::duration<double, std::milli>(now - from).count();
    last_report = now;
    const double loss = p.loss, norm = p.norm, aux = p.aux, maxvio = p.maxvio;
    const bool skipped = p.skipped;

    StepMetrics m{};
    m.step = step;
    m.loss = loss;
    m.lr = lr_at(oc, step - st.skips);  // the update's (st.skips: the steps skipped before this one)
    m.grad_norm = norm;
    m.ms = ms;
    m.tokens = (unsigned long long)(step + 1) * (unsigned long long)cfg.total_batch;
    m.tokens_per_s = cfg.total_batch / (ms / 1000.0);
    const double peak = backend_peak_flops(*be);
    m.mfu = peak > 0 ? train_flops_per_token(mc, cfg.T) * m.tokens_per_s / (peak * lay.world)
                     : 0;
    m.val_loss = -1;
    m.aux_loss = aux;
    m.moe_maxvio = maxvio;
    m.comm_json = p.comm_json;
    const std::string& comm_text = p.comm_text;
    if (take_op_times(*be, &op_ms)) {
        const std::vector<std::string>& names = op_class_names();
        for (size_t i = 0; i < names.size(); i++)
            m.breakdown_json += (i ? ", \"" : "{\"") + names[i] + "\": " + std::to_string(op_ms[i]);
        m.breakdown_json += "}";
    }
    // --log-every N: the line of every Nth step, the first and the last (metrics.jsonl has them all).
    const bool log = step == 0 || step + 1 == cfg.max_steps || (step + 1) % cfg.log_every == 0;
    if (main_rank && log) {
        std::printf("step %5d/%d | loss %.6f", step + 1, cfg.max_steps, loss);
        if (aux >= 0) std::printf(" | aux %.6f", aux);
        if (maxvio >= 0) std::printf(" | maxvio %.3f", maxvio);
        std::printf(" | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s", m.lr, norm, ms, m.tokens_per_s);
        if (m.mfu > 0) std::printf(" | MFU %.1f%%", 100 * m.mfu);
        std::printf(" | %s", progress.line(step, cfg.max_steps, m.tokens, ms, *be).c_str());
        if (!comm_text.empty()) std::printf(" |%s", comm_text.c_str());
        std::printf("\n");
    }
    const std::string threads_line = cpu_threads.after_step();
    if (main_rank && !threads_line.empty()) std::printf("step %5d: %s\n", step + 1, threads_line.c_str());
    StragglerCheck sc;  // --straggler-every: a collective on the steps that close a window
    const double t_s = std::chrono::duration<double>(now.time_since_epoch()).count();
    if (stragglers.after_step(step, t_s, blocked_seconds(grid), *grid.world, &sc)) {
        m.stragglers_json = sc.json();
        if (main_rank && !sc.slow.empty()) std::printf("%s\n", sc.line().c_str());
    }
    if (skipped) {
        st.skips++;
        if (main_rank)
            std::printf("step %5d: update skipped (%s), %d so far\n", step + 1,
                        !std::isfinite(loss) ? "the loss is not finite"
                        : !std::isfinite(norm) ? "the gradient norm is not finite"
                                                : "a loss spike over --skip-spikes x the running mean",
                        st.skips);
        setup_check(st.skips <= cfg.max_skips,
                    "flag --max-skips " + std::to_string(cfg.max_skips) + ": " + std::to_string(st.skips) +
                        " updates skipped by step " + std::to_string(step + 1) +
                        " (non-finite loss or gradient norm, or loss spikes); the run stops rather than train on "
                        "garbage");
    } else if (!figures) {  // (the sync-free step's device counted it already)
        double f[step_figure::count] = {};
        f[step_figure::loss] = loss, f[step_figure::loss_mean] = st.loss_mean, f[step_figure::loss_count] = st.loss_count;
        accept_loss(f);
        st.loss_count = (int)f[step_figure::loss_count];
        st.loss_mean = f[step_figure::loss_mean];
    }
    m.skipped = skipped;
    m.skips = st.skips;
    return m;
}

// The step's global loss from this rank's sum of its micro-batches' means,
// read on the host: the mean over the global batch (the last stage's sum
// over the dp x cp ranks, then to every stage), and whether the step is bad
// (docs/design.md section 2.8: a loss that is not finite, or with
// --skip-spikes over FACTOR x the running mean; the norm is judged later).
// Ranks decide together: the loss is the same global mean everywhere; the
// max makes the verdict one even if it were not.
double Trainer::step_loss(double loss, bool* bad) {
    loss = grid.dpcp_group->host_all_reduce(loss, ReduceOp::Sum) / (accum * grid.dpcp_group->size());
    loss = s.pipe->sum_over_stages(grid.pp_rank == s.pipe->head_stage() ? loss : 0.0);
    double f[step_figure::count] = {};
    f[step_figure::loss] = loss, f[step_figure::loss_mean] = st.loss_mean, f[step_figure::loss_count] = st.loss_count;
    StepVerdict v;
    v.skip_spikes = cfg.skip_spikes;
    apply_verdict(f, v);
    *bad = grid.world->host_all_reduce(f[step_figure::skip], ReduceOp::Max) > 0;
    return loss;
}

// The same on the device (--sync-free): the loss's sum reduced by device
// all-reduces of one double, in the same order, the verdict there; nothing
// comes back (the optimizer step reads the verdict on the device, the host
// reads every figure at the step's end).
void Trainer::reduce_loss_figure() {
    void* l = elem_ptr(figures, DType::F64, step_figure::loss);
    // With Mixtral's load-balancing loss beside it (step_figure::aux), as its host sum.
    const size_t n = mc.moe() ? 2 : 1;
    if (grid.dpcp_group->size() > 1) grid.dpcp_group->all_reduce(l, n, DType::F64, ReduceOp::Sum);
    if (s.groups.pp && s.groups.pp->size() > 1) s.groups.pp->all_reduce(l, 1, DType::F64, ReduceOp::Sum);
    StepVerdict v;
    v.loss_divisor = (double)accum * grid.dpcp_group->size();
    v.skip_spikes = cfg.skip_spikes;
    be->step_verdict(figures, v);
    if (grid.world->size() > 1)
        grid.world->all_reduce(elem_ptr(figures, DType::F64, step_figure::skip), 1, DType::F64, ReduceOp::Max);
}

// Validation micro-batches of B rows (the last one shorter when B does not
// divide the rows) are dealt round robin over the data-parallel ranks;
// every rank runs the same number of forwards (the extra ones are
// discarded), each through the whole pipeline. The loss is the mean over
// all rows, each micro-batch's mean weighted by its rows.
double Trainer::validate() {
    trace::set_step(-1);
    double sum = 0, count = 0;
    const long long micro = (data.val_rows + cfg.B - 1) / cfg.B;
    for (long long k0 = 0; k0 < micro; k0 += lay.dp()) {
        const long long k = k0 + grid.dp_rank;
        const bool mine = k < micro;
        const int rows = mine ? (int)std::min<long long>(cfg.B, data.val_rows - k * cfg.B) : cfg.B;
        data.read_micro_batch(data.val, (uint64_t)(mine ? k : 0) * cfg.B, rows, cfg.T, cfg.eot_token, *s.cp,
                              cfg.bos_token);
        double l = s.pipe->forward_only(*s.model, data.inputs.data(), data.targets.data(), rows, T_local, data.docs_or_null());
        if (mine) sum += l * rows, count += rows;
    }
    sum = grid.dpcp_group->host_all_reduce(sum, ReduceOp::Sum);
    count = grid.dpcp_group->host_all_reduce(count, ReduceOp::Sum);
    reset_counts(grid);  // validation traffic is not step traffic
    if (main_rank) std::printf("val loss %.6f\n", sum / count);
    return sum / count;
}

// Every rank runs the same forwards (ZeRO-3 gathers need all of them) with
// the same RNG; rank 0 prints. Each forward runs on the whole window of T
// tokens (as llm.c does): causal attention keeps the padding after position
// t from mattering, and the shape stays one that sequence parallelism can
// split.
void Trainer::sample() {
    trace::set_step(-1);
    const int V = mc.vocab_size, T = cfg.T;
    std::vector<int> tokens(T, data.tok.eot() < V ? data.tok.eot() : 0), local(T / s.cp->size());
    std::vector<int> full_dc(data.docs.empty() ? 0 : T), local_dc(full_dc.empty() ? 0 : T / s.cp->size());
    std::vector<float> logits(V);
    int n = std::min(cfg.gen_tokens, T - 1);
    for (int t = 1; t <= n; t++) {
        s.cp->shard_rows(tokens.data(), 1, T, local.data());
        if (!full_dc.empty()) {  // the document mask on the sample too (a sampled EOT starts a new document)
            GPT::document_starts(tokens.data(), 1, T, cfg.eot_token, full_dc.data(), cfg.bos_token);
            s.cp->shard_rows(full_dc.data(), 1, T, local_dc.data());
        }
        s.model->want_logits(0, t - 1);  // --head-chunk computes only that row's chunk
        s.pipe->forward_only(*s.model, local.data(), nullptr, 1, T / s.cp->size(),
                             local_dc.empty() ? nullptr : local_dc.data());
        s.pipe->logits_row(*s.model, 0, t - 1, logits.data());
        int next = sample_token(logits, rng.uniform());
        tokens[t] = next;
    }
    // The sampled tokens' text (byte tokens joined into characters).
    const std::string text = data.tok.decode_text(std::vector<int>(tokens.begin() + 1, tokens.begin() + 1 + n));
    if (main_rank) std::printf("---- sample ----\n%s\n----------------\n", Tokenizer::printable(text).c_str());
    reset_counts(grid);
}
