// llmc/backend/device_peaks.h: the dense bf16 tensor-core peak of a GPU, the
// denominator of MFU. Taken from the datasheet of the part the device's name
// says it is; a name the table does not know gets an estimate from the
// compute capability, SM count and clock, marked as an estimate (the
// clock the driver reports is the boost clock, which reads about 8% above
// what the datasheet's figure assumes on an H100 SXM, so the estimate is a
// fallback only). Plain C++ with no CUDA: the trainer, the kernel lab and the
// unit tests share it.
#pragma once
#include <string>

struct DevicePeak {
    double flops;        // dense bf16 FLOP/s with fp32 accumulation; 0 when unknown
    const char* source;  // which datasheet row, or "estimate ..."
    bool datasheet;      // false: estimated from the device's attributes
};

// name: cudaDeviceProp::name (e.g. "NVIDIA H100 80GB HBM3"); major, minor:
// the compute capability; sms: multiprocessors; clock_khz: the peak clock.
inline DevicePeak device_bf16_peak(const std::string& name, int major, int minor, int sms, double clock_khz) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    // Dense figures: NVIDIA's datasheets print bf16 tensor-core TFLOP/s with
    // sparsity; the dense rate is half of it. H100 SXM5 1979 -> 989.5, H100
    // NVL 1671 -> 835.5, H100 PCIe 1513 -> 756.5, H200 SXM 1979 -> 989.5,
    // H200 NVL 1671 -> 835.5, GH200 1979 -> 989.5; A100 (SXM and PCIe, 40 and
    // 80 GB) 312 dense. More specific names first: "GH200" contains "H200".
    struct Row {
        bool match;
        double tflops;
        const char* source;
    };
    const Row rows[] = {
        {has("GH200"), 989.5, "datasheet: GH200 (H100/H200 GPU), 989.5 TFLOP/s dense bf16"},
        {has("H200") && has("NVL"), 835.5, "datasheet: H200 NVL, 835.5 TFLOP/s dense bf16"},
        {has("H200"), 989.5, "datasheet: H200 SXM, 989.5 TFLOP/s dense bf16"},
        {has("H100") && has("NVL"), 835.5, "datasheet: H100 NVL, 835.5 TFLOP/s dense bf16"},
        {has("H100") && has("PCIe"), 756.5, "datasheet: H100 PCIe, 756.5 TFLOP/s dense bf16"},
        {has("H100") && (has("SXM") || has("HBM3")), 989.5, "datasheet: H100 SXM5, 989.5 TFLOP/s dense bf16"},
        {has("A100"), 312.0, "datasheet: A100 (SXM or PCIe, 40 or 80 GB), 312 TFLOP/s dense bf16"},
    };
    for (const Row& r : rows)
        if (r.match) return {r.tflops * 1e12, r.source, true};
    // Not in the table: dense bf16 FLOPs per SM per clock with fp32
    // accumulation (A100 312 TF = 108 SMs x 1.41 GHz x 2048; H100 SXM 989 TF
    // = 132 x 1.83 GHz x 4096; the sm_86/89 parts 1024; sm_100 8192).
    double per_sm_clk = 0;
    if (major == 8 && minor == 0) per_sm_clk = 2048;
    else if (major == 8) per_sm_clk = 1024;
    else if (major == 9) per_sm_clk = 4096;
    else if (major == 10) per_sm_clk = 8192;
    if (per_sm_clk == 0 || sms <= 0 || clock_khz <= 0) return {0.0, "unknown device: no MFU", false};
    return {per_sm_clk * sms * clock_khz * 1e3, "estimate: SMs x reported clock x dense bf16 FLOPs per SM per clock",
            false};
}
