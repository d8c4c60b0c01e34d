// The decode fast path of the CUDA matmul: y[M, N] = alpha x[M, K] W[N, K]^T + beta y + bias[N]
// for a few rows of x (M <= 16), bf16 or f16 operands, on tensor cores and without cuBLASLt.
// cuda/matmul.cu asks can_gemv and otherwise calls gemm_rowmajor; cuda/gemv.cu holds the design.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "cuda/matmul_gemm.h"

namespace surogate::cuda {

// Whether gemv takes this call of gemm_rowmajor's arguments: op(A) = A (no trans_a), op(B) = B^T
// (trans_b: W stored [N, K]), 1 <= M <= 16, N < 2^30, K < 2^30 a positive multiple of 8, A and B
// of one dtype (bf16 or f16) with 16-byte aligned bases and row strides; C and bias of any float
// dtype and C of any row stride. False for every call when SUROGATE_NO_GEMV is set (read once; a
// debug and benchmark switch).
bool can_gemv(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B);

// gemm_rowmajor's contract for the calls can_gemv accepts: beta == 0 never reads C, bias may be
// null, C must not overlap A, B or bias. One kernel launch on current_stream(), no allocation:
// capturable in a CUDA graph (the first call per CTA size also asks the occupancy API once).
Status gemv(const char* op, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A, const GemmMatrix& B,
            float beta, const GemmMatrix& C, const void* bias, DType bias_dtype);

}  // namespace surogate::cuda
