// The FP8 training ops' argument checks and the scale rule, shared by cpu/fp8.cpp and
// cuda/fp8.cu (the fp8_hybrid recipe: surogate/compile/fp8.py).
//
//   quantize_fp8  (x[R,C] f32/bf16/f16, rows may be strided) -> (q[R,C], or [C,R] with transpose,
//                 float8_e4m3fn | float8_e5m2 (q's dtype is the format), scale_inv f32 [1],
//                 [amax_history f32 [H + 1], read and rewritten]); attrs transpose, roll
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
// Current scaling (no history): amax is this tensor's. Delayed scaling (an amax_history of H + 1
// values): [0] is the largest amax of this run's uses so far (NaN winning), [1..H] those of the
// last H runs, newest first. A site's first quantize of a run (attr roll, placed by the lowering)
// first shifts the history by one run ([0] into [1], the oldest out, [0] zeroed). The amax the
// scale comes from is the largest of [1..H] (NaN entries skipped), or this tensor's while they hold
// only zeros (the first run); then this tensor's amax goes into [0]. So every use of a site in one
// run takes the same scale from the runs before it, and a block recomputed in the backward, or an
// MLP run chunk by chunk, quantizes as its forward did; ranks that max-reduce their histories
// elementwise after a step hold a one-rank run's. All deterministic (a max does not depend on order).
#pragma once
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
  int64_t H = 0;        // the runs an amax history holds (its length less one), 0: current scaling
  bool roll = false;    // the history moves on by one run first (a site's first quantize of a run)
};
Status check_quantize_fp8(const OpArgs& a, QuantizeFp8Args* r);

#if defined(__CUDACC__)
#define SG_FP8_FN __host__ __device__ inline
#else
#define SG_FP8_FN inline
#endif

// Delayed scaling's rule above, on hist[0..H]: the amax the scale comes from, given this tensor's.
SG_FP8_FN float delayed_amax(float now, float* hist, int64_t H, bool roll) {
  if (roll) {
    for (int64_t i = H; i > 0; --i) hist[i] = hist[i - 1];
    hist[0] = 0.0f;
  }
  float m = 0.0f;
  for (int64_t i = 1; i <= H; ++i) {
    if (!(hist[i] != hist[i]) && hist[i] > m) m = hist[i];  // (x != x: NaN, in host and device code alike)
  }
  hist[0] = (now != now || hist[0] != hist[0]) ? now + hist[0] : (now > hist[0] ? now : hist[0]);
  return m > 0.0f ? m : now;
}

struct MatmulFp8Args {
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const Tensor* bias = nullptr;
};
Status check_matmul_fp8(const OpArgs& a, MatmulFp8Args* r);

}  // namespace surogate
