#!/usr/bin/python3
# tests/reference/fp8_reference.py: the reference's FP8 operands
# (docs/fp8.md), written here from the formats' definitions with NumPy,
# independently of llmc/backend/fp8.h: per-tensor scaling, saturation,
# round to nearest even on the grid, back at the tensor's scale.
# reference_gpt.py --fp8 1 runs the four linear layers of each block
# through Fp8Linear: e4m3 inputs and weights, e5m2 output gradients, the
# bias gradient from the unrounded output gradient. Current scaling takes
# each operand's own amax; with --fp8-history N (DELAYED.length) each
# operand, told apart by (layer, linear layer, which), takes the largest
# amax of its last N steps (its own while none is recorded), records its
# own into the step's max, and end_step() moves the step's maxes into the
# histories. --fp8-layers (LAYERS) leaves the other linear layers plain.
import numpy as np
import torch

FP8 = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}  # mantissa bits, smallest normal's exponent, largest


class Delayed:
    def __init__(self):
        self.length, self.history, self.step = 0, {}, {}

    def amax(self, key, own):
        """The amax an operand is scaled by: its history's largest, or its own."""
        if self.length == 0:
            return own
        self.step[key] = max(self.step.get(key, 0.0), own)
        past = max(self.history.get(key, []), default=0.0)
        return past if past != 0 else own

    def end_step(self):
        for key, m in self.step.items():
            self.history[key] = ([m] + self.history.get(key, []))[:self.length]
        self.step = {}


DELAYED = Delayed()


def fp8_round(t, fmt, key=None):
    mbits, emin, fmax = FP8[fmt]
    x = t.detach().double().numpy()
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    if key is not None:
        amax = DELAYED.amax(key, amax)
    s = fmax / amax if amax > 0 and np.isfinite(amax) else 1.0
    y = x * s
    a = np.minimum(np.abs(y), fmax)
    _, e = np.frexp(a)                      # a = f * 2^e, f in [0.5, 1)
    e = np.maximum(e - 1, emin)
    q = np.ldexp(1.0, e - mbits)
    r = np.rint(a / q) * q                  # ties to even
    r = np.where(np.isnan(y), y, np.copysign(r, y)) / s
    return torch.from_numpy(r).to(t.dtype)


class Fp8Linear(torch.autograd.Function):
    """x @ w.t() + b on FP8 operands; key: (layer, linear layer) for delayed scaling."""
    @staticmethod
    def forward(ctx, x, w, b, key):
        xq, wq = fp8_round(x, "e4m3", key + (0,)), fp8_round(w, "e4m3", key + (1,))
        ctx.save_for_backward(xq, wq)
        ctx.key = key
        return xq @ wq.t() + b

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        gq = fp8_round(g, "e5m2", ctx.key + (2,))
        C_in, C_out = xq.shape[-1], gq.shape[-1]
        dw = gq.reshape(-1, C_out).t() @ xq.reshape(-1, C_in)
        return gq @ wq, dw, g.reshape(-1, C_out).sum(0), None


NAMES = ("qkv", "attproj", "fc", "fcproj")  # the linear layers' names, key[1] 0-3
LAYERS = set(range(4))                      # --fp8-layers: those on FP8 operands


def set_layers(names):
    """--fp8-layers: "all" or a list such as "qkv,fc"."""
    LAYERS.clear()
    LAYERS.update(range(4) if names == "all" else (NAMES.index(n) for n in names.split(",")))


def fp8_linear(x, w, b, key):
    """x @ w.t() + b, through Fp8Linear where key's linear layer is among LAYERS."""
    return Fp8Linear.apply(x, w, b, key) if key[1] in LAYERS else x @ w.t() + b
