// llmc/parallel/model_stack.cpp: a rank's model and its parallel modes, built
// from a layout (llmc/parallel/model_stack.h).
#include "llmc/parallel/model_stack.h"

#include <stdexcept>

size_t ModelStack::comm_bytes() const {
    return (dp ? dp->comm_buffer_bytes() : 0) + (cp ? cp->buffer_bytes() : 0) + (pipe ? pipe->buffer_bytes() : 0) +
           (ep ? ep->buffer_bytes() : 0);
}

ModelStack::~ModelStack() {
    dp.reset();
    model.reset();
    ep.reset();
    pipe.reset();
    cp.reset();
    tp.reset();
}

void build_stack(Backend& be, const GPTConfig& mc, const Layout& l, const RankGroups& g, ModelStack* s) {
    s->tp.reset(new TensorParallel(*g.tp, l.sp != 0));
    // The pipeline says which chunks of blocks this stage runs (its
    // micro-batches are the accumulation steps); the model allocates them.
    s->pipe.reset(new PipelineParallel(*g.pp, *g.embed, mc.num_layers, l.vpp, l.micro_batches(), l.pp_order));
    // The all-to-all's group: the cp group (a2a), its part (hybrid), none (ring).
    Comm* a2a = l.cp > 1 && l.cp_a2a == l.cp ? g.cp : l.cp > 1 && l.cp_a2a > 1 ? g.cp_a2a : nullptr;
    if (l.cp_hybrid() && (!g.cp_a2a || !g.cp_ring))
        throw std::logic_error("build_stack: hybrid context parallel without its a2a and ring groups");
    s->cp.reset(new ContextParallel(*g.cp, be, l.B, l.T_local(), mc.num_heads / l.tp, mc.head_size(),
                                    mc.kv_heads() / l.tp, a2a, l.cp_hybrid() ? g.cp_ring : nullptr));
    // Expert parallel: the ep group's experts, and the expert-data group
    // that reduces (and, under ZeRO, shards) them.
    if (l.ep > 1 && (!g.ep || !g.edp || g.ep->size() != l.ep))
        throw std::logic_error("build_stack: expert parallel without its ep and expert-data groups");
    if (l.ep > 1) s->ep.reset(new ExpertParallel(*g.ep, be, mc.experts));
    Comm* edp = l.ep > 1 ? g.edp : g.dpcp;
    // The model's options, all from the layout and the groups.
    ModelOptions o(l.B, l.T_local());
    o.recompute = l.recompute;
    o.sharding = Sharding::for_zero(l.zero, g.dpcp->size(), g.dpcp->rank(), edp->size(), edp->rank());
    o.chunks = s->pipe->chunks();
    o.head_chunk = l.head_chunk;
    o.bf16_optimizer_state = l.bf16_optimizer;
    o.fp8 = l.fp8;
    o.fp8_history = l.fp8_history;
    o.fp8_weight_copies = l.fp8_weight_copies;
    o.fp8_layers = l.fp8_layers;
    o.split_backward = s->pipe->schedule().split();  // zero-bubble: B and W apart
    o.tp = s->tp.get();
    o.cp = s->cp.get();
    o.ep = s->ep.get();
    s->model.reset(new GPT(&be, mc, o));
    s->model->set_positions(ContextParallel::positions(l.T, l.cp, g.cp_rank));
    s->pipe->attach(*s->model);
    s->dp.reset(new DataParallel(*s->model, *g.dpcp, l.zero, l.ep > 1 ? g.edp : nullptr));
    s->groups = {g.dpcp, g.tp, g.pp, g.embed, l.ep > 1 ? g.ep : nullptr, l.ep > 1 ? g.edp : nullptr, g.world};
    // The ops' temporary memory, now, before any step (a GPU must not
    // allocate while collectives are in flight).
    be.reserve_workspace(s->model->workspace());
}

double ModelStack::step(const OptimConfig& o, int step, int update, bool skip, bool* skipped, void* figures) {
    dp->finish_reductions();
    return optimizer_step(*model, groups, o, step, update, skip, skipped, figures);
}
