// llmc/model/fp8.cpp: the four linear layers of a block (QKV, attention
// output, MLP up, MLP down) and their products, plain or, with --fp8 1, on
// operands rounded to FP8 grids at current scaling (docs/fp8.md): the input
// and the weight in e4m3, the output gradient in e5m2, each with the amax of
// its whole tensor. A tensor this rank holds a piece of takes the max over
// the ranks that hold the others first, so every layout rounds every value
// the same way: under tp the weights of all four layers, the input of the
// row-parallel ones and the output gradient of the column-parallel ones;
// under cp every activation and output gradient (split by sequence).
#include "llmc/base/test_hooks.h"
#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

void GPT::fp8_amax(int which, const void* x, DType t, size_t n, bool tp_split, bool cp_split) {
    void* am = elem_ptr(a_->fp8_amax, DType::F64, (size_t)which);
    be_->amax_to(am, x, t, n);
    static const bool local = test_hooks::fp8_local_amax();  // the tests' counter-example
    if (tp_split && tp_ && !local) tp_->max(am, 1, DType::F64);
    if (cp_split && cp_ && !local) cp_->max(am, 1, DType::F64);
}

void GPT::linear_forward(void* out, const void* in, Param w, const void* bias, int l, int N, int IC, int OC, bool row) {
    if (!fp8_) {
        be_->matmul_forward(out, in, P(w, l), bias, N, IC, OC);
        return;
    }
    fp8_amax(0, in, prec_.act, (size_t)N * IC, row, true);
    fp8_amax(1, P(w, l), prec_.param, (size_t)OC * IC, true, false);
    be_->matmul_forward_fp8(out, in, P(w, l), bias, N, IC, OC, a_->fp8_amax);
}

void GPT::linear_backward(void* dinp, Param w, void* dbias, const void* dout, const void* in, int l, int N, int IC,
                          int OC, bool row) {
    if (!fp8_) {
        be_->matmul_backward(dinp, G(w, l), dbias, dout, in, P(w, l), N, IC, OC);
        return;
    }
    fp8_amax(0, in, prec_.act, (size_t)N * IC, row, true);
    fp8_amax(1, P(w, l), prec_.param, (size_t)OC * IC, true, false);
    fp8_amax(2, dout, prec_.act, (size_t)N * OC, !row, true);
    be_->matmul_backward_fp8(dinp, G(w, l), dbias, dout, in, P(w, l), N, IC, OC, a_->fp8_amax);
}
