// tests/unit/test_gpu_host.cpp: the decisions the GPU path takes on the
// host, checked where no GPU is needed:
//   - the MFU denominator: the datasheet's dense bf16 peak by device name
//     (llmc/backend/device_peaks.h), against the datasheets' figures, with
//     the more specific names first and an estimate only for unknown parts;
//   - MPI is started only under a launcher (llmc/comm/dist.h): the launcher
//     variables of Open MPI, PMIx, PMI, hydra and Slurm, and a process
//     started without any of them runs as a world of one without MPI;
//   - a matmul's bias goes to cuBLASLt's epilogue only when 16-byte aligned,
//     else to the separate bias kernel (llmc/backend/cuda/kernel_index.h);
//   - the optimization switches (llmc/backend/cuda/switches.h): each value
//     LLMC_GELU_FUSION, LLMC_BIAS_GRAD_EPILOGUE and LLMC_GEMM_WORKSPACE_MB
//     accept or refuse, and
//     when a GELU epilogue may run (aux leading dimension a multiple of 8,
//     output, aux and bias 16-byte aligned) or the separate kernels must;
//   - the tolerances of the GPU checks (tests/lib/tolerances.h) are sane.
// Last line: "N passed, N failed".
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "llmc/backend/cuda/kernel_index.h"
#include "llmc/backend/cuda/switches.h"
#include "llmc/backend/device_peaks.h"
#include "llmc/comm/dist.h"
#include "llmc/comm/mpi.h"
#include "tests/lib/check.h"
#include "tests/lib/tolerances.h"

static bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fabs(b); }

static void test_peaks() {
    struct Case {
        const char* name;
        int major, minor, sms;
        double khz, tflops;
    };
    // Names as the driver reports them; the reported clock is the boost clock.
    const Case cases[] = {
        {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000, 989.5},
        {"NVIDIA H100 PCIe", 9, 0, 114, 1755000, 756.5},
        {"NVIDIA H100 NVL", 9, 0, 132, 1785000, 835.5},
        {"NVIDIA H200", 9, 0, 132, 1980000, 989.5},
        {"NVIDIA H200 NVL", 9, 0, 132, 1785000, 835.5},
        {"NVIDIA GH200 480GB", 9, 0, 132, 1980000, 989.5},
        {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410000, 312.0},
        {"NVIDIA A100-SXM4-40GB", 8, 0, 108, 1410000, 312.0},
        {"NVIDIA A100 80GB PCIe", 8, 0, 108, 1410000, 312.0},
        {"NVIDIA A100-PCIE-40GB", 8, 0, 108, 1410000, 312.0},
    };
    for (const Case& c : cases) {
        const DevicePeak p = device_bf16_peak(c.name, c.major, c.minor, c.sms, c.khz);
        CHECK(p.datasheet && near(p.flops, c.tflops * 1e12), "%s: %.1f TFLOP/s from '%s', datasheet %.1f", c.name,
              p.flops / 1e12, p.source, c.tflops);
    }
    // The reason for the table: the boost clock overstates an H100 SXM by ~8%.
    const double est = 4096.0 * 132 * 1980000 * 1e3;
    CHECK(est / 989.5e12 > 1.07, "H100 SXM estimate from the boost clock %.0f TFLOP/s (8%% above 989.5)", est / 1e12);
    // GH200 contains "H200": the more specific row must win.
    CHECK(std::string(device_bf16_peak("NVIDIA GH200 480GB", 9, 0, 132, 1980000).source).find("GH200") !=
              std::string::npos,
          "GH200 is matched as GH200, not as H200");
    // An H100 of no known form factor is not guessed from the table.
    const DevicePeak h = device_bf16_peak("NVIDIA H100", 9, 0, 132, 1755000);
    CHECK(!h.datasheet && near(h.flops, 4096.0 * 132 * 1755000 * 1e3), "bare 'H100': an estimate, %.1f TFLOP/s",
          h.flops / 1e12);
    // Unknown parts: SMs x clock x FLOPs per SM per clock, said to be an estimate.
    const DevicePeak l = device_bf16_peak("NVIDIA L40S", 8, 9, 142, 2520000);
    CHECK(!l.datasheet && near(l.flops, 1024.0 * 142 * 2520000 * 1e3), "L40S: estimate %.1f TFLOP/s", l.flops / 1e12);
    const DevicePeak u = device_bf16_peak("Some GPU", 7, 5, 40, 1590000);
    CHECK(u.flops == 0 && !u.datasheet, "an unknown architecture has no peak (no MFU printed): %.1f", u.flops);
}

static void test_launcher() {
    auto env = [](std::map<std::string, std::string> vars) {
        return [vars](const char* name) -> const char* {
            auto it = vars.find(name);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    };
    CHECK(!launched_by_mpi(env({})), "no launcher variables: not launched");
    CHECK(!launched_by_mpi(env({{"PATH", "/usr/bin"}, {"OMPI_MCA_btl", "self"}})),
          "Open MPI settings alone (OMPI_MCA_*) are not a launch");
    CHECK(!launched_by_mpi(env({{"OMPI_COMM_WORLD_SIZE", ""}})), "an empty variable is not a launch");
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID"})
        CHECK(launched_by_mpi(env({{v, "0"}})), "%s: launched", v);
}

// This process was not started by a launcher (the test tier runs it alone):
// with those variables removed, dist_init must leave MPI alone.
static void test_no_mpi_alone(int* argc, char*** argv) {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID"})
        unsetenv(v);
    dist_init(argc, argv);
#ifdef LLMC_MPI
    int init = 0;
    MPI_Initialized(&init);
    CHECK(!init, "dist_init without a launcher does not start MPI");
#endif
    CHECK(dist_world_size() == 1 && dist_world_rank() == 0 && dist_local_rank() == 0 && dist_local_size() == 1,
          "alone: a world of one");
    std::string err;
    CHECK(dist_all_ok(true, "", &err) && !dist_all_ok(false, "bad", &err) && err == "bad",
          "alone: agreement on errors needs no MPI");
    dist_finalize();
}

static void test_bias_route() {
    CHECK(!llmc_idx::bias_in_epilogue(0), "no bias: no epilogue");
    for (uintptr_t base : {(uintptr_t)0x10000, (uintptr_t)0x7f0000001000}) {
        for (int off = 0; off < 64; off += 2) {  // bf16 elements: 2-byte steps
            const bool want = off % 16 == 0;
            CHECK(llmc_idx::bias_in_epilogue(base + off) == want, "bias at +%d bytes: %s", off,
                  want ? "epilogue" : "separate kernel");
        }
    }
}

static void test_switches() {
    using llmc_switch::GeluFusion;
    std::string err;
    GeluFusion g = GeluFusion::both;
    CHECK(llmc_switch::parse_gelu_fusion(nullptr, &g, &err) && g == GeluFusion::none, "GELU fusion unset: none");
    CHECK(llmc_switch::parse_gelu_fusion("", &g, &err) && g == GeluFusion::none, "GELU fusion empty: none");
    CHECK(llmc_switch::parse_gelu_fusion("1", &g, &err) && g == GeluFusion::forward, "GELU fusion 1: forward");
    CHECK(llmc_switch::parse_gelu_fusion("2", &g, &err) && g == GeluFusion::both, "GELU fusion 2: both");
    for (const char* bad : {"3", "-1", "yes", "1 ", "01x"}) {
        err.clear();
        CHECK(!llmc_switch::parse_gelu_fusion(bad, &g, &err) && err.find("LLMC_GELU_FUSION") != std::string::npos &&
                  err.find(bad) != std::string::npos,
              "GELU fusion '%s' refused, naming the variable and the value: %s", bad, err.c_str());
    }
    bool on = true;
    CHECK(llmc_switch::parse_on_off("LLMC_BIAS_GRAD_EPILOGUE", nullptr, &on, &err) && !on, "on/off unset: off");
    CHECK(llmc_switch::parse_on_off("LLMC_BIAS_GRAD_EPILOGUE", "1", &on, &err) && on, "on/off 1: on");
    CHECK(llmc_switch::parse_on_off("LLMC_BIAS_GRAD_EPILOGUE", "0", &on, &err) && !on, "on/off 0: off");
    CHECK(llmc_switch::check_attention_switches(nullptr, nullptr, &err) &&
              llmc_switch::check_attention_switches("5", "0", &err) && llmc_switch::check_attention_switches("2", "1", &err),
          "attention switches: unset, 5/0 and 2/1 accepted");
    CHECK(!llmc_switch::check_attention_switches("4", nullptr, &err) && err.find("LLMC_ATTN_BWD='4'") == 0,
          "LLMC_ATTN_BWD=4 refused naming it: %s", err.c_str());
    CHECK(!llmc_switch::check_attention_switches(nullptr, "off", &err) && err.find("LLMC_ATTN_TC='off'") == 0,
          "LLMC_ATTN_TC=off refused naming it: %s", err.c_str());
    llmc_switch::AttnWg wgm = llmc_switch::AttnWg::both;
    CHECK(llmc_switch::parse_attn_wg(nullptr, &wgm, &err) && wgm == llmc_switch::AttnWg::off, "LLMC_ATTN_WG unset: off");
    CHECK(llmc_switch::parse_attn_wg("1", &wgm, &err) && wgm == llmc_switch::AttnWg::both,
          "LLMC_ATTN_WG=1: forward and backward");
    CHECK(llmc_switch::parse_attn_wg("fwd", &wgm, &err) && wgm == llmc_switch::AttnWg::forward,
          "LLMC_ATTN_WG=fwd: the forward alone");
    CHECK(llmc_switch::parse_attn_wg("det", &wgm, &err) && wgm == llmc_switch::AttnWg::deterministic,
          "LLMC_ATTN_WG=det: forward and backward, dq in a fixed order");
    CHECK(llmc_switch::parse_attn_wg("0", &wgm, &err) && wgm == llmc_switch::AttnWg::off, "LLMC_ATTN_WG=0: off");
    CHECK(!llmc_switch::parse_attn_wg("2", &wgm, &err) && err.find("LLMC_ATTN_WG='2'") == 0,
          "LLMC_ATTN_WG=2 refused naming the variable: %s", err.c_str());
    CHECK(!llmc_switch::parse_on_off("LLMC_CUDA_GRAPH", "yes", &on, &err) && err.find("LLMC_CUDA_GRAPH='yes'") == 0,
          "LLMC_CUDA_GRAPH=yes refused naming the variable: %s", err.c_str());
    for (const char* bad : {"2", "on", "true", "-1"}) {
        err.clear();
        CHECK(!llmc_switch::parse_on_off("LLMC_BIAS_GRAD_EPILOGUE", bad, &on, &err) &&
                  err.find("LLMC_BIAS_GRAD_EPILOGUE='") != std::string::npos,
              "on/off '%s' refused, naming the variable: %s", bad, err.c_str());
    }
    size_t bytes = 0;
    CHECK(llmc_switch::parse_gemm_workspace(nullptr, &bytes, &err) && bytes == (size_t)32 << 20,
          "workspace unset: 32 MiB");
    CHECK(llmc_switch::parse_gemm_workspace("128", &bytes, &err) && bytes == (size_t)128 << 20, "workspace 128 MiB");
    CHECK(llmc_switch::parse_gemm_workspace("1024", &bytes, &err) && bytes == (size_t)1 << 30, "workspace 1 GiB");
    for (const char* bad : {"0", "-5", "1025", "64MB", "1e3", " "}) {
        err.clear();
        CHECK(!llmc_switch::parse_gemm_workspace(bad, &bytes, &err) &&
                  err.find("LLMC_GEMM_WORKSPACE_MB") != std::string::npos,
              "workspace '%s' refused: %s", bad, err.c_str());
    }
    // GELU epilogue routing: rows (OC, the aux leading dimension) a multiple
    // of 8; out, aux and a bias 16-byte aligned. bf16 elements: 2-byte steps.
    const uintptr_t base = 0x7f0000001000;
    CHECK(llmc_switch::gelu_epilogue_fits(base, base + 4096, base + 8192, 3072), "d12 fc: aligned, 3072 rows");
    CHECK(llmc_switch::gelu_epilogue_fits(base, base + 4096, 0, 3072), "no bias: the aux-only epilogue");
    int wrong = 0;
    for (int off = 0; off < 32; off += 2) {
        const bool al = off % 16 == 0;
        wrong += llmc_switch::gelu_epilogue_fits(base + off, base + 4096, base + 8192, 768) != al;
        wrong += llmc_switch::gelu_epilogue_fits(base, base + 4096 + off, base + 8192, 768) != al;
        wrong += llmc_switch::gelu_epilogue_fits(base, base + 4096, base + 8192 + off, 768) != al;
    }
    CHECK(wrong == 0, "out, aux and bias each at every 2-byte offset: the epilogue only when 16-byte aligned (%d wrong)",
          wrong);
    for (long long rows : {1LL, 4LL, 97LL, 100LL, 3076LL, 0LL, -8LL})
        CHECK(!llmc_switch::gelu_epilogue_fits(base, base + 4096, 0, rows) == (rows <= 0 || rows % 8 != 0),
              "rows %lld: the epilogue only for a positive multiple of 8", rows);
    CHECK(!llmc_switch::gelu_epilogue_fits(0, base, 0, 64) && !llmc_switch::gelu_epilogue_fits(base, 0, 0, 64),
          "no output or no aux: never");
}

static void test_tolerances() {
    const double all[] = {tol::kCpuFp64,     tol::kCpuFp32,      tol::kFp32,
                          tol::kBf16Forward, tol::kBf16Grad,     tol::kBf16Steps,
                          tol::kBf16Kernel,  tol::kBf16Layout,   tol::kCurveFp32,
                          tol::kCurveBf16,   tol::kBf16TwoRoundings, tol::kFp32AttentionBackward,
                          tol::kSumSquaresRatio};
    bool ok = true;
    for (double t : all) ok = ok && t > 0 && t < 1;
    CHECK(ok, "every tolerance is in (0, 1)");
    CHECK(tol::kCpuFp64 < tol::kCpuFp32 && tol::kFp32 < tol::kBf16Kernel && tol::kBf16Forward <= tol::kBf16Grad,
          "tolerances grow with lower precision and with depth (fp64 < fp32 < bf16; forward <= gradients)");
}

int main(int argc, char** argv) {
    test_peaks();
    test_launcher();
    test_bias_route();
    test_switches();
    test_tolerances();
    test_no_mpi_alone(&argc, &argv);
    return check_summary();
}
