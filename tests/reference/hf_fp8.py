#!/usr/bin/env python3
# tests/reference/hf_fp8.py: --fp8 1 (docs/fp8.md) for reference_hf.py's
# Llama, Qwen2 and Mixtral: transformers' own modules with their linear
# layers' operands rounded by fp8_reference.py's Fp8Linear (written from
# the formats' definitions, independently of the trainer), each product one
# tensor as the trainer multiplies it:
#   QKV          q_proj, k_proj and v_proj as one product of [Wq; Wk; Wv]
#                (q_proj's call computes all three; k_proj's and v_proj's
#                return their parts), Qwen2's biases after it;
#   attention    o_proj;
#   MLP up       Llama, Qwen2: [gate; up] as one product, then down_proj;
#                Mixtral: each expert's [w1; w3] over the rows routed to it
#                in the forward call (one micro-batch), then its w2.
# The router, the embeddings and the head stay in fp64. Instance forwards
# are replaced, so the parameters keep their names (and file order).
# --fp8-layers (fp8_reference.LAYERS): the layers it leaves out stay plain.
import torch

from fp8_reference import fp8_linear


def fused(x, weights, biases, key):
    """x @ cat(weights).t() + cat(biases) on FP8 operands (one tensor each)."""
    w = torch.cat(weights) if len(weights) > 1 else weights[0]
    b = torch.cat(biases) if biases[0] is not None else torch.zeros(w.shape[0], dtype=w.dtype)
    return fp8_linear(x, w, b, key)


def _attention(i, attn):
    q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
    parts = {}

    def qkv(x):
        y = fused(x, [q.weight, k.weight, v.weight], [q.bias, k.bias, v.bias], (i, 0))
        nq, nk = q.weight.shape[0], k.weight.shape[0]
        parts["k"], parts["v"] = y[..., nq:nq + nk], y[..., nq + nk:]
        return y[..., :nq]
    q.forward = qkv
    k.forward = lambda x: parts.pop("k")
    v.forward = lambda x: parts.pop("v")
    o.forward = lambda x: fused(x, [o.weight], [o.bias], (i, 1))


def _swiglu(i, gate, up, down, act):
    H = gate.weight.shape[0]

    def forward(x):
        gu = fused(x, [gate.weight, up.weight], [None], (i, 2))
        return fused(act(gu[..., :H]) * gu[..., H:], [down.weight], [None], (i, 3))
    return forward


def patch(model):
    """The model's products on FP8 operands from here on."""
    for i, layer in enumerate(model.model.layers):
        _attention(i, layer.self_attn)
        if hasattr(layer, "block_sparse_moe"):
            for ex in layer.block_sparse_moe.experts:
                ex.forward = _swiglu(i, ex.w1, ex.w3, ex.w2, ex.act_fn)
        else:
            m = layer.mlp
            m.forward = _swiglu(i, m.gate_proj, m.up_proj, m.down_proj, m.act_fn)
