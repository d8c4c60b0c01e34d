// Portable integer dot products of GGML weight rows with Q8-style activations (cpu/gguf_dot.h),
// for CPUs without AVX2 and as the plain statement of what cpu/gguf_dot_avx2.cpp computes.
//
// Each weight row is decoded 256 values at a time into a Chunk in L1: int8 quants, a scale per
// 16 values and, for types with a min, an additive term per 16; value = scale * q + min. The
// chunk is dotted with every row of x.
#include <algorithm>
#include <cstring>

#include "core/gguf_types.h"
#include "cpu/gguf_dot.h"

namespace surogate::cpu {

using gguf::GgmlType;

namespace {

constexpr int kChunk = 256;  // weights decoded at a time (one K super-block)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SG_GGUF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SG_GGUF_CLONES
#endif

// ---- weight chunks ---------------------------------------------------------------------------

// Up to 256 weights of one row: value = sc * w + mn, sc and mn one entry per 16 values.
struct Chunk {
  alignas(32) int8_t w[kChunk];
  alignas(32) float sc[kChunk / 16];
  alignas(32) float mn[kChunk / 16];
};

// Scales of the 32 values of group g: s0 for values 0-15, s1 for 16-31.
inline void set_scales(Chunk* c, int g, float s0, float s1) {
  c->sc[2 * g] = s0;
  c->sc[2 * g + 1] = s1;
}

using Unpack = void (*)(const uint8_t* b, int n, Chunk* c);  // n: a multiple of the block size, <= 256

SG_GGUF_CLONES void up_q4_0(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 18) {
    const float d = gguf::load_half(b);
    int8_t* w = c->w + 32 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>((b[2 + j] & 0xF) - 8);
      w[j + 16] = static_cast<int8_t>((b[2 + j] >> 4) - 8);
    }
    set_scales(c, g, d, d);
  }
}

SG_GGUF_CLONES void up_q4_1(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 20) {
    const float d = gguf::load_half(b), m = gguf::load_half(b + 2);
    int8_t* w = c->w + 32 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>(b[4 + j] & 0xF);
      w[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
    }
    set_scales(c, g, d, d);
    c->mn[2 * g] = c->mn[2 * g + 1] = m;
  }
}

SG_GGUF_CLONES void up_q5_0(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 22) {
    const float d = gguf::load_half(b);
    const uint32_t qh = gguf::load_u32(b + 2);
    int8_t* w = c->w + 32 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>(((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
      w[j + 16] = static_cast<int8_t>(((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    set_scales(c, g, d, d);
  }
}

SG_GGUF_CLONES void up_q5_1(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 24) {
    const float d = gguf::load_half(b), m = gguf::load_half(b + 2);
    const uint32_t qh = gguf::load_u32(b + 4);
    int8_t* w = c->w + 32 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>((b[8 + j] & 0xF) | (((qh >> j) & 1) << 4));
      w[j + 16] = static_cast<int8_t>((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    set_scales(c, g, d, d);
    c->mn[2 * g] = c->mn[2 * g + 1] = m;
  }
}

SG_GGUF_CLONES void up_q8_0(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 34) {
    const float d = gguf::load_half(b);
    std::memcpy(c->w + 32 * g, b + 2, 32);
    set_scales(c, g, d, d);
  }
}

SG_GGUF_CLONES void up_iq4_nl(const uint8_t* b, int n, Chunk* c) {
  for (int g = 0; g < n / 32; ++g, b += 18) {
    const float d = gguf::load_half(b);
    int8_t* w = c->w + 32 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = gguf::kIQ4NLValues[b[2 + j] & 0xF];
      w[j + 16] = gguf::kIQ4NLValues[b[2 + j] >> 4];
    }
    set_scales(c, g, d, d);
  }
}

// K types: n is always 256 (one super-block). Layouts as in core/gguf_types.cpp.

SG_GGUF_CLONES void up_q2_k(const uint8_t* b, int, Chunk* c) {
  const uint8_t* s = b;
  const uint8_t* qs = b + 16;
  const float d = gguf::load_half(b + 80), dmin = gguf::load_half(b + 82);
  for (int g = 0; g < 8; ++g) set_scales(c, g, d * (s[2 * g] & 0xF), d * (s[2 * g + 1] & 0xF));
  for (int h = 0; h < 16; ++h) c->mn[h] = -(dmin * (s[h] >> 4));
  for (int half = 0; half < 2; ++half) {
    for (int shift = 0; shift < 4; ++shift) {
      int8_t* w = c->w + 128 * half + 32 * shift;
      for (int l = 0; l < 32; ++l) w[l] = static_cast<int8_t>((qs[32 * half + l] >> (2 * shift)) & 3);
    }
  }
}

SG_GGUF_CLONES void up_q3_k(const uint8_t* b, int, Chunk* c) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const float d = gguf::load_half(b + 108);
  for (int g = 0; g < 8; ++g) set_scales(c, g, d * gguf::k3_scale(2 * g, b + 96), d * gguf::k3_scale(2 * g + 1, b + 96));
  for (int half = 0; half < 2; ++half) {
    for (int shift = 0; shift < 4; ++shift) {
      const int bit = 4 * half + shift;
      int8_t* w = c->w + 32 * bit;
      for (int l = 0; l < 32; ++l) {
        const int lo = (qs[32 * half + l] >> (2 * shift)) & 3;
        w[l] = static_cast<int8_t>(lo - ((((hm[l] >> bit) & 1) ^ 1) << 2));
      }
    }
  }
}

SG_GGUF_CLONES void up_q4_k(const uint8_t* b, int, Chunk* c) {
  const float d = gguf::load_half(b), dmin = gguf::load_half(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    gguf::k4_scale_min(j, b + 4, &s, &m);
    set_scales(c, j, d * s, d * s);
    c->mn[2 * j] = c->mn[2 * j + 1] = -(dmin * m);
  }
  const uint8_t* qs = b + 16;
  for (int k = 0; k < 4; ++k) {
    int8_t* w = c->w + 64 * k;
    for (int l = 0; l < 32; ++l) {
      w[l] = static_cast<int8_t>(qs[32 * k + l] & 0xF);
      w[l + 32] = static_cast<int8_t>(qs[32 * k + l] >> 4);
    }
  }
}

SG_GGUF_CLONES void up_q5_k(const uint8_t* b, int, Chunk* c) {
  const float d = gguf::load_half(b), dmin = gguf::load_half(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    gguf::k4_scale_min(j, b + 4, &s, &m);
    set_scales(c, j, d * s, d * s);
    c->mn[2 * j] = c->mn[2 * j + 1] = -(dmin * m);
  }
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int k = 0; k < 4; ++k) {
    int8_t* w = c->w + 64 * k;
    for (int l = 0; l < 32; ++l) {
      w[l] = static_cast<int8_t>((qs[32 * k + l] & 0xF) | (((qh[l] >> (2 * k)) & 1) << 4));
      w[l + 32] = static_cast<int8_t>((qs[32 * k + l] >> 4) | (((qh[l] >> (2 * k + 1)) & 1) << 4));
    }
  }
}

SG_GGUF_CLONES void up_q6_k(const uint8_t* b, int, Chunk* c) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* s = reinterpret_cast<const int8_t*>(b + 192);
  const float d = gguf::load_half(b + 208);
  for (int g = 0; g < 8; ++g) set_scales(c, g, d * s[2 * g], d * s[2 * g + 1]);
  for (int half = 0; half < 2; ++half) {
    int8_t* w = c->w + 128 * half;
    const uint8_t* lo = ql + 64 * half;
    const uint8_t* hi = qh + 32 * half;
    for (int l = 0; l < 32; ++l) {
      w[l] = static_cast<int8_t>(((lo[l] & 0xF) | ((hi[l] & 3) << 4)) - 32);
      w[l + 32] = static_cast<int8_t>(((lo[l + 32] & 0xF) | (((hi[l] >> 2) & 3) << 4)) - 32);
      w[l + 64] = static_cast<int8_t>(((lo[l] >> 4) | (((hi[l] >> 4) & 3) << 4)) - 32);
      w[l + 96] = static_cast<int8_t>(((lo[l + 32] >> 4) | (((hi[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

SG_GGUF_CLONES void up_q8_k(const uint8_t* b, int, Chunk* c) {
  float d;
  std::memcpy(&d, b, 4);
  std::memcpy(c->w, b + 4, kChunk);
  for (int g = 0; g < 8; ++g) set_scales(c, g, d, d);
}

SG_GGUF_CLONES void up_iq4_xs(const uint8_t* b, int, Chunk* c) {
  const float d = gguf::load_half(b);
  const uint16_t sh = gguf::load_u16(b + 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    set_scales(c, j, dl, dl);
    int8_t* w = c->w + 32 * j;
    for (int l = 0; l < 16; ++l) {
      w[l] = gguf::kIQ4NLValues[qs[16 * j + l] & 0xF];
      w[l + 16] = gguf::kIQ4NLValues[qs[16 * j + l] >> 4];
    }
  }
}

struct DotType {
  Unpack unpack;
  bool has_min;
};

bool dot_type(GgmlType t, DotType* out) {
  switch (t) {
    case GgmlType::Q4_0: *out = {up_q4_0, false}; return true;
    case GgmlType::Q4_1: *out = {up_q4_1, true}; return true;
    case GgmlType::Q5_0: *out = {up_q5_0, false}; return true;
    case GgmlType::Q5_1: *out = {up_q5_1, true}; return true;
    case GgmlType::Q8_0: *out = {up_q8_0, false}; return true;
    case GgmlType::IQ4_NL: *out = {up_iq4_nl, false}; return true;
    case GgmlType::Q2_K: *out = {up_q2_k, true}; return true;
    case GgmlType::Q3_K: *out = {up_q3_k, false}; return true;
    case GgmlType::Q4_K: *out = {up_q4_k, true}; return true;
    case GgmlType::Q5_K: *out = {up_q5_k, true}; return true;
    case GgmlType::Q6_K: *out = {up_q6_k, false}; return true;
    case GgmlType::Q8_K: *out = {up_q8_k, false}; return true;
    case GgmlType::IQ4_XS: *out = {up_iq4_xs, false}; return true;
    default: return false;
  }
}

// ---- the dot of one chunk with N quantized rows: out[n] += sum over the chunk -----------------

void chunk_dot(const Chunk& c, int groups, bool has_min, const int8_t* xq, const float* xd, const float* xs16,
               int64_t K, int64_t N, float* out) {
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* q = xq + n * K;
    float acc = 0;
    for (int g = 0; g < groups; ++g) {
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 16; ++l) {
        s0 += c.w[32 * g + l] * q[32 * g + l];
        s1 += c.w[32 * g + 16 + l] * q[32 * g + 16 + l];
      }
      acc += xd[n * (K / 32) + g] * (c.sc[2 * g] * static_cast<float>(s0) + c.sc[2 * g + 1] * static_cast<float>(s1));
    }
    if (has_min) {
      for (int h = 0; h < 2 * groups; ++h) acc += c.mn[h] * xs16[n * (K / 16) + h];
    }
    out[n] += acc;
  }
}

}  // namespace

bool dot_portable_supported(GgmlType t) {
  DotType dt;
  return dot_type(t, &dt);
}

void dot_portable_rows(GgmlType t, const uint8_t* W, int64_t row_bytes, const QuantizedX& x, int64_t N, int64_t m_lo,
                       int64_t m_hi, float* y, int64_t ldy) {
  DotType dt;
  dot_type(t, &dt);
  const gguf::TypeInfo* info = gguf::type_info(t);
  const int64_t K = x.K;
  Chunk chunk;
  float acc[kMaxDotRows];
  for (int64_t m = m_lo; m < m_hi; ++m) {
    const uint8_t* wrow = W + m * row_bytes;
    std::fill(acc, acc + N, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, K - k0));
      dt.unpack(wrow + k0 / info->block_size * info->type_size, n, &chunk);
      chunk_dot(chunk, n / 32, dt.has_min, x.q + k0, x.d + k0 / 32, x.s16 + k0 / 16, K, N, acc);
    }
    for (int64_t n = 0; n < N; ++n) y[n * ldy + m] = acc[n];
  }
}

}  // namespace surogate::cpu
