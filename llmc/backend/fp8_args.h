// llmc/backend/fp8_args.h: what an FP8 product or the op that writes its
// operand is told besides its tensors (docs/fp8.md): delayed scaling's cast
// of an operand by the op that writes it, a product's delayed scaling, the
// weights' FP8 copies made once per step, and the input's transposed copy
// kept from the forward. Plain structs of device pointers, by value into a
// recorded op; Backend's FP8 ops take them (backend.h), and the CUDA
// backend hands them to its kernels (cuda/fp8.cuh).
#pragma once

// Delayed scaling's fused cast (--fp8-history, docs/fp8.md): the op that writes an FP8 product's operand writes
// the operand's FP8 copies for that product too, at the scale of its history [len] doubles (fmax over their
// max, once they hold one); transposed: both ways (a whole backward's output gradient), else as it is; keep
// false: nothing but that product reads the op's output, which is then not stored while the history holds one.
// kept (a forward's, or null): the input's transposed copy for the same layer's weight gradient goes there
// as well ([H, rows padded to 16] bytes, Fp8Kept), and with plain false only there (a recompute's, for the
// backward after it: no product of the forward follows).
struct Fp8Cast {
    const void* history;
    int len;
    bool transposed;
    bool keep = true;
    void* kept = nullptr;
    bool plain = true;
};

// Delayed scaling of a product's three operands (--fp8-history; input, weight, output gradient, the layer's
// consecutive slots): step_max [3] and history [3][len] doubles. The product scales each operand by its
// history's amax once that holds one (by the amax given while it holds none), and operand i's amax joins
// step_max[i] when bit i of record is set (the operands this pass measured), in the product's own launch.
struct Fp8Delayed {
    void* step_max;
    const void* history;
    int len;
    unsigned record;
};

// A product's weight as FP8 copies made once per optimizer step (the weight changes only at the update, and the
// step's micro-batches reuse them): bytes [OC, IC] for the forward, bytes_t [IC, OC] for the input gradient, e4m3
// at the scale of the weight's amax, which is at `amax` (one double, read there instead of amax[1]). quantize /
// quantize_t: this call makes that copy (the step's first to need it); otherwise it is there already.
struct Fp8Weight {
    void* bytes;
    void* bytes_t;
    const void* amax;
    bool quantize, quantize_t;
};

// A product's input kept from its forward as the transposed FP8 copy its weight gradient multiplies
// (--fp8-history): `bytes` [IC, N padded to 16] e4m3 at the scale of the input's history [len] doubles, which
// the op that wrote the input filled (Fp8Cast::kept) while the history holds an amax; while it holds none the
// backward writes it there from the input, after reading the input whole: `bytes` may be the input's own
// buffer, which the op then did not store. A backend that rounds inside its products (the CPU's) ignores it.
struct Fp8Kept {
    void* bytes;
    const void* history;
    int len;
};
