// The gated activations' math on CUDA, the one copy that swiglu_fwd / geglu_fwd and their
// backwards (norm_rope_act_gated.cu) and gemv's gated_matmul prologue (gemv.cu) share. The formulas
// and why they take this form are cpu/activation.cpp's: gelu_tanh as g s(2z), p (1 - p) as
// 1 / (2 + e + 1/e), so both tails stay accurate; exp is CUDA's expf (within 2 ulp, as the CPU's).
#pragma once

#include "cuda/common.cuh"

namespace surogate::cuda {

// p (1 - p) for p = s(v), given e = exp(-v); exact in both tails (1 - p cancels, e * p is inf * 0).
__device__ __forceinline__ float sigmoid_slope(float e) { return 1.0f / (2.0f + e + 1.0f / e); }

struct Silu {
  static __device__ __forceinline__ float act(float g) { return g / (1.0f + expf(-g)); }
  // d act / d g, and act into *a, from one exp.
  static __device__ __forceinline__ float grad(float g, float* a) {
    const float e = expf(-g);
    const float p = 1.0f / (1.0f + e);
    *a = g * p;
    return p + g * sigmoid_slope(e);
  }
};

struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCoeff = 0.044715f;
  static __device__ __forceinline__ float act(float g) {
    const float z = kSqrt2OverPi * (g + kCoeff * g * g * g);
    return g / (1.0f + expf(-2.0f * z));
  }
  static __device__ __forceinline__ float grad(float g, float* a) {
    const float g2 = g * g;
    const float z = kSqrt2OverPi * (g + kCoeff * g2 * g);
    const float e = expf(-2.0f * z);
    const float p = 1.0f / (1.0f + e);
    *a = g * p;
    return p + 2.0f * g * sigmoid_slope(e) * kSqrt2OverPi * (1.0f + 3.0f * kCoeff * g2);
  }
};

// The exact GELU (act_mul's act "gelu", nn.GELU()): cpu/activation.cpp's GeluErf, CUDA's erff / expf.
struct GeluErf {
  static constexpr float kInvSqrt2 = 0.70710678118654752f;
  static constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  static __device__ __forceinline__ float act(float g) { return 0.5f * g * (1.0f + erff(g * kInvSqrt2)); }
  static __device__ __forceinline__ float grad(float g, float* a) {
    const float cdf = 0.5f * (1.0f + erff(g * kInvSqrt2));
    *a = g * cdf;
    return cdf + g * kInvSqrt2Pi * expf(-0.5f * g * g);
  }
};

}  // namespace surogate::cuda
