// The matmul and LM head + cross-entropy ops' argument checks and attributes, shared by
// cpu/matmul.cpp, cpu/cross_entropy.cpp and cuda/matmul.cu.
//   matmul          (A, B, [bias[N]]) -> (C = alpha op(A) op(B) + beta C + bias); op(A) [M, K], op(B) [K, N].
//                   A may be 3-D [B, T, K] without trans_a; 2-D operands may be row-strided.
//   lm_head_ce_fwd  (h[N,C], W[V,C], targets[N] i32) -> (loss[N] f32, lse[N] f32)
//   lm_head_ce_bwd  (h, W, targets, lse, dloss[N] f32) -> (dh[N,C], [dW[V,C]])
// The targets' values (in [0, V) or ignore_index) are host memory on the CPU (which checks them)
// and device memory on CUDA.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct MatmulArgs {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  const Tensor* bias = nullptr;  // the optional bias
};
Status check_matmul(const OpArgs& a, MatmulArgs* d);

struct LmHeadCeArgs {
  int64_t N = 0, C = 0, V = 0;
  int64_t ignore_index = -100;
  float eps = 0.0f;       // attr label_smoothing
  int64_t chunk = 4096;   // vocab rows per GEMM step
  float cap = 0.0f;       // attr softcap: 0 none
  bool accumulate = false;     // backward: add into dW
  const Tensor* dW = nullptr;  // backward's optional dW
};
Status check_lm_head_ce_fwd(const OpArgs& a, LmHeadCeArgs* r);
Status check_lm_head_ce_bwd(const OpArgs& a, LmHeadCeArgs* r);

}  // namespace surogate
