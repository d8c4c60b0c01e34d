// The serving fusions of a matmul with the op that feeds it, on CUDA: gated_matmul and
// add_rmsnorm_matmul (runtime/fused_matmul.h: the contract, the checks and the composition).
// Where gemv takes the matmul in its resident-x regime (can_gemv_fused: a decode step's few rows,
// K <= 4096), one gemv launch makes its x operand in a prologue (cuda/gemv.cu); otherwise the
// composition runs: the feeding op's kernel into scratch, then matmul (itself gemv or cuBLASLt).
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/gemv.h"
#include "runtime/fused_matmul.h"

namespace surogate::cuda {

namespace {

GemmMatrix matrix(const Tensor& t) { return GemmMatrix{t.data, t.dtype, t.strides[0]}; }

Status gated_matmul(const OpArgs& a) {
  GatedMatmulDims d;
  SG_RETURN_IF_ERROR(check_gated_matmul(a, &d));
  GemvPrologue pro;
  pro.x = d.gelu ? GemvX::kGeluTanh : GemvX::kSilu;
  // x is the gate half of gu: K = F columns of a row of stride 2F, the up half F columns further on.
  const GemmMatrix gu = matrix(a.in(0)), W = matrix(a.in(1));
  if (!can_gemv_fused(pro, d.M, d.N, d.F, gu, W)) return gated_matmul_unfused(a);
  const Tensor* bias = a.has_in(2) ? &a.in(2) : nullptr;
  return gemv("gated_matmul", d.M, d.N, d.F, 1.0f, gu, W, 0.0f, matrix(a.out(0)), bias ? bias->data : nullptr,
              bias ? bias->dtype : DType::kF32, pro);
}

Status add_rmsnorm_matmul(const OpArgs& a) {
  NormMatmulDims d;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_matmul(a, &d));
  GemvPrologue pro;
  pro.x = GemvX::kRmsNorm;
  if (a.has_in(1)) {
    pro.residual = a.in(1).data;
    pro.ld_residual = a.in(1).strides[0];
  }
  pro.norm_w = a.in(2).data;
  pro.norm_w_dtype = a.in(2).dtype;
  if (a.has_out(1)) {
    pro.h = a.out(1).data;
    pro.ld_h = a.out(1).strides[0];
  }
  pro.eps = d.eps;
  pro.weight_offset = d.weight_offset;
  const GemmMatrix x = matrix(a.in(0)), W = matrix(a.in(3));
  if (!can_gemv_fused(pro, d.M, d.N, d.K, x, W)) return add_rmsnorm_matmul_unfused(a);
  const Tensor* bias = a.has_in(4) ? &a.in(4) : nullptr;
  return gemv("add_rmsnorm_matmul", d.M, d.N, d.K, 1.0f, x, W, 0.0f, matrix(a.out(0)), bias ? bias->data : nullptr,
              bias ? bias->dtype : DType::kF32, pro);
}

}  // namespace

void register_cuda_fused_matmul(OpRegistry& reg) {
  add_op(reg, "gated_matmul", gated_matmul);
  add_op(reg, "add_rmsnorm_matmul", add_rmsnorm_matmul);
}

}  // namespace surogate::cuda
