// gguf_matmul: y[N, M] = x[N, K] @ dequant(Wq)[M, K]^T with the weight left in its GGML blocks.
//
// Two paths, chosen by N (the number of tokens):
//
// Decode (N <= kMaxDotRows): integer dot products, as llama.cpp's vec_dot. x is quantized
// once per call to int8 in groups of 32 (scale amax/127, like Q8_0). Each weight row is
// decoded 256 values at a time into a small L1 chunk: int8 quants plus one f32 scale per 16
// values, and for types with a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) one f32 additive term per 16;
// a value is scale * q + min. Every type fits this form with |q| <= 128, so one kernel does
// the dot for all of them: per 32 values u8*s8 products summed to int32 (AVX2 maddubs on
// |w| and sign(x, w)), converted to f32 and scaled; the mins contribute min * dx * sum(qx).
// The chunk is decoded once and dotted with all N rows. Nothing f32 of the weight is stored.
// Accuracy: x is rounded to 8 bits per 32 values, as llama.cpp rounds it to Q8_0 / Q8_K.
//
// Prefill (N > kMaxDotRows): a panel of weight rows (about kPanelBytes of f32) is decoded
// exactly (dequantize_row) by the thread pool, then multiplied with OpenBLAS sgemm; panel after
// panel. The weight is read once; the only f32 copy of it is one panel.
//
// F32 / F16 / BF16 weights always take the sgemm path (no int8 rounding of x for them).
// Threads split the output rows M.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cpu_features.h"
#include "core/gguf_types.h"
#include "cpu/common.h"
#include "cpu/gguf_dot.h"

namespace surogate::cpu {

using gguf::GgmlType;

namespace {

constexpr int kChunk = 256;               // weights decoded at a time (one K super-block)
constexpr int64_t kPanelBytes = 2 << 20;   // f32 weight panel on the sgemm path

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SG_GGUF_CLONES __attribute__((target_clones("avx2", "default")))
#define SG_HAVE_AVX2_PATH 1
#else
#define SG_GGUF_CLONES
#endif

// ---- weight chunks ---------------------------------------------------------------------------

// Up to 256 weights of one row: value = sc * w + mn. sc has 8 lanes per 32 values (lanes 0-3
// scale values 0-15, lanes 4-7 values 16-31: the int32 lanes of the AVX2 dot); mn one entry
// per 16 values.
struct Chunk {
  alignas(32) int8_t w[kChunk];
  alignas(32) float sc[kChunk / 4];
  alignas(32) float mn[kChunk / 16];
};

inline void set_scales(Chunk* c, int g, float s0, float s1) {
  for (int l = 0; l < 4; ++l) {
    c->sc[8 * g + l] = s0;
    c->sc[8 * g + 4 + l] = s1;
  }
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

// ---- activations -------------------------------------------------------------------------------

// Storage behind a QuantizedX (cpu/gguf_dot.h).
struct QuantizedXBuffers {
  std::vector<int8_t> q;
  std::vector<float> d, s16, s32;
  QuantizedX view(int64_t K) const { return {q.data(), d.data(), s16.data(), s32.data(), K}; }
};

void quantize_x_row(const float* x, int64_t K, int8_t* q, float* d, float* s16, float* s32) {
  for (int64_t g = 0; g < K / 32; ++g) {
    const float* xg = x + 32 * g;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xg[j]));
    const float dg = amax / 127.0f;
    const float id = dg > 0 ? 1.0f / dg : 0.0f;
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int v = gguf::nearest_int(xg[j] * id);
      q[32 * g + j] = static_cast<int8_t>(v);
      sum[j / 16] += v;
    }
    d[g] = dg;
    s16[2 * g] = dg * static_cast<float>(sum[0]);
    s16[2 * g + 1] = dg * static_cast<float>(sum[1]);
    s32[g] = dg * static_cast<float>(sum[0] + sum[1]);
  }
}

// ---- the dot of one chunk with N quantized rows: out[n] += sum over the chunk -----------------

using ChunkDot = void (*)(const Chunk& c, int groups, bool has_min, const int8_t* xq, const float* xd,
                          const float* xs16, int64_t K, int64_t N, float* out);

void chunk_dot_scalar(const Chunk& c, int groups, bool has_min, const int8_t* xq, const float* xd, const float* xs16,
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
      acc += xd[n * (K / 32) + g] * (c.sc[8 * g] * static_cast<float>(s0) + c.sc[8 * g + 4] * static_cast<float>(s1));
    }
    if (has_min) {
      for (int h = 0; h < 2 * groups; ++h) acc += c.mn[h] * xs16[n * (K / 16) + h];
    }
    out[n] += acc;
  }
}

#ifdef SG_HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) void chunk_dot_avx2(const Chunk& c, int groups, bool has_min, const int8_t* xq,
                                                         const float* xd, const float* xs16, int64_t K, int64_t N,
                                                         float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* q = xq + n * K;
    const float* d = xd + n * (K / 32);
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(c.w + 32 * g));
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * g));
      // |w| * (a with w's sign): u8 x s8 pairs summed to s16 (|w| <= 128, |a| <= 127: no overflow).
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
      const __m256 s = _mm256_mul_ps(_mm256_load_ps(c.sc + 8 * g), _mm256_broadcast_ss(d + g));
      acc = _mm256_fmadd_ps(p, s, acc);
    }
    if (has_min) {
      const float* s16 = xs16 + n * (K / 16);
      for (int h = 0; h + 8 <= 2 * groups; h += 8) {
        acc = _mm256_fmadd_ps(_mm256_load_ps(c.mn + h), _mm256_loadu_ps(s16 + h), acc);
      }
      const int tail = (2 * groups) / 8 * 8;
      for (int h = tail; h < 2 * groups; ++h) out[n] += c.mn[h] * s16[h];
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    out[n] += _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
}
#endif

ChunkDot pick_chunk_dot() {
#ifdef SG_HAVE_AVX2_PATH
  if (cpu_features().avx2 && cpu_features().fma) return chunk_dot_avx2;
#endif
  return chunk_dot_scalar;
}

// ---- the two paths -------------------------------------------------------------------------------

template <typename Ty>
void dot_path(const DotType& dt, int block_size, int type_size, const uint8_t* W, int64_t row_bytes,
              const QuantizedX& xq, int64_t N, int64_t K, int64_t M, Ty* y) {
  const ChunkDot dot = pick_chunk_dot();
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / K);
  parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    Chunk chunk;
    float acc[kMaxDotRows];
    for (int64_t m = lo; m < hi; ++m) {
      const uint8_t* wrow = W + m * row_bytes;
      std::fill(acc, acc + N, 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, K - k0));
        dt.unpack(wrow + k0 / block_size * type_size, n, &chunk);
        dot(chunk, n / 32, dt.has_min, xq.q + k0, xq.d + k0 / 32, xq.s16 + k0 / 16, K, N, acc);
      }
      for (int64_t i = 0; i < N; ++i) y[i * M + m] = store<Ty>(acc[i]);
    }
  });
}

// The AVX2 kernels of cpu/gguf_dot_avx2.cpp, split over output rows.
template <typename Ty>
void dot_path_avx2(GgmlType t, const uint8_t* W, int64_t row_bytes, const QuantizedX& xq, int64_t N, int64_t K,
                   int64_t M, Ty* y) {
  const int64_t grain = std::max<int64_t>(4, (1 << 16) / K);
  parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<Ty, float>) {
      dot_avx2_rows(t, W, row_bytes, xq, N, lo, hi, y, M);
    } else {
      for (int64_t m0 = lo; m0 < hi; m0 += 64) {  // f32 results of 64 rows, then rounded into y
        const int64_t p = std::min<int64_t>(64, hi - m0);
        float buf[kMaxDotRows * 64];
        dot_avx2_rows(t, W + m0 * row_bytes, row_bytes, xq, N, 0, p, buf, 64);
        for (int64_t i = 0; i < N; ++i) {
          for (int64_t r = 0; r < p; ++r) y[i * M + m0 + r] = store<Ty>(buf[i * 64 + r]);
        }
      }
    }
  });
}

// Panels of weight rows decoded in parallel by our pool, then multiplied by OpenBLAS with its
// own threads. (This OpenBLAS has no per-thread thread count, so our workers cannot each call a
// single-threaded sgemm on their own panel without oversubscribing the cores.)
template <typename Ty>
Status sgemm_path(GgmlType t, const uint8_t* W, int64_t row_bytes, const float* x, int64_t N, int64_t K, int64_t M,
                  Ty* y) {
  constexpr bool kF32Out = std::is_same_v<Ty, float>;
  const bool avx2 = dot_avx2_supported(t);
  const int64_t panel = std::min(M, std::max<int64_t>(16, kPanelBytes / (K * 4)));
  Tensor wf, yp;
  SG_RETURN_IF_ERROR(empty({panel * K}, DType::kF32, Device{}, &wf));
  if (!kF32Out) SG_RETURN_IF_ERROR(empty({N * panel}, DType::kF32, Device{}, &yp));
  float* w = wf.ptr<float>();
  for (int64_t m0 = 0; m0 < M; m0 += panel) {
    const int64_t p = std::min(panel, M - m0);
    parallel_for(0, p, std::max<int64_t>(1, (1 << 16) / K), [&](int64_t lo, int64_t hi) {
      if (avx2) {
        decode_avx2(t, W + (m0 + lo) * row_bytes, w + lo * K, (hi - lo) * K);
      } else {
        (void)gguf::dequantize_row(t, W + (m0 + lo) * row_bytes, w + lo * K, (hi - lo) * K);
      }
    });
    if constexpr (kF32Out) {
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, p, K, 1.0f, x, K, w, K, 0.0f, y + m0, M);
    } else {
      float* yt = yp.ptr<float>();
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, p, K, 1.0f, x, K, w, K, 0.0f, yt, p);
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t r = 0; r < p; ++r) y[i * M + m0 + r] = store<Ty>(yt[i * p + r]);
      }
    }
  }
  return Status::OK();
}

template <typename Tx>
void to_f32(const Tx* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = load(x[i]);
}

}  // namespace

// gguf_matmul: (x[N, K] f32/bf16/f16, Wq[M, row_bytes(K)] uint8) -> (y[N, M] f32/bf16/f16);
// attrs: type (ggml type id of Wq).
Status gguf_matmul(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& Wq = a.in(1);
  const Tensor& y = a.out(0);
  SG_CHECK_ARG(a.attr().has("type"), "gguf_matmul: attr `type` (the ggml type id of Wq) is required");
  const auto t = static_cast<GgmlType>(a.attr().get_int("type", -1));
  const gguf::TypeInfo* info = gguf::type_info(t);
  SG_CHECK_ARG(info, str_cat("gguf_matmul: unknown GGUF type id ", static_cast<int>(t)));
  SG_CHECK(info->dequantize, StatusCode::kUnsupported, str_cat("gguf_matmul: unsupported GGUF type ", info->name),
           "dequantize the weight to f16/f32 at load time, or requantize it to a K type");
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "Wq", Wq, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "y", y, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "Wq", Wq, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "y", y, {DType::kF32, DType::kBF16, DType::kF16}));
  for (const Tensor* p : {&x, &Wq, &y}) SG_RETURN_IF_ERROR(check_contiguous("gguf_matmul", "operand", *p));
  const int64_t N = x.size(0), K = x.size(1), M = Wq.size(0);
  SG_CHECK_SHAPE(K % info->block_size == 0, str_cat("gguf_matmul: K = ", K, " is not a multiple of the ", info->name,
                                                    " block size ", info->block_size));
  const int64_t row_bytes = K / info->block_size * info->type_size;
  SG_CHECK_SHAPE(Wq.size(1) == row_bytes, str_cat("gguf_matmul: a ", info->name, " row of K = ", K, " values takes ",
                                                  row_bytes, " bytes, Wq ", Wq.shape_str(), " has ", Wq.size(1)));
  SG_CHECK_SHAPE(y.size(0) == N && y.size(1) == M,
                 str_cat("gguf_matmul: y ", y.shape_str(), " should be [", N, ", ", M, "] for x ", x.shape_str(),
                         " and ", info->name, " Wq ", Wq.shape_str()));
  if (N == 0 || M == 0) return Status::OK();
  const uint8_t* W = Wq.ptr<uint8_t>();

  DotType dt;
  const bool avx2 = dot_avx2_supported(t);
  if (N <= kMaxDotRows && K % 32 == 0 && (avx2 || dot_type(t, &dt))) {
    QuantizedXBuffers xb;
    xb.q.resize(N * K);
    xb.d.resize(N * K / 32);
    xb.s16.resize(N * K / 16);
    xb.s32.resize(N * K / 32);
    std::vector<float> row(K);
    for (int64_t i = 0; i < N; ++i) {
      SG_DISPATCH_FLOAT("gguf_matmul", x.dtype, Tx, to_f32(x.ptr<Tx>() + i * K, K, row.data()));
      quantize_x_row(row.data(), K, xb.q.data() + i * K, xb.d.data() + i * K / 32, xb.s16.data() + i * K / 16,
                     xb.s32.data() + i * K / 32);
    }
    const QuantizedX xq = xb.view(K);
    if (avx2) {
      SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty, dot_path_avx2(t, W, row_bytes, xq, N, K, M, y.ptr<Ty>()));
    } else {
      SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty,
                        dot_path(dt, info->block_size, info->type_size, W, row_bytes, xq, N, K, M, y.ptr<Ty>()));
    }
    return Status::OK();
  }

  Tensor xf;
  const float* xp = x.ptr<float>();
  if (x.dtype != DType::kF32) {
    SG_RETURN_IF_ERROR(empty({N * K}, DType::kF32, Device{}, &xf));
    SG_DISPATCH_FLOAT("gguf_matmul", x.dtype, Tx, to_f32(x.ptr<Tx>(), N * K, xf.ptr<float>()));
    xp = xf.ptr<float>();
  }
  SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty,
                    SG_RETURN_IF_ERROR(sgemm_path(t, W, row_bytes, xp, N, K, M, y.ptr<Ty>())));
  return Status::OK();
}

}  // namespace surogate::cpu
