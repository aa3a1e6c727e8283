// llmc/backend/cuda/switches.h: the CUDA backend's optimization switches,
// read once from the environment when the backend starts, and the host-side
// decisions that go with them. Plain C++ (no CUDA), so that the parsing and
// the routing are tested on a machine without a GPU
// (tests/unit/test_gpu_host.cpp). Each switch is off, or at today's
// setting, by default; scripts/gpu/switches.txt lists them for the GPU
// benchmark, which measures every run with and without each.
//
//   LLMC_GELU_FUSION=0|1|2   the MLP's GELU inside cuBLASLt's epilogues:
//       0 (default) none: the fc product, then the GELU kernel; the fcproj
//         input gradient, then the GELU backward kernel;
//       1 forward: the fc product with CUBLASLT_EPILOGUE_GELU_AUX_BIAS
//         writes both GELU(x·W^T + b) and its input (the "aux" matrix the
//         backward needs) in one pass;
//       2 forward and backward: also the fcproj input-gradient product with
//         CUBLASLT_EPILOGUE_DGELU, which multiplies by GELU'(aux) before it
//         stores (one pass over the N x 4C gradient instead of three).
//       Either form falls back to the separate kernels, per call, when the
//       epilogue's alignment rules are not met or no algorithm accepts it.
//   LLMC_BIAS_GRAD_EPILOGUE=0|1  a Linear's bias gradient from cuBLASLt's
//       BGRADB epilogue on the weight-gradient product (1) instead of the
//       column-sum kernel (0, the default; matmul.cuh says why it is the
//       default: the += contract, a fixed summation order). The epilogue
//       overwrites, so it writes to scratch and one small add follows.
//   LLMC_CUDA_GRAPH=0|1  the step's forward and backward passes as CUDA
//       graphs (1): each pass is captured the first time its shape is seen
//       and replayed after (cuda/graphs.cuh; docs/design.md section 2.9),
//       in the layouts whose passes hold device work only. Same kernels,
//       same order: the numbers do not change.
//   LLMC_ATTN_WG=0|1|det|fwd  the Hopper attention (cuda/attention_wg.cuh:
//       TMA, wgmma, warp-specialised; sm_90 with the sm_90a code built in)
//       in place of the mma.sync kernels: 1 the forward and the backward,
//       whose dq is summed with fp32 atomics (not bitwise reproducible run
//       to run, as LLMC_ATTN_BWD=5); det the same with dq summed in a fixed
//       order (the key blocks take turns per query tile: reproducible, at
//       the cost of the waits); fwd the forward alone (to tell the kernels
//       apart on a GPU); off (0) by default until a GPU run has checked
//       them. Same math, other rounding order.
//   LLMC_GEMM_WORKSPACE_MB=N  cuBLASLt's workspace in MiB (default 32, 1 to
//       1024): a larger one lets the heuristic pick split-K algorithms for
//       the weight-gradient products, whose K (the B·T rows) is long and whose
//       M x N (the weight) is small. Allocated once, when the backend starts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace llmc_switch {

enum class GeluFusion { none = 0, forward = 1, both = 2 };

// Parses LLMC_GELU_FUSION's value (null or empty: the default, none).
// Returns false with a message naming the variable on anything else.
inline bool parse_gelu_fusion(const char* v, GeluFusion* out, std::string* err) {
    *out = GeluFusion::none;
    if (!v || !*v) return true;
    const std::string s(v);
    if (s == "0") *out = GeluFusion::none;
    else if (s == "1") *out = GeluFusion::forward;
    else if (s == "2") *out = GeluFusion::both;
    else {
        *err = "LLMC_GELU_FUSION='" + s + "': expected 0 (none), 1 (forward) or 2 (forward and backward)";
        return false;
    }
    return true;
}

// Parses an on/off switch's value (null or empty: off); `name` for the message.
inline bool parse_on_off(const char* name, const char* v, bool* on, std::string* err) {
    *on = false;
    if (!v || !*v) return true;
    const std::string s(v);
    if (s == "0" || s == "1") {
        *on = s == "1";
        return true;
    }
    *err = std::string(name) + "='" + s + "': expected 0 (off) or 1 (on)";
    return false;
}

enum class AttnWg { off = 0, both = 1, forward = 2, deterministic = 3 };

// Parses LLMC_ATTN_WG's value (null or empty: off).
inline bool parse_attn_wg(const char* v, AttnWg* out, std::string* err) {
    *out = AttnWg::off;
    if (!v || !*v) return true;
    const std::string s(v);
    if (s == "0") *out = AttnWg::off;
    else if (s == "1") *out = AttnWg::both;
    else if (s == "fwd") *out = AttnWg::forward;
    else if (s == "det") *out = AttnWg::deterministic;
    else {
        *err = "LLMC_ATTN_WG='" + s +
               "': expected 0 (off), 1 (forward and backward), det (the same, dq in a fixed order) or fwd (forward only)";
        return false;
    }
    return true;
}

// LLMC_ATTN_BWD (unset, empty or 2: the two-kernel attention backward; 5:
// the one-kernel backward) and LLMC_ATTN_TC (unset, empty or 1: the
// tensor-core attention where it applies; 0: the CUDA-core kernels). The
// attention reads them itself (cuda/attention_tc.cuh); the backend checks
// them here when it starts, so a typo stops the run instead of silently
// measuring the default.
inline bool check_attention_switches(const char* bwd, const char* tc, std::string* err) {
    const std::string b = bwd ? bwd : "", t = tc ? tc : "";
    if (!b.empty() && b != "2" && b != "5") {
        *err = "LLMC_ATTN_BWD='" + b + "': expected 2 (two kernels, the default) or 5 (one kernel)";
        return false;
    }
    if (!t.empty() && t != "0" && t != "1") {
        *err = "LLMC_ATTN_TC='" + t + "': expected 0 (CUDA-core kernels) or 1 (tensor cores, the default)";
        return false;
    }
    return true;
}

constexpr size_t kGemmWorkspaceDefaultMiB = 32, kGemmWorkspaceMaxMiB = 1024;

// Parses LLMC_GEMM_WORKSPACE_MB's value into bytes (null or empty: 32 MiB).
inline bool parse_gemm_workspace(const char* v, size_t* bytes, std::string* err) {
    *bytes = kGemmWorkspaceDefaultMiB << 20;
    if (!v || !*v) return true;
    char* end = nullptr;
    const long long mib = std::strtoll(v, &end, 10);
    if (*end != '\0' || mib < 1 || (size_t)mib > kGemmWorkspaceMaxMiB) {
        *err = std::string("LLMC_GEMM_WORKSPACE_MB='") + v + "': expected a whole number of MiB from 1 to 1024";
        return false;
    }
    *bytes = (size_t)mib << 20;
    return true;
}

// Whether a GELU epilogue may run for an output D of `rows` rows in cuBLASLt's
// column-major view (the layer's OC, D's leading dimension, which is also the
// aux matrix's): cuBLASLt requires the aux leading dimension to be a
// multiple of 8 elements, and the aux matrix, like the bias, is read and
// written in 16-byte pieces, so the aux pointer, the output pointer and the
// bias (when there is one) must be 16-byte aligned. Anything else takes the
// separate kernels (a fault here would leave the CUDA context unusable).
inline bool gelu_epilogue_fits(uintptr_t out, uintptr_t aux, uintptr_t bias, long long rows) {
    const auto aligned = [](uintptr_t p) { return p != 0 && p % 16 == 0; };
    return rows > 0 && rows % 8 == 0 && aligned(out) && aligned(aux) && (bias == 0 || aligned(bias));
}

}  // namespace llmc_switch
