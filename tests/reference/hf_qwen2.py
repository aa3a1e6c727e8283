#!/usr/bin/env python3
# tests/reference/hf_qwen2.py: the Qwen2 part of tests/reference/reference_hf.py:
# transformers' Qwen2ForCausalLM (Llama with biases on q_proj, k_proj and
# v_proj) built from the trainer's -e sizes, made to compute in fp64, and its
# biases in the trainer's model file order (llmc/model/tensors.h: qkvb, the
# rows [Q; K; V] as qkvw's, after qkvw).
#
# Sliding-window attention stays off (use_sliding_window False, the trainer
# refuses it) and sliding_window is None: transformers 4.40.2 builds its
# eager causal mask with sliding_window whether or not the window is on.
import torch


def modeling():
    from transformers.models.qwen2 import modeling_qwen2
    return modeling_qwen2


def patch_fp64():
    """transformers' Qwen2 computes RMSNorm and the RoPE tables in fp32 (its
    softmax upcast is reference_hf.patch_fp64's), and cannot build an fp64
    causal mask."""
    mq = modeling()

    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    @torch.no_grad()
    def rope_forward(self, x, seq_len=None):
        inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    mq.Qwen2RMSNorm.forward = rms_forward
    mq.Qwen2RotaryEmbedding.forward = rope_forward
    # Its causal mask from a 2-D attention mask (generate's) is filled with
    # the dtype's minimum in a default-dtype (fp32) tensor first, which
    # overflows for fp64: built with fp64 the default there.
    from transformers.modeling_attn_mask_utils import AttentionMaskConverter as conv
    if not getattr(conv._make_causal_mask, "_fp64", False):
        make = conv._make_causal_mask

        def make_causal_mask(*args, **kw):
            dtype = kw.get("dtype", args[1] if len(args) > 1 else None)
            if dtype != torch.float64:
                return make(*args, **kw)
            old = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                return make(*args, **kw)
            finally:
                torch.set_default_dtype(old)

        make_causal_mask._fp64 = True
        conv._make_causal_mask = staticmethod(make_causal_mask)


def make_config(s):
    """Qwen2Config of the sizes s (reference_hf.parse_spec): eps 1e-6 unless
    given (Qwen2Config's default, as the trainer's arch=qwen2)."""
    import transformers
    return transformers.Qwen2Config(
        hidden_size=s["C"], num_attention_heads=s["NH"], num_key_value_heads=s.get("NKV", s["NH"]),
        intermediate_size=s["F"], num_hidden_layers=s["L"], vocab_size=s["V"], max_position_embeddings=s["T"],
        rope_theta=s["theta"], rms_norm_eps=s["eps"] if s["eps"] is not None else 1e-6,
        tie_word_embeddings=bool(s["tied"]), attention_dropout=0.0, hidden_act="silu",
        use_sliding_window=False, sliding_window=None, max_window_layers=s["L"], attn_implementation="eager")


def is_qwen2(model):
    return model.config.model_type == "qwen2"


def qkvb_order(get, L):
    """qkvb in the file order: (name, fn) as reference_hf.file_order."""
    lay = lambda l, s: get(f"model.layers.{l}.self_attn.{s}")  # noqa: E731
    return [("qkvb", lambda t: torch.stack([torch.cat([t(lay(l, f"{p}_proj.bias")) for p in "qkv"])
                                            for l in range(L)]))]
