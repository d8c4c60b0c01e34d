// Row quantizers for the GGML block types (declared in core/gguf_types.h).
//
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: gguf-py's quantize, bit for bit (its Q8_0 is also llama.cpp's).
// The arithmetic is written in numpy's order, f32 throughout, no fused multiply-add.
//
// Q2_K..Q6_K: llama.cpp's reference quantizers (quantize_row_*_ref in ggml-quants.c, which is
// also what llama-quantize runs without an importance matrix), re-derived here:
//   - Q4_K, Q5_K: per 32-value sub-block an asymmetric (scale, min) fit minimizing a weighted
//     squared error, weights |x| + rms(sub-block), over a grid of candidate scales around
//     (max - min) / nmax (make_qkx2_quants); then the 8 scales and 8 mins are quantized to
//     6 bits against the super-block's largest, and the values re-quantized with those.
//   - Q2_K: the same fit on 16-value sub-blocks, weights |x|, absolute error, 4-bit scales.
//   - Q6_K: symmetric per 16 values, the scale chosen among 19 candidates around max/32 by
//     x^2-weighted least squares (make_qx_quants), 8-bit scales.
//   - Q3_K: symmetric per 16 values, x^2-weighted least squares refined by coordinate descent
//     on single quants (make_q3_quants), 6-bit scales.
// Q8_K: llama.cpp's quantize_row_q8_K_ref (scale -max/127, bsums per 16).
// Past 400 lines on purpose: the three scale searches are shared by the K quantizers below them.
#include <algorithm>
#include <cmath>

#include "core/gguf_types.h"

namespace surogate::gguf {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// ---- gguf-py's legacy quantizers -----------------------------------------------------------

// Index of the first value of largest magnitude (numpy's argmax of abs).
int argmax_abs(const float* x, int n) {
  int imax = 0;
  float amax = std::fabs(x[0]);
  for (int j = 1; j < n; ++j) {
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); imax = j; }
  }
  return imax;
}

void min_max(const float* x, int n, float* mn, float* mx) {
  *mn = x[0];
  *mx = x[0];
  for (int j = 1; j < n; ++j) {
    *mn = std::min(*mn, x[j]);
    *mx = std::max(*mx, x[j]);
  }
}

float inverse(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

void q_q8_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = inverse(d);
    store_half(b, d);
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

// MXFP4: gguf-py's MXFP4.quantize_blocks (llama.cpp's quantize_row_mxfp4_ref): e = floor(log2
// amax) - 2 + 127 (log2 in f32, as numpy computes it on the f32 block maximum), d = e8m0 half
// scale, each value the first code whose d * code is nearest.
void q_mxfp4(const float* x, uint8_t* b, int64_t nb) {
  static const int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 17) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127) : 0;
    const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
    float d;
    std::memcpy(&d, &bits, 4);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
      int best = 0;
      float err = std::fabs(d * static_cast<float>(kValues[0]) - x[j]);
      for (int k = 1; k < 16; ++k) {
        const float ek = std::fabs(d * static_cast<float>(kValues[k]) - x[j]);
        if (ek < err) err = ek, best = k;
      }
      q[j] = static_cast<uint8_t>(best);
    }
    b[0] = e;
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

void q_q4_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 18) {
    const float d = x[argmax_abs(x, 32)] / -8.0f;
    const float id = inverse(d);
    store_half(b, d);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
      b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void q_q4_1(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 20) {
    float mn, mx;
    min_max(x, 32, &mn, &mx);
    const float d = (mx - mn) / 15.0f;
    const float id = inverse(d);
    store_half(b, d);
    store_half(b + 2, mn);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>((x[j] - mn) * id + 0.5f));
      const int hi = std::min(15, static_cast<int>((x[j + 16] - mn) * id + 0.5f));
      b[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Q5: low nibbles as in Q4, the fifth bit of value j in bit j of qh.
void pack_q5(const int* q, uint8_t* qh_out, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}

void q_q5_0(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 22) {
    const float d = x[argmax_abs(x, 32)] / -16.0f;
    const float id = inverse(d);
    store_half(b, d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    pack_q5(q, b + 2, b + 6);
  }
}

void q_q5_1(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, b += 24) {
    float mn, mx;
    min_max(x, 32, &mn, &mx);
    const float d = (mx - mn) / 31.0f;
    const float id = inverse(d);
    store_half(b, d);
    store_half(b + 2, mn);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>((x[j] - mn) * id + 0.5f));
    pack_q5(q, b + 4, b + 8);
  }
}

// ---- llama.cpp's scale searches ------------------------------------------------------------

// Asymmetric fit x ~ scale * L + min, L in [0, nmax], minimizing sum w * err (err = |diff| with
// use_mad, diff^2 otherwise). Tries iscale = (nmax + rmin + rdelta * is) / (max - min) for
// is = 0..nstep, each followed by the closed-form least-squares (scale, min) for its L.
// Returns the scale; *neg_min = -min (>= 0: min is clamped to <= 0).
float make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep, bool use_mad) {
  float mn = x[0], mx = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    std::fill(L, L + n, 0);
    *neg_min = -mn;
    return 0.0f;
  }
  float iscale = nmax / (mx - mn);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax));
    const float diff = scale * L[i] + mn - x[i];
    best_err += w[i] * (use_mad ? std::fabs(diff) : diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (mx - mn);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * Laux[i] + this_min - x[i];
      err += w[i] * (use_mad ? std::fabs(diff) : diff * diff);
    }
    if (err < best_err) {
      std::copy(Laux, Laux + n, L);
      best_err = err;
      scale = this_scale;
      mn = this_min;
    }
  }
  *neg_min = -mn;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L - nmax in [-nmax, nmax - 1], weights x^2: the scale
// of largest (sum w x l)^2 / (sum w l^2) among iscale = -(nmax + 0.1 is) / max, is = -9..9.
// (llama.cpp's make_qx_quants with rmse_type 1 and no importance weights.)
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float mx = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); mx = x[i]; }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2, bool write) {
    *sumlx = 0;
    *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      if (write) L[i] = static_cast<int8_t>(l + nmax);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  float sumlx, suml2;
  fit(-nmax / mx, &sumlx, &suml2, true);
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(nmax + 0.1f * is) / mx;
    fit(iscale, &sumlx, &suml2, false);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      fit(iscale, &sumlx, &suml2, true);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric fit for Q3_K: start from iscale = -nmax / max, then up to 5 sweeps that move single
// quants to their best level while the x^2-weighted least-squares error falls.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float mx = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); mx = x[i]; }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  const float iscale = -nmax / mx;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx <= 0) continue;
      float sl2 = suml2 - w * L[i] * L[i];
      const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      slx += w * x[i] * new_l;
      sl2 += w * new_l * new_l;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<int8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++n_changed;
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

// Low 2 bits of 128 values into 32 bytes: byte l holds values l, l+32, l+64, l+96.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>((L[j + l] & 3) | ((L[j + l + 32] & 3) << 2) | ((L[j + l + 64] & 3) << 4) |
                                           ((L[j + l + 96] & 3) << 6));
    }
  }
}

// ---- K types ---------------------------------------------------------------------------------

void q_q2_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 84) {
    uint8_t* sc = b;
    uint8_t L[QK_K], Laux[16];
    float w[16], scales[16], mins[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    std::memset(sc, 0, 16);
    store_half(b + 80, 0.0f);
    store_half(b + 82, 0.0f);
    if (max_scale > 0) {
      const float iscale = 15.0f / max_scale;
      for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      store_half(b + 80, max_scale / 15.0f);
    }
    if (max_min > 0) {
      const float iscale = 15.0f / max_min;
      for (int j = 0; j < 16; ++j) sc[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      store_half(b + 82, max_min / 15.0f);
    }
    const float d = load_half(b + 80), dmin = load_half(b + 82);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * (sc[j] & 0xF);
      if (dl == 0.0f) continue;
      const float ml = dmin * (sc[j] >> 4);
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + l] + ml) / dl), 0, 3));
    }
    pack_2bit(L, b + 16);
  }
}

void q_q3_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 110) {
    uint8_t* hmask = b;
    uint8_t* sc = b + 96;
    int8_t L[QK_K];
    float scales[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) { amax = std::fabs(scales[j]); max_scale = scales[j]; }
    }
    std::memset(sc, 0, 12);
    store_half(b + 108, 0.0f);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32;
        if (j < 8) sc[j] = static_cast<uint8_t>(l & 0xF);
        else sc[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
        sc[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      }
      store_half(b + 108, 1 / iscale);
    }
    const float d = load_half(b + 108);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * k3_scale(j, sc);
      if (dl == 0.0f) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + l] / dl), -4, 3) + 4);
    }
    // High bit (value >= 4) of value e goes to bit e/32 of hmask[e%32].
    std::memset(hmask, 0, 32);
    uint8_t Lu[QK_K];
    for (int e = 0; e < QK_K; ++e) {
      if (L[e] > 3) hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
      Lu[e] = static_cast<uint8_t>(L[e] & 3);
    }
    pack_2bit(Lu, b + 32);
  }
}

// Shared by Q4_K and Q5_K: fits of 8 sub-blocks of 32, 6-bit scales and mins, final levels in L.
void fit_k4(const float* x, int nmax, float rmin, int nstep, uint8_t* b, uint8_t* L) {
  uint8_t Laux[32];
  float w[32], scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* s = b + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(63, nearest_int(inv_min * mins[j]));
    if (j < 4) {
      s[j] = static_cast<uint8_t>(ls);
      s[j + 4] = static_cast<uint8_t>(lm);
    } else {
      s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  store_half(b, max_scale / 63.0f);
  store_half(b + 2, max_min / 63.0f);
  const float d = load_half(b), dmin = load_half(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k4_scale_min(j, s, &sc, &m);
    const float dl = d * sc;
    if (dl == 0.0f) continue;
    const float ml = dmin * m;
    for (int l = 0; l < 32; ++l) L[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + ml) / dl), 0, nmax));
  }
}

void q_q4_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 144) {
    uint8_t L[QK_K];
    fit_k4(x, 15, -1.0f, 20, b, L);
    uint8_t* qs = b + 16;
    for (int j = 0; j < QK_K; j += 64, qs += 32) {
      for (int l = 0; l < 32; ++l) qs[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void q_q5_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 176) {
    uint8_t L[QK_K];
    fit_k4(x, 31, -0.5f, 15, b, L);
    uint8_t* qh = b + 16;
    uint8_t* qs = b + 48;
    std::memset(qh, 0, 32);
    for (int j = 0; j < QK_K; j += 64, qs += 32) {
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[j + l], l2 = L[j + l + 32];
        qh[l] |= static_cast<uint8_t>(((l1 >> 4) << (j / 32)) | ((l2 >> 4) << (j / 32 + 1)));
        qs[l] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
      }
    }
  }
}

void q_q6_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 210) {
    int8_t L[QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_qx_quants(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) { max_abs_scale = std::fabs(scales[j]); max_scale = scales[j]; }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(b, 0, 210);
      continue;
    }
    int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
    const float iscale = -128.0f / max_scale;
    store_half(b + 208, 1 / iscale);
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
    const float d = load_half(b + 208);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * sc[j];
      if (dl == 0.0f) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + l] / dl), -32, 31) + 32);
    }
    uint8_t* ql = b;
    uint8_t* qh = b + 128;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

void q_q8_k(const float* x, uint8_t* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K, b += 292) {
    float mx = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); mx = x[j]; }
    }
    std::memset(b, 0, 292);
    if (amax == 0.0f) continue;
    const float iscale = -127.0f / mx;
    int8_t* qs = reinterpret_cast<int8_t*>(b + 4);
    for (int j = 0; j < QK_K; ++j) qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int16_t sum = 0;
      for (int l = 0; l < 16; ++l) sum = static_cast<int16_t>(sum + qs[16 * j + l]);
      std::memcpy(b + 260 + 2 * j, &sum, 2);
    }
    const float d = 1 / iscale;
    std::memcpy(b, &d, 4);
  }
}

}  // namespace

Status quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  int64_t bytes;
  SG_RETURN_IF_ERROR(row_bytes(t, n, &bytes));
  const int64_t nb = n / type_info(t)->block_size;
  uint8_t* b = static_cast<uint8_t*>(dst);
  switch (t) {
    case GgmlType::F32: std::memcpy(b, src, n * 4); break;
    case GgmlType::F16: for (int64_t i = 0; i < n; ++i) store_half(b + 2 * i, src[i]); break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(b + 2 * i, &h, 2);
      }
      break;
    case GgmlType::Q8_0: q_q8_0(src, b, nb); break;
    case GgmlType::Q4_0: q_q4_0(src, b, nb); break;
    case GgmlType::Q4_1: q_q4_1(src, b, nb); break;
    case GgmlType::Q5_0: q_q5_0(src, b, nb); break;
    case GgmlType::Q5_1: q_q5_1(src, b, nb); break;
    case GgmlType::Q2_K: q_q2_k(src, b, nb); break;
    case GgmlType::Q3_K: q_q3_k(src, b, nb); break;
    case GgmlType::Q4_K: q_q4_k(src, b, nb); break;
    case GgmlType::Q5_K: q_q5_k(src, b, nb); break;
    case GgmlType::Q6_K: q_q6_k(src, b, nb); break;
    case GgmlType::Q8_K: q_q8_k(src, b, nb); break;
    case GgmlType::MXFP4: q_mxfp4(src, b, nb); break;
    default:
      return SG_ERROR(StatusCode::kUnsupported, str_cat("unsupported GGUF type ", type_name(t), " for quantization"),
                      "this build quantizes to F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, Q8_K, MXFP4");
  }
  return Status::OK();
}

}  // namespace surogate::gguf
