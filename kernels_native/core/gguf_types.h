// GGML tensor types, the element types of GGUF files: ids, block geometry, names, and the
// conversion of one row to and from f32.
//
// A GGML type packs `block_size` consecutive values of a row into `type_size` bytes; a row of
// n values takes n / block_size * type_size bytes (n must be a multiple of block_size). Ids
// and sizes are those of ggml.h / ggml-common.h (gguf-py's GGMLQuantizationType and
// GGML_QUANT_SIZES). dequantize_row reproduces gguf-py's gguf.quants.dequantize bit for bit:
// the same operations in the same order (Q4_K is (d*sc)*q - dmin*m, two roundings), never a
// fused multiply-add. quantize_row reproduces gguf-py's quantize for Q8_0, Q4_0, Q4_1, Q5_0
// and Q5_1, and llama.cpp's reference quantizers (quantize_row_*_ref, no importance matrix)
// for the K types; see cpu/gguf_quantize.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace surogate::gguf {

enum class GgmlType : int32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

constexpr int QK_K = 256;  // values per super-block of the K types (and IQ4_XS)

struct TypeInfo {
  const char* name;    // "Q4_K"
  int block_size;      // values per block
  int type_size;       // bytes per block
  bool dequantize;     // dequantize_row supports it
  bool quantize;       // quantize_row supports it
};

// Geometry of `t`, or nullptr for an id ggml does not define (or has retired: 4, 5, 31-33).
const TypeInfo* type_info(GgmlType t);
// "Q4_K"; "type 99" for an unknown id.
std::string type_name(GgmlType t);
// Bytes of a row of n values. Errors (naming the type) when the id is unknown or n is not a
// multiple of the block size.
Status row_bytes(GgmlType t, int64_t n, int64_t* bytes);

// Decode n values (one row, or several rows back to back) from raw blocks. Error "unsupported
// GGUF type X" for a type this build cannot decode; the caller adds the tensor's name.
Status dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// Encode n values into raw blocks (row_bytes(t, n) bytes). Supported: F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
Status quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

// ---- helpers shared by the decoders, quantizers and the quantized matmul ------------------

inline uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// binary16 -> binary32, exact for every input (NaNs stay NaN), with integer and f32 arithmetic
// only so that loops over it vectorize (the compiler's _Float16 conversion is a libgcc call on
// baseline x86-64). After M. Dukhan's FP16 library.
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal (and inf/NaN): move the exponent and mantissa into place, then rebias by 2^-112.
  const float normalized = bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: mantissa as the low bits of 0.5 * 2^1, minus 0.5.
  const float denormalized = bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized));
  return bits_f32(r);
}
inline float load_half(const uint8_t* p) { return half_to_float(load_u16(p)); }
inline void store_half(uint8_t* p, float f) { uint16_t h = f32_to_f16(f); std::memcpy(p, &h, 2); }

// Round to nearest, ties to even, for |f| < 2^22 (ggml's nearest_int).
inline int nearest_int(float f) {
  const float v = f + 12582912.0f;  // 1.5 * 2^23: the integer lands in the low mantissa bits
  return static_cast<int>(f32_bits(v) & 0x007fffff) - 0x00400000;
}

// IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void k4_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: signed 6-bit scale of sub-block j (0..15) from the 12 packed bytes.
inline int k3_scale(int j, const uint8_t* s) {
  const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

}  // namespace surogate::gguf
