// The GGML type table and the row decoders. Each decoder is written as gguf-py's numpy code
// computes, so that results match it bit for bit: a scale is formed in f32 first (d * sc), then
// multiplied by the quant, then the min subtracted, each step rounded. The build never lets the
// compiler fuse these (no FMA in the baseline or "avx2" targets; see target_clones below).
#include "core/gguf_types.h"

namespace surogate::gguf {

namespace {

// Vectorized clone for AVX2 CPUs. "avx2" does not enable FMA, so a*b+c stays two roundings.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SG_GGUF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SG_GGUF_CLONES
#endif

using Dequant = void (*)(const uint8_t* b, float* y, int64_t nb);

// ---- plain floats --------------------------------------------------------------------------

SG_GGUF_CLONES void dq_f32(const uint8_t* b, float* y, int64_t n) { std::memcpy(y, b, n * 4); }

SG_GGUF_CLONES void dq_f16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_float(load_u16(b + 2 * i));
}

SG_GGUF_CLONES void dq_bf16(const uint8_t* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bits_f32(static_cast<uint32_t>(load_u16(b + 2 * i)) << 16);
}

// ---- 32-value blocks -----------------------------------------------------------------------
// Value j of a block is in the low nibble of byte j (j < 16) or the high nibble of byte j-16.

SG_GGUF_CLONES void dq_q4_0(const uint8_t* b, float* y, int64_t nb) {  // d, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = load_half(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
      y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

SG_GGUF_CLONES void dq_q4_1(const uint8_t* b, float* y, int64_t nb) {  // d, m, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
    const float d = load_half(b), m = load_half(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(qs[j] & 0xF) + m;
      y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

SG_GGUF_CLONES void dq_q5_0(const uint8_t* b, float* y, int64_t nb) {  // d, qh (bit j: value j), qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const float d = load_half(b);
    const uint32_t qh = load_u32(b + 2);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo - 16);
      y[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

SG_GGUF_CLONES void dq_q5_1(const uint8_t* b, float* y, int64_t nb) {  // d, m, qh, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 24, y += 32) {
    const float d = load_half(b), m = load_half(b + 2);
    const uint32_t qh = load_u32(b + 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo) + m;
      y[j + 16] = d * static_cast<float>(hi) + m;
    }
  }
}

SG_GGUF_CLONES void dq_q8_0(const uint8_t* b, float* y, int64_t nb) {  // d, qs[32] int8
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const float d = load_half(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

SG_GGUF_CLONES void dq_iq4_nl(const uint8_t* b, float* y, int64_t nb) {  // d, qs[16] (code book indices)
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = load_half(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIQ4NLValues[qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
    }
  }
}

// MXFP4 (gpt-oss): e (e8m0), qs[16]: values j and j + 16 in the low and high nibbles of qs[j],
// each a doubled e2m1 code times half the block scale (gguf-py's MXFP4.dequantize_blocks:
// e8m0_to_fp32_half, then one f32 product).
const int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

SG_GGUF_CLONES void dq_mxfp4(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 17, y += 32) {
    const float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kMXFP4Values[b[1 + j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kMXFP4Values[b[1 + j] >> 4]);
    }
  }
}

// ---- 256-value super-blocks ----------------------------------------------------------------
// The low bits of the quants are laid out in 32-value strips: byte l of a strip of bytes holds
// values l, l+32, l+64, ... in successive bit fields.

// scales[16] (low nibble: scale, high: min), qs[64] (2 bits), d, dmin. Sub-blocks of 16.
SG_GGUF_CLONES void dq_q2_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 84, y += QK_K) {
    const uint8_t* sc = b;
    const uint8_t* qs = b + 16;
    const float d = load_half(b + 80), dmin = load_half(b + 82);
    for (int e = 0; e < QK_K; e += 16) {
      const float dl = d * static_cast<float>(sc[e / 16] & 0xF);
      const float ml = dmin * static_cast<float>(sc[e / 16] >> 4);
      const int half = e / 128, shift = 2 * ((e % 128) / 32), l0 = e % 32;
      for (int l = 0; l < 16; ++l) {
        const int q = (qs[half * 32 + l0 + l] >> shift) & 3;
        y[e + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// hmask[32] (bit e/32 of byte e%32: high bit, set means no -4), qs[64], scales[12], d.
SG_GGUF_CLONES void dq_q3_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 110, y += QK_K) {
    const uint8_t* hm = b;
    const uint8_t* qs = b + 32;
    const uint8_t* sc = b + 96;
    const float d = load_half(b + 108);
    for (int e = 0; e < QK_K; e += 16) {
      const float dl = d * static_cast<float>(k3_scale(e / 16, sc));
      const int half = e / 128, shift = 2 * ((e % 128) / 32), l0 = e % 32, bit = e / 32;
      for (int l = 0; l < 16; ++l) {
        const int lo = (qs[half * 32 + l0 + l] >> shift) & 3;
        const int h = (hm[l0 + l] >> bit) & 1;
        y[e + l] = dl * static_cast<float>(lo - ((h ^ 1) << 2));
      }
    }
  }
}

// d, dmin, scales[12] (6-bit scale and min per 32), qs[128] (nibbles). Sub-blocks of 32.
SG_GGUF_CLONES void dq_q4_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144, y += QK_K) {
    const float d = load_half(b), dmin = load_half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      k4_scale_min(j, scales, &s, &m);
      const float dl = d * static_cast<float>(s), ml = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
    }
  }
}

// d, dmin, scales[12], qh[32] (bit j of byte l: value 32j+l), qs[128].
SG_GGUF_CLONES void dq_q5_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176, y += QK_K) {
    const float d = load_half(b), dmin = load_half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      k4_scale_min(j, scales, &s, &m);
      const float dl = d * static_cast<float>(s), ml = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
        y[32 * j + l] = dl * static_cast<float>(v) - ml;
      }
    }
  }
}

// ql[128] (low nibbles), qh[64] (2 high bits), scales[16] int8, d. Sub-blocks of 16.
SG_GGUF_CLONES void dq_q6_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210, y += QK_K) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_half(b + 208);
    for (int e = 0; e < QK_K; e += 16) {
      const float dl = d * static_cast<float>(sc[e / 16]);
      const int half = e / 128, quarter = (e % 128) / 32, l0 = e % 32;
      const uint8_t* lo = ql + 64 * half + 32 * (quarter % 2);
      const uint8_t* hi = qh + 32 * half;
      for (int l = 0; l < 16; ++l) {
        const int q = ((lo[l0 + l] >> (4 * (quarter / 2))) & 0xF) | (((hi[l0 + l] >> (2 * quarter)) & 3) << 4);
        y[e + l] = dl * static_cast<float>(q - 32);
      }
    }
  }
}

// d (f32), qs[256] int8, bsums[16] int16 (the sums, unused here).
SG_GGUF_CLONES void dq_q8_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 292, y += QK_K) {
    float d;
    std::memcpy(&d, b, 4);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 4);
    for (int j = 0; j < QK_K; ++j) y[j] = d * static_cast<float>(qs[j]);
  }
}

// d, scales_h (2 bits per sub-block), scales_l[4] (nibbles), qs[128]. Sub-blocks of 32, each
// with 16 bytes: low nibbles are values 0..15, high nibbles 16..31.
SG_GGUF_CLONES void dq_iq4_xs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 136, y += QK_K) {
    const float d = load_half(b);
    const uint16_t sh = load_u16(b + 2);
    const uint8_t* sl = b + 4;
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 8; ++j) {
      const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* q = qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[32 * j + l] = dl * static_cast<float>(kIQ4NLValues[q[l] & 0xF]);
        y[32 * j + l + 16] = dl * static_cast<float>(kIQ4NLValues[q[l] >> 4]);
      }
    }
  }
}

struct Entry {
  GgmlType type;
  TypeInfo info;
  Dequant dequant;  // over whole blocks: (src, dst, number of blocks)
};

// Q8_1 is 36 bytes as in ggml-common.h (gguf-py's table still says 40; no file carries it).
const Entry kTypes[] = {
    {GgmlType::F32, {"F32", 1, 4, true, true}, dq_f32},
    {GgmlType::F16, {"F16", 1, 2, true, true}, dq_f16},
    {GgmlType::Q4_0, {"Q4_0", 32, 18, true, true}, dq_q4_0},
    {GgmlType::Q4_1, {"Q4_1", 32, 20, true, true}, dq_q4_1},
    {GgmlType::Q5_0, {"Q5_0", 32, 22, true, true}, dq_q5_0},
    {GgmlType::Q5_1, {"Q5_1", 32, 24, true, true}, dq_q5_1},
    {GgmlType::Q8_0, {"Q8_0", 32, 34, true, true}, dq_q8_0},
    {GgmlType::Q8_1, {"Q8_1", 32, 36, false, false}, nullptr},
    {GgmlType::Q2_K, {"Q2_K", 256, 84, true, true}, dq_q2_k},
    {GgmlType::Q3_K, {"Q3_K", 256, 110, true, true}, dq_q3_k},
    {GgmlType::Q4_K, {"Q4_K", 256, 144, true, true}, dq_q4_k},
    {GgmlType::Q5_K, {"Q5_K", 256, 176, true, true}, dq_q5_k},
    {GgmlType::Q6_K, {"Q6_K", 256, 210, true, true}, dq_q6_k},
    {GgmlType::Q8_K, {"Q8_K", 256, 292, true, true}, dq_q8_k},
    {GgmlType::IQ2_XXS, {"IQ2_XXS", 256, 66, false, false}, nullptr},
    {GgmlType::IQ2_XS, {"IQ2_XS", 256, 74, false, false}, nullptr},
    {GgmlType::IQ3_XXS, {"IQ3_XXS", 256, 98, false, false}, nullptr},
    {GgmlType::IQ1_S, {"IQ1_S", 256, 50, false, false}, nullptr},
    {GgmlType::IQ4_NL, {"IQ4_NL", 32, 18, true, false}, dq_iq4_nl},
    {GgmlType::IQ3_S, {"IQ3_S", 256, 110, false, false}, nullptr},
    {GgmlType::IQ2_S, {"IQ2_S", 256, 82, false, false}, nullptr},
    {GgmlType::IQ4_XS, {"IQ4_XS", 256, 136, true, false}, dq_iq4_xs},
    {GgmlType::I8, {"I8", 1, 1, false, false}, nullptr},
    {GgmlType::I16, {"I16", 1, 2, false, false}, nullptr},
    {GgmlType::I32, {"I32", 1, 4, false, false}, nullptr},
    {GgmlType::I64, {"I64", 1, 8, false, false}, nullptr},
    {GgmlType::F64, {"F64", 1, 8, false, false}, nullptr},
    {GgmlType::IQ1_M, {"IQ1_M", 256, 56, false, false}, nullptr},
    {GgmlType::BF16, {"BF16", 1, 2, true, true}, dq_bf16},
    {GgmlType::TQ1_0, {"TQ1_0", 256, 54, false, false}, nullptr},
    {GgmlType::TQ2_0, {"TQ2_0", 256, 66, false, false}, nullptr},
    {GgmlType::MXFP4, {"MXFP4", 32, 17, true, true}, dq_mxfp4},
};

const Entry* find(GgmlType t) {
  for (const Entry& e : kTypes) {
    if (e.type == t) return &e;
  }
  return nullptr;
}

}  // namespace

const TypeInfo* type_info(GgmlType t) {
  const Entry* e = find(t);
  return e ? &e->info : nullptr;
}

std::string type_name(GgmlType t) {
  const TypeInfo* info = type_info(t);
  return info ? std::string(info->name) : str_cat("type ", static_cast<int>(t));
}

Status row_bytes(GgmlType t, int64_t n, int64_t* bytes) {
  const TypeInfo* info = type_info(t);
  SG_CHECK(info, StatusCode::kInvalidArgument, str_cat("unknown GGUF type id ", static_cast<int>(t)),
           "ids are ggml's (gguf.GGMLQuantizationType)");
  SG_CHECK(n % info->block_size == 0, StatusCode::kShapeMismatch,
           str_cat(info->name, ": a row of ", n, " values is not a multiple of the block size ", info->block_size), "");
  *bytes = n / info->block_size * info->type_size;
  return Status::OK();
}

Status dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  int64_t bytes;
  SG_RETURN_IF_ERROR(row_bytes(t, n, &bytes));
  const Entry* e = find(t);
  SG_CHECK(e->dequant, StatusCode::kUnsupported, str_cat("unsupported GGUF type ", e->info.name),
           "this build decodes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K, IQ4_NL, IQ4_XS, MXFP4");
  e->dequant(static_cast<const uint8_t*>(src), dst, n / e->info.block_size);
  return Status::OK();
}

}  // namespace surogate::gguf
