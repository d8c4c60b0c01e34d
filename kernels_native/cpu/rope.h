// The RoPE pieces that the rope ops (cpu/rope.cpp) and the serving op qkv_rope_cache
// (cpu/qkv_rope_cache.cpp) share, so that both round exactly alike: the rope attributes and
// inv_freq, the cos/sin table, the rotation and the per-head RMSNorm's sum of squares. The
// formulas and the rounding order are written down in cpu/rope.cpp's header.
//
// N tokens, R = rotary_dim, half = R / 2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_rope.h"

namespace surogate::cpu {

inline constexpr int64_t kRopeGrainElems = 1 << 14;  // elements of work per parallel chunk, at least

// x rounded to T and back (no-op for float). bf16 stays in 32-bit lanes (same bits as
// load(store<bf16_t>(x)), NaN included) so that the loops using it vectorize without packing.
template <typename T> inline float rnd(float x) { return load(store<T>(x)); }
template <> inline float rnd<bf16_t>(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
  return bits_f32(r & 0xffff0000u);
}
// f16 the same way (without F16C, _Float16 conversions are library calls): 13 mantissa bits
// dropped for normal values, the 2^-24 grid below 2^-14 (f32 add of 0.75, whose ulp is 2^-24),
// beyond 65504 infinity, NaN quieted as f32 -> f16 -> f32 does.
template <> inline float rnd<f16_t>(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t a = u & 0x7fffffffu, sign = u & 0x80000000u;
  uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  normal = normal > 0x477fe000u ? 0x7f800000u : normal;
  const uint32_t sub = f32_bits((bits_f32(a) + 0.75f) - 0.75f);
  const uint32_t r = a > 0x7f800000u ? (a | 0x400000u) & 0xffffe000u : a < 0x38800000u ? sub : normal;
  return bits_f32(r | sign);
}

// The rope attributes with inv_freq (runtime/op_checks_rope.h: parse_rope).
using RopeConfig = RopeAttrs;

// cos/sin rows, each [R]: cos[half] then sin[half], already rounded to T.
struct CosSinTable {
  Tensor buf;
  int64_t first_pos = 0;
  bool by_position = false;
  const float* row(const float* base, int64_t n, int32_t p, int64_t R) const {
    return base + (by_position ? p - first_pos : n) * R;
  }
};

// One row per position of [min pos, max pos] when that range is shorter than N (packed
// documents restarting at 0, batches of equal sequences), else one row per token.
template <typename T>
Status build_table(const RopeConfig& cfg, const int32_t* pos, int64_t N, CosSinTable* t) {
  const int64_t R = cfg.rotary_dim, half = R / 2;
  int64_t lo = 0, hi = -1;
  if (N > 0) {
    lo = hi = pos[0];
    for (int64_t n = 1; n < N; ++n) {
      lo = std::min<int64_t>(lo, pos[n]);
      hi = std::max<int64_t>(hi, pos[n]);
    }
  }
  t->by_position = hi - lo + 1 < N;
  t->first_pos = lo;
  const int64_t rows = t->by_position ? hi - lo + 1 : N;
  SG_RETURN_IF_ERROR(empty({std::max<int64_t>(rows, 1), R}, DType::kF32, Device{}, &t->buf));
  float* base = t->buf.ptr<float>();
  const float* f = cfg.inv_freq.data();
  const float af = cfg.attention_factor;
  const bool by_pos = t->by_position;
  parallel_for(0, rows, std::max<int64_t>(1, kRopeGrainElems / (8 * R)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float p = static_cast<float>(by_pos ? lo + r : pos[r]);
      float* c = base + r * R;
      float* s = c + half;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p * f[i]);  // the f32 product, as HF
        c[i] = rnd<T>(static_cast<float>(std::cos(angle)) * af);
        s[i] = rnd<T>(static_cast<float>(std::sin(angle)) * af);
      }
    }
  });
  return Status::OK();
}

// y1 = T(T(a c) - T(b s)), y2 = T(T(b c) + T(a s)) with s = sign * sin: the rotation of the pair
// (a, b) in HF's rounding order. y1, y2 do not overlap a, b (callers stage inputs in scratch).
template <typename T>
inline void rotate_pairs(const float* __restrict a, const float* __restrict b, const float* __restrict c,
                         const float* __restrict s, float sign, T* __restrict y1, T* __restrict y2, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float sn = sign * s[i];
    y1[i] = store<T>(rnd<T>(a[i] * c[i]) - rnd<T>(b[i] * sn));
    y2[i] = store<T>(rnd<T>(b[i] * c[i]) + rnd<T>(a[i] * sn));
  }
}

template <typename T>
inline void load_row(const T* __restrict x, float* __restrict v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = load(x[i]);
}

inline float sum_squares(const float* __restrict v, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += v[i + k] * v[i + k];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += v[i] * v[i];
  return s;
}

// One head of qk_norm_rope_fwd: xs = the head's D values in f32, w = the weight in f32;
// nb is [D] scratch. Returns rstd = 1 / sqrt(sum(x^2) / D + eps); y = rope(T(w T(x rstd))), or with
// a weight offset o != 0 (Gemma's `1 + w`) y = rope(T(x rstd (w + o))).
template <typename T>
inline float norm_rope_head(const float* __restrict xs, const float* __restrict w, float eps, const float* c,
                            int64_t D, int64_t R, float* __restrict nb, T* __restrict y, float offset = 0.0f) {
  const int64_t half = R / 2;
  const float r = 1.0f / std::sqrt(sum_squares(xs, D) / static_cast<float>(D) + eps);
  if (offset == 0.0f) {  // Qwen3RMSNorm: x rstd rounded to T, then times w
    for (int64_t j = 0; j < D; ++j) nb[j] = rnd<T>(rnd<T>(xs[j] * r) * w[j]);
  } else {  // Gemma3RMSNorm: x rstd (w + offset) in f32, rounded once (cpu/norm.cpp's two orders)
    for (int64_t j = 0; j < D; ++j) nb[j] = rnd<T>(xs[j] * r * (w[j] + offset));
  }
  rotate_pairs(nb, nb + half, c, c + half, 1.0f, y, y + half, half);
  for (int64_t j = R; j < D; ++j) y[j] = store<T>(nb[j]);
  return r;
}

}  // namespace surogate::cpu
