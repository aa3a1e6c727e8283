// llmc/model/fp8.cpp: the four linear layers of a block (QKV, attention
// output, MLP up, MLP down) and their products, plain or, with --fp8 1, on
// operands rounded to FP8 grids at current scaling (docs/fp8.md): the input
// and the weight in e4m3, the output gradient in e5m2, each with the amax of
// its whole tensor. A tensor this rank holds a piece of takes the max over
// the ranks that hold the others first, so every layout rounds every value
// the same way: under tp the weights of all four layers, the input of the
// row-parallel ones and the output gradient of the column-parallel ones;
// under cp every activation and output gradient (split by sequence).
#include "llmc/backend/fp8.h"
#include "llmc/base/test_hooks.h"
#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

const void* GPT::fp8_operand(int which, const void* x, DType t, size_t n, int format, bool tp_split, bool cp_split) {
    Acts& a = *a_;
    void* am = elem_ptr(a.fp8_amax, DType::F64, (size_t)which);
    be_->amax_to(am, x, t, n);
    static const bool local = test_hooks::fp8_local_amax();  // the tests' counter-example
    if (tp_split && tp_ && !local) tp_->max(am, 1, DType::F64);
    if (cp_split && cp_ && !local) cp_->max(am, 1, DType::F64);
    void* dst = which == 0 ? a.fp8_in : which == 1 ? a.fp8_w : a.fp8_dout;
    be_->fp8_round(dst, x, t, n, am, format);
    return dst;
}

void GPT::linear_forward(void* out, const void* in, Param w, const void* bias, int l, int N, int IC, int OC, bool row) {
    if (!fp8_) {
        be_->matmul_forward(out, in, P(w, l), bias, N, IC, OC);
        return;
    }
    const int e4m3 = (int)fp8::Format::e4m3;
    const void* xq = fp8_operand(0, in, prec_.act, (size_t)N * IC, e4m3, row, true);
    const void* wq = fp8_operand(1, P(w, l), prec_.param, (size_t)OC * IC, e4m3, true, false);
    be_->matmul_forward(out, xq, wq, bias, N, IC, OC);
}

void GPT::linear_backward(void* dinp, Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC,
                          int OC, bool row) {
    if (!fp8_) {
        be_->matmul_backward(dinp, G(w, l), dbias, dout, in, P(w, l), N, IC, OC);
        return;
    }
    const int e4m3 = (int)fp8::Format::e4m3, e5m2 = (int)fp8::Format::e5m2;
    const void* dq = fp8_operand(2, dout, prec_.act, (size_t)N * OC, e5m2, !row, true);
    const void* xq = fp8_operand(0, in, prec_.act, (size_t)N * IC, e4m3, row, true);
    const void* wq = fp8_operand(1, P(w, l), prec_.param, (size_t)OC * IC, e4m3, true, false);
    be_->matmul_backward(dinp, G(w, l), nullptr, dq, xq, wq, N, IC, OC);
    if (dbias) be_->bias_backward(dbias, dout, N, OC);  // from the unrounded gradient
}
