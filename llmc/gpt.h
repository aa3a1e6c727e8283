// llmc/gpt.h: the GPT-2 model: its flat buffers (parameters, gradients,
// master weights, Adam m and v, all laid out by the tensor table), its
// activations, and a forward and backward pass written once against the
// Backend interface, so the same code runs on the CPU and on CUDA.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"
#include "config.h"
#include "tensors.h"

// A named backend allocation, for the memory report.
struct BufferInfo {
    std::string group;  // "params", "grads", "master", "optimizer", "activations", "scratch"
    std::string name;
    size_t bytes;
};

class GPT {
  public:
    // Allocates every buffer for micro-batches of up to B rows of T tokens.
    // recompute_gelu: keep only the GELU input per layer and recompute its
    // output in backward (llm.c's -r 1), saving L·B·T·4C activations.
    GPT(Backend* be, const GPTConfig& cfg, int B, int T, bool recompute_gelu = false);
    ~GPT();
    GPT(const GPT&) = delete;
    GPT& operator=(const GPT&) = delete;

    const GPTConfig& config() const { return cfg_; }
    const TensorTable& table() const { return table_; }
    Backend& backend() { return *be_; }
    const Precision& precision() const { return prec_; }
    int max_B() const { return B_; }
    int max_T() const { return T_; }

    // Flat buffers (backend memory); master is null without mixed precision.
    void* params() { return params_; }
    void* grads() { return grads_; }
    void* master() { return master_; }
    void* adam_m() { return m_; }
    void* adam_v() { return v_; }
    // The buffer that holds full-precision weights: master if any, else params.
    void* weights() { return master_ ? master_ : params_; }
    DType weights_dtype() const { return prec_.has_master ? prec_.master : prec_.param; }
    void* param(Param p, int layer = 0);
    void* grad(Param p, int layer = 0);

    // GPT-2 initialisation, deterministic for a seed and independent of the
    // memory layout: values are drawn tensor by tensor in model-file order.
    void init_random(uint64_t seed);
    // Sets every weight from host values of type t in model-file order
    // (params, and master when present). Adam state is left as is.
    void set_weights_file_order(const void* host, DType t);
    // Reads one buffer (weights(), grads(), adam_m(), adam_v()) of type
    // `src_t` into host memory in model-file order, converted to dst_t.
    void get_file_order(void* host, DType dst_t, const void* buf, DType src_t);
    void set_file_order(void* buf, DType buf_t, const void* host, DType src_t);

    // Forward over inputs (host int32 [B,T]); returns the mean loss over the
    // B·T targets when targets is non-null. With dloss != 0 the fused
    // classifier leaves dloss·(softmax - onehot) in the logits for backward
    // (the caller passes 1/(tokens in the global batch)).
    double forward(const int* inputs, const int* targets, int B, int T, double dloss = 0.0);
    // Backward of the last forward (which must have had dloss != 0);
    // gradients accumulate (+=) into grads().
    void backward();
    void zero_grad();
    // Logits of row (b, t) of the last forward, first V columns, to host
    // memory of type dt (before backward overwrote them with gradients).
    void logits_row(int b, int t, void* out, DType dt);

    const std::vector<BufferInfo>& buffers() const { return buffers_; }

  private:
    struct Acts;  // activation and scratch pointers, see gpt.cpp
    void* alloc_buffer(const char* group, const char* name, size_t count, DType t);
    void* act_layer(void* base, int l, size_t per_layer_count, DType t);

    Backend* be_;
    GPTConfig cfg_;
    TensorTable table_;
    Precision prec_;
    int B_, T_;
    bool recompute_gelu_;
    int last_B_ = 0, last_T_ = 0;
    bool grad_ready_ = false;
    void* params_ = nullptr;
    void* grads_ = nullptr;
    void* master_ = nullptr;
    void* m_ = nullptr;
    void* v_ = nullptr;
    Acts* a_;
    std::vector<void*> owned_;
    std::vector<BufferInfo> buffers_;
};
