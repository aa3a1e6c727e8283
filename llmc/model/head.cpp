// llmc/model/head.cpp: the LM head and its cross-entropy, whole or in row
// chunks (--head-chunk), and the logits the sampler reads.
//
// Whole (head_chunk 0): the forward writes the logits of every row of the
// micro-batch (one [N,Vl] buffer per slot in flight), the fused classifier
// overwrites them with dloss·(softmax - onehot), and the backward's matrix
// product turns them into the gradients of the head's input and weight.
//
// Chunked (head_chunk ROWS): the forward runs rows r0..r0+ROWS-1 at a time
// through the logits, the cross-entropy (with its gradient written in place)
// and at once both products of the backward: d(head input) rows = dlogits·W
// into a per-slot [N,C] buffer the backward reads instead of its own
// product, and dW += dlogits^T·rows into an accumulator of the head
// weight's size, which the backward adds into the gradient buffer (that
// buffer is handed out only in the backward under ZeRO-2/3 and pipeline
// schedules) and clears. Only one [ROWS,Vl] chunk of logits exists. A
// forward without targets (sampling) computes one chunk only: the one
// holding the row named by want_logits().
#include <algorithm>
#include <stdexcept>

#include "llmc/model/activations.h"
#include "llmc/model/gpt.h"

// Cross-entropy of rows r0..r0+n-1 whose logits are in `logits`; with
// dloss != 0 the logits become dloss·(softmax - onehot). Under tensor
// parallelism the vocab-parallel three steps, never gathering the logits.
void GPT::cross_entropy(void* logits, int r0, int n, const int* tgt, double dloss) {
    Acts& a = *a_;
    const int V = cfg_.vocab_size, Vl = table_.vocab_rows;
    const DType st = prec_.stat;
    void* losses = elem_ptr(a.losses, st, (size_t)r0);
    tgt += r0;
    if (!tp_) {
        be_->softmax_crossentropy(logits, losses, tgt, dloss, n, V, Vl, dloss != 0.0);
        return;
    }
    const int vb = table_.vocab_begin;
    void* mx = elem_ptr(a.ce_max, st, (size_t)r0);
    void* target = elem_ptr(a.ce_target, st, (size_t)r0);
    void* sumexp = elem_ptr(a.ce_sumexp, st, (size_t)r0);
    be_->crossentropy_stats(logits, tgt, mx, target, n, Vl, vb, V);
    tp_->max(mx, n, st);
    tp_->sum(target, n, st);
    be_->crossentropy_sumexp(logits, mx, sumexp, n, Vl, vb, V);
    tp_->sum(sumexp, n, st);
    be_->crossentropy_finish(logits, losses, tgt, mx, sumexp, target, dloss, n, Vl, vb, V, dloss != 0.0);
}

void GPT::head_forward(const ModelChunk& ch, int slot, void* lnf, const int* tgt, bool has_targets, int N,
                       double dloss) {
    Acts& a = *a_;
    const int C = cfg_.channels, Vl = table_.vocab_rows, final_unit = cfg_.num_layers + 1;
    const DType act = prec_.act;
    // Vocabulary-parallel, column-parallel over the rows of wte (tied) or of
    // lm_head, which lives in the final unit (untied); f gathers the input
    // rows under sequence parallelism.
    if (cfg_.tied) {
        release(final_unit);
        if (!ch.embed) acquire(0);
    }
    const int head_unit = cfg_.tied ? 0 : final_unit;
    const void* W = P(cfg_.tied ? Param::wte : Param::lm_head);
    const void* in = tp_ ? tp_->f_forward(lnf, a.ln_full, C, N, act) : lnf;
    if (head_chunk_) {
        head_forward_chunked(slot, in, W, tgt, has_targets, N, dloss);
        release(head_unit);
    } else {
        void* logits = elem_ptr(a.logits, act, (size_t)head_buf(slot) * N * Vl);
        be_->matmul_forward(logits, in, W, nullptr, N, C, Vl);
        release(head_unit);
        if (has_targets) cross_entropy(logits, 0, N, tgt, dloss);
    }
}

// The mean of the N losses the head's forward left (a transfer: after the
// forward's region), or its addition to the step's loss figure on the device. Chunked, the logits buffer then holds the last chunk's
// rows, readable when the forward wrote no gradient into them.
double GPT::head_loss(int N, double dloss) {
    if (head_chunk_) {
        const int R = std::min(head_chunk_, N);
        logits_first_ = (N - 1) / R * R;
        logits_rows_ = dloss != 0.0 ? 0 : N - logits_first_;
    }
    Acts& a = *a_;
    if (loss_figure_ && dloss != 0.0) {  // the step keeps its figures on the device
        be_->sum_to_figure(loss_figure_, a.losses, prec_.stat, (size_t)N, (double)N);
        return 0.0;
    }
    std::vector<double> losses(N);
    be_->download(losses.data(), DType::F64, a.losses, prec_.stat, N);
    double sum = 0;
    for (double v : losses) sum += v;
    return sum / N;
}

void GPT::head_forward_chunked(int slot, const void* in, const void* W, const int* tgt, bool has_targets, int N,
                               double dloss) {
    Acts& a = *a_;
    const int C = cfg_.channels, Vl = table_.vocab_rows, R = std::min(head_chunk_, N);
    const DType act = prec_.act;
    auto rows = [&](const void* base, int r0) { return elem_ptr(base, act, (size_t)r0 * C); };
    if (!has_targets) {
        // The chunk of the wanted row, on the rank that holds its position
        // (context parallel puts it on one rank of the group).
        int row = want_pos_ < 0 ? 0 : -1;
        for (int t = 0; t < last_T_ && want_pos_ >= 0; t++)
            if (pos_host_[t] == want_pos_) row = want_b_ * last_T_ + t;
        logits_first_ = 0, logits_rows_ = 0;
        if (row < 0 || row >= N) return;
        logits_first_ = row / R * R;
        logits_rows_ = std::min(R, N - logits_first_);
        be_->matmul_forward(a.logits, rows(in, logits_first_), W, nullptr, logits_rows_, C, Vl);
        return;
    }
    const bool grad = dloss != 0.0;
    void* dlnf = grad ? elem_ptr(a.dlnf, act, (size_t)head_buf(slot) * N * C) : nullptr;
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = std::min(R, N - r0);
        const void* x = rows(in, r0);
        be_->matmul_forward(a.logits, x, W, nullptr, n, C, Vl);
        cross_entropy(a.logits, r0, n, tgt, dloss);
        if (grad) be_->matmul_backward(elem_ptr(dlnf, act, (size_t)r0 * C), a.head_dw, nullptr, a.logits, x, W, n, C, Vl);
    }
}

int GPT::head_buf(int slot) const {
    for (const ModelChunk& c : chunks_)
        if (c.head) return c.fb(slot);
    return slot;
}

void* GPT::head_backward(int slot, const void* lnf, int N) {
    Acts& a = *a_;
    const int b = head_buf(slot);
    const int C = cfg_.channels, Vl = table_.vocab_rows;
    const DType act = prec_.act;
    const Param head = cfg_.tied ? Param::wte : Param::lm_head;
    if (!head_chunk_) {  // the logits hold dlogits
        const void* in = tp_ ? tp_->f_forward(lnf, a.ln_full, C, N, act) : lnf;
        be_->matmul_backward(a.dln, G(head), nullptr, elem_ptr(a.logits, act, (size_t)b * N * Vl), in, P(head), N, C,
                             Vl);
        return a.dln;
    }
    // The accumulator holds the weight gradient of every micro-batch whose
    // forward ran since the last backward (several in flight under pipeline
    // schedules): added here, it lands in this or an earlier micro-step of
    // the same optimizer step, whose gradients are summed either way.
    const size_t n = (size_t)Vl * C;
    be_->accumulate(G(head), a.head_dw, n);
    be_->zero(a.head_dw, n * dtype_size(prec_.grad));
    return elem_ptr(a.dlnf, act, (size_t)b * N * C);
}

void GPT::want_logits(int b, int pos) {
    want_b_ = b;
    want_pos_ = pos;
}

void GPT::logits_row(int b, int pos, void* out, DType dt) {
    // The local token at global position pos, if this rank holds it.
    int t = -1;
    for (int i = 0; i < last_T_; i++)
        if (pos_host_[i] == pos) t = i;
    const size_t Vl = table_.vocab_rows, V = cfg_.vocab_size;
    if (!a_->logits) throw std::logic_error("logits_row: this pipeline stage has no LM head");
    // Slot 0's buffer (head_buf): the forward-only passes (samples) use
    // slot 0. Chunked, the one chunk of rows the last forward kept.
    const void* src = nullptr;
    if (t >= 0 && !head_chunk_)
        src = elem_ptr(a_->logits, prec_.act, ((size_t)head_buf(0) * last_B_ * last_T_ + (size_t)b * last_T_ + t) * Vl);
    if (t >= 0 && head_chunk_) {
        const int row = b * last_T_ + t;
        if (row < logits_first_ || row >= logits_first_ + logits_rows_)
            throw std::logic_error("logits_row: --head-chunk kept other rows (call want_logits before the forward)");
        src = elem_ptr(a_->logits, prec_.act, (size_t)(row - logits_first_) * Vl);
    }
    if (!tp_ && !cp_) {
        if (!src) throw std::invalid_argument("logits_row: position not in the last forward");
        be_->download(out, dt, src, prec_.act, V);
        return;
    }
    // Each rank contributes the part of the row it holds (a vocabulary slice
    // under tp, nothing when cp puts the position elsewhere); sums assemble it.
    const size_t vb = table_.vocab_begin, held = vb < V ? std::min(Vl, V - vb) : 0;
    be_->zero(a_->logit_row, V * dtype_size(prec_.act));
    if (src && held) be_->copy(elem_ptr(a_->logit_row, prec_.act, vb), src, held * dtype_size(prec_.act));
    if (tp_) tp_->sum(a_->logit_row, V, prec_.act);
    if (cp_) cp_->sum(a_->logit_row, V, prec_.act);
    be_->download(out, dt, a_->logit_row, prec_.act, V);
}
