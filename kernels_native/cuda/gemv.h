// The decode fast path of the CUDA matmul: y[M, N] = alpha x[M, K] W[N, K]^T + beta y + bias[N]
// for a few rows of x (M <= 16), bf16 or f16 operands, on tensor cores and without cuBLASLt.
// cuda/matmul.cu asks can_gemv and otherwise calls gemm_rowmajor; cuda/gemv.cu holds the design.
// cuda/fused_matmul.cu asks can_gemv_fused and has gemv make x from the op that feeds the matmul.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "cuda/matmul_gemm.h"

namespace surogate::cuda {

// What gemv's x operand is made of. kPlain: x = A. The others are the serving fusions of
// runtime/fused_matmul.h, computed in a prologue once per CTA with the composition's formulas:
//   kSilu / kGeluTanh: A is gu [M, 2K] (a row's gate, then its up; row stride A.ld), and
//     x = T(T(act(gate)) up), as swiglu_fwd / geglu_fwd;
//   kRmsNorm: x = rmsnorm(h) w with h = T(A + residual) (or h = A without a residual), as
//     add_rmsnorm_fwd / rmsnorm_fwd; CTA 0 stores h when `h` is given.
enum class GemvX { kPlain, kSilu, kGeluTanh, kRmsNorm };

struct GemvPrologue {
  GemvX x = GemvX::kPlain;
  const void* residual = nullptr;  // kRmsNorm: [M, K] in A's dtype, row stride ld_residual; may be null
  int64_t ld_residual = 0;
  const void* norm_w = nullptr;  // kRmsNorm: [K], any float dtype
  DType norm_w_dtype = DType::kF32;
  void* h = nullptr;  // kRmsNorm: [M, K] in A's dtype, row stride ld_h; null: not stored
  int64_t ld_h = 0;
  float eps = 1e-6f, weight_offset = 0.0f;
};

// Whether gemv takes this call of gemm_rowmajor's arguments: op(A) = A (no trans_a), op(B) = B^T
// (trans_b: W stored [N, K]), 1 <= M <= 16, N < 2^30, K < 2^30 a positive multiple of 8, A and B
// of one dtype (bf16 or f16) with 16-byte aligned bases and row strides; C and bias of any float
// dtype and C of any row stride. False for every call when SUROGATE_NO_GEMV is set (read once; a
// debug and benchmark switch).
bool can_gemv(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B);

// can_gemv (no trans_a, trans_b) and the prologue's own bounds: K <= 4096 (x resident in
// registers, so the prologue runs once per CTA), residual and h 16-byte aligned with row strides
// a multiple of 8, and the CTA's staging of x in shared memory within the device's limit.
bool can_gemv_fused(const GemvPrologue& pro, int64_t M, int64_t N, int64_t K, const GemmMatrix& A,
                    const GemmMatrix& B);

// gemm_rowmajor's contract for the calls can_gemv (with a prologue: can_gemv_fused) accepts:
// beta == 0 never reads C, bias may be null, C must not overlap A, B or bias (nor h, nor the
// prologue's inputs). One kernel launch on current_stream(), no allocation: capturable in a CUDA
// graph (the first call per kernel and CTA size also asks the occupancy API once).
Status gemv(const char* op, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A, const GemmMatrix& B,
            float beta, const GemmMatrix& C, const void* bias, DType bias_dtype, const GemvPrologue& pro = {});

}  // namespace surogate::cuda
