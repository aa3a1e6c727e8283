// dev/cuda/global_norm.cu: kernel lab for the sum of squares of a gradient
// buffer (global norm for clipping), returned to the host as a double.
//   version 1: a single block with a grid-stride loop (naive: one SM)
//   version 2: llmc/backend/cuda/norm.cuh (production: fixed grid, double partials,
//              summed on the host in block order)
#include "common.h"
#include "llmc/backend/cpu_ops.h"
#include "llmc/backend/cuda/norm.cuh"

using namespace llmc_cuda;

template <typename E>
__global__ void sum_squares_v1(double* result, const E* x, size_t n) {
    __shared__ double red[1024];
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const double v = (double)to_float(x[i]);
        acc += v * v;
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = red[0];
}

template <typename E>
double run(int version, const E* x, size_t n, double* scratch) {
    if (version == 1) {
        sum_squares_v1<E><<<1, 1024>>>(scratch, x, n);
        CUDA_CHECK_LAUNCH();
        double r = 0;
        CUDA_CHECK(cudaMemcpy(&r, scratch, sizeof(double), cudaMemcpyDeviceToHost));
        return r;
    }
    return sum_squares<E>(x, n, scratch, 0);
}

template <typename E>
void check(int version, const char* label, const std::vector<float>& x) {
    const double ref = cpu::sum_squares(x.data(), x.size());
    E* dx = lab::to_device<E>(x);
    double* scratch = lab::dev_alloc<double>(sum_squares_scratch_doubles(x.size()));
    const double got = run<E>(version, dx, x.size(), scratch);
    // Both sides sum exact squares in double: only the order differs.
    lab::validate(label, {(float)(got / ref)}, {1.f}, tol::kSumSquaresRatio);
    std::printf("    got %.12e  ref %.12e  rel %.2e\n", got, ref, std::fabs(got - ref) / ref);
    lab::dev_free(dx), lab::dev_free(scratch);
}

int main() {
    if (!lab::have_gpu()) return lab::finish();
    const size_t n = (size_t)124475904;  // GPT-2 124M parameters
    std::vector<float> x = lab::rand_normal(n, 0.01f, 1);
    std::printf("validation (n=%zu, and n=1000)\n", n);
    check<float>(1, "v1 fp32", x);
    check<float>(2, "v2 fp32", x);
    check<bf16>(2, "v2 bf16", x);
    check<float>(2, "v2 fp32 n=1000", std::vector<float>(x.begin(), x.begin() + 1000));

    if (lab::check_only()) return lab::finish();
    std::printf("timing (n=%zu)\n", n);
    bf16* xb = lab::to_device<bf16>(x);
    float* xf = lab::to_device<float>(x);
    double* scratch = lab::dev_alloc<double>(sum_squares_scratch_doubles(n));
    for (int v = 1; v <= 2; v++) {
        float ms = lab::time_ms([&] { run<bf16>(v, xb, n, scratch); }, v == 1 ? 3 : 20);
        lab::report_bw(v == 1 ? "v1 one block bf16" : "v2 production bf16", ms, (double)n * sizeof(bf16));
        ms = lab::time_ms([&] { run<float>(v, xf, n, scratch); }, v == 1 ? 3 : 20);
        lab::report_bw(v == 1 ? "v1 one block fp32" : "v2 production fp32", ms, (double)n * sizeof(float));
    }
    lab::dev_free(xb), lab::dev_free(xf), lab::dev_free(scratch);
    return lab::finish();
}
