// llmc/backend/cpu_gemm_bf16.h: the matrix product of the CPU bf16 backend:
// bf16 operands, fp32 result. Two paths: AVX-512 BF16 dot products
// (vdpbf16ps) straight on the bf16 operands, where the CPU has them; else
// the operands widened to fp32 (exact) and cpu::gemm (OpenBLAS sgemm). The
// second is what the project's AVX2-only machines run, so it stays the
// default everywhere the first is missing.
#pragma once
#include <cstdint>

// Whether the CPU has AVX-512 BF16 (and the OS saves the AVX-512 registers).
bool cpu_bf16_dot_supported();
// Whether gemm_bf16 takes the AVX-512 BF16 path: the CPU has it and the
// environment does not turn it off (LLMC_CPU_BF16_DOT=0). Read at each call.
bool cpu_bf16_dot_available();

// Row-major C = alpha·op(A)·op(B) + beta·C, as cpu::gemm: op(A) is M x K
// (A stored K x M when ta), op(B) is K x N (B stored N x K when tb), C is
// M x N in fp32; A and B hold bf16 bit patterns (llmc/base/dtype.h). With
// beta == 0, C is not read. Deterministic: each C element is summed in one
// fixed order whatever the thread count. Picks the path by
// cpu_bf16_dot_available().
void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda, const uint16_t* B,
               int ldb, float beta, float* C, int ldc);
// The AVX-512 BF16 path (throws std::logic_error where the CPU lacks it).
void gemm_bf16_dot(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                   const uint16_t* B, int ldb, float beta, float* C, int ldc);
// The portable path: op(A) and op(B) widened to fp32, then cpu::gemm.
void gemm_bf16_widened(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                       const uint16_t* B, int ldb, float beta, float* C, int ldc);
