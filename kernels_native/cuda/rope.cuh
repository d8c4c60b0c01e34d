// The RoPE pieces that the CUDA rope ops (cuda/norm_rope_act_rope.cu) and the serving op
// qkv_rope_cache (cuda/qkv_rope_cache.cu) share, so that both round alike: the rope attributes
// with inv_freq (parsed on the host once for both backends, runtime/op_checks_rope.cpp), the cos / sin of a (token, frequency)
// pair (one at a time, or a token's row into shared memory) and the rotation of a pair. The
// formulas and rounding order are cpu/rope.cpp's.
//
// inv_freq travels to a kernel as a by-value parameter (no copy, no host sync, capturable in a
// CUDA graph), which caps half = rotary_dim / 2 at kMaxHalf.
#pragma once

#include <cstdint>

#include "cuda/norm_rope_act.cuh"
#include "runtime/op_checks_rope.h"

namespace surogate::cuda::nra {

inline constexpr int kMaxHalf = 512;

struct InvFreq {
  float f[kMaxHalf];
};

struct RopeConfig {
  int64_t rotary_dim = 0;
  float attention_factor = 1.0f;
  InvFreq inv{};
};

// The parsed rope attributes (runtime/op_checks_rope.h) as a kernel parameter; an error naming
// `op` when rotary_dim is above the kernels' limit (2 kMaxHalf).
Status device_rope(const char* op, const RopeAttrs& r, RopeConfig* cfg);

// The parameter table into shared memory once per block (indexing a kernel parameter with a
// per-thread index would serialize on the constant cache).
__device__ __forceinline__ void load_inv_freq(const InvFreq& inv, float* fr, int64_t half) {
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) fr[i] = inv.f[i];
}

// cos and sin of token position p at frequency f, in cpu/rope.cpp's build_table order: the f32
// angle p f, its sincos in f64, each rounded to f32, times attention_factor, rounded to T.
// (Below |angle| 2^31 sincos reduces with a three-part Cody-Waite; its slow path beyond is the
// 40-byte stack frame ptxas reports for the kernels that use this.)
template <typename T>
__device__ __forceinline__ void cos_sin(float f, int32_t p, float af, float* c, float* s) {
  const double angle = static_cast<double>(static_cast<float>(p) * f);  // the f32 product, as HF
  double sd, cd;
  sincos(angle, &sd, &cd);
  *c = rnd<T>(static_cast<float>(cd) * af);
  *s = rnd<T>(static_cast<float>(sd) * af);
}

// cs[0, half) = cos, cs[half, 2 half) = sin of token position p, the block's threads in turn.
template <typename T>
__device__ __forceinline__ void fill_cos_sin(const float* fr, int32_t p, float af, float* cs, int64_t half) {
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) cos_sin<T>(fr[i], p, af, cs + i, cs + half + i);
}

// (y1, y2) = (T(T(a c) - T(b sn)), T(T(b c) + T(a sn))). __fmul_rn keeps the products apart from
// the add / subtract (no FMA), so f32 results round like the CPU's.
template <typename T>
__device__ __forceinline__ void rotate(float a, float b, float c, float sn, T* y1, T* y2) {
  *y1 = st<T>(rnd<T>(__fmul_rn(a, c)) - rnd<T>(__fmul_rn(b, sn)));
  *y2 = st<T>(rnd<T>(__fmul_rn(b, c)) + rnd<T>(__fmul_rn(a, sn)));
}

}  // namespace surogate::cuda::nra
