// llmc/backend/backend_profile.cpp: the step's time by op class
// (llmc/backend/backend_profile.h).
#include "llmc/backend/backend_profile.h"

#include <cstring>
#include <stdexcept>

#include "llmc/backend/backend_wrapper.h"

namespace {

// The classes, in op_class_names()'s order.
enum Cls : int {
    kEmbed, kQkv, kAttproj, kFc, kFcproj, kHead, kAttnFwd, kAttnBwd, kNorm, kAct, kResidual, kRope, kMoe, kOptim, kCopy,
    kCount
};

class ProfilingBackend final : public BackendWrapper {
  public:
    explicit ProfilingBackend(Backend* inner) : BackendWrapper(inner) {}
    ProfileShapes shapes;

    // Every op is seen: no recorded regions.
    bool region_replay(uint64_t) override { return false; }
    bool region_begin(uint64_t) override { return false; }

    // The products: their class from their widths.
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                        int OC) override {
        product_ = product_class(IC, OC);
        BackendWrapper::matmul_forward(out, inp, weight, bias, N, IC, OC);
    }
    void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         int N, int IC, int OC) override {
        product_ = product_class(IC, OC);
        BackendWrapper::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    }

    // FP8 products (--fp8 1): the same classes. Their operands' amax ops run
    // just before them (llmc/model/fp8.cpp) and count to the product that
    // follows.
    void matmul_forward_fp8(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC,
                            const void* amax, const Fp8Delayed* d, const Fp8Weight* q) override {
        product_ = product_class(IC, OC);
        BackendWrapper::matmul_forward_fp8(out, inp, weight, bias, N, IC, OC, amax, d, q);
    }
    void matmul_backward_fp8(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                             const void* weight, int N, int IC, int OC, const void* amax, const Fp8Kept* kept,
                             const Fp8Delayed* d, const Fp8Weight* q) override {
        product_ = product_class(IC, OC);
        BackendWrapper::matmul_backward_fp8(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, amax, kept, d, q);
    }

    void take(std::vector<double>* ms) {
        ms->assign(kCount, 0.0);
        for (const Span& s : spans_) (*ms)[s.cls] += in_->mark_ms(s.a, s.b);
        spans_.clear();
        pending_ = 0;
        in_->clear_marks();
    }

  private:
    struct Span {
        int cls, a, b;
    };
    int product_class(int IC, int OC) const {
        const ProfileShapes& s = shapes;
        if (IC == s.C && OC == s.qkv_out) return kQkv;
        if (IC == s.attn_in && OC == s.C) return kAttproj;
        if (IC == s.C && OC == s.fc_out) return kFc;
        if (IC == s.fcproj_in && OC == s.C) return kFcproj;
        if (OC == s.head_rows || IC == s.head_rows) return kHead;
        if (s.experts > 0 && OC == s.experts) return kMoe;
        return kCopy;  // a product of no known layer (none in the models here)
    }
    static int op_class(const char* n) {
        auto is = [&](const char* p) { return std::strncmp(n, p, std::strlen(p)) == 0; };
        if (is("encoder")) return kEmbed;
        if (is("matmul_gelu")) return kFc;
        if (is("matmul_backward_gelu")) return kFcproj;
        if (is("softmax_crossentropy") || is("crossentropy")) return kHead;
        if (is("attention_forward") || is("attention_block_forward")) return kAttnFwd;
        if (is("attention_backward") || is("attention_block_backward")) return kAttnBwd;
        if (is("layernorm") || is("rmsnorm") || is("residual_layernorm") || is("residual_rmsnorm") || is("norm"))
            return kNorm;
        if (is("gelu") || is("swiglu") || is("activation")) return kAct;
        if (is("residual") || is("add_bias") || is("accumulate")) return kResidual;
        if (is("rope")) return kRope;
        if (is("moe")) return kMoe;
        if (is("adamw") || is("sum_squares")) return kOptim;
        return kCopy;
    }
    void device_op(const char* name, std::function<void()> fn) override {
        auto is = [&](const char* n) { return std::strcmp(name, n) == 0; };
        const bool product =
            is("matmul_forward") || is("matmul_backward") || is("matmul_forward_fp8") || is("matmul_backward_fp8");
        const bool scaling = is("amax_to") || is("fp8_delayed");
        const int cls = product ? product_ : op_class(name);
        const int a = in_->mark();
        fn();
        if (product)
            for (size_t i = pending_; i < spans_.size(); i++) spans_[i].cls = cls;
        spans_.push_back({cls, a, in_->mark()});
        if (!scaling) pending_ = spans_.size();
    }
    int product_ = kCopy;
    size_t pending_ = 0;  // spans_[pending_..]: amax ops waiting for their product
    std::vector<Span> spans_;
};

}  // namespace

const std::vector<std::string>& op_class_names() {
    static const std::vector<std::string> names = {"embed",         "qkv",  "attproj",    "fc",       "fcproj",
                                                   "head",          "attention_fwd", "attention_bwd", "norm",
                                                   "activation",    "residual",      "rope",          "moe",
                                                   "optimizer",     "copy"};
    return names;
}

Backend* make_profiling_backend(Backend* inner) { return new ProfilingBackend(inner); }

bool is_profiling(Backend& be) { return dynamic_cast<ProfilingBackend*>(&be) != nullptr; }

void set_profile_shapes(Backend& be, const ProfileShapes& s) {
    if (ProfilingBackend* p = dynamic_cast<ProfilingBackend*>(&be)) p->shapes = s;
}

bool take_op_times(Backend& be, std::vector<double>* ms) {
    ProfilingBackend* p = dynamic_cast<ProfilingBackend*>(&be);
    if (!p) return false;
    p->take(ms);
    return true;
}
