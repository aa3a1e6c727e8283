#!/usr/bin/python3
# tests/reference/reference_gpt.py: the plain-PyTorch reference GPT-2 that the C++/CUDA
# trainer is checked against. It holds the same model (token + learned position
# embeddings, pre-LayerNorm blocks, causal multi-head attention written by hand,
# tanh GELU, LM head tied to a vocab-padded wte), the llm.c model/data file
# formats, a GPT-2 style random init, and a hand-written clipped AdamW run on one
# fixed batch. It writes the initial model (--write-model) and a debug state
# file (--write-state: inputs, targets, logits, loss, grads, step losses) for
# the trainer's tests. Run it with the system python: /usr/bin/python3.
#
# State file (--write-state), all little-endian:
#   header 256 int32: [0]=20240327, [1]=2 (fp32 payload) or 3 (fp64 payload),
#     [2]=B [3]=T [4]=S (steps) [5]=warmup steps; [8..21] seven float64 (two
#     int32 each) lr, beta1, beta2, eps, weight_decay, grad_clip,
#     final_lr_frac, so an fp64 run sees exactly these values; rest 0.
#   payload: inputs int32[B*T], targets int32[B*T], then floats (fp32 or fp64):
#     logits[B*T*V] (first V columns, initial model), loss (1, initial model),
#     grads of every parameter of the initial model (model-file order, P values,
#     padded wte rows included), step losses[S].
import argparse
import math
import os
import struct
import sys

import numpy as np
import torch

from fp8_reference import DELAYED, fp8_linear, set_layers

MODEL_MAGIC = 20240326
STATE_MAGIC = 20240327
DATA_MAGIC_U16 = 20240520
DATA_MAGIC_U32 = 20240801
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
LN_EPS = 1e-5

# Parameters that get weight decay: the 2-D kinds (embeddings and linear
# weights). Decided by name, because the per-layer stacks are 3-D.
DECAY_NAMES = ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw")


class RefError(Exception):
    """Bad input; the message names the file (or argument) at fault."""


class Config:
    """Model shape: maxT (rows of wpe), V (real vocab), Vp (rows of wte), L, NH, C."""

    def __init__(self, maxT, V, L, NH, C, Vp=None):
        self.maxT, self.V, self.L, self.NH, self.C = int(maxT), int(V), int(L), int(NH), int(C)
        self.Vp = int(Vp) if Vp is not None else default_padded_vocab(self.V)

    def validate(self, where):
        for k in ("maxT", "V", "L", "NH", "C", "Vp"):
            if getattr(self, k) <= 0:
                raise RefError(f"{where}: {k} must be positive (got {getattr(self, k)})")
        if self.C % self.NH != 0:
            raise RefError(f"{where}: C={self.C} is not a multiple of NH={self.NH}")
        if self.Vp < self.V:
            raise RefError(f"{where}: Vp={self.Vp} must be >= V={self.V}")

    def __str__(self):
        return f"L={self.L} C={self.C} NH={self.NH} V={self.V} Vp={self.Vp} maxT={self.maxT}"


def default_padded_vocab(V):
    return ((V + 127) // 128) * 128


def parse_spec(spec):
    """'L=2,C=64,NH=4,V=128,T=32[,Vp=...]' or a descriptor 'dN' (GPT-2 sizes)."""
    s = spec.strip()
    if len(s) >= 2 and s[0] == "d" and "=" not in s:
        try:
            depth = int(s[1:])
        except ValueError:
            raise RefError(f"--spec: bad descriptor '{spec}' (expected dN, e.g. d12)")
        cfg = Config(maxT=1024, V=50257, L=depth, NH=depth, C=64 * depth, Vp=50304)
        cfg.validate("--spec")
        return cfg
    vals = {}
    for item in s.split(","):
        if "=" not in item:
            raise RefError(f"--spec: bad item '{item}' in '{spec}' (expected KEY=integer)")
        k, v = item.split("=", 1)
        k = k.strip()
        if k not in ("L", "C", "NH", "V", "T", "Vp"):
            raise RefError(f"--spec: unknown key '{k}' in '{spec}' (keys: L, C, NH, V, T, Vp)")
        try:
            vals[k] = int(v)
        except ValueError:
            raise RefError(f"--spec: bad value '{v}' for {k} in '{spec}'")
    missing = [k for k in ("L", "C", "NH", "V", "T") if k not in vals]
    if missing:
        raise RefError(f"--spec: '{spec}' is missing {', '.join(missing)}")
    cfg = Config(maxT=vals["T"], V=vals["V"], L=vals["L"], NH=vals["NH"], C=vals["C"],
                 Vp=vals.get("Vp"))
    cfg.validate("--spec")
    return cfg


def param_shapes(cfg):
    """(name, shape) of every parameter, in model-file order."""
    C, L = cfg.C, cfg.L
    return [
        ("wte", (cfg.Vp, C)), ("wpe", (cfg.maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]


def num_params(cfg):
    return sum(math.prod(s) for _, s in param_shapes(cfg))


# ----------------------------------------------------------------------------
# init and model-file I/O (parameters are kept as an ordered dict name -> tensor)

def init_params(cfg, seed):
    """GPT-2 style init in fp32, deterministic for a seed."""
    g = torch.Generator()
    g.manual_seed(int(seed))
    proj_std = 0.02 / math.sqrt(2 * cfg.L)
    params = {}
    for name, shape in param_shapes(cfg):
        t = torch.zeros(shape, dtype=torch.float32)
        if name in ("ln1w", "ln2w", "lnfw"):
            t.fill_(1.0)
        elif name in ("attprojw", "fcprojw"):
            t.normal_(0.0, proj_std, generator=g)
        elif name in ("wte", "wpe", "qkvw", "fcw"):
            t.normal_(0.0, 0.02, generator=g)
        # everything else is a bias (LayerNorm or linear): zero
        params[name] = t
    params["wte"][cfg.V:].zero_()
    return params


def fp32_to_bf16_bits(a):
    """fp32 array -> uint16 bf16 bit patterns, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    rounded = np.where(nan, (u >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_fp32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_params_to_bf16(params):
    return {n: torch.from_numpy(bf16_bits_to_fp32(fp32_to_bf16_bits(t.numpy())).reshape(t.shape))
            for n, t in params.items()}


def _read_header(path, f, what):
    raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise RefError(f"{path}: truncated {what} header ({len(raw)} of {HEADER_BYTES} bytes)")
    return np.frombuffer(raw, dtype="<i4")


def read_model(path):
    """Read an llm.c model file (version 3 fp32 or 5 bf16) -> (cfg, fp32 params)."""
    try:
        with open(path, "rb") as f:
            h = _read_header(path, f, "model")
            if h[0] != MODEL_MAGIC:
                raise RefError(f"{path}: bad magic {h[0]} (expected {MODEL_MAGIC}, a model file)")
            if h[1] not in (3, 5):
                raise RefError(f"{path}: unsupported model version {h[1]} (expected 3 or 5)")
            cfg = Config(maxT=h[2], V=h[3], L=h[4], NH=h[5], C=h[6], Vp=h[7])
            cfg.validate(path)
            P = num_params(cfg)
            esize = 4 if h[1] == 3 else 2
            payload = f.read()
    except OSError as e:
        raise RefError(f"{path}: cannot read ({e.strerror})")
    if len(payload) != P * esize:
        kind = "truncated" if len(payload) < P * esize else "too long"
        raise RefError(f"{path}: {kind}: payload {len(payload)} bytes, expected {P * esize} "
                       f"({P} params, {cfg})")
    if esize == 4:
        flat = np.frombuffer(payload, dtype="<f4").astype(np.float32)
    else:
        flat = bf16_bits_to_fp32(np.frombuffer(payload, dtype="<u2"))
    params, off = {}, 0
    for name, shape in param_shapes(cfg):
        n = math.prod(shape)
        params[name] = torch.from_numpy(flat[off:off + n].copy().reshape(shape))
        off += n
    return cfg, params


def write_model(path, cfg, params, version=3):
    """Write an llm.c model file: version 3 (fp32) or 5 (bf16, round to nearest even)."""
    if version not in (3, 5):
        raise RefError(f"{path}: model version must be 3 or 5 (got {version})")
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:8] = [MODEL_MAGIC, version, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp]
    flat = np.concatenate([params[n].detach().to(torch.float32).numpy().reshape(-1)
                           for n, _ in param_shapes(cfg)])
    body = flat.astype("<f4") if version == 3 else fp32_to_bf16_bits(flat).astype("<u2")
    try:
        with open(path, "wb") as f:
            f.write(h.tobytes())
            f.write(body.tobytes())
    except OSError as e:
        raise RefError(f"{path}: cannot write ({e.strerror})")


# ----------------------------------------------------------------------------
# data

def random_batch(B, T, V, data_seed, eot=None, eot_every=4):
    """B rows of T+1 random tokens in [0, V): inputs the first T, targets the last T.
    With eot, about one token in eot_every becomes eot (documents of random
    lengths, several per row, for the document mask)."""
    g = torch.Generator()
    g.manual_seed(int(data_seed))
    rows = torch.randint(0, V, (B, T + 1), generator=g, dtype=torch.int64)
    if eot is not None:
        ends = torch.randint(0, eot_every, (B, T + 1), generator=g) == 0
        rows = torch.where(ends, torch.full_like(rows, eot), rows)
    return rows[:, :T].contiguous(), rows[:, 1:].contiguous()


def document_mask(inputs, eot):
    """(B, 1, T, T) bool, True where query t may see key s: s <= t and s in
    t's document. A document ends with (and includes) its EOT; the next starts
    after it. Positions are not touched."""
    B, T = inputs.shape
    ends = (inputs == eot).to(torch.int64)
    # document index of each token: EOTs strictly before it
    doc = torch.cumsum(ends, dim=1) - ends
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (same & causal)[:, None]


def read_data_batch(path, B, T, V):
    """Rows i = tokens i*T .. i*T+T of an llm.c shard (uint16 or uint32 tokens)."""
    try:
        with open(path, "rb") as f:
            h = _read_header(path, f, "data shard")
            if h[0] == DATA_MAGIC_U16:
                dt, esize = "<u2", 2
            elif h[0] == DATA_MAGIC_U32:
                dt, esize = "<u4", 4
            else:
                raise RefError(f"{path}: bad magic {h[0]} (expected {DATA_MAGIC_U16} or "
                               f"{DATA_MAGIC_U32}, a data shard)")
            ntok = int(h[2])
            payload = f.read()
    except OSError as e:
        raise RefError(f"{path}: cannot read ({e.strerror})")
    if ntok < 0 or len(payload) < ntok * esize:
        raise RefError(f"{path}: truncated: header says {ntok} tokens, payload has "
                       f"{len(payload) // esize}")
    need = B * T + 1
    if ntok < need:
        raise RefError(f"{path}: {ntok} tokens, the batch needs {need} (B={B}, T={T})")
    tok = np.frombuffer(payload[:need * esize], dtype=dt).astype(np.int64)
    if tok.max() >= V:
        raise RefError(f"{path}: token id {int(tok.max())} is outside the vocabulary (V={V})")
    tok = torch.from_numpy(tok)
    idx = torch.arange(B)[:, None] * T + torch.arange(T)[None, :]
    return tok[idx].contiguous(), tok[idx + 1].contiguous()


# ----------------------------------------------------------------------------
# the model

def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance
    return xc * torch.rsqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def causal_attention(q, k, v, allowed=None):
    """q, k, v: (B, NH, T, HS) -> (B, NH, T, HS), softmax of scaled scores over keys <= query
    (and, given allowed (B, 1, T, T) from document_mask, over the keys it allows)."""
    T, HS = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future if allowed is None else ~allowed, float("-inf"))
    scores = scores - scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores)
    return (e / e.sum(dim=-1, keepdim=True)) @ v


# FP8 operands (docs/fp8.md): the four linear layers through Fp8Linear
# (fp8_reference.py) with --fp8 1; key (layer, 0-3: QKV, attention output,
# MLP up, MLP down) tells the operands apart for --fp8-history.
USE_FP8 = False


def linear(x, w, b, key):
    return fp8_linear(x, w, b, key) if USE_FP8 else x @ w.t() + b


def forward(params, cfg, inputs, targets=None, eot=None):
    """Returns (logits over all Vp columns (B,T,Vp), mean loss over columns < V or None).
    eot: the document mask's separator (None: causal attention only)."""
    p = params
    B, T = inputs.shape
    allowed = None if eot is None else document_mask(inputs, eot)
    C, NH = cfg.C, cfg.NH
    HS = C // NH
    x = p["wte"][inputs] + p["wpe"][:T].unsqueeze(0)
    for l in range(cfg.L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = linear(h, p["qkvw"][l], p["qkvb"][l], (l, 0))        # (B,T,3C): Q | K | V
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.reshape(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v, allowed).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p["attprojw"][l], p["attprojb"][l], (l, 1))
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu_tanh(linear(h, p["fcw"][l], p["fcb"][l], (l, 2)))
        x = x + linear(h, p["fcprojw"][l], p["fcprojb"][l], (l, 3))
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].t()                                # (B,T,Vp)
    if targets is None:
        return logits, None
    lv = logits[..., :cfg.V]                                 # padding never enters the loss
    lse = torch.logsumexp(lv, dim=-1)
    tgt = lv.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logits, (lse - tgt).mean()


# ----------------------------------------------------------------------------
# optimizer run

class Hyper:
    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, clip=1.0,
                 warmup=0, final_frac=1.0):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.wd, self.clip, self.warmup, self.final_frac = wd, clip, int(warmup), final_frac


def lr_at(hp, s, S):
    """Linear warmup over hp.warmup steps, then cosine from lr to lr*final_frac."""
    if s < hp.warmup:
        return hp.lr * (s + 1) / hp.warmup
    denom = S - hp.warmup
    if denom <= 0:       # S == warmup: no decay phase (not reached for s < S)
        return hp.lr
    lr_min = hp.lr * hp.final_frac
    ratio = (s - hp.warmup) / denom
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (hp.lr - lr_min)


def train(params_fp32, cfg, inputs, targets, hp, S, dtype=torch.float64, eot=None):
    """S AdamW steps on one batch. Returns a dict with the initial logits (first V
    columns), loss and grads, the step losses (before each update), the lr and
    grad norm of each step, and the final parameters."""
    params = {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in params_fp32.items()}
    names = [n for n, _ in param_shapes(cfg)]
    m = {n: torch.zeros_like(params[n]) for n in names}
    v = {n: torch.zeros_like(params[n]) for n in names}
    out = {"step_losses": [], "lrs": [], "norms": []}

    def fwd_bwd():
        for n in names:
            params[n].grad = None
        logits, loss = forward(params, cfg, inputs, targets, eot)
        loss.backward()
        return logits, loss

    for s in range(max(S, 1)):
        logits, loss = fwd_bwd()
        if s == 0:
            out["logits"] = logits[..., :cfg.V].detach().clone()
            out["loss"] = loss.detach().clone()
            out["grads"] = {n: params[n].grad.detach().clone() for n in names}
        if s >= S:                      # S == 0: only the initial forward/backward
            break
        out["step_losses"].append(loss.item())
        with torch.no_grad():
            grads = [params[n].grad for n in names]
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            out["norms"].append(norm.item())
            if hp.clip > 0 and norm.item() > hp.clip:
                scale = hp.clip / norm
                for g in grads:
                    g.mul_(scale)
            lr = lr_at(hp, s, S)
            out["lrs"].append(lr)
            t = s + 1
            bc1 = 1.0 - hp.beta1 ** t
            bc2 = 1.0 - hp.beta2 ** t
            for n in names:
                p, g = params[n], params[n].grad
                m[n].mul_(hp.beta1).add_((1.0 - hp.beta1) * g)
                v[n].mul_(hp.beta2).add_((1.0 - hp.beta2) * g * g)
                mhat = m[n] / bc1
                vhat = v[n] / bc2
                wd = hp.wd if n in DECAY_NAMES else 0.0
                p.sub_(lr * (mhat / (torch.sqrt(vhat) + hp.eps) + wd * p))
        DELAYED.end_step()  # --fp8-history: the step's amaxes join the histories
    out["params"] = {n: params[n].detach().clone() for n in names}
    return out


# ----------------------------------------------------------------------------
# state file

HYPER_AT, HYPER_N = 8, 7  # header ints [8..21]: seven little-endian float64


def pack_hyper(vals):
    return np.frombuffer(struct.pack("<7d", *[float(v) for v in vals]), dtype="<i4")


def unpack_hyper(h):
    return list(struct.unpack("<7d", np.asarray(h[HYPER_AT:HYPER_AT + 2 * HYPER_N], dtype="<i4").tobytes()))


def write_state(path, cfg, inputs, targets, result, hp, S, dtype):
    B, T = inputs.shape
    fp64 = dtype == torch.float64
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[0], h[1], h[2], h[3], h[4], h[5] = STATE_MAGIC, 3 if fp64 else 2, B, T, S, hp.warmup
    h[HYPER_AT:HYPER_AT + 2 * HYPER_N] = pack_hyper((hp.lr, hp.beta1, hp.beta2, hp.eps, hp.wd, hp.clip, hp.final_frac))
    fdt = "<f8" if fp64 else "<f4"
    floats = [result["logits"].reshape(-1).numpy(),
              result["loss"].reshape(1).numpy()]
    floats += [result["grads"][n].reshape(-1).numpy() for n, _ in param_shapes(cfg)]
    floats.append(np.asarray(result["step_losses"], dtype=np.float64))
    try:
        with open(path, "wb") as f:
            f.write(h.tobytes())
            f.write(inputs.numpy().astype("<i4").tobytes())
            f.write(targets.numpy().astype("<i4").tobytes())
            for a in floats:
                f.write(np.asarray(a).astype(fdt).tobytes())
    except OSError as e:
        raise RefError(f"{path}: cannot write ({e.strerror})")


def read_state(path, V, P):
    """Read a state file back (V and P come from the model). Returns a dict."""
    try:
        with open(path, "rb") as f:
            h = _read_header(path, f, "state")
            payload = f.read()
    except OSError as e:
        raise RefError(f"{path}: cannot read ({e.strerror})")
    if h[0] != STATE_MAGIC or h[1] not in (2, 3):
        raise RefError(f"{path}: bad magic/version {h[0]}/{h[1]} (expected {STATE_MAGIC}/2|3)")
    B, T, S, warmup = (int(x) for x in h[2:6])
    fdt, fsz = ("<f8", 8) if h[1] == 3 else ("<f4", 4)
    nf = B * T * V + 1 + P + S
    expect = 2 * B * T * 4 + nf * fsz
    if len(payload) != expect:
        raise RefError(f"{path}: payload {len(payload)} bytes, expected {expect}")
    ints = np.frombuffer(payload[:2 * B * T * 4], dtype="<i4")
    fl = np.frombuffer(payload[2 * B * T * 4:], dtype=fdt)
    o = 0
    st = {"header": h, "B": B, "T": T, "S": S, "warmup": warmup, "version": int(h[1]),
          "hyper": unpack_hyper(h),
          "inputs": ints[:B * T].reshape(B, T), "targets": ints[B * T:].reshape(B, T)}
    st["logits"] = fl[o:o + B * T * V].reshape(B, T, V); o += B * T * V
    st["loss"] = fl[o]; o += 1
    st["grads"] = fl[o:o + P]; o += P
    st["step_losses"] = fl[o:o + S]
    return st


# ----------------------------------------------------------------------------
# command line

def build_argparser():
    ap = argparse.ArgumentParser(description="Reference GPT-2 (plain PyTorch) for the trainer's tests.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="llm.c model file (version 3 or 5)")
    src.add_argument("--spec", help='model sizes "L=2,C=64,NH=4,V=128,T=32[,Vp=...]" or dN')
    ap.add_argument("--seed", type=int, default=1337, help="init seed (with --spec)")
    ap.add_argument("--dtype", choices=("fp32", "fp64"), default="fp32")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=None, help="sequence length (default maxT)")
    ap.add_argument("--data", help="llm.c data shard (default: random tokens)")
    ap.add_argument("--data-seed", type=int, default=42)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip (<= 0: off)")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--final-frac", type=float, default=1.0)
    ap.add_argument("--write-model", help="write the initial model here")
    ap.add_argument("--fp8", type=int, choices=(0, 1), default=0,
                    help="1: the four linear layers of each block on FP8 operands (docs/fp8.md)")
    ap.add_argument("--fp8-history", type=int, default=0, metavar="N",
                    help="with --fp8 1: delayed scaling by the largest amax of each operand's last N steps")
    ap.add_argument("--fp8-layers", default="all",
                    help="with --fp8 1: the linear layers on FP8 operands (qkv, attproj, fc, fcproj, or all)")
    ap.add_argument("--model-version", type=int, choices=(3, 5), default=3)
    ap.add_argument("--write-state", help="write the debug state here")
    ap.add_argument("--document-mask", type=int, default=None, metavar="EOT",
                    help="attention within documents ending with token EOT; random data gets EOTs (about 1 token in 4)")
    return ap


def main(argv=None):
    args = build_argparser().parse_args(argv)
    global USE_FP8
    USE_FP8 = args.fp8 == 1
    DELAYED.length = args.fp8_history if USE_FP8 else 0
    set_layers(args.fp8_layers)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    try:
        if args.model:
            if not os.path.isfile(args.model):
                raise RefError(f"{args.model}: no such file")
            cfg, params = read_model(args.model)
        else:
            cfg = parse_spec(args.spec)
            params = init_params(cfg, args.seed)
        T = cfg.maxT if args.T is None else args.T
        if not (0 < T <= cfg.maxT):
            raise RefError(f"--T: {T} must be in 1..maxT={cfg.maxT}")
        if args.B <= 0:
            raise RefError(f"--B: {args.B} must be positive")
        if args.steps < 0 or args.warmup < 0:
            raise RefError("--steps/--warmup: must be >= 0")
        if args.write_model and args.model_version == 5:
            # the state must describe the model the file holds: compute with the
            # bf16-rounded weights (a no-op when they came from a bf16 file)
            params = round_params_to_bf16(params)
        if args.data:
            if not os.path.isfile(args.data):
                raise RefError(f"{args.data}: no such file")
            inputs, targets = read_data_batch(args.data, args.B, T, cfg.V)
        else:
            inputs, targets = random_batch(args.B, T, cfg.V, args.data_seed, args.document_mask)
        hp = Hyper(args.lr, args.beta1, args.beta2, args.eps, args.wd, args.clip,
                   args.warmup, args.final_frac)
        dtype = torch.float64 if args.dtype == "fp64" else torch.float32
        if args.write_model:
            write_model(args.write_model, cfg, params, args.model_version)
        if args.document_mask is not None and not 0 <= args.document_mask < cfg.V:
            raise RefError(f"--document-mask: {args.document_mask} is not a token id below V={cfg.V}")
        res = train(params, cfg, inputs, targets, hp, args.steps, dtype, args.document_mask)
        if args.write_state:
            write_state(args.write_state, cfg, inputs, targets, res, hp, args.steps, dtype)
    except RefError as e:
        print(f"reference_gpt.py: {e}", file=sys.stderr)
        return 1
    print(f"model {cfg} params {num_params(cfg)} dtype {args.dtype} B={args.B} T={T}")
    print(f"initial loss {res['loss'].item():.9f}")
    print("step losses " + " ".join(f"{x:.6f}" for x in res["step_losses"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
