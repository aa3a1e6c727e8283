#!/usr/bin/env python3
# tests/reference/reference_hf.py: the Hugging Face reference for the trainer's
# Llama, Mixtral (hf_mixtral.py), Qwen2 (hf_qwen2.py) and GPT-2 checkpoints. Run it with the
# virtual environment's python that scripts/setup.sh makes
# (build/hfenv/bin/python: transformers 4.40.2 on Debian's torch 1.13).
#
# Modes:
#   --spec SPEC --save-dir DIR [--write-state S]
#       builds a random LlamaForCausalLM ("arch=llama,L=..,C=..,NH=..,NKV=..,F=..,V=..,T=..
#       [,theta=..,eps=..,tied=0|1]"), Qwen2ForCausalLM (arch=qwen2, the same keys),
#       MixtralForCausalLM (arch=mixtral, the same and E=..,K=..[,aux=..]) or GPT2LMHeadModel ("L=..,C=..,NH=..,V=..,T=.."), saves it with
#       save_pretrained (safetensors; --save-dtype, --shard-size for sharded files) and writes
#       the debug state test_gpt reads (tests/reference/reference_gpt.py write_state's format):
#       inputs, targets, logits, loss, every gradient in the trainer's model file order
#       (llmc/model/tensors.h), and the losses of --steps AdamW steps with the project's
#       semantics (docs/design.md section 2), by transformers' own modules in fp64.
#       --document-mask EOT: random data with EOTs and attention within documents (below).
#       --fp8 1: Llama's, Qwen2's and Mixtral's linear layers on FP8 operands (hf_fp8.py).
#   --compare DIR --logits FILE
#       loads DIR with from_pretrained and compares its logits on the inputs
#       of FILE (written by test_gpt --write-logits) with FILE's logits;
#       last line "N passed, N failed".
#   --check-weights DIR --weights FILE [--exported DIR2]
#       the trainer's tensor maps against transformers' own tensors: FILE
#       (test_gpt --write-weights: DIR loaded by llmc/io/hf.cpp, in model file
#       order, fp64) must equal DIR's parameters put in file order here; and
#       DIR2 (test_gpt --export-hf of that model) must load in transformers
#       with every parameter equal to DIR's. Last line "N passed, N failed".
#   --selfcheck
#       the patched fp64 transformers against independent math
#       (tests/reference/hf_selfcheck.py); last line "N passed, N failed".
#
# Document mask (--document-mask EOT): reference_gpt.document_mask as
# transformers 4.40.2 takes it: Llama a 4-D (B, 1, T, T) mask of 1/0 that
# replaces its causal mask; GPT2Model flattens any mask to (B, 1, 1, T), so
# GPT-2 runs its GPT2Blocks with a 4-D additive mask (0 or the dtype's min).
#
# fp64: transformers computes RoPE and RMSNorm in fp32, upcasts the attention
# softmax to fp32 and casts Llama's logits to fp32 whatever the model dtype.
# patch_fp64() replaces those forwards with the same math in the input's
# dtype, and the logits are taken from the LM head directly, so an fp64 model
# is fp64 throughout.
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_gpt as rg  # noqa: E402  (state-file header, AdamW schedule)
import hf_mixtral as hm  # noqa: E402  (MixtralForCausalLM: its config, loss, file order)
import hf_qwen2 as hq  # noqa: E402  (Qwen2ForCausalLM: its config, fp64, the biases' file order)

LOGITS_MAGIC = 20241201


class RefError(Exception):
    pass


def import_transformers():
    try:
        import transformers  # noqa: F401
        from transformers.models.llama import modeling_llama
        transformers.utils.logging.disable_progress_bar()
    except ImportError as e:
        raise RefError(f"transformers is not importable ({e}); run scripts/setup.sh and use build/hfenv/bin/python")
    return transformers, modeling_llama


def patch_fp64():
    """Make transformers' Llama compute in the input's dtype (see the header)."""
    _, ml = import_transformers()

    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    @torch.no_grad()
    def rope_forward(self, x, position_ids):
        inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
        freqs = position_ids[:, :, None].to(torch.float64) * inv[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    ml.LlamaRMSNorm.forward = rms_forward
    ml.LlamaRotaryEmbedding.forward = rope_forward
    hm.patch_fp64()
    hq.patch_fp64()
    if not getattr(torch.nn.functional.softmax, "_keeps_fp64", False):
        softmax = torch.nn.functional.softmax

        def softmax_keep_fp64(input, dim=None, _stacklevel=3, dtype=None):
            if dtype is not None and input.dtype == torch.float64:
                dtype = None  # an fp32 "upcast" of fp64 scores is a downcast
            return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

        softmax_keep_fp64._keeps_fp64 = True
        torch.nn.functional.softmax = softmax_keep_fp64


# ----------------------------------------------------------------------------
# model shapes

def parse_spec(spec):
    """Our -e size syntax -> dict (arch, L, C, NH, NKV, F, V, T, theta, eps, tied)."""
    d = {"arch": "gpt2", "theta": 10000.0, "eps": None, "tied": None, "aux": 0.01}
    for item in spec.split(","):
        if "=" not in item:
            raise RefError(f"--spec: bad item '{item}'")
        k, v = item.split("=", 1)
        if k == "arch":
            if v not in ("gpt2", "llama", "mixtral", "qwen2"):
                raise RefError(f"--spec: arch {v} (gpt2, llama, mixtral or qwen2)")
            d["arch"] = v
        elif k in ("theta", "eps", "aux"):
            d[k] = float(v)
        elif k == "tied":
            d[k] = v == "1"
        elif k in ("L", "C", "NH", "NKV", "F", "V", "T", "E", "K"):
            d[k] = int(v)
        else:
            raise RefError(f"--spec: unknown key {k}")
    for k in ("L", "C", "NH", "V", "T"):
        if k not in d:
            raise RefError(f"--spec: missing {k}")
    if d["arch"] != "gpt2" and "F" not in d or d["arch"] == "mixtral" and not ("E" in d and "K" in d):
        raise RefError("--spec: a Llama or Qwen2 model needs F, a Mixtral model F, E and K")
    return d


def make_config(s):
    import transformers
    if s["arch"] == "mixtral":
        return hm.make_config(s)
    if s["arch"] == "qwen2":
        return hq.make_config(s)
    if s["arch"] == "llama":
        return transformers.LlamaConfig(
            hidden_size=s["C"], num_attention_heads=s["NH"], num_key_value_heads=s.get("NKV", s["NH"]),
            intermediate_size=s["F"], num_hidden_layers=s["L"], vocab_size=s["V"],
            max_position_embeddings=s["T"], rope_theta=s["theta"],
            rms_norm_eps=s["eps"] if s["eps"] is not None else 1e-5,
            tie_word_embeddings=bool(s["tied"]), attention_dropout=0.0, hidden_act="silu",
            attn_implementation="eager")
    return transformers.GPT2Config(
        n_embd=s["C"], n_head=s["NH"], n_layer=s["L"], vocab_size=s["V"], n_positions=s["T"],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
        activation_function="gelu_new", attn_implementation="eager")


def is_llama(model):
    return model.config.model_type in ("llama", "mixtral", "qwen2")


def model_class(s):
    import transformers
    return {"llama": transformers.LlamaForCausalLM, "mixtral": transformers.MixtralForCausalLM,
            "qwen2": transformers.Qwen2ForCausalLM, "gpt2": transformers.GPT2LMHeadModel}[s["arch"]]


def randomize(model, seed):
    """Every parameter random (norm weights near 1, biases small), so a mix-up
    of any two tensors shows."""
    g = torch.Generator()
    g.manual_seed(int(seed))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * r)
            elif p.dim() == 1:
                p.copy_(0.05 * r)
            else:
                p.copy_(0.05 * r)


def base_and_head(model):
    return (model.model, model.lm_head) if is_llama(model) else (model.transformer, model.lm_head)


def logits_of(model, inputs, eot=None):
    """(B, T, V) logits in the model's dtype (Llama's forward would cast them to fp32);
    eot: attention within the documents it ends (see the header)."""
    base, head = base_and_head(model)
    if eot is None and (hm.is_mixtral(model) or hq.is_qwen2(model)):
        eot = -1  # no EOT: the causal mask, which fp64 Mixtral and Qwen2 must be given as 4-D (their own overflow)
    allowed = None if eot is None else rg.document_mask(inputs, eot)
    if eot is None or is_llama(model):
        mask = None if eot is None else allowed.to(torch.float64)
        h = base(input_ids=inputs, attention_mask=mask, use_cache=False).last_hidden_state
    else:
        dt = base.wte.weight.dtype
        add = torch.zeros(allowed.shape, dtype=dt).masked_fill(~allowed, torch.finfo(dt).min)
        x = base.drop(base.wte(inputs) + base.wpe(torch.arange(inputs.shape[1])[None, :]))
        for block in base.h:
            x = block(x, attention_mask=add, use_cache=False)[0]
        h = base.ln_f(x)
    return head(h)


# ----------------------------------------------------------------------------
# our model file order

def file_order(model):
    """The model's tensors (or their .grad with grads=True, via the returned
    function) as the trainer's model file order: a list of (name, tensor)."""
    c = model.config
    sd = dict(model.named_parameters())

    def get(n):
        return sd[n]

    out = []
    if is_llama(model):
        L = c.num_hidden_layers
        lay = lambda l, s: get(f"model.layers.{l}.{s}")  # noqa: E731
        out.append(("wte", lambda t: t(get("model.embed_tokens.weight"))))
        out.append(("ln1w", lambda t: torch.stack([t(lay(l, "input_layernorm.weight")) for l in range(L)])))
        out.append(("qkvw", lambda t: torch.stack([torch.cat([t(lay(l, f"self_attn.{p}_proj.weight"))
                                                              for p in "qkv"]) for l in range(L)])))
        if hq.is_qwen2(model):
            out += hq.qkvb_order(get, L)
        out.append(("attprojw", lambda t: torch.stack([t(lay(l, "self_attn.o_proj.weight")) for l in range(L)])))
        out.append(("ln2w", lambda t: torch.stack([t(lay(l, "post_attention_layernorm.weight")) for l in range(L)])))
        if hm.is_mixtral(model):
            out += hm.mlp_order(get, L, c.num_local_experts)
        else:
            out.append(("fcw", lambda t: torch.stack([torch.cat([t(lay(l, "mlp.gate_proj.weight")),
                                                                 t(lay(l, "mlp.up_proj.weight"))]) for l in range(L)])))
            out.append(("fcprojw", lambda t: torch.stack([t(lay(l, "mlp.down_proj.weight")) for l in range(L)])))
        out.append(("lnfw", lambda t: t(get("model.norm.weight"))))
        if not c.tie_word_embeddings:
            out.append(("lm_head", lambda t: t(get("lm_head.weight"))))
    else:
        L = c.n_layer
        lay = lambda l, s: get(f"transformer.h.{l}.{s}")  # noqa: E731
        stack = lambda s, tr=False: (lambda t: torch.stack(  # noqa: E731
            [t(lay(l, s)).t() if tr else t(lay(l, s)) for l in range(L)]))
        out.append(("wte", lambda t: t(get("transformer.wte.weight"))))
        out.append(("wpe", lambda t: t(get("transformer.wpe.weight"))))
        out += [("ln1w", stack("ln_1.weight")), ("ln1b", stack("ln_1.bias")),
                ("qkvw", stack("attn.c_attn.weight", True)), ("qkvb", stack("attn.c_attn.bias")),
                ("attprojw", stack("attn.c_proj.weight", True)), ("attprojb", stack("attn.c_proj.bias")),
                ("ln2w", stack("ln_2.weight")), ("ln2b", stack("ln_2.bias")),
                ("fcw", stack("mlp.c_fc.weight", True)), ("fcb", stack("mlp.c_fc.bias")),
                ("fcprojw", stack("mlp.c_proj.weight", True)), ("fcprojb", stack("mlp.c_proj.bias"))]
        out.append(("lnfw", lambda t: t(get("transformer.ln_f.weight"))))
        out.append(("lnfb", lambda t: t(get("transformer.ln_f.bias"))))
    return out


def flat_file_order(model, grads):
    pick = (lambda p: p.grad) if grads else (lambda p: p)
    return torch.cat([f(pick).detach().reshape(-1) for _, f in file_order(model)])


# ----------------------------------------------------------------------------
# the run

def train(model, inputs, targets, hp, S, eot=None):
    """S AdamW steps on one batch with the project's semantics (as
    reference_gpt.train): the initial logits, loss and grads (file order),
    and the loss before each update."""
    params = list(model.parameters())  # tied tensors once
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    out = {"step_losses": []}
    V = model.config.vocab_size
    for s in range(max(S, 1)):
        for p in params:
            p.grad = None
        logits = logits_of(model, inputs, eot)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)) + hm.objective_extra(model)
        loss.backward()
        if s == 0:
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.detach().clone()
            out["grads"] = flat_file_order(model, grads=True).clone()
        if s >= S:
            break
        out["step_losses"].append(loss.item())
        with torch.no_grad():
            norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params))
            if hp.clip > 0 and norm.item() > hp.clip:
                for p in params:
                    p.grad.mul_(hp.clip / norm)
            lr = rg.lr_at(hp, s, S)
            t = s + 1
            bc1, bc2 = 1.0 - hp.beta1 ** t, 1.0 - hp.beta2 ** t
            for p, mi, vi in zip(params, m, v):
                g = p.grad
                mi.mul_(hp.beta1).add_((1.0 - hp.beta1) * g)
                vi.mul_(hp.beta2).add_((1.0 - hp.beta2) * g * g)
                wd = hp.wd if p.dim() == 2 else 0.0  # 2-D tensors only
                p.sub_(lr * ((mi / bc1) / (torch.sqrt(vi / bc2) + hp.eps) + wd * p))
    return out


def write_state(path, inputs, targets, res, hp, S):
    """reference_gpt.write_state's format (version 3, fp64)."""
    B, T = inputs.shape
    h = np.zeros(rg.HEADER_INTS, dtype="<i4")
    h[0], h[1], h[2], h[3], h[4], h[5] = rg.STATE_MAGIC, 3, B, T, S, hp.warmup
    h[rg.HYPER_AT:rg.HYPER_AT + 2 * rg.HYPER_N] = rg.pack_hyper(
        (hp.lr, hp.beta1, hp.beta2, hp.eps, hp.wd, hp.clip, hp.final_frac))
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(inputs.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        for a in (res["logits"].reshape(-1), res["loss"].reshape(1), res["grads"],
                  torch.tensor(res["step_losses"], dtype=torch.float64)):
            f.write(a.numpy().astype("<f8").tobytes())


SAVE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


def build_and_save(args):
    s = parse_spec(args.spec)
    torch.manual_seed(args.seed)
    cfg = make_config(s)
    model = model_class(s)(cfg)
    model.eval()  # no dropout anywhere
    hm.attach(model)
    randomize(model, args.seed)
    if args.save_dir:
        # Saved in the dtype asked for; the reference then computes in fp64
        # on exactly the saved values.
        model.to(SAVE_DTYPES[args.save_dtype])
        kw = {"safe_serialization": True}
        if args.shard_size:
            kw["max_shard_size"] = args.shard_size
        model.save_pretrained(args.save_dir, **kw)
    model.to(torch.float64)
    return s, model


# ----------------------------------------------------------------------------
# --compare and --selfcheck

def read_logits_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 16:
        raise RefError(f"{path}: truncated")
    magic, B, T, V = struct.unpack("<4i", raw[:16])
    if magic != LOGITS_MAGIC:
        raise RefError(f"{path}: bad magic {magic} (expected {LOGITS_MAGIC}, test_gpt --write-logits)")
    need = 16 + 4 * B * T + 8 * B * T * V
    if len(raw) != need:
        raise RefError(f"{path}: {len(raw)} bytes, expected {need}")
    inputs = np.frombuffer(raw[16:16 + 4 * B * T], dtype="<i4").reshape(B, T).astype(np.int64)
    logits = np.frombuffer(raw[16 + 4 * B * T:], dtype="<f8").reshape(B, T, V)
    return torch.from_numpy(inputs.copy()), torch.from_numpy(logits.copy())


def rel_err(a, b):
    return (torch.linalg.norm((a - b).reshape(-1)) / torch.linalg.norm(b.reshape(-1))).item()


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what):
        print(("PASS " if ok else "FAIL ") + what)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def compare(args):
    import transformers
    inputs, theirs = read_logits_file(args.logits)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.compare, torch_dtype=torch.float64,
                                                              attn_implementation="eager")
    model.eval()
    ck = Checks()
    with open(os.path.join(args.compare, "config.json")) as f:
        arch = json.load(f).get("architectures", ["?"])[0]
    ck(type(model).__name__ == arch, f"from_pretrained gives {type(model).__name__} (config.json: {arch})")
    with torch.no_grad():
        mine = logits_of(model, inputs)
    ok_shape = tuple(mine.shape) == tuple(theirs.shape)
    ck(ok_shape, f"logits shape {tuple(mine.shape)} vs the file's {tuple(theirs.shape)}")
    if ok_shape:
        e = rel_err(theirs, mine)
        ck(e <= args.tol, f"logits of {args.compare} (transformers) vs {args.logits}: rel err {e:.3e} (tol {args.tol:.0e})")
    print(f"{ck.passed} passed, {ck.failed} failed")
    return 0 if ck.failed == 0 else 1


def load_fp64(d):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager")
    return m.eval()


def check_weights(args):
    ck = Checks()
    model = load_fp64(args.check_weights)
    want = flat_file_order(model, grads=False)
    got = torch.from_numpy(np.fromfile(args.weights, dtype="<f8"))
    ok = got.numel() == want.numel()
    ck(ok, f"{args.weights}: {got.numel()} values, the model's file order {want.numel()}")
    if ok:
        bad = (got != want).nonzero()
        where = ""
        if bad.numel():
            i, off = int(bad[0]), 0
            for name, f in file_order(model):
                n = f(lambda p: p).numel()
                if i < off + n:
                    where = f" (first at {name}, element {i - off})"
                    break
                off += n
        ck(bad.numel() == 0, f"weights loaded by llmc/io/hf.cpp equal transformers' in file order: "
                             f"{bad.numel()} differ{where}")
    if args.exported:
        exp = load_fp64(args.exported)
        ck(type(exp) is type(model), f"{args.exported} loads as {type(exp).__name__}")
        a, b = dict(model.named_parameters()), dict(exp.named_parameters())
        ck(sorted(a) == sorted(b), f"{args.exported}: the same parameter names ({len(b)})")
        diff = [n for n in a if n in b and (a[n].shape != b[n].shape or not torch.equal(a[n], b[n]))]
        ck(not diff, f"{args.exported}: every parameter equal to {args.check_weights}'s"
                     + (f" (differ: {', '.join(diff[:4])})" if diff else ""))
        keys = ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "hidden_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
                "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "use_sliding_window",
                "sliding_window", "n_embd", "n_head", "n_layer", "n_positions", "layer_norm_epsilon",
                "activation_function")
        cd = [k for k in keys if getattr(model.config, k, None) != getattr(exp.config, k, None)]
        ck(not cd, f"{args.exported}: config fields equal" + (f" (differ: {cd})" if cd else ""))
    print(f"{ck.passed} passed, {ck.failed} failed")
    return 0 if ck.failed == 0 else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description="Hugging Face reference (transformers) for the trainer's tests.")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--spec", help="model sizes in the trainer's -e syntax (arch=llama,... or GPT-2's)")
    mode.add_argument("--compare", metavar="DIR", help="a Hugging Face directory to compare with --logits")
    mode.add_argument("--selfcheck", action="store_true", help="patched transformers against independent math")
    mode.add_argument("--check-weights", metavar="DIR", help="compare --weights FILE (and --exported DIR2) with DIR")
    ap.add_argument("--weights", help="with --check-weights: test_gpt --write-weights output")
    ap.add_argument("--exported", help="with --check-weights: test_gpt --export-hf output")
    ap.add_argument("--logits", help="with --compare: test_gpt --write-logits output")
    ap.add_argument("--tol", type=float, default=1e-10)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--save-dir", help="save_pretrained here (safetensors)")
    ap.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default="fp32")
    ap.add_argument("--shard-size", help="save_pretrained max_shard_size (e.g. 20KB) for sharded files")
    ap.add_argument("--write-state", help="debug state for test_gpt")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=None, help="sequence length (default: the model's T)")
    ap.add_argument("--data-seed", type=int, default=42)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--final-frac", type=float, default=1.0)
    ap.add_argument("--document-mask", type=int, metavar="EOT", help="documents end with EOT (1 token in 4)")
    ap.add_argument("--fp8", type=int, choices=(0, 1), default=0,
                    help="1: Llama's, Qwen2's and Mixtral's linear layers on FP8 operands (hf_fp8.py)")
    ap.add_argument("--fp8-layers", default="all",
                    help="with --fp8 1: the linear layers on FP8 operands (qkv, attproj, fc, fcproj, or all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    try:
        import_transformers()
        patch_fp64() if not args.selfcheck else None
        if args.selfcheck:
            import hf_selfcheck
            return hf_selfcheck.selfcheck(args)
        if args.check_weights:
            if not args.weights:
                raise RefError("--check-weights needs --weights FILE")
            return check_weights(args)
        if args.compare:
            if not args.logits:
                raise RefError("--compare needs --logits FILE")
            return compare(args)
        s, model = build_and_save(args)
        if args.fp8:
            if s["arch"] == "gpt2":
                raise RefError("--fp8 1: GPT-2's FP8 reference is reference_gpt.py --fp8 1")
            import hf_fp8
            import fp8_reference
            fp8_reference.set_layers(args.fp8_layers)
            hf_fp8.patch(model)
        T = args.T or s["T"]
        if not 0 < T <= s["T"]:
            raise RefError(f"--T {T} must be in 1..{s['T']}")
        if args.document_mask is not None and not 0 <= args.document_mask < s["V"]:
            raise RefError(f"--document-mask: {args.document_mask} is not a token id below V={s['V']}")
        inputs, targets = rg.random_batch(args.B, T, s["V"], args.data_seed, args.document_mask)
        hp = rg.Hyper(args.lr, args.beta1, args.beta2, args.eps, args.wd, args.clip, args.warmup, args.final_frac)
        res = train(model, inputs, targets, hp, args.steps, args.document_mask)
        if args.write_state:
            write_state(args.write_state, inputs, targets, res, hp, args.steps)
    except RefError as e:
        print(f"reference_hf.py: {e}", file=sys.stderr)
        return 1
    print(f"model {args.spec} saved to {args.save_dir} ({args.save_dtype}); B={args.B} T={T}")
    print(f"initial loss {res['loss'].item():.9f}")
    print("step losses " + " ".join(f"{x:.6f}" for x in res["step_losses"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
