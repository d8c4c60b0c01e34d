// The serving fusions of a matmul with the op that feeds it: the contract, the argument checks
// both backends share, and the unfused composition (the CPU op, and the CUDA op's fallback).
// Forward only; serving graphs (surogate/dsl/nn.py, mode "serve") use them, training graphs do not.
//
// Shape letters: M rows (tokens), N output features, K the inner dim (F for gated_matmul).
//
//   gated_matmul        (gu[M, 2F], W[N, F], [bias[N]]) -> (y[M, N]); attr act = "silu" | "gelu_tanh"
//                         y = act(gate) * up @ W^T (+ bias), gu = [gate, up]:
//                         swiglu_fwd (silu) or geglu_fwd (gelu_tanh), then matmul (trans_b)
//   add_rmsnorm_matmul  (x[M, K], [residual[M, K]], w[K], W[N, K], [bias[N]]) -> (y[M, N], [h[M, K]]);
//                         attrs eps, weight_offset (as add_rmsnorm_fwd)
//                         h = x + residual, y = rmsnorm(h) w @ W^T (+ bias): add_rmsnorm_fwd, then
//                         matmul. Without a residual (a model's first layer) it is rmsnorm_fwd of x,
//                         and h must be absent (it would be x itself); h may also be absent when
//                         not needed.
// The results are the composition's, with its roundings to the storage dtype (the activation and
// the normed row are stored in it between the two ops): the CPU runs the composition itself;
// CUDA's fused gemv path computes the same formulas, up to expf's and the sum of squares' order
// in the last bits. Every tensor is contiguous; y and h must not overlap the inputs (CUDA's fused
// path writes h while other blocks still read x and residual).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct GatedMatmulDims {
  int64_t M = 0, N = 0, F = 0;
  bool gelu = false;  // act = "gelu_tanh" (else "silu")
};

struct NormMatmulDims {
  int64_t M = 0, N = 0, K = 0;
  float eps = 1e-6f, weight_offset = 0.0f;
};

Status check_gated_matmul(const OpArgs& a, GatedMatmulDims* d);
Status check_add_rmsnorm_matmul(const OpArgs& a, NormMatmulDims* d);

// The ops as their parts, on the tensors' device: the feeding op into scratch, then matmul.
Status gated_matmul_unfused(const OpArgs& a);
Status add_rmsnorm_matmul_unfused(const OpArgs& a);

}  // namespace surogate
