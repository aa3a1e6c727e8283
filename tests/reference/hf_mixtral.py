#!/usr/bin/env python3
# tests/reference/hf_mixtral.py: the Mixtral part of tests/reference/reference_hf.py:
# transformers' MixtralForCausalLM in fp64, its load-balancing loss as the
# objective adds it, its tensors in the trainer's model file order
# (llmc/model/tensors.h: moe_gate, moe_fc = [w1; w3] per expert, moe_proj =
# w2 per expert), and a by-hand MoE block (docs/moe.md) for the selfcheck.
#
# The loss transformers trains with output_router_logits=True is the
# cross-entropy plus router_aux_loss_coef times load_balancing_loss_func
# over the router logits of every layer of the forward call, concatenated
# (one forward per batch here: the micro-batch the trainer sees).
#
# Ties in the top-k: the routing probabilities come from random fp64
# weights, so two equal ones (where the two codes could choose differently)
# have probability ~0; the by-hand check below would show one.
import torch


def modeling():
    from transformers.models.mixtral import modeling_mixtral
    return modeling_mixtral


def patch_fp64():
    """transformers' Mixtral computes RMSNorm and RoPE in fp32 (and the
    router softmax in fp32: reference_hf.patch_fp64's softmax keeps fp64)."""
    mm = modeling()

    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    @torch.no_grad()
    def rope_forward(self, x, seq_len=None):
        inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    mm.MixtralRMSNorm.forward = rms_forward
    mm.MixtralRotaryEmbedding.forward = rope_forward
    if not hasattr(mm, "_lbl_fp32"):
        mm._lbl_fp32 = mm.load_balancing_loss_func
        mm.load_balancing_loss_func = load_balancing_fp64


def load_balancing_fp64(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """transformers' load_balancing_loss_func without an attention mask, its
    fraction of tokens per expert in the logits' dtype (it takes the one-hot
    mask's mean in fp32: a 1e-9 relative error in fp64)."""
    mm = modeling()
    if attention_mask is not None:
        return mm._lbl_fp32(gate_logits, num_experts, top_k, attention_mask)
    logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = torch.nn.functional.softmax(logits, dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected, num_experts).to(logits.dtype)
    tokens_per_expert = torch.mean(expert_mask, dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


def make_config(s):
    import transformers
    return transformers.MixtralConfig(
        hidden_size=s["C"], num_attention_heads=s["NH"], num_key_value_heads=s.get("NKV", s["NH"]),
        intermediate_size=s["F"], num_hidden_layers=s["L"], vocab_size=s["V"], max_position_embeddings=s["T"],
        rope_theta=s["theta"], rms_norm_eps=s["eps"] if s["eps"] is not None else 1e-5,
        tie_word_embeddings=bool(s["tied"]), attention_dropout=0.0, hidden_act="silu", sliding_window=None,
        num_local_experts=s["E"], num_experts_per_tok=s["K"], router_aux_loss_coef=s["aux"],
        output_router_logits=True, router_jitter_noise=0.0, attn_implementation="eager")


def is_mixtral(model):
    return model.config.model_type == "mixtral"


def attach(model):
    """Keeps the router logits of the model's last forward (hooks on the gates)."""
    if not is_mixtral(model) or hasattr(model, "_router_logits"):
        return
    model._router_logits = []
    model.model.register_forward_pre_hook(lambda *_: model._router_logits.clear())
    for layer in model.model.layers:
        layer.block_sparse_moe.gate.register_forward_hook(lambda m, i, o: model._router_logits.append(o))


def aux_loss(model):
    """transformers' load-balancing loss of the last forward (without its coefficient)."""
    c = model.config
    return modeling().load_balancing_loss_func(tuple(model._router_logits), c.num_local_experts,
                                               c.num_experts_per_tok)


def objective_extra(model):
    """What the objective adds to the cross-entropy: coef x aux (0 for other models)."""
    return model.config.router_aux_loss_coef * aux_loss(model) if is_mixtral(model) else 0.0


def mlp_order(get, L, E):
    """The MoE block's tensors in the file order: (name, fn) as reference_hf.file_order."""
    moe = lambda l, s: get(f"model.layers.{l}.block_sparse_moe.{s}")  # noqa: E731
    return [
        ("moe_gate", lambda t: torch.stack([t(moe(l, "gate.weight")) for l in range(L)])),
        ("moe_fc", lambda t: torch.stack([torch.cat([t(moe(l, f"experts.{e}.{w}.weight")) for e in range(E)
                                                     for w in ("w1", "w3")]) for l in range(L)])),
        ("moe_proj", lambda t: torch.stack([torch.cat([t(moe(l, f"experts.{e}.w2.weight")) for e in range(E)])
                                            for l in range(L)])),
    ]


def moe_by_hand(model, l, h, logits_out):
    """Layer l's MoE block on h (B, T, C), token by token from docs/moe.md;
    appends the router logits to logits_out."""
    c = model.config
    sd = dict(model.named_parameters())
    p = lambda s: sd[f"model.layers.{l}.block_sparse_moe.{s}"]  # noqa: E731
    x = h.reshape(-1, h.shape[-1])
    logits = x @ p("gate.weight").t()
    logits_out.append(logits)
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        z = logits[n] - logits[n].max()
        prob = z.exp() / z.exp().sum()
        order = sorted(range(c.num_local_experts), key=lambda e: -prob[e].item())[:c.num_experts_per_tok]
        s = sum(prob[e] for e in order)
        for e in order:
            g, u = x[n] @ p(f"experts.{e}.w1.weight").t(), x[n] @ p(f"experts.{e}.w3.weight").t()
            out[n] += (prob[e] / s) * ((g * torch.sigmoid(g) * u) @ p(f"experts.{e}.w2.weight").t())
    return out.reshape(h.shape)


def aux_by_hand(all_logits, E, K):
    """E * sum_e f_e P_e over the concatenated layers' routings (docs/moe.md)."""
    logits = torch.cat(all_logits)
    prob = torch.softmax(logits, -1)
    f = torch.zeros(E, dtype=torch.float64)
    for row in prob:
        for e in sorted(range(E), key=lambda e: -row[e].item())[:K]:
            f[e] += 1
    return E * (f / logits.shape[0] * prob.mean(0)).sum()


def selfcheck(ck, llama_by_hand, logits_of, rel_err, model, inputs):
    """The patched fp64 transformers' Mixtral against docs/moe.md by hand:
    the logits and the load-balancing loss."""
    attach(model)
    with torch.no_grad():
        got = logits_of(model, inputs)
        aux = aux_loss(model)
        router = []
        want = llama_by_hand(model, inputs, mlp=lambda l, h: moe_by_hand(model, l, h, router))
        aux_want = aux_by_hand(router, model.config.num_local_experts, model.config.num_experts_per_tok)
    e = rel_err(got, want)
    ck(e <= 1e-12, f"Mixtral: patched fp64 transformers vs docs/moe.md by hand: rel err {e:.3e}")
    ea = abs(aux.item() - aux_want.item()) / aux_want.item()
    ck(ea <= 1e-12, f"Mixtral: fp64 load_balancing_loss_func {aux.item():.12f} vs by hand {aux_want.item():.12f}")
    c = model.config
    orig = modeling()._lbl_fp32(tuple(model._router_logits), c.num_local_experts, c.num_experts_per_tok).item()
    eo = abs(orig - aux_want.item()) / aux_want.item()
    ck(eo <= 1e-6, f"Mixtral: transformers' own load_balancing_loss_func {orig:.12f} (fp32 fractions) vs by hand: "
                   f"rel err {eo:.1e}")
