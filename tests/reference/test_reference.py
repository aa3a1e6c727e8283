#!/usr/bin/python3
# tests/reference/test_reference.py: self-check of tests/reference/reference_gpt.py against
# independent math: model-file round trips (fp32 exact, bf16 = torch's round to
# nearest even), the hand-written model vs one built from torch.nn.functional
# with a per-head attention loop, autograd vs central finite differences,
# padded-vocab isolation, the document mask against per-document runs, the
# hand-written AdamW vs torch.optim.AdamW (also with clipping and the lr
# schedule), the state-file layout, data shards and the error paths of the
# command line. Run: /usr/bin/python3 tests/reference/test_reference.py
# Last line: "N passed, N failed"; exit status 1 when anything failed.
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep scripts/ free of __pycache__
sys.path.insert(0, HERE)
import reference_gpt as ref  # noqa: E402

SCRIPT = os.path.join(HERE, "reference_gpt.py")
PY = "/usr/bin/python3"
TMP = tempfile.mkdtemp(prefix="test_reference_")

torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def perturbed_params(cfg, seed, pad_nonzero=False):
    """Random init, then non-trivial LayerNorm weights and biases everywhere, so
    that a wrong bias or LayerNorm term cannot hide behind zeros and ones."""
    p = ref.init_params(cfg, seed)
    g = torch.Generator()
    g.manual_seed(seed + 1)
    for n in p:
        if n.endswith("b") or n in ("ln1w", "ln2w", "lnfw"):
            p[n] = p[n] + 0.1 * torch.randn(p[n].shape, generator=g)
    # larger weights so the tiny models are not near-uniform
    for n in ("wte", "wpe", "qkvw", "fcw", "attprojw", "fcprojw"):
        p[n] = p[n] * 10.0
    if pad_nonzero:
        p["wte"][cfg.V:] = torch.randn(p["wte"][cfg.V:].shape, generator=g)
    else:
        p["wte"][cfg.V:] = 0.0
    return p


def to64(p, grad=False):
    return {n: t.detach().to(torch.float64).clone().requires_grad_(grad) for n, t in p.items()}


def run_cli(*args):
    r = subprocess.run([PY, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


# --------------------------------------------------------------------------
# an independent model: torch.nn.functional pieces, attention head by head

def independent_loss(p, cfg, inputs, targets, pos0=0):
    """pos0: the first token's position (a document cut out of a row keeps its positions)."""
    B, T = inputs.shape
    C, NH = cfg.C, cfg.NH
    HS = C // NH
    x = F.embedding(inputs, p["wte"]) + F.embedding(torch.arange(pos0, pos0 + T), p["wpe"])
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for l in range(cfg.L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        heads = []
        for hh in range(NH):
            rq = slice(hh * HS, (hh + 1) * HS)
            rk = slice(C + hh * HS, C + (hh + 1) * HS)
            rv = slice(2 * C + hh * HS, 2 * C + (hh + 1) * HS)
            q = F.linear(h, p["qkvw"][l][rq], p["qkvb"][l][rq])
            k = F.linear(h, p["qkvw"][l][rk], p["qkvb"][l][rk])
            v = F.linear(h, p["qkvw"][l][rv], p["qkvb"][l][rv])
            s = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(C / NH) + mask
            heads.append(torch.einsum("bts,bsd->btd", torch.softmax(s, dim=-1), v))
        y = torch.cat(heads, dim=-1)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = F.linear(x, p["wte"][:cfg.V])
    return logits, F.cross_entropy(logits.reshape(-1, cfg.V), targets.reshape(-1))


# --------------------------------------------------------------------------
# tests

def test_model_file_roundtrip():
    """(a) v3 exact; v5 equals torch's bf16 (round to nearest even) conversion."""
    cfg = ref.Config(maxT=16, V=50, L=2, NH=2, C=16, Vp=64)
    p = perturbed_params(cfg, 3, pad_nonzero=True)
    f3 = os.path.join(TMP, "rt3.bin")
    ref.write_model(f3, cfg, p, 3)
    check(os.path.getsize(f3) == 1024 + 4 * ref.num_params(cfg), "v3 size")
    cfg2, p2 = ref.read_model(f3)
    check(str(cfg2) == str(cfg), f"v3 config {cfg2} != {cfg}")
    for n in p:
        check(torch.equal(p[n], p2[n]), f"v3 {n} differs")
    # parameter count formula of the reference sheet
    C, L = cfg.C, cfg.L
    check(ref.num_params(cfg) == 12 * L * C * C + 13 * L * C + (cfg.Vp + cfg.maxT) * C + 2 * C,
          "param count formula")
    f5 = os.path.join(TMP, "rt5.bin")
    ref.write_model(f5, cfg, p, 5)
    check(os.path.getsize(f5) == 1024 + 2 * ref.num_params(cfg), "v5 size")
    hdr = np.fromfile(f5, dtype="<i4", count=8)
    check(list(hdr) == [20240326, 5, 16, 50, 2, 2, 16, 64], f"v5 header {list(hdr)}")
    _, p5 = ref.read_model(f5)
    for n in p:
        want = p[n].to(torch.bfloat16).to(torch.float32)
        check(torch.equal(p5[n], want), f"v5 {n} is not round-to-nearest-even")
        rel = ((p5[n] - p[n]).abs() <= p[n].abs() * 2.0 ** -8).all()
        check(bool(rel), f"v5 {n} outside bf16 rounding")
    # ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    ties = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)], dtype=np.float32)
    got = ref.bf16_bits_to_fp32(ref.fp32_to_bf16_bits(ties))
    check(list(got) == [1.0, 1 + 2 ** -6, -1.0], f"ties to even: {list(got)}")


def test_loss_vs_independent():
    """(b) hand-written model == functional model with a per-head loop, fp64, <= 1e-12."""
    cfg = ref.Config(maxT=12, V=37, L=2, NH=4, C=32, Vp=64)
    p = to64(perturbed_params(cfg, 5, pad_nonzero=True))
    inputs, targets = ref.random_batch(3, 10, cfg.V, 9)
    logits, loss = ref.forward(p, cfg, inputs, targets)
    logits2, loss2 = independent_loss(p, cfg, inputs, targets)
    d_loss = abs(loss.item() - loss2.item())
    d_logits = (logits[..., :cfg.V] - logits2).abs().max().item()
    check(d_loss <= 1e-12, f"loss differs by {d_loss:.3e}")
    check(d_logits <= 1e-12, f"logits differ by {d_logits:.3e}")
    check(2.0 < loss.item() < 20.0, f"implausible loss {loss.item()}")


def test_document_mask():
    """(b') the document mask: each row's logits equal the independent model run on
    each document alone (at its positions in the row), fp64, <= 1e-12; several
    EOTs per row, one row without any (then the mask is plain causal)."""
    cfg = ref.Config(maxT=24, V=37, L=2, NH=4, C=32, Vp=64)
    p = to64(perturbed_params(cfg, 6, pad_nonzero=True))
    eot = 5
    inputs, targets = ref.random_batch(3, 24, cfg.V, 13, eot=eot)
    inputs[2] = torch.where(inputs[2] == eot, torch.full_like(inputs[2], eot + 1), inputs[2])
    logits, loss = ref.forward(p, cfg, inputs, targets, eot)
    ends = [(inputs[r] == eot).sum().item() for r in range(3)]
    check(min(ends[:2]) >= 3 and ends[2] == 0, f"EOTs per row {ends}")
    worst = 0.0
    for r in range(3):
        a = 0
        cuts = [t + 1 for t in range(24) if inputs[r, t].item() == eot and t + 1 < 24] + [24]
        for b in cuts:
            lg, _ = independent_loss(p, cfg, inputs[r:r + 1, a:b], targets[r:r + 1, a:b], pos0=a)
            worst = max(worst, (logits[r:r + 1, a:b, :cfg.V] - lg).abs().max().item())
            a = b
    check(worst <= 1e-12, f"masked logits differ from per-document runs by {worst:.3e}")
    unmasked, _ = ref.forward(p, cfg, inputs, targets)
    check(torch.equal(unmasked[2], logits[2]), "a row without EOT: the mask changed the logits")
    check((unmasked[:2] - logits[:2]).abs().max().item() > 1e-3, "rows with EOTs: the mask changed nothing")


def test_gradcheck():
    """(c) autograd vs central finite differences, tiny model, fp64, rel err <= 1e-6."""
    cfg = ref.Config(maxT=5, V=11, L=1, NH=2, C=8, Vp=16)
    p = to64(perturbed_params(cfg, 7), grad=True)
    inputs, targets = ref.random_batch(2, 5, cfg.V, 11)
    _, loss = ref.forward(p, cfg, inputs, targets)
    loss.backward()
    g = torch.Generator()
    g.manual_seed(0)
    h = 1e-5
    worst = 0.0
    for n, _ in ref.param_shapes(cfg):
        grad = p[n].grad.reshape(-1)
        limit = cfg.V * cfg.C if n == "wte" else grad.numel()   # skip padding rows here
        picks = {int(grad[:limit].abs().argmax())}
        picks |= {int(i) for i in torch.randint(0, limit, (3,), generator=g)}
        for i in sorted(picks):
            flat = p[n].data.reshape(-1)
            old = flat[i].item()
            with torch.no_grad():
                flat[i] = old + h
                lp = ref.forward(p, cfg, inputs, targets)[1].item()
                flat[i] = old - h
                lm = ref.forward(p, cfg, inputs, targets)[1].item()
                flat[i] = old
            num = (lp - lm) / (2 * h)
            ana = grad[i].item()
            # relative error, with a floor so entries whose gradient is ~0 are
            # judged on absolute error (finite differences give ~1e-11 there)
            rel = abs(ana - num) / max(abs(ana), abs(num), 1e-4)
            worst = max(worst, rel)
            check(rel <= 1e-6, f"{n}[{i}]: autograd {ana:.12e} vs numeric {num:.12e} (rel {rel:.2e})")
    print(f"    gradcheck worst rel err {worst:.2e}")


def test_padded_vocab():
    """(d) wte padding rows get exactly zero gradient and never change the loss."""
    cfg = ref.Config(maxT=8, V=13, L=1, NH=2, C=8, Vp=32)
    p = to64(perturbed_params(cfg, 13), grad=True)
    inputs, targets = ref.random_batch(2, 8, cfg.V, 17)
    _, loss = ref.forward(p, cfg, inputs, targets)
    loss.backward()
    gp = p["wte"].grad[cfg.V:]
    check(bool((gp == 0).all()), f"padding-row grads not zero: max {gp.abs().max().item():.3e}")
    check(bool((p["wte"].grad[:cfg.V] != 0).any()), "real-row grads all zero")
    q = {n: t.detach().clone() for n, t in p.items()}
    q["wte"][cfg.V:] = 100.0 * torch.randn(cfg.Vp - cfg.V, cfg.C, dtype=torch.float64)
    _, loss2 = ref.forward(q, cfg, inputs, targets)
    check(loss2.item() == loss.item(), f"padding changed loss: {loss.item()} -> {loss2.item()}")


def torch_adamw_run(p32, cfg, inputs, targets, hp, S, clip_by_hand):
    """The same run with torch.optim.AdamW (two groups: decay / no decay)."""
    p = to64(p32, grad=True)
    decay = [p[n] for n in p if n in ref.DECAY_NAMES]
    nodecay = [p[n] for n in p if n not in ref.DECAY_NAMES]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp.wd},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)
    losses = []
    for s in range(S):
        opt.zero_grad(set_to_none=True)
        _, loss = ref.forward(p, cfg, inputs, targets)
        loss.backward()
        losses.append(loss.item())
        if clip_by_hand:
            allg = torch.cat([t.grad.reshape(-1) for t in p.values()])
            norm = torch.linalg.vector_norm(allg).item()
            if norm > hp.clip:
                for t in p.values():
                    t.grad *= hp.clip / norm
        # schedule written out independently of ref.lr_at
        if s < hp.warmup:
            lr = hp.lr * (s + 1) / hp.warmup
        else:
            lo = hp.lr * hp.final_frac
            lr = lo + (hp.lr - lo) * 0.5 * (1 + math.cos(math.pi * (s - hp.warmup) / (S - hp.warmup)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
    return p, losses


def compare_to_torch(mine, theirs, cfg, what):
    """Max abs difference <= 1e-12 for every parameter, except the K block of
    qkvb: the loss does not depend on the key bias (it shifts every score of a
    query row by the same amount), so its gradient is rounding noise (~1e-18)
    and Adam turns that noise into updates of size ~lr*noise/eps. After the
    first step the two runs' noise differs, so only a loose bound holds there."""
    C = cfg.C
    for n in theirs:
        a, b = mine[n], theirs[n].detach()
        if n == "qkvb":
            dk = (a[:, C:2 * C] - b[:, C:2 * C]).abs().max().item()
            check(dk <= 1e-9, f"{what}: key bias differs by {dk:.3e}")
            a = torch.cat([a[:, :C], a[:, 2 * C:]], dim=1)
            b = torch.cat([b[:, :C], b[:, 2 * C:]], dim=1)
        d = (a - b).abs().max().item()
        check(d <= 1e-12, f"{what}: {n} differs by {d:.3e}")


def test_adamw_vs_torch():
    """(e) 3 hand-written AdamW steps == torch.optim.AdamW, no clip, constant lr, fp64."""
    cfg = ref.Config(maxT=8, V=29, L=2, NH=2, C=16, Vp=32)
    p32 = perturbed_params(cfg, 19)
    inputs, targets = ref.random_batch(2, 8, cfg.V, 23)
    hp = ref.Hyper(lr=1e-2, wd=0.1, clip=0.0)
    res = ref.train(p32, cfg, inputs, targets, hp, 3, torch.float64)
    pt, losses = torch_adamw_run(p32, cfg, inputs, targets, hp, 3, clip_by_hand=False)
    compare_to_torch(res["params"], pt, cfg, "torch AdamW")
    for n in pt:
        moved = (res["params"][n] - p32[n].double()).abs().max().item()
        check(moved > 1e-4, f"{n} barely moved ({moved:.3e})")
    for a, b in zip(res["step_losses"], losses):
        check(abs(a - b) <= 1e-12, f"step loss {a} vs {b}")
    check(res["step_losses"][2] < res["step_losses"][0], "loss did not go down")


def test_clip_and_schedule():
    """AdamW with clipping active and warmup + cosine == torch.optim.AdamW run by hand."""
    cfg = ref.Config(maxT=8, V=29, L=1, NH=2, C=16, Vp=32)
    p32 = perturbed_params(cfg, 29)
    inputs, targets = ref.random_batch(2, 8, cfg.V, 31)
    hp = ref.Hyper(lr=1e-2, wd=0.1, clip=0.5, warmup=2, final_frac=0.1)
    S = 6
    res = ref.train(p32, cfg, inputs, targets, hp, S, torch.float64)
    check(sum(nrm > hp.clip for nrm in res["norms"]) >= 2, f"clipping never active: {res['norms']}")
    pt, losses = torch_adamw_run(p32, cfg, inputs, targets, hp, S, clip_by_hand=True)
    compare_to_torch(res["params"], pt, cfg, "torch AdamW (clip+schedule)")
    lrs = [ref.lr_at(hp, s, S) for s in range(S)]
    check(abs(lrs[0] - 5e-3) < 1e-15 and abs(lrs[1] - 1e-2) < 1e-15 and abs(lrs[2] - 1e-2) < 1e-15,
          f"warmup lrs {lrs}")
    check(all(a > b for a, b in zip(lrs[2:], lrs[3:])) and lrs[-1] > 1e-3, f"cosine lrs {lrs}")
    const = ref.Hyper(lr=3e-4)
    check(all(ref.lr_at(const, s, 7) == 3e-4 for s in range(7)), "final_frac 1 not constant")
    check(ref.lr_at(ref.Hyper(lr=1.0, warmup=4), 3, 4) == 1.0, "S == warmup")


def test_state_file():
    """(f) state file written by the CLI: header, sizes for B,T,V,P,S, and contents."""
    cfg_s = "L=2,C=16,NH=2,V=40,T=12"
    B, T, S = 3, 10, 4
    V, P = 40, ref.num_params(ref.parse_spec(cfg_s))
    for dt, ver, fsz in (("fp64", 3, 8), ("fp32", 2, 4)):
        mf = os.path.join(TMP, f"st_{dt}.model")
        sf = os.path.join(TMP, f"st_{dt}.state")
        rc, out, err = run_cli("--spec", cfg_s, "--seed", "5", "--dtype", dt, "--B", str(B),
                               "--T", str(T), "--steps", str(S), "--warmup", "1",
                               "--final-frac", "0.5", "--lr", "2e-3", "--clip", "0.75",
                               "--write-model", mf, "--write-state", sf)
        check(rc == 0, f"cli failed: {err}")
        check(os.path.getsize(sf) == 1024 + 8 * B * T + fsz * (B * T * V + 1 + P + S),
              f"{dt} state size {os.path.getsize(sf)}")
        st = ref.read_state(sf, V, P)
        h = st["header"]
        check(list(h[:6]) == [20240327, ver, B, T, S, 1], f"header {list(h[:6])}")
        check(not h[6:8].any() and not h[22:].any(), "unused header ints not zero")
        want = [2e-3, 0.9, 0.95, 1e-8, 0.1, 0.75, 0.5]
        check(st["hyper"] == want, f"hyper {st['hyper']}")
        check(np.array_equal(st["inputs"][:, 1:], st["targets"][:, :-1]), "targets not shifted by one")
        check(st["inputs"].max() < V and st["inputs"].min() >= 0, "token ids out of range")
        # the loss is the mean CE of the stored logits at the stored targets
        lg = torch.from_numpy(st["logits"].astype(np.float64)).reshape(-1, V)
        ce = F.cross_entropy(lg, torch.from_numpy(st["targets"].astype(np.int64)).reshape(-1)).item()
        tol = 1e-12 if dt == "fp64" else 1e-5
        check(abs(ce - st["loss"]) <= tol, f"{dt} stored loss {st['loss']} vs CE of logits {ce}")
        check(st["step_losses"][0] == st["loss"], "step 0 loss != initial loss")
        # grads and logits equal an in-process run on the written model
        cfg, p = ref.read_model(mf)
        inputs = torch.from_numpy(st["inputs"].astype(np.int64))
        targets = torch.from_numpy(st["targets"].astype(np.int64))
        dtype = torch.float64 if dt == "fp64" else torch.float32
        hp = ref.Hyper(lr=2e-3, clip=0.75, warmup=1, final_frac=0.5)
        res = ref.train(p, cfg, inputs, targets, hp, S, dtype)
        g = np.concatenate([res["grads"][n].reshape(-1).numpy() for n, _ in ref.param_shapes(cfg)])
        check(np.array_equal(g.astype(st["grads"].dtype), st["grads"]), f"{dt} grads differ")
        check(np.array_equal(np.asarray(res["step_losses"], dtype=st["step_losses"].dtype),
                             st["step_losses"]), f"{dt} step losses differ")
        wte_g = st["grads"][:cfg.Vp * cfg.C].reshape(cfg.Vp, cfg.C)
        check(not wte_g[V:].any(), "stored padding grads not zero")
    # fp32 and fp64 runs of the same model agree to fp32 accuracy
    s64 = ref.read_state(os.path.join(TMP, "st_fp64.state"), V, P)
    s32 = ref.read_state(os.path.join(TMP, "st_fp32.state"), V, P)
    check(np.abs(s64["step_losses"] - s32["step_losses"]).max() < 1e-4, "fp32 vs fp64 step losses")


def test_bf16_model_cli():
    """--write-model v5: the state describes the bf16 model the file holds."""
    m5 = os.path.join(TMP, "cli5.model")
    s1 = os.path.join(TMP, "cli5a.state")
    s2 = os.path.join(TMP, "cli5b.state")
    rc, _, err = run_cli("--spec", "L=1,C=16,NH=2,V=40,T=8", "--dtype", "fp64", "--B", "2",
                         "--steps", "2", "--write-model", m5, "--model-version", "5",
                         "--write-state", s1)
    check(rc == 0, err)
    rc, _, err = run_cli("--model", m5, "--dtype", "fp64", "--B", "2", "--steps", "2",
                         "--write-state", s2)
    check(rc == 0, err)
    with open(s1, "rb") as a, open(s2, "rb") as b:
        check(a.read() == b.read(), "state from the v5 file differs from the run that wrote it")


def test_data_shards():
    """--data: uint16 and uint32 shards, rows of T+1 consecutive (overlapping) tokens."""
    B, T, V = 3, 6, 40
    tokens = (np.arange(B * T + 5) * 7) % V
    for magic, ver, dt in ((20240520, 1, "<u2"), (20240801, 7, "<u4")):
        path = os.path.join(TMP, f"shard_{magic}.bin")
        h = np.zeros(256, dtype="<i4")
        h[:3] = [magic, ver, len(tokens)]
        with open(path, "wb") as f:
            f.write(h.tobytes())
            f.write(tokens.astype(dt).tobytes())
        inputs, targets = ref.read_data_batch(path, B, T, V)
        for i in range(B):
            check(list(inputs[i]) == list(tokens[i * T:i * T + T]), f"row {i} inputs")
            check(list(targets[i]) == list(tokens[i * T + 1:i * T + T + 1]), f"row {i} targets")
        sf = os.path.join(TMP, f"shard_{magic}.state")
        rc, _, err = run_cli("--spec", f"L=1,C=8,NH=2,V={V},T={T}", "--data", path, "--B", str(B),
                             "--steps", "1", "--write-state", sf)
        check(rc == 0, err)
        st = ref.read_state(sf, V, ref.num_params(ref.parse_spec(f"L=1,C=8,NH=2,V={V},T={T}")))
        check(np.array_equal(st["inputs"], inputs.numpy()), "cli inputs from shard")
        check(np.array_equal(st["targets"], targets.numpy()), "cli targets from shard")


def test_bad_input():
    """Missing, wrong-magic and truncated files: one stderr line naming the file, exit 1."""
    good = os.path.join(TMP, "good.model")
    ref.write_model(good, ref.parse_spec("L=1,C=8,NH=2,V=11,T=5"),
                    ref.init_params(ref.parse_spec("L=1,C=8,NH=2,V=11,T=5"), 1), 3)
    data = open(good, "rb").read()
    trunc = os.path.join(TMP, "trunc.model")
    open(trunc, "wb").write(data[:len(data) - 4])
    short = os.path.join(TMP, "short.model")
    open(short, "wb").write(data[:100])
    magic = os.path.join(TMP, "magic.model")
    open(magic, "wb").write(b"\x01\x02\x03\x04" + data[4:])
    shard = os.path.join(TMP, "trunc_shard.bin")
    h = np.zeros(256, dtype="<i4")
    h[:3] = [20240520, 1, 1000]
    open(shard, "wb").write(h.tobytes() + np.arange(50, dtype="<u2").tobytes())
    missing = os.path.join(TMP, "does_not_exist.bin")
    cases = [("--model", missing), ("--model", trunc), ("--model", short), ("--model", magic),
             ("--model", shard)]
    for flag, path in cases:
        rc, out, err = run_cli(flag, path)
        lines = err.strip().splitlines()
        check(rc == 1, f"{path}: rc {rc}")
        check(len(lines) == 1 and path in lines[0], f"{path}: stderr {err!r}")
    for path in (missing, shard, good):   # a model file is not a data shard
        rc, out, err = run_cli("--spec", "L=1,C=8,NH=2,V=11,T=5", "--data", path)
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and path in lines[0], f"--data {path}: {rc} {err!r}")


def main():
    tests = [test_model_file_roundtrip, test_loss_vs_independent, test_document_mask, test_gradcheck,
             test_padded_vocab, test_adamw_vs_torch, test_clip_and_schedule, test_state_file,
             test_bf16_model_cli, test_data_shards, test_bad_input]
    passed = failed = 0
    for t in tests:
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc(limit=3)
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
