// The CUDA backend's GEMM: row-major C = alpha * op(A) @ op(B) + beta * C (+ bias per column),
// on cuBLASLt, for any mix of f32 / bf16 / f16 operands. The matmul op is a thin shell over it;
// the fused LM-head cross-entropy (and later other ops) call it for their inner GEMMs; its FP8
// sibling gemm_fp8_rowmajor is matmul_fp8's.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per device by shape,
// leading dimensions, dtypes, transposes, bias and pointer alignment, so a repeated call costs a
// hash lookup and the cuBLASLt launch. Everything runs on the default stream, without host
// synchronisation: capturable in a CUDA graph once the plan exists.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace surogate::cuda {

// A row-major matrix in device memory: `ld` is the row stride in elements (>= its column count).
struct GemmMatrix {
  const void* ptr = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
};

// C[M,N] = alpha * op(A) @ op(B) + beta * C + bias[N] (row-major). op(A) is [M,K]: A is stored
// [M,K], or [K,M] with ta; op(B) is [K,N]: B is stored [K,N], or [N,K] with tb. beta == 0 never
// reads C (NaNs in it do not propagate). bias may be null. C must not overlap A, B or bias.
// A pair of f32 / bf16 / f16 that cuBLASLt has no kernel for is widened to f32 in scratch first.
// `op` names the caller in errors; `device` is the CUDA device index every pointer lives on.
Status gemm_rowmajor(const char* op, int device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const GemmMatrix& A, const GemmMatrix& B, float beta, const GemmMatrix& C,
                     const void* bias = nullptr, DType bias_dtype = DType::kF32);

// The FP8 GEMM of matmul_fp8 (cuda/fp8.cu): C[M,N] = alpha * a_scale * b_scale * (A @ B^T) +
// beta * C + bias[N], A [M,K] and B [N,K] row-major float8_e4m3fn / float8_e5m2 (not both e5m2),
// both K-major as Hopper's FP8 kernels take them (cuBLASLt's "TN"); a_scale / b_scale are device
// pointers to one f32 each (the quantizer's scale_inv, never read on the host); f32 accumulation
// and compute, C f32 / bf16 / f16. The caller has checked that M, N and K are multiples of 16.
Status gemm_fp8_rowmajor(const char* op, int device, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A,
                         const float* a_scale, const GemmMatrix& B, const float* b_scale, float beta,
                         const GemmMatrix& C, const void* bias = nullptr, DType bias_dtype = DType::kF32);

// dst[r, c] = src[r, c] (or dst += src with accumulate) for a rows x cols block, converting dtypes
// (f32 math). Both are row-major with their own leading dimensions.
Status cast_matrix(const char* op, const GemmMatrix& src, const GemmMatrix& dst, int64_t rows, int64_t cols,
                   bool accumulate = false);

}  // namespace surogate::cuda
