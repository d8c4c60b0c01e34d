// Device decoders of GGML blocks for cuda/gguf.cu: one 32-value unit at a time.
//
// Every decoder turns unit s (values 32s .. 32s+31) of one block into 32 f32 values with the
// same arithmetic as core/gguf_types.cpp's dequantize_row (gguf-py's numpy code): scale formed
// first (d * sc), then times the quant, then the min added or subtracted, each step rounded.
// nvcc fuses a*b+c into an FMA by default, so these use the __fmul_rn / __fadd_rn / __fsub_rn
// intrinsics, which it never contracts; the results are then bit-identical to the CPU's.
//
// Blocks sit at arbitrary byte offsets (a Q4_0 block is 18 bytes), so multi-byte fields are
// assembled from bytes, little-endian as in the file.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "core/gguf_types.h"

namespace surogate::cuda::gguf_dev {

using gguf::GgmlType;

__device__ __forceinline__ uint32_t u16_at(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) { return u16_at(p) | (u16_at(p + 2) << 16); }
// binary16 -> binary32 is exact (NaNs stay NaN), as core's half_to_float.
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(u16_at(p))));
}

// ggml's kvalues_iq4nl (core/gguf_types.h kIQ4NLValues); in global memory, where lanes that
// index it differently are served by L1 in one pass (constant memory would serialise them).
__device__ const int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: signed 6-bit scale of sub-block j (0..15) from the 12 packed bytes.
__device__ __forceinline__ int k3_scale(int j, const uint8_t* s) {
  const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Block<T>: kUnits 32-value units per block of kBytes bytes; unit(b, s, w) decodes unit s of
// the block at b into w[0..32). The plain float types are read in units of 32 values, which
// only serves rows whose length is a multiple of 32 (the callers check); their units are then
// aligned to the element size (tensors start on allocator / GGUF alignment), so they load typed.
template <GgmlType T> struct Block;

template <> struct Block<GgmlType::F32> {
  static constexpr int kUnits = 1, kBytes = 128;
  __device__ static void unit(const uint8_t* b, int, float* w) {
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = reinterpret_cast<const float*>(b)[l];
  }
};

template <> struct Block<GgmlType::F16> {
  static constexpr int kUnits = 1, kBytes = 64;
  __device__ static void unit(const uint8_t* b, int, float* w) {
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = __half2float(reinterpret_cast<const __half*>(b)[l]);
  }
};

template <> struct Block<GgmlType::BF16> {
  static constexpr int kUnits = 1, kBytes = 64;
  __device__ static void unit(const uint8_t* b, int, float* w) {
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = __uint_as_float(uint32_t{reinterpret_cast<const uint16_t*>(b)[l]} << 16);
  }
};

// ---- 32-value blocks: value j in the low nibble of byte j (j < 16), else the high nibble of j-16.

template <> struct Block<GgmlType::Q4_0> {  // d, qs[16]
  static constexpr int kUnits = 1, kBytes = 18;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      w[j] = mul(d, static_cast<float>((b[2 + j] & 0xF) - 8));
      w[j + 16] = mul(d, static_cast<float>((b[2 + j] >> 4) - 8));
    }
  }
};

template <> struct Block<GgmlType::Q4_1> {  // d, m, qs[16]
  static constexpr int kUnits = 1, kBytes = 20;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      w[j] = __fadd_rn(mul(d, static_cast<float>(b[4 + j] & 0xF)), m);
      w[j + 16] = __fadd_rn(mul(d, static_cast<float>(b[4 + j] >> 4)), m);
    }
  }
};

template <> struct Block<GgmlType::Q5_0> {  // d, qh (bit j: value j), qs[16]
  static constexpr int kUnits = 1, kBytes = 22;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b);
    const uint32_t qh = u32_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[6 + j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      w[j] = mul(d, static_cast<float>(lo - 16));
      w[j + 16] = mul(d, static_cast<float>(hi - 16));
    }
  }
};

template <> struct Block<GgmlType::Q5_1> {  // d, m, qh, qs[16]
  static constexpr int kUnits = 1, kBytes = 24;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = u32_at(b + 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[8 + j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      w[j] = __fadd_rn(mul(d, static_cast<float>(lo)), m);
      w[j + 16] = __fadd_rn(mul(d, static_cast<float>(hi)), m);
    }
  }
};

template <> struct Block<GgmlType::Q8_0> {  // d, qs[32] int8
  static constexpr int kUnits = 1, kBytes = 34;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = mul(static_cast<float>(static_cast<int8_t>(b[2 + j])), d);
  }
};

template <> struct Block<GgmlType::IQ4_NL> {  // d, qs[16] (code book indices)
  static constexpr int kUnits = 1, kBytes = 18;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      w[j] = mul(d, static_cast<float>(kIQ4NL[b[2 + j] & 0xF]));
      w[j + 16] = mul(d, static_cast<float>(kIQ4NL[b[2 + j] >> 4]));
    }
  }
};

// MXFP4 (gpt-oss): e (e8m0), qs[16]; doubled e2m1 codes times half the block scale (core/gguf_types.cpp).
__device__ const int8_t kMXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

template <> struct Block<GgmlType::MXFP4> {
  static constexpr int kUnits = 1, kBytes = 17;
  __device__ static void unit(const uint8_t* b, int, float* w) {
    const uint32_t e = b[0];
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      w[j] = mul(d, static_cast<float>(kMXFP4[b[1 + j] & 0xF]));
      w[j + 16] = mul(d, static_cast<float>(kMXFP4[b[1 + j] >> 4]));
    }
  }
};

// ---- 256-value super-blocks. The low bits of the quants are laid out in 32-value strips: byte l
// of a strip holds values l, l+32, l+64, ... in successive bit fields, so unit s reads byte l of
// its strip for value l.

template <> struct Block<GgmlType::Q2_K> {  // scales[16] (lo: scale, hi: min), qs[64], d, dmin
  static constexpr int kUnits = 8, kBytes = 84;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    const uint8_t* qs = b + 16 + 32 * (s / 4);
    const int shift = 2 * (s % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the two 16-value sub-blocks of the unit
      const int sc = b[2 * s + h];
      const float dl = mul(d, static_cast<float>(sc & 0xF)), ml = mul(dmin, static_cast<float>(sc >> 4));
#pragma unroll
      for (int l = 16 * h; l < 16 * h + 16; ++l) {
        w[l] = __fsub_rn(mul(dl, static_cast<float>((qs[l] >> shift) & 3)), ml);
      }
    }
  }
};

template <> struct Block<GgmlType::Q3_K> {  // hmask[32], qs[64], scales[12], d
  static constexpr int kUnits = 8, kBytes = 110;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b + 108);
    const uint8_t* qs = b + 32 + 32 * (s / 4);
    const int shift = 2 * (s % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float dl = mul(d, static_cast<float>(k3_scale(2 * s + h, b + 96)));
#pragma unroll
      for (int l = 16 * h; l < 16 * h + 16; ++l) {
        const int lo = (qs[l] >> shift) & 3;
        const int hbit = (b[l] >> s) & 1;  // hmask: bit s of byte l; set means no -4
        w[l] = mul(dl, static_cast<float>(lo - ((hbit ^ 1) << 2)));
      }
    }
  }
};

template <> struct Block<GgmlType::Q4_K> {  // d, dmin, scales[12], qs[128]
  static constexpr int kUnits = 8, kBytes = 144;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    k4_scale_min(s, b + 4, &sc, &m);
    const float dl = mul(d, static_cast<float>(sc)), ml = mul(dmin, static_cast<float>(m));
    const uint8_t* q = b + 16 + 32 * (s / 2);
    const int shift = 4 * (s % 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = __fsub_rn(mul(dl, static_cast<float>((q[l] >> shift) & 0xF)), ml);
  }
};

template <> struct Block<GgmlType::Q5_K> {  // d, dmin, scales[12], qh[32], qs[128]
  static constexpr int kUnits = 8, kBytes = 176;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    k4_scale_min(s, b + 4, &sc, &m);
    const float dl = mul(d, static_cast<float>(sc)), ml = mul(dmin, static_cast<float>(m));
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + 48 + 32 * (s / 2);
    const int shift = 4 * (s % 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> s) & 1) << 4);
      w[l] = __fsub_rn(mul(dl, static_cast<float>(v)), ml);
    }
  }
};

template <> struct Block<GgmlType::Q6_K> {  // ql[128], qh[64], scales[16] int8, d
  static constexpr int kUnits = 8, kBytes = 210;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b + 208);
    const int half = s / 4, quarter = s % 4;
    const uint8_t* lo = b + 64 * half + 32 * (quarter % 2);
    const uint8_t* hi = b + 128 + 32 * half;
    const int lo_shift = 4 * (quarter / 2), hi_shift = 2 * quarter;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float dl = mul(d, static_cast<float>(static_cast<int8_t>(b[192 + 2 * s + h])));
#pragma unroll
      for (int l = 16 * h; l < 16 * h + 16; ++l) {
        const int q = ((lo[l] >> lo_shift) & 0xF) | (((hi[l] >> hi_shift) & 3) << 4);
        w[l] = mul(dl, static_cast<float>(q - 32));
      }
    }
  }
};

template <> struct Block<GgmlType::Q8_K> {  // d (f32), qs[256] int8, bsums[16] int16 (unused)
  static constexpr int kUnits = 8, kBytes = 292;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = __uint_as_float(u32_at(b));
    const uint8_t* qs = b + 4 + 32 * s;
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = mul(d, static_cast<float>(static_cast<int8_t>(qs[l])));
  }
};

// d, scales_h (2 bits per sub-block), scales_l[4] (nibbles), qs[128]; unit s is sub-block s, its
// 16 bytes hold values 0..15 in the low nibbles and 16..31 in the high ones.
template <> struct Block<GgmlType::IQ4_XS> {
  static constexpr int kUnits = 8, kBytes = 136;
  __device__ static void unit(const uint8_t* b, int s, float* w) {
    const float d = f16_at(b);
    const uint32_t sh = u16_at(b + 2);
    const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
    const float dl = mul(d, static_cast<float>(ls - 32));
    const uint8_t* q = b + 8 + 16 * s;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      w[l] = mul(dl, static_cast<float>(kIQ4NL[q[l] & 0xF]));
      w[l + 16] = mul(dl, static_cast<float>(kIQ4NL[q[l] >> 4]));
    }
  }
};

// Calls `f.template operator()<T>()` with the decoder type for `t`; false when there is none.
template <typename F>
bool dispatch_block(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: f.template operator()<GgmlType::F32>(); return true;
    case GgmlType::F16: f.template operator()<GgmlType::F16>(); return true;
    case GgmlType::BF16: f.template operator()<GgmlType::BF16>(); return true;
    case GgmlType::Q4_0: f.template operator()<GgmlType::Q4_0>(); return true;
    case GgmlType::Q4_1: f.template operator()<GgmlType::Q4_1>(); return true;
    case GgmlType::Q5_0: f.template operator()<GgmlType::Q5_0>(); return true;
    case GgmlType::Q5_1: f.template operator()<GgmlType::Q5_1>(); return true;
    case GgmlType::Q8_0: f.template operator()<GgmlType::Q8_0>(); return true;
    case GgmlType::IQ4_NL: f.template operator()<GgmlType::IQ4_NL>(); return true;
    case GgmlType::MXFP4: f.template operator()<GgmlType::MXFP4>(); return true;
    case GgmlType::Q2_K: f.template operator()<GgmlType::Q2_K>(); return true;
    case GgmlType::Q3_K: f.template operator()<GgmlType::Q3_K>(); return true;
    case GgmlType::Q4_K: f.template operator()<GgmlType::Q4_K>(); return true;
    case GgmlType::Q5_K: f.template operator()<GgmlType::Q5_K>(); return true;
    case GgmlType::Q6_K: f.template operator()<GgmlType::Q6_K>(); return true;
    case GgmlType::Q8_K: f.template operator()<GgmlType::Q8_K>(); return true;
    case GgmlType::IQ4_XS: f.template operator()<GgmlType::IQ4_XS>(); return true;
    default: return false;
  }
}

// Whether there is a decoder for `t` (the capture keeps nvcc from asking for a function-pointer
// conversion it cannot give a template lambda).
inline bool has_block(GgmlType t) {
  return dispatch_block(t, [&]<GgmlType>() {});
}

}  // namespace surogate::cuda::gguf_dev
