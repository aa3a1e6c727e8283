#!/usr/bin/env python3
# scripts/gpu/torch_gpt2.py: the compiled-PyTorch peer of the side-by-side
# benchmark (scripts/gpu/check.sh's peers step): GPT-2 as nanoGPT defines it,
# trained the way a PyTorch user trains it for speed on one GPU:
#   model      GPT-2 (learned positions, pre-LayerNorm blocks with biases,
#              GELU (tanh) MLP of 4C, the LM head tied to wte), the vocabulary
#              padded to 50304 rows as nanoGPT and llm.c pad it, so d12 has
#              124,475,904 parameters, this trainer's and llm.c's count;
#              GPT-2's initialisation (N(0, 0.02), the projections into the
#              residual stream scaled by 1/sqrt(2L)); no dropout
#   attention  F.scaled_dot_product_attention(is_causal=True): PyTorch picks
#              its fastest backend (flash, cuDNN or memory-efficient); the
#              run says which ran, read off the kernels of a profiled step
#   training   torch.compile of the model, bf16 autocast, TF32 for what stays
#              fp32, fused AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight
#              decay 0.1 on 2-D weights only), gradients clipped to norm 1
#   data       consecutive rows of B x (T+1) tokens of an llm.c token shard
#              (scripts/shards.py), the shard both other trainers read
# Tokens/s is B·T over the median step time after --warmup steps (each step
# timed between two synchronisations: forward, backward, clipping, AdamW),
# with the compile in the warm-up steps. Figures only, nothing passes or
# fails; printed as "figure NAME VALUE UNIT" lines for scripts/gpu/figures.py:
#   tokens_per_s, step_ms, compile_s, params, peak_mem_gib
# and "sdpa_backend NAME".
#   usage: torch_gpt2.py --data SHARD [--B 32] [--T 1024] [--steps 30] [--warmup 10]
#                        [--no-compile] [--model d12|L=,C=,NH=]
#          torch_gpt2.py --selfcheck     (any PyTorch, CPU: the model's
#                        parameter count against the formula, and a few steps
#                        that lower the loss; "N passed, N failed")
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/, for shards.py
VOCAB, VOCAB_PADDED = 50257, 50304


def attention(q, k, v):
    """Causal attention of [B, NH, T, HS] tensors: PyTorch's fused op where it
    has one (2.0 and later), else the plain form (the self-check on old
    versions only; the benchmark needs the fused op)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, maxT=1024, V=VOCAB_PADDED):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def gpt2_params(L, C, V=VOCAB_PADDED, maxT=1024):
    """12·L·C² + 13·L·C + (Vp + maxT)·C + 2C (docs/design.md section 1)."""
    return 12 * L * C * C + 13 * L * C + (V + maxT) * C + 2 * C


def model_shape(spec):
    if spec == "d12":
        return 12, 768, 12
    kv = dict(p.split("=") for p in spec.split(","))
    return int(kv["L"]), int(kv["C"]), int(kv["NH"])


def optimizer(model, fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **kw)


def sdpa_backend(step):
    """The attention backend one step ran, from its CUDA kernels' names."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    for key, name in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"), ("efficient", "efficient")):
        if key in names and ("attention" in names or "fmha" in names or "sdpa" in names or key == "flash"):
            return name
    return "math (no fused attention kernel seen)"


def selfcheck():
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed, failed = passed + bool(ok), failed + (not ok)
        if not ok:
            print(f"FAIL {what}")

    n = sum(p.numel() for p in GPT(12, 768, 12).parameters())
    check(n == 124475904 == gpt2_params(12, 768), f"d12: {n} parameters (this trainer's and llm.c's 124,475,904)")
    torch.manual_seed(0)
    m = GPT(2, 64, 4, maxT=32)
    opt = optimizer(m, fused=False)
    x = torch.randint(0, 97, (4, 33))
    losses = []
    for _ in range(5):
        loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    check(abs(losses[0] - math.log(VOCAB_PADDED)) < 0.5, f"initial loss {losses[0]:.3f} near ln(Vp) {math.log(VOCAB_PADDED):.3f}")
    check(losses[-1] < losses[0] - 0.5, f"5 steps on one batch lower the loss: {losses}")
    check(m.lm_head.weight.data_ptr() == m.wte.weight.data_ptr(), "the LM head is wte")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description="GPT-2 in compiled PyTorch: tokens/s on one GPU.")
    ap.add_argument("--data", help="an llm.c token shard")
    ap.add_argument("--model", default="d12")
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the median (the compile is in them)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--selfcheck", action="store_true")
    a = ap.parse_args()
    if a.selfcheck:
        return selfcheck()
    if not a.data or not torch.cuda.is_available():
        sys.exit("torch_gpt2.py: needs --data SHARD and a CUDA GPU (--selfcheck runs without)")
    from shards import read_shard
    tokens = torch.from_numpy(read_shard(a.data).astype("int64"))
    L, C, NH = model_shape(a.model)
    dev = "cuda"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = GPT(L, C, NH, maxT=max(1024, a.T)).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = optimizer(model, fused=True)
    run = model if a.no_compile else torch.compile(model)
    rows = a.B * (a.T + 1)
    pos = [0]

    def step():
        if pos[0] + rows > tokens.numel():
            pos[0] = 0
        buf = tokens[pos[0]:pos[0] + rows].view(a.B, a.T + 1).to(dev, non_blocking=True)
        pos[0] += rows
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = run(buf[:, :-1], buf[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    times, t_first = [], None
    for i in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i == 0:
            t_first = dt
        times.append(dt)
        print(f"step {i + 1}/{a.steps} loss {loss.item():.4f} {dt * 1e3:.1f} ms", flush=True)
    backend = sdpa_backend(step)
    ms = statistics.median(times[a.warmup:] or times) * 1e3
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {a.model} ({nparams} parameters), "
          f"B={a.B} T={a.T}, {'compiled' if not a.no_compile else 'eager'}, sdpa {backend}")
    print(f"sdpa_backend {backend.split()[0]}")
    print(f"figure tokens_per_s {a.B * a.T / (ms / 1e3):.0f} tok/s")
    print(f"figure step_ms {ms:.2f} ms")
    print(f"figure compile_s {t_first:.1f} s")
    print(f"figure params {nparams} count")
    print(f"figure peak_mem_gib {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
