// llmc/backend/backend_profile.h: the time of a step by op class
// (scripts/benchmark.py --breakdown; the trainer under LLMC_BREAKDOWN=1):
// a backend in front of the real one (backend_wrapper.h) that places a
// timing mark (Backend::mark: CUDA events on the GPU, the clock on the CPU)
// before and after every op and adds the time between them to the op's
// class:
//   embed          the token and position embeddings, forward and backward
//   qkv, attproj   the attention's two products (forward and both backward
//   fc, fcproj     products), the MLP's two (fc with its fused GELU, fcproj
//                  with its fused GELU backward); a Mixtral's experts count
//                  as fc and fcproj, its router as moe
//   head           the LM head's products and the cross-entropy
//   attention_fwd, attention_bwd   the attention core (local or a ring's block)
//   norm           LayerNorm and RMSNorm (with their fused residual adds)
//   activation     GELU and SwiGLU where not fused into a product
//   residual       residual adds, bias adds, accumulations
//   rope           rotary embeddings
//   moe            the routing, dispatch and combine
//   optimizer      AdamW and the gradient norm's sums
//   copy           copies, conversions, zeroing within the backend
// A product's class follows from its shape (ProfileShapes, set once the
// model is built); a toy model whose head has as many rows as a layer's
// product has columns (V padded to 384 and 3C = 384) counts its head as
// that layer. Recorded regions are off while profiling (every op must
// be seen); what the device does outside the backend's ops (collectives on
// their own stream, idle gaps) is the step's time less the classes'.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "llmc/backend/backend.h"

// The widths that tell a product's class (this rank's, after tensor
// parallelism): the model's channels, QKV's output and the attention
// output's width (attproj's input), fc's output and fcproj's input, the LM
// head's rows, the router's experts (0: none).
struct ProfileShapes {
    int C = 0, qkv_out = 0, attn_in = 0, fc_out = 0, fcproj_in = 0, head_rows = 0, experts = 0;
};

// The class names, in the order take_op_times reports them.
const std::vector<std::string>& op_class_names();

// Takes ownership of inner.
Backend* make_profiling_backend(Backend* inner);
// Whether be is profiling; the shapes of its model's products.
bool is_profiling(Backend& be);
void set_profile_shapes(Backend& be, const ProfileShapes& s);
// The milliseconds of each class since the last call (waits for the
// device), in op_class_names()'s order; false when be is not profiling.
bool take_op_times(Backend& be, std::vector<double>* ms);
