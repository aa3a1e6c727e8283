#!/usr/bin/env python3
# tests/reference/hf_selfcheck.py: reference_hf.py --selfcheck, the patched
# fp64 transformers against independent math: a Llama forward written here
# from docs/design.md section 9 (Qwen2's: the same with its Q, K, V biases), Mixtral's MoE block and load-balancing loss
# by hand (hf_mixtral.py), and GPT-2 against tests/reference/reference_gpt.py's
# model; last line "N passed, N failed".
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_mixtral as hm  # noqa: E402
import reference_gpt as rg  # noqa: E402
import reference_hf as rh  # noqa: E402


def llama_by_hand(model, inputs, eot=None, mlp=None):
    """Llama from docs/design.md section 9, with the model's weights (eot: the document mask;
    mlp(l, h): another block's MLP, Mixtral's; the q, k, v biases where the model has them, Qwen2's)."""
    c = model.config
    sd = {k: v for k, v in model.named_parameters()}
    C, NH, NKV = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    HS = C // NH
    B, T = inputs.shape
    eps = c.rms_norm_eps

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    i = torch.arange(HS // 2, dtype=torch.float64)
    inv = c.rope_theta ** (-2.0 * i / HS)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)

    def rope(x):  # (B, H, T, HS)
        a, b = x[..., :HS // 2], x[..., HS // 2:]
        return x * cos + torch.cat([-b, a], -1) * sin

    x = sd["model.embed_tokens.weight"][inputs]
    for l in range(c.num_hidden_layers):
        p = lambda s: sd[f"model.layers.{l}.{s}"]  # noqa: E731
        h = rms(x, p("input_layernorm.weight"))
        bias = lambda n: sd.get(f"model.layers.{l}.self_attn.{n}_proj.bias", 0.0)  # noqa: E731
        q = (h @ p("self_attn.q_proj.weight").t() + bias("q")).reshape(B, T, NH, HS).transpose(1, 2)
        k = (h @ p("self_attn.k_proj.weight").t() + bias("k")).reshape(B, T, NKV, HS).transpose(1, 2)
        v = (h @ p("self_attn.v_proj.weight").t() + bias("v")).reshape(B, T, NKV, HS).transpose(1, 2)
        q, k = rope(q), rope(k)
        g = NH // NKV
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # q head j uses kv head j // g
        allowed = None if eot is None else rg.document_mask(inputs, eot)
        y = rg.causal_attention(q, k, v, allowed).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("self_attn.o_proj.weight").t()
        h = rms(x, p("post_attention_layernorm.weight"))
        if mlp:
            x = x + mlp(l, h)
            continue
        gate, up = h @ p("mlp.gate_proj.weight").t(), h @ p("mlp.up_proj.weight").t()
        x = x + (gate * torch.sigmoid(gate) * up) @ p("mlp.down_proj.weight").t()
    x = rms(x, sd["model.norm.weight"])
    head = sd["model.embed_tokens.weight"] if c.tie_word_embeddings else sd["lm_head.weight"]
    return x @ head.t()


def gpt2_by_reference_gpt(model, inputs, eot=None):
    """tests/reference/reference_gpt.py's GPT-2 with the model's weights in its order."""
    c = model.config
    cfg = rg.Config(maxT=c.n_positions, V=c.vocab_size, L=c.n_layer, NH=c.n_head, C=c.n_embd, Vp=c.vocab_size)
    params = {n: f(lambda p: p).detach() for n, f in rh.file_order(model)}
    logits, _ = rg.forward(params, cfg, inputs, None, eot)
    return logits


def check_document_mask(ck, name, model, inputs, by_hand):
    """logits_of's document mask against the by-hand model with reference_gpt's:
    row 0 with several EOTs (3), row 1 without any (= plain causal attention)."""
    eot, x = 3, inputs.clone()
    x[0, ::3] = eot
    x[1] = torch.where(x[1] == eot, torch.full_like(x[1], eot + 1), x[1])
    with torch.no_grad():
        got, want, plain = rh.logits_of(model, x, eot), by_hand(model, x, eot), rh.logits_of(model, x)
        e = rh.rel_err(got, want)
    ck(e <= 1e-12, f"{name}: document mask ({int((x[0] == eot).sum())} EOTs in row 0) vs by hand: rel err {e:.3e}")
    e1, e0 = rh.rel_err(got[1], plain[1]), rh.rel_err(got[0], plain[0])
    ck(e1 <= 1e-14 and e0 > 1e-3, f"{name}: no EOT: mask = causal (rel err {e1:.1e}); EOTs: differs by {e0:.1e}")


def selfcheck(args):
    import transformers
    ck = rh.Checks()
    g = torch.Generator()
    g.manual_seed(7)
    cases = []
    for spec in ("arch=llama,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16,theta=500",
                 "arch=llama,L=1,C=64,NH=4,NKV=1,F=40,V=37,T=12,tied=1,eps=1e-6",
                 "arch=qwen2,L=2,C=48,NH=4,NKV=2,F=72,V=101,T=16,theta=1000000",
                 "arch=qwen2,L=1,C=64,NH=4,NKV=1,F=40,V=37,T=12,tied=1"):
        s = rh.parse_spec(spec)
        model = rh.model_class(s)(rh.make_config(s)).eval()
        rh.randomize(model, 3)
        model.to(torch.float64)
        inputs = torch.randint(0, s["V"], (2, s["T"]), generator=g)
        with torch.no_grad():  # before the patch (which stays for the process)
            cases.append((spec, model, inputs, rh.logits_of(model, inputs)))
    rh.patch_fp64()
    for spec, model, inputs, unpatched in cases:
        with torch.no_grad():
            want = llama_by_hand(model, inputs)
            got = rh.logits_of(model, inputs)
        e = rh.rel_err(got, want)
        ck(e <= 1e-12, f"{spec}: patched fp64 transformers vs docs/design.md section 9 by hand: rel err {e:.3e}")
        # The patch matters: unpatched transformers computes parts in fp32.
        e0 = rh.rel_err(unpatched, want)
        ck(e0 > 1e-10, f"{spec}: unpatched transformers differs by {e0:.3e} (> 1e-10, so the fp64 patch is needed)")
        # Our file order holds every parameter exactly once.
        n_file = rh.flat_file_order(model, grads=False).numel()
        n_model = sum(p.numel() for p in model.parameters())
        ck(n_file == n_model, f"{spec}: file order holds {n_file} values, the model {n_model}")
        check_document_mask(ck, spec, model, inputs, llama_by_hand)
    mix = rh.parse_spec("arch=mixtral,L=2,C=48,NH=4,NKV=2,F=40,E=4,K=2,V=61,T=12,theta=500")
    mixtral = transformers.MixtralForCausalLM(rh.make_config(mix)).eval()
    rh.randomize(mixtral, 5)
    hm.selfcheck(ck, llama_by_hand, rh.logits_of, rh.rel_err, mixtral.to(torch.float64),
                 torch.randint(0, mix["V"], (2, mix["T"]), generator=g))
    n_file = rh.flat_file_order(mixtral, grads=False).numel()
    ck(n_file == sum(p.numel() for p in mixtral.parameters()), f"Mixtral file order holds {n_file} values")
    s = rh.parse_spec("L=2,C=48,NH=3,V=97,T=16")
    model = transformers.GPT2LMHeadModel(rh.make_config(s)).eval()
    rh.randomize(model, 4)
    model.to(torch.float64)
    inputs = torch.randint(0, s["V"], (2, s["T"]), generator=g)
    with torch.no_grad():
        e = rh.rel_err(rh.logits_of(model, inputs), gpt2_by_reference_gpt(model, inputs))
    ck(e <= 1e-12, f"GPT2LMHeadModel fp64 vs tests/reference/reference_gpt.py forward: rel err {e:.3e}")
    n_file = rh.flat_file_order(model, grads=False).numel()
    ck(n_file == sum(p.numel() for p in model.parameters()), f"GPT-2 file order holds {n_file} values")
    check_document_mask(ck, "GPT-2", model, inputs, gpt2_by_reference_gpt)
    print(f"{ck.passed} passed, {ck.failed} failed")
    return 0 if ck.failed == 0 else 1
