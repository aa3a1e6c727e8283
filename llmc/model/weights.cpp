// llmc/model/weights.cpp: the model's weights in file order: moving them
// between host arrays in model-file order and this rank's part of its flat
// buffers (whole or a ZeRO shard, a tensor-parallel slice, a pipeline
// stage's units; the walks are llmc/model/weight_walk.h), and the seeded
// initialisation.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "llmc/base/rng.h"
#include "llmc/model/gpt.h"

void GPT::get_file_order(void* host, DType dst_t, const void* buf, bool sharded, DType src_t, Tensors which) {
    download_file_order(*be_, table_, sharding_, host, dst_t, buf, sharded, src_t, which);
}

void GPT::set_weights_file_range(const void* host, DType t, size_t file_begin, size_t file_end) {
    upload_file_range(*be_, table_, sharding_, params_, sharding_.params, prec_.param, host, t, file_begin, file_end);
    if (master_)
        upload_file_range(*be_, table_, sharding_, master_, sharding_.optimizer, prec_.master, host, t, file_begin,
                          file_end);
}

void GPT::set_weights_file_order(const void* host, DType t) { set_weights_file_range(host, t, 0, table_.file_params); }

void GPT::init_random(uint64_t seed) {
    // Drawn on the host in file order for the whole model, tensor by tensor,
    // so the values do not depend on the memory layout or on which rank holds
    // what: every rank draws every tensor of the whole model (the table of
    // one process lists them) and keeps its own part.
    Rng rng(seed);
    // GPT-2 (llm.c): N(0, 0.02), the projections into the residual stream
    // scaled by 1/sqrt(2L). Llama (Hugging Face): N(0, 0.02) everywhere.
    const double std_base = 0.02;
    const double std_resid = cfg_.llama() ? std_base : 0.02 / std::sqrt(2.0 * cfg_.num_layers);
    const TensorTable whole(cfg_);
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : whole.entries) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](const TensorEntry* x, const TensorEntry* y) { return x->file_offset < y->file_offset; });
    std::vector<double> host;
    for (const TensorEntry* e : order) {
        const size_t n = e->file_rows * e->file_cols;
        host.assign(n, 0.0);
        double* x = host.data();
        switch (e->kind) {
            case Param::ln1w: case Param::ln2w: case Param::lnfw:
                for (size_t i = 0; i < n; i++) x[i] = 1.0;
                break;
            case Param::wte: case Param::lm_head:  // padded rows V..Vp-1 stay zero: they never see a gradient
                for (size_t i = 0; i < (size_t)cfg_.vocab_size * e->file_cols; i++) x[i] = std_base * rng.normal();
                break;
            case Param::attprojw: case Param::fcprojw:
                for (size_t i = 0; i < n; i++) x[i] = std_resid * rng.normal();
                break;
            default:
                if (e->decay)
                    for (size_t i = 0; i < n; i++) x[i] = std_base * rng.normal();
                break;  // biases stay zero
        }
        set_weights_file_range(x, DType::F64, e->file_offset, e->file_offset + n);
    }
}
