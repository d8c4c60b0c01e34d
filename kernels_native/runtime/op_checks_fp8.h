// The FP8 training ops' argument checks and the scale rule, shared by cpu/fp8.cpp and
// cuda/fp8.cu (the fp8_hybrid recipe: surogate/compile/fp8.py).
//
//   quantize_fp8  (x[R,C] f32/bf16/f16, rows may be strided) -> (q[R,C], or [C,R] with transpose,
//                 float8_e4m3fn | float8_e5m2 (q's dtype is the format), scale_inv f32 [1],
//                 [amax_history f32 [H], read and rewritten]); attr transpose
//   matmul_fp8    (a[M,K] fp8, a_scale_inv f32 [1], b[N,K] fp8, b_scale_inv f32 [1], [bias[N]])
//                 -> (c[M,N] f32/bf16/f16 = alpha a_scale_inv b_scale_inv (a @ b^T) + beta c + bias);
//                 attrs alpha, beta. Both operands K-major (the TN layout Hopper's FP8 GEMMs take);
//                 e5m2 x e5m2 is refused, as cuBLASLt has no such kernel.
//
// The scale (TransformerEngine's per-tensor scaling): scale = FP8_MAX / amax with FP8_MAX 448
// (e4m3) or 57344 (e5m2), capped at FLT_MAX, and 1 where amax is 0; q = sat(x * scale) rounded
// to nearest even, finite overflow and +-inf saturating to +-FP8_MAX, NaN kept (the OCP
// "satfinite" conversion: core/dtype.h's _sat variants, PTX cvt.rn.satfinite); scale_inv =
// 1 / scale, which the GEMM multiplies back. amax is max |x| with NaN winning, so a NaN anywhere
// makes the whole quantized tensor NaN (and an inf makes scale 0: inf * 0 = NaN): a broken step
// shows in the loss instead of being saturated away.
//
// Current scaling (no history): amax is this tensor's. Delayed scaling (an amax_history of H
// values, newest first): amax is the history's largest (NaN entries skipped), or this tensor's
// while the history holds only zeros (its first use); then the history shifts by one and this
// tensor's amax goes in front. Both are deterministic (a max does not depend on order).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

struct QuantizeFp8Args {
  int64_t R = 0, C = 0;
  int64_t ld = 0;  // x's row stride, in elements
  bool transpose = false;
  bool e5m2 = false;    // q's format
  float fp8_max = 0.0f;
  int64_t H = 0;        // amax history length, 0: current scaling
};
Status check_quantize_fp8(const OpArgs& a, QuantizeFp8Args* r);

struct MatmulFp8Args {
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const Tensor* bias = nullptr;
};
Status check_matmul_fp8(const OpArgs& a, MatmulFp8Args* r);

}  // namespace surogate
