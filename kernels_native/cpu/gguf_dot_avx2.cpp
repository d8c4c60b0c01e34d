// AVX2 integer dot products of GGML weight rows with Q8-style activations (cpu/gguf_dot.h).
//
// One kernel, templated on a decoder per type. A decoder takes a block (32 or 256 values) and
// yields, per 32 values, the int8 quants in one register, the f32 scale of each half (lanes 0-3
// scale values 0-15, lanes 4-7 values 16-31: the int32 lanes of madd), and the block's additive
// term (the min of Q4_K, or the -8 offset of Q4_0 folded into one: value = scale * q + min).
// Unsigned quants (0..63) go straight into maddubs(u8 w, s8 x); signed ones (Q8_0, the IQ4 code
// book) use |w| and sign(x, w). The 32 quants are decoded once and dotted with all N rows.
//
// Compiled for AVX2+FMA+F16C only; dot_avx2_supported() checks the CPU at run time.
// Also here: the exact f32 decode of whole blocks (sgemm panels, gguf_dequantize) and f32 dot
// products for F16 / BF16 weights. Past 400 lines on purpose: thirteen small decoders and the
// loops that use them read best side by side, one block layout per struct.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/cpu_features.h"
#include "cpu/gguf_dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SG_DOT_AVX2 1
#endif

namespace surogate::cpu {

using gguf::GgmlType;

#ifdef SG_DOT_AVX2

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace {

inline float h2f(const uint8_t* p) { return _cvtsh_ss(gguf::load_u16(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// Scale s0 for lanes 0-3 (values 0-15), s1 for lanes 4-7 (values 16-31).
inline __m256 halves(float s0, float s1) { return _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)); }
// 16 bytes -> 32 nibbles: low nibbles are values 0-15, high nibbles 16-31.
inline __m256i nibbles(__m128i v) {
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// Bit j of `bits` -> 0x10 in byte j (the fifth bit of Q5_0 / Q5_1 quants).
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}
inline __m256i shr_and(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}
// 8 bytes -> 8 floats times d.
inline __m256 u8x8_to_f32(uint64_t v, float d) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(v)))),
                       _mm256_set1_ps(d));
}

// Additive terms: acc += sum over 16s (or 32s) of min * (d * sum of x quants).
enum class Min { kNone, kPer32, kPer16, kPerBlock };

// ---- decoders ---------------------------------------------------------------------------------
// Each: kValues, kBytes, kSigned, kMin, kOffset; constructor from the block; group(g) -> 32
// quants; scale(g) -> 8 lanes. Per-32 / per-16 mins in mn[]; per-block min in mn[0]. A type
// stored with an offset (Q4_0: value = d * (q - 8)) keeps q unsigned for maddubs and has
// min = -kOffset * scale for the dot; the f32 decoder subtracts kOffset instead, as gguf-py does.

struct DecQ4_0 {
  static constexpr int kOffset = 8;
  static constexpr int kValues = 32, kBytes = 18;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPerBlock;
  const uint8_t* b;
  float d, mn[1];
  explicit DecQ4_0(const uint8_t* p) : b(p), d(h2f(p)) { mn[0] = -8.0f * d; }
  __m256i group(int) const { return nibbles(load128(b + 2)); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

struct DecQ4_1 {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 32, kBytes = 20;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPerBlock;
  const uint8_t* b;
  float d, mn[1];
  explicit DecQ4_1(const uint8_t* p) : b(p), d(h2f(p)) { mn[0] = h2f(p + 2); }
  __m256i group(int) const { return nibbles(load128(b + 4)); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

struct DecQ5_0 {
  static constexpr int kOffset = 16;
  static constexpr int kValues = 32, kBytes = 22;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPerBlock;
  const uint8_t* b;
  float d, mn[1];
  explicit DecQ5_0(const uint8_t* p) : b(p), d(h2f(p)) { mn[0] = -16.0f * d; }
  __m256i group(int) const { return _mm256_or_si256(nibbles(load128(b + 6)), bits_to_bytes(gguf::load_u32(b + 2))); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

struct DecQ5_1 {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 32, kBytes = 24;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPerBlock;
  const uint8_t* b;
  float d, mn[1];
  explicit DecQ5_1(const uint8_t* p) : b(p), d(h2f(p)) { mn[0] = h2f(p + 2); }
  __m256i group(int) const { return _mm256_or_si256(nibbles(load128(b + 8)), bits_to_bytes(gguf::load_u32(b + 4))); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

struct DecQ8_0 {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 32, kBytes = 34;
  static constexpr bool kSigned = true;
  static constexpr Min kMin = Min::kNone;
  const uint8_t* b;
  float d, mn[1] = {0};
  explicit DecQ8_0(const uint8_t* p) : b(p), d(h2f(p)) {}
  __m256i group(int) const { return load256(b + 2); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

inline __m256i iq4_lookup(__m128i packed) {
  const __m128i kv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIQ4NLValues));
  return _mm256_shuffle_epi8(_mm256_set_m128i(kv, kv), nibbles(packed));
}

struct DecIQ4_NL {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 32, kBytes = 18;
  static constexpr bool kSigned = true;
  static constexpr Min kMin = Min::kNone;
  const uint8_t* b;
  float d, mn[1] = {0};
  explicit DecIQ4_NL(const uint8_t* p) : b(p), d(h2f(p)) {}
  __m256i group(int) const { return iq4_lookup(load128(b + 2)); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

// Q2_K: scales[16] (scale | min << 4), qs[64], d, dmin. Value = d*sc*q - dmin*m, q in 0..3.
struct DecQ2_K {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 256, kBytes = 84;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPer16;
  const uint8_t* b;
  alignas(32) float sc[16], mn[16];
  explicit DecQ2_K(const uint8_t* p) : b(p) {
    const float d = h2f(p + 80), dmin = -h2f(p + 82);
    const __m128i s = load128(p);
    const __m128i lo = _mm_and_si128(s, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0F));
    _mm256_store_ps(sc, u8x8_to_f32(_mm_cvtsi128_si64(lo), d));
    _mm256_store_ps(sc + 8, u8x8_to_f32(_mm_extract_epi64(lo, 1), d));
    _mm256_store_ps(mn, u8x8_to_f32(_mm_cvtsi128_si64(hi), dmin));
    _mm256_store_ps(mn + 8, u8x8_to_f32(_mm_extract_epi64(hi, 1), dmin));
  }
  __m256i group(int g) const { return shr_and(load256(b + 16 + 32 * (g / 4)), 2 * (g % 4), 3); }
  __m256 scale(int g) const { return halves(sc[2 * g], sc[2 * g + 1]); }
};

// Q3_K: hmask[32], qs[64], scales[12], d. Value = d*(s-32)*(q - 4), q = low 2 bits | hmask bit << 2.
struct DecQ3_K {
  static constexpr int kOffset = 4;
  static constexpr int kValues = 256, kBytes = 110;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPer16;
  const uint8_t* b;
  __m256i hm;
  alignas(32) float sc[16], mn[16];
  explicit DecQ3_K(const uint8_t* p) : b(p), hm(load256(p)) {
    // 16 six-bit scales: low nibbles in bytes 0-7 (scales 0-7) and their high nibbles (8-15),
    // the top 2 bits of scale j in byte 8 + j%4 at bit 2*(j/4).
    uint32_t a, bb, c;
    std::memcpy(&a, p + 96, 4);
    std::memcpy(&bb, p + 100, 4);
    std::memcpy(&c, p + 104, 4);
    const uint32_t m4 = 0x0F0F0F0F, m2 = 0x03030303;
    const __m128i s6 = _mm_set_epi32(static_cast<int>(((bb >> 4) & m4) | (((c >> 6) & m2) << 4)),
                                     static_cast<int>(((a >> 4) & m4) | (((c >> 4) & m2) << 4)),
                                     static_cast<int>((bb & m4) | (((c >> 2) & m2) << 4)),
                                     static_cast<int>((a & m4) | ((c & m2) << 4)));
    const __m128i s = _mm_sub_epi8(s6, _mm_set1_epi8(32));
    const __m256 d = _mm256_set1_ps(h2f(p + 108));
    const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), d);
    const __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), d);
    _mm256_store_ps(sc, s0);
    _mm256_store_ps(sc + 8, s1);
    _mm256_store_ps(mn, _mm256_mul_ps(s0, _mm256_set1_ps(-4.0f)));
    _mm256_store_ps(mn + 8, _mm256_mul_ps(s1, _mm256_set1_ps(-4.0f)));
  }
  __m256i group(int g) const {
    const __m256i lo = shr_and(load256(b + 32 + 32 * (g / 4)), 2 * (g % 4), 3);
    return _mm256_or_si256(lo, _mm256_slli_epi16(shr_and(hm, g, 1), 2));
  }
  __m256 scale(int g) const { return halves(sc[2 * g], sc[2 * g + 1]); }
};

// Q4_K / Q5_K scales: 12 bytes -> 8 six-bit scales and 8 six-bit mins, four per 32-bit word.
inline void k4_scales(const uint8_t* q, uint64_t* sc, uint64_t* mn) {
  uint32_t a, b, c;
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  const uint32_t s_lo = a & 0x3F3F3F3F, m_lo = b & 0x3F3F3F3F;
  const uint32_t s_hi = (c & 0x0F0F0F0F) | (((a >> 6) & 0x03030303) << 4);
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0F) | (((b >> 6) & 0x03030303) << 4);
  *sc = s_lo | (static_cast<uint64_t>(s_hi) << 32);
  *mn = m_lo | (static_cast<uint64_t>(m_hi) << 32);
}

struct DecQ4_K {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 256, kBytes = 144;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPer32;
  const uint8_t* b;
  alignas(32) float sc[8], mn[8];
  explicit DecQ4_K(const uint8_t* p) : b(p) {
    uint64_t s, m;
    k4_scales(p + 4, &s, &m);
    _mm256_store_ps(sc, u8x8_to_f32(s, h2f(p)));
    _mm256_store_ps(mn, u8x8_to_f32(m, -h2f(p + 2)));
  }
  __m256i group(int g) const { return shr_and(load256(b + 16 + 32 * (g / 2)), 4 * (g % 2), 0x0F); }
  __m256 scale(int g) const { return _mm256_set1_ps(sc[g]); }
};

struct DecQ5_K {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 256, kBytes = 176;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPer32;
  const uint8_t* b;
  __m256i qh;
  alignas(32) float sc[8], mn[8];
  explicit DecQ5_K(const uint8_t* p) : b(p), qh(load256(p + 16)) {
    uint64_t s, m;
    k4_scales(p + 4, &s, &m);
    _mm256_store_ps(sc, u8x8_to_f32(s, h2f(p)));
    _mm256_store_ps(mn, u8x8_to_f32(m, -h2f(p + 2)));
  }
  __m256i group(int g) const {
    const __m256i lo = shr_and(load256(b + 48 + 32 * (g / 2)), 4 * (g % 2), 0x0F);
    return _mm256_or_si256(lo, _mm256_slli_epi16(shr_and(qh, g, 1), 4));
  }
  __m256 scale(int g) const { return _mm256_set1_ps(sc[g]); }
};

// Q6_K: ql[128], qh[64], scales[16] int8, d. Value = d*s*(q - 32), q in 0..63.
struct DecQ6_K {
  static constexpr int kOffset = 32;
  static constexpr int kValues = 256, kBytes = 210;
  static constexpr bool kSigned = false;
  static constexpr Min kMin = Min::kPer16;
  const uint8_t* b;
  alignas(32) float sc[16], mn[16];
  explicit DecQ6_K(const uint8_t* p) : b(p) {
    const float d = h2f(p + 208);
    const __m128i s = load128(p + 192);
    const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), _mm256_set1_ps(d));
    const __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), _mm256_set1_ps(d));
    _mm256_store_ps(sc, s0);
    _mm256_store_ps(sc + 8, s1);
    _mm256_store_ps(mn, _mm256_mul_ps(s0, _mm256_set1_ps(-32.0f)));
    _mm256_store_ps(mn + 8, _mm256_mul_ps(s1, _mm256_set1_ps(-32.0f)));
  }
  __m256i group(int g) const {
    const int half = g / 4, quarter = g % 4;
    const __m256i lo = shr_and(load256(b + 64 * half + 32 * (quarter % 2)), 4 * (quarter / 2), 0x0F);
    const __m256i hi = shr_and(load256(b + 128 + 32 * half), 2 * quarter, 3);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
  __m256 scale(int g) const { return halves(sc[2 * g], sc[2 * g + 1]); }
};

struct DecQ8_K {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 256, kBytes = 292;
  static constexpr bool kSigned = true;
  static constexpr Min kMin = Min::kNone;
  const uint8_t* b;
  float d, mn[1] = {0};
  explicit DecQ8_K(const uint8_t* p) : b(p) { std::memcpy(&d, p, 4); }
  __m256i group(int g) const { return load256(b + 4 + 32 * g); }
  __m256 scale(int) const { return _mm256_set1_ps(d); }
};

// IQ4_XS: d, scales_h, scales_l[4], qs[128]; 8 sub-blocks of 32 with 6-bit scales (minus 32).
struct DecIQ4_XS {
  static constexpr int kOffset = 0;
  static constexpr int kValues = 256, kBytes = 136;
  static constexpr bool kSigned = true;
  static constexpr Min kMin = Min::kNone;
  const uint8_t* b;
  alignas(32) float sc[8], mn[1] = {0};
  explicit DecIQ4_XS(const uint8_t* p) : b(p) {
    const float d = h2f(p);
    const uint16_t sh = gguf::load_u16(p + 2);
    for (int j = 0; j < 8; ++j) {
      const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      sc[j] = d * static_cast<float>(ls - 32);
    }
  }
  __m256i group(int g) const { return iq4_lookup(load128(b + 8 + 16 * g)); }
  __m256 scale(int g) const { return _mm256_set1_ps(sc[g]); }
};

// ---- the kernel -------------------------------------------------------------------------------

inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// kN (1..4) rows of x against weight rows [m_lo, m_hi): the accumulators stay in registers.
// kA accumulators per row, used round-robin over the groups of 32, so that few rows still
// keep several FMA chains in flight (one chain waits ~4 cycles per group).
template <class D, int kN>
void rows(const uint8_t* W, int64_t row_bytes, const QuantizedX& x, int64_t m_lo, int64_t m_hi, float* y,
          int64_t ldy) {
  constexpr int64_t N = kN;
  constexpr int kA = kN == 1 ? 4 : kN == 2 ? 2 : 1;
  const int64_t K = x.K, G = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t m = m_lo; m < m_hi; ++m) {
    __m256 acc[kN][kA];
    float macc[kN];
    for (int64_t n = 0; n < N; ++n) {
      for (int a = 0; a < kA; ++a) acc[n][a] = _mm256_setzero_ps();
      macc[n] = 0.0f;
    }
    const uint8_t* b = W + m * row_bytes;
    for (int64_t k0 = 0; k0 < K; k0 += D::kValues, b += D::kBytes) {
      const D dec(b);
      const int64_t g0 = k0 / 32;
      for (int g = 0; g < D::kValues / 32; ++g) {
        const __m256i w = dec.group(g);
        const __m256 s = dec.scale(g);
        const __m256i wu = D::kSigned ? _mm256_sign_epi8(w, w) : w;
        const int a_i = static_cast<int>((g0 + g) % kA);
        for (int64_t n = 0; n < N; ++n) {
          __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + n * K + 32 * (g0 + g)));
          if constexpr (D::kSigned) a = _mm256_sign_epi8(a, w);
          const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wu, a), ones));
          acc[n][a_i] = _mm256_fmadd_ps(p, _mm256_mul_ps(s, _mm256_broadcast_ss(x.d + n * G + g0 + g)), acc[n][a_i]);
        }
      }
      const int a_m = static_cast<int>(g0 % kA);
      for (int64_t n = 0; n < N; ++n) {
        if constexpr (D::kMin == Min::kPer32) {
          acc[n][a_m] = _mm256_fmadd_ps(_mm256_load_ps(dec.mn), _mm256_loadu_ps(x.s32 + n * G + g0), acc[n][a_m]);
        } else if constexpr (D::kMin == Min::kPer16) {
          const float* s16 = x.s16 + n * 2 * G + 2 * g0;
          acc[n][a_m] = _mm256_fmadd_ps(_mm256_load_ps(dec.mn), _mm256_loadu_ps(s16), acc[n][a_m]);
          acc[n][a_m] = _mm256_fmadd_ps(_mm256_load_ps(dec.mn + 8), _mm256_loadu_ps(s16 + 8), acc[n][a_m]);
        } else if constexpr (D::kMin == Min::kPerBlock) {
          macc[n] += dec.mn[0] * x.s32[n * G + g0];
        }
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      __m256 sum = acc[n][0];
      for (int a = 1; a < kA; ++a) sum = _mm256_add_ps(sum, acc[n][a]);
      y[n * ldy + m] = hsum(sum) + macc[n];
    }
  }
}

// One block to f32, equal to core/gguf_types.cpp's decoder bit for bit: the same products in
// the same order (scale * (q - offset), then + min), each rounded; the empty asm keeps the
// compiler from fusing the multiply and the add into an FMA.
template <class D>
void decode_block(const uint8_t* b, float* y) {
  const D dec(b);
  for (int g = 0; g < D::kValues / 32; ++g) {
    __m256i w = dec.group(g);
    if constexpr (D::kOffset != 0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(D::kOffset));
    const __m256 s = dec.scale(g);  // lanes 0-3: values 0-15, lanes 4-7: values 16-31
    const __m256 s_lo = _mm256_permute2f128_ps(s, s, 0x00), s_hi = _mm256_permute2f128_ps(s, s, 0x11);
    const __m128i w_lo = _mm256_castsi256_si128(w), w_hi = _mm256_extracti128_si256(w, 1);
    const __m128i parts[4] = {w_lo, _mm_srli_si128(w_lo, 8), w_hi, _mm_srli_si128(w_hi, 8)};
    for (int k = 0; k < 4; ++k) {
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), k < 2 ? s_lo : s_hi);
      if constexpr (D::kMin != Min::kNone && D::kOffset == 0) {
        const int h = D::kMin == Min::kPer16 ? 2 * g + k / 2 : D::kMin == Min::kPer32 ? g : 0;
        __asm__("" : "+x"(v));
        v = _mm256_add_ps(v, _mm256_set1_ps(dec.mn[h]));
      }
      _mm256_storeu_ps(y + 32 * g + 8 * k, v);
    }
  }
}

template <class D>
void decode_rows(const uint8_t* b, int64_t n_blocks, float* y) {
  for (int64_t i = 0; i < n_blocks; ++i) decode_block<D>(b + i * D::kBytes, y + i * D::kValues);
}

// Plain float types: F16 through F16C (exact), BF16 by a shift.
void decode_f16(const uint8_t* b, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(load128(b + 2 * i)));
  for (; i < n; ++i) y[i] = gguf::half_to_float(gguf::load_u16(b + 2 * i));
}

void decode_bf16(const uint8_t* b, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(b + 2 * i)), 16);
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(v));
  }
  for (; i < n; ++i) y[i] = bits_f32(static_cast<uint32_t>(gguf::load_u16(b + 2 * i)) << 16);
}

using DecodeFn = void (*)(const uint8_t*, int64_t, float*);

DecodeFn decode_fn(GgmlType t) {
  switch (t) {
    case GgmlType::F16: return decode_f16;
    case GgmlType::BF16: return decode_bf16;
    case GgmlType::Q4_0: return decode_rows<DecQ4_0>;
    case GgmlType::Q4_1: return decode_rows<DecQ4_1>;
    case GgmlType::Q5_0: return decode_rows<DecQ5_0>;
    case GgmlType::Q5_1: return decode_rows<DecQ5_1>;
    case GgmlType::Q8_0: return decode_rows<DecQ8_0>;
    case GgmlType::IQ4_NL: return decode_rows<DecIQ4_NL>;
    case GgmlType::Q2_K: return decode_rows<DecQ2_K>;
    case GgmlType::Q3_K: return decode_rows<DecQ3_K>;
    case GgmlType::Q4_K: return decode_rows<DecQ4_K>;
    case GgmlType::Q5_K: return decode_rows<DecQ5_K>;
    case GgmlType::Q6_K: return decode_rows<DecQ6_K>;
    case GgmlType::Q8_K: return decode_rows<DecQ8_K>;
    case GgmlType::IQ4_XS: return decode_rows<DecIQ4_XS>;
    default: return nullptr;
  }
}

// ---- F16 / BF16 weights: f32 dot products, each 8 weights widened in a register ------------------

inline __m256 widen8(const uint8_t* p, bool bf16) {
  return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16))
              : _mm256_cvtph_ps(load128(p));
}

template <bool kBF16, int kN>
void float_rows(const uint8_t* W, int64_t K, const float* x, int64_t m_lo, int64_t m_hi, float* y, int64_t ldy) {
  for (int64_t m = m_lo; m < m_hi; ++m) {
    const uint8_t* w = W + m * K * 2;
    __m256 acc[kN][2];
    for (int n = 0; n < kN; ++n) acc[n][0] = acc[n][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256 w0 = widen8(w + 2 * k, kBF16), w1 = widen8(w + 2 * k + 16, kBF16);
      for (int n = 0; n < kN; ++n) {
        acc[n][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + n * K + k), acc[n][0]);
        acc[n][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + n * K + k + 8), acc[n][1]);
      }
    }
    for (int n = 0; n < kN; ++n) {
      float tail = 0.0f;
      for (int64_t j = k; j < K; ++j) {
        const uint16_t h = gguf::load_u16(w + 2 * j);
        tail += (kBF16 ? bits_f32(static_cast<uint32_t>(h) << 16) : gguf::half_to_float(h)) * x[n * K + j];
      }
      y[n * ldy + m] = hsum(_mm256_add_ps(acc[n][0], acc[n][1])) + tail;
    }
  }
}

using FloatRowsFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <bool kBF16>
FloatRowsFn pick_float(int64_t n) {
  switch (n) {
    case 1: return float_rows<kBF16, 1>;
    case 2: return float_rows<kBF16, 2>;
    case 3: return float_rows<kBF16, 3>;
    default: return float_rows<kBF16, 4>;
  }
}

using RowsFn = void (*)(const uint8_t*, int64_t, const QuantizedX&, int64_t, int64_t, float*, int64_t);

template <class D>
RowsFn pick(int64_t n) {
  switch (n) {
    case 1: return rows<D, 1>;
    case 2: return rows<D, 2>;
    case 3: return rows<D, 3>;
    default: return rows<D, 4>;
  }
}

// The kernel for type t and a block of n (1..4) rows of x; nullptr when t has none.
RowsFn rows_fn(GgmlType t, int64_t n) {
  switch (t) {
    case GgmlType::Q4_0: return pick<DecQ4_0>(n);
    case GgmlType::Q4_1: return pick<DecQ4_1>(n);
    case GgmlType::Q5_0: return pick<DecQ5_0>(n);
    case GgmlType::Q5_1: return pick<DecQ5_1>(n);
    case GgmlType::Q8_0: return pick<DecQ8_0>(n);
    case GgmlType::IQ4_NL: return pick<DecIQ4_NL>(n);
    case GgmlType::Q2_K: return pick<DecQ2_K>(n);
    case GgmlType::Q3_K: return pick<DecQ3_K>(n);
    case GgmlType::Q4_K: return pick<DecQ4_K>(n);
    case GgmlType::Q5_K: return pick<DecQ5_K>(n);
    case GgmlType::Q6_K: return pick<DecQ6_K>(n);
    case GgmlType::Q8_K: return pick<DecQ8_K>(n);
    case GgmlType::IQ4_XS: return pick<DecIQ4_XS>(n);
    default: return nullptr;
  }
}

}  // namespace

#pragma GCC pop_options

bool avx2_enabled() {
  static const bool enabled = [] {
    const CpuFeatures& f = cpu_features();
    const char* off = std::getenv("SUROGATE_GGUF_NO_AVX2");  // debug switch: test the portable path
    return f.avx2 && f.fma && f.f16c && !(off && *off && *off != '0');
  }();
  return enabled;
}

bool dot_avx2_supported(GgmlType t) { return avx2_enabled() && rows_fn(t, 1) != nullptr; }
bool decode_avx2_supported(GgmlType t) { return avx2_enabled() && decode_fn(t) != nullptr; }

bool dot_float_avx2_supported(GgmlType t) {
  return avx2_enabled() && (t == GgmlType::F16 || t == GgmlType::BF16);
}

void dot_float_avx2_rows(GgmlType t, const uint8_t* W, const float* x, int64_t K, int64_t N, int64_t m_lo, int64_t m_hi,
                         float* y, int64_t ldy) {
  for (int64_t n0 = 0; n0 < N; n0 += 4) {
    const int64_t n = std::min<int64_t>(4, N - n0);
    const FloatRowsFn fn = t == GgmlType::BF16 ? pick_float<true>(n) : pick_float<false>(n);
    fn(W, K, x + n0 * K, m_lo, m_hi, y + n0 * ldy, ldy);
  }
}

void decode_avx2(GgmlType t, const uint8_t* src, float* y, int64_t n) {
  const DecodeFn fn = decode_fn(t);
  const gguf::TypeInfo* info = gguf::type_info(t);
  fn(src, n / info->block_size, y);
}

void dot_avx2_rows(GgmlType t, const uint8_t* W, int64_t row_bytes, const QuantizedX& x, int64_t N, int64_t m_lo,
                   int64_t m_hi, float* y, int64_t ldy) {
  // Blocks of 4 rows of x; each block decodes the weight rows again (from L1/L2 for the later
  // blocks: the task's rows are few).
  const int64_t G = x.K / 32;
  for (int64_t n0 = 0; n0 < N; n0 += 4) {
    const int64_t n = std::min<int64_t>(4, N - n0);
    const QuantizedX xb{x.q + n0 * x.K, x.d + n0 * G, x.s16 + n0 * 2 * G, x.s32 + n0 * G, x.K};
    rows_fn(t, n)(W, row_bytes, xb, m_lo, m_hi, y + n0 * ldy, ldy);
  }
}

#else

bool dot_avx2_supported(GgmlType) { return false; }
bool decode_avx2_supported(GgmlType) { return false; }
bool dot_float_avx2_supported(GgmlType) { return false; }
void dot_float_avx2_rows(GgmlType, const uint8_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t) {}
void decode_avx2(GgmlType, const uint8_t*, float*, int64_t) {}
void dot_avx2_rows(GgmlType, const uint8_t*, int64_t, const QuantizedX&, int64_t, int64_t, int64_t, float*, int64_t) {}

#endif

}  // namespace surogate::cpu
