// llmc/parallel/layout.cpp: a layout's description and its checks, every
// message naming its flag (llmc/parallel/layout.h).
#include "llmc/parallel/layout.h"

#include "llmc/parallel/pipeline_parallel.h"

std::string Layout::describe() const {
    const std::string cp_words = cp_hybrid() ? " (a2a " + std::to_string(cp_a2a) + " x ring " +
                                                   std::to_string(cp / cp_a2a) + ")"
                                 : cp > 1 && cp_a2a == cp ? " (a2a)"
                                                          : "";
    std::string s = "pp " + std::to_string(pp) + (vpp > 1 ? "(x" + std::to_string(vpp) + ")" : "") + " x dp " +
                    std::to_string(dp()) + " x cp " + std::to_string(cp) + cp_words + " x tp " + std::to_string(tp) +
                    (sp ? " (sp)" : "") + ", ZeRO " + std::to_string(zero) + ", B=" + std::to_string(B) +
                    ", recompute " + recompute_name(recompute);
    if (pp_order != PipeOrder::standard) s += std::string(", ") + pipe_order_name(pp_order, vpp);
    if (ep > 1) s += ", ep " + std::to_string(ep);
    if (head_chunk > 0) s += ", head chunk " + std::to_string(head_chunk);
    if (bf16_optimizer) s += ", bf16 Adam state";
    if (fp8) s += fp8_history > 0 ? ", fp8 products (delayed scaling over " + std::to_string(fp8_history) + ")"
                                  : ", fp8 products";
    if (fp8 && fp8_layers != kLinearLayersAll) s += " on " + linear_layers_names(fp8_layers);
    if (fp8 && !fp8_weight_copies) s += ", no weight copies";
    return s;
}

bool cp_a2a_of(const std::string& impl, int cp, int n, int* cp_a2a, std::string* err) {
    const std::string N = std::to_string(n), c = std::to_string(cp);
    if (impl != "hybrid" && n != 0)
        *err = "flag --cp-a2a: an all-to-all group size is for --cp-impl hybrid only (--cp-impl is " + impl + ")";
    else if (impl == "hybrid" && n == 0)
        *err = "flag --cp-a2a: --cp-impl hybrid needs the all-to-all group size N (1 < N < cp, N divides cp)";
    else if (impl == "hybrid" && (n <= 1 || n >= cp))
        *err = "flag --cp-a2a: N=" + N + " must be above 1 and below --cp " + c +
               " (N=1 is --cp-impl ring, N=cp is --cp-impl a2a)";
    else if (impl == "hybrid" && cp % n != 0)
        *err = "flag --cp-a2a: N=" + N + " does not divide --cp " + c;
    else {
        *cp_a2a = impl == "a2a" ? cp : impl == "hybrid" ? n : 1;
        return true;
    }
    return false;
}

bool check_world(const Layout& l, std::string* err) {
    auto fail = [&](const std::string& m) {
        *err = m;
        return false;
    };
    for (const auto& d : {std::make_pair("--pp", l.pp), std::make_pair("--tp", l.tp), std::make_pair("--cp", l.cp),
                          std::make_pair("--ep", l.ep), std::make_pair("--vpp", l.vpp)})
        if (d.second < 1) return fail(std::string("flag ") + d.first + ": " + std::to_string(d.second) + " must be at least 1");
    // The product in 64 bits: --tp 65536 --cp 65536 would wrap an int to 0.
    const long long world = l.world, ptc = (long long)l.tp * l.cp * l.pp;
    // One process started for a parallel layout: the usual slip is a missing mpirun.
    const std::string hint = world == 1 ? " (this is one process: start pp*tp*cp = " + std::to_string(ptc) +
                                              " or a multiple with mpirun -np " + std::to_string(ptc) + " ./train_gpt ...)"
                                        : "";
    if (l.pp > world)
        return fail("flag --pp: " + std::to_string(l.pp) + " stages is larger than the world size " +
                    std::to_string(world) + hint);
    if (l.tp > world)
        return fail("flag --tp: " + std::to_string(l.tp) + " is larger than the world size " + std::to_string(world) +
                    hint);
    if (ptc > world)
        return fail("flags --pp " + std::to_string(l.pp) + " --tp " + std::to_string(l.tp) + " --cp " +
                    std::to_string(l.cp) + ": pp*tp*cp = " + std::to_string(ptc) + " is larger than the world size " +
                    std::to_string(world) + hint);
    if (world % ptc != 0)
        return fail(std::string(l.cp > 1 ? "flag --cp" : l.tp > 1 ? "flag --tp" : "flag --pp") + ": world size " +
                    std::to_string(world) + " is not a multiple of pp*tp*cp = " + std::to_string(ptc));
    if (l.cp_a2a < 1 || l.cp_a2a > l.cp || l.cp % l.cp_a2a != 0)
        return fail("flag --cp-a2a: N=" + std::to_string(l.cp_a2a) + " does not divide --cp " + std::to_string(l.cp));
    if (l.sp && l.tp == 1) return fail("flag --sp: sequence parallel needs --tp > 1");
    if (l.ep > 1 && l.dp() % l.ep != 0)
        return fail("flag --ep: " + std::to_string(l.ep) + " does not divide the " + std::to_string(l.dp()) +
                    " data-parallel ranks (world / (pp*tp*cp); the experts are split over dp ranks)");
    if (l.pp_order != PipeOrder::standard && l.pp == 1)
        return fail(std::string("flag --pp-schedule: ") + pipe_order_name(l.pp_order, l.vpp) + " needs --pp > 1");
    if (l.vpp > 1 && l.pp == 1) return fail("flag --vpp: interleaved stages need --pp > 1");
    return true;
}

bool check_layout(Layout* lp, const GPTConfig& c, std::string* err) {
    Layout& l = *lp;
    auto fail = [&](const std::string& m) {
        *err = m;
        return false;
    };
    if (!check_world(l, err)) return false;
    if (l.T > c.max_seq_len)
        return fail("flag -t: T=" + std::to_string(l.T) + " exceeds the model's maxT=" + std::to_string(c.max_seq_len));
    if (c.num_heads % l.tp != 0)
        return fail("flag --tp: " + std::to_string(l.tp) + " does not divide the " + std::to_string(c.num_heads) +
                    " attention heads");
    if (c.kv_heads() % l.tp != 0)
        return fail("flag --tp: " + std::to_string(l.tp) + " does not divide the " + std::to_string(c.kv_heads()) +
                    " key/value heads (grouped-query attention splits whole key/value heads)");
    if (c.hidden() % l.tp != 0)
        return fail("flag --tp: " + std::to_string(l.tp) + " does not divide the MLP's " + std::to_string(c.hidden()) +
                    " hidden channels");
    if (l.cp > 1 && l.T % (2 * l.cp) != 0)
        return fail("flag --cp: the sequence length T=" + std::to_string(l.T) + " does not cut into 2*cp = " +
                    std::to_string(2 * l.cp) + " chunks");
    // All-to-all context parallel splits each rank's heads over its group.
    const int heads = c.num_heads / l.tp, kv_heads = c.kv_heads() / l.tp;
    const std::string a2a_flag = l.cp_hybrid() ? "flag --cp-a2a: N=" : "flag --cp-impl a2a: --cp ";
    if (l.cp > 1 && l.cp_a2a > 1 && heads % l.cp_a2a != 0)
        return fail(a2a_flag + std::to_string(l.cp_a2a) + " does not divide the " +
                    std::to_string(heads) + " attention heads of a tensor-parallel rank");
    if (l.cp > 1 && l.cp_a2a > 1 && kv_heads % l.cp_a2a != 0)
        return fail(a2a_flag + std::to_string(l.cp_a2a) + " does not divide the " +
                    std::to_string(kv_heads) + " key/value heads of a tensor-parallel rank (grouped-query attention: "
                    "key/value heads are split, not replicated)");
    if (l.ep > 1 && !c.moe())
        return fail("flag --ep: expert parallelism needs a mixture-of-experts model (arch=mixtral)");
    if (l.ep > 1 && c.experts % l.ep != 0)
        return fail("flag --ep: " + std::to_string(l.ep) + " does not divide the " + std::to_string(c.experts) +
                    " experts");
    if (l.sp && l.T_local() % l.tp != 0)
        return fail("flag --sp: the sequence length T/cp=" + std::to_string(l.T_local()) + " does not divide by --tp " +
                    std::to_string(l.tp));
    // Rows of the batch are split over the dp ranks; -d says how many per step.
    const long long rows_per_micro = (long long)l.B * l.dp();
    if (l.total_batch < 0) l.total_batch = rows_per_micro * l.T;
    if (l.total_batch % (rows_per_micro * l.T) != 0)
        return fail("flag -d: total batch " + std::to_string(l.total_batch) + " tokens is not a multiple of B*T*dp = " +
                    std::to_string(rows_per_micro * l.T) + " (B=" + std::to_string(l.B) + ", T=" + std::to_string(l.T) +
                    ", dp=" + std::to_string(l.dp()) + ")");
    const long long micro = l.total_batch / (rows_per_micro * l.T);
    if (micro > 1000000000LL)
        return fail("flag -d: " + std::to_string(l.total_batch) + " tokens per step is " + std::to_string(micro) +
                    " micro-steps of B*T*dp = " + std::to_string(rows_per_micro * l.T) + " tokens (at most 1e9)");
    if (!pipe_layout_ok(c.num_layers, l.pp, l.vpp, (int)micro, err, l.pp_order)) {
        // Too few micro-batches for the pipeline: say which -d gives 4 per
        // stage (bubble (pp-1)/(4·pp·vpp), under a fifth of the step).
        if (micro < l.pp)
            *err += " (-d is tokens per step, B*T*dp = " + std::to_string(rows_per_micro * l.T) +
                    " per micro-batch: try -d " + std::to_string(rows_per_micro * l.T * 4 * l.pp) + ", " +
                    std::to_string(4 * l.pp) + " micro-batches)";
        return false;
    }
    return true;
}
