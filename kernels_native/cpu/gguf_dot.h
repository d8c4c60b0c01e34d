// The integer dot products behind gguf_matmul's decode path (see cpu/gguf_matmul.cpp).
#pragma once

#include <cstdint>

#include "core/gguf_types.h"

namespace surogate::cpu {

constexpr int64_t kMaxDotRows = 32;  // N at or below which gguf_matmul takes the integer dot path

// x[N, K] quantized for the dot: per 32 values a scale d = amax/127 and int8 q = round(x / d);
// s16 / s32: d times the sum of each 16 / 32 quants (what a weight block's min multiplies).
struct QuantizedX {
  const int8_t* q;    // [N, K]
  const float* d;     // [N, K/32]
  const float* s16;   // [N, K/16]
  const float* s32;   // [N, K/32]
  int64_t K;
};

// True when this CPU has AVX2+FMA+F16C and there is a kernel for `t` (the environment variable
// SUROGATE_GGUF_NO_AVX2=1 turns them off, to test the portable path).
bool dot_avx2_supported(gguf::GgmlType t);
// y[n * ldy + m] = sum_k x[n, k] * W[m, k] for n < N, m in [m_lo, m_hi), W rows
// of `row_bytes` raw blocks of type `t`.
void dot_avx2_rows(gguf::GgmlType t, const uint8_t* W, int64_t row_bytes, const QuantizedX& x, int64_t N,
                   int64_t m_lo, int64_t m_hi, float* y, int64_t ldy);

// F16 / BF16 weights against f32 x[N, K] (no rounding of x): the same contract, for small N.
bool dot_float_avx2_supported(gguf::GgmlType t);
void dot_float_avx2_rows(gguf::GgmlType t, const uint8_t* W, const float* x, int64_t K, int64_t N, int64_t m_lo,
                         int64_t m_hi, float* y, int64_t ldy);

// The same on any CPU (cpu/gguf_dot_portable.cpp), for every type with a decoder.
bool dot_portable_supported(gguf::GgmlType t);
void dot_portable_rows(gguf::GgmlType t, const uint8_t* W, int64_t row_bytes, const QuantizedX& x, int64_t N,
                       int64_t m_lo, int64_t m_hi, float* y, int64_t ldy);

// n values (whole blocks) of type `t` to f32, equal to gguf::dequantize_row (NaN payloads
// aside); only where decode_avx2_supported(t): the quantized types and F16, BF16.
bool decode_avx2_supported(gguf::GgmlType t);
void decode_avx2(gguf::GgmlType t, const uint8_t* src, float* y, int64_t n);

}  // namespace surogate::cpu
