// Row-major f32 GEMM for the CPU kernels (OpenBLAS sgemm underneath), and the conversions
// between storage dtypes and f32 that kernels use to feed it bf16 / f16 operands.
//
// OpenBLAS threads each call itself, so call gemm_f32 from the kernel's own thread, never from
// inside parallel_for; the conversions are serial and meant to be split over rows by the caller.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

// Compile a hot loop once per x86-64 level (AVX-512, AVX2+FMA+F16C, SSE2) and pick one at load
// time: the binary stays portable (no -march=native) and still runs wide vectors where it can.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SG_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SG_CPU_CLONES
#endif

namespace surogate::cpu {

// C[M,N] = alpha * op(A) @ op(B) + beta * C, all row-major f32. op(A) is [M,K]: A is stored
// [M,K] (or [K,M] when trans_a) with row stride lda; op(B) is [K,N]: B is stored [K,N] (or
// [N,K] when trans_b) with row stride ldb. beta == 0 ignores C's old contents, NaN included.
// Fails, naming `op`, when a size does not fit OpenBLAS's 32-bit integers.
Status gemm_f32(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// True for the storage dtypes the helpers below take: f32, bf16, f16.
inline bool is_gemm_dtype(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

// dst[i] = src[i] for n contiguous elements of storage dtype dt, widened to f32.
void to_f32(const void* src, DType dt, float* dst, int64_t n);
// dst[i] = src[i] rounded (to nearest even) to dt.
void from_f32(const float* src, void* dst, DType dt, int64_t n);
// dst[i] = round(dst[i] + src[i]): accumulate an f32 result into bf16 / f16 / f32 storage.
void add_from_f32(const float* src, void* dst, DType dt, int64_t n);

}  // namespace surogate::cpu
