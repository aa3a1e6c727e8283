#!/usr/bin/python3
# tests/reference/fp8_reference.py: the reference's FP8 operands
# (docs/fp8.md), written here from the formats' definitions with NumPy,
# independently of llmc/backend/fp8.h: per-tensor current scaling,
# saturation, round to nearest even on the grid, back at the tensor's
# scale. reference_gpt.py --fp8 1 runs the four linear layers of each block
# through Fp8Linear: e4m3 inputs and weights, e5m2 output gradients, the
# bias gradient from the unrounded output gradient.
import numpy as np
import torch

FP8 = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}  # mantissa bits, smallest normal's exponent, largest


def fp8_round(t, fmt):
    mbits, emin, fmax = FP8[fmt]
    x = t.detach().double().numpy()
    amax = float(np.max(np.abs(x))) if x.size else 0.0
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
    @staticmethod
    def forward(ctx, x, w, b):
        xq, wq = fp8_round(x, "e4m3"), fp8_round(w, "e4m3")
        ctx.save_for_backward(xq, wq)
        return xq @ wq.t() + b

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        gq = fp8_round(g, "e5m2")
        C_in, C_out = xq.shape[-1], gq.shape[-1]
        dw = gq.reshape(-1, C_out).t() @ xq.reshape(-1, C_in)
        return gq @ wq, dw, g.reshape(-1, C_out).sum(0)
