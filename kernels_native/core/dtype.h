// Element types and exact conversions between them.
//
// f32, f16 (IEEE binary16), bf16 (upper half of binary32), fp8 e4m3fn and e5m2 (OCP 8-bit
// floating point spec). Every narrowing conversion rounds to nearest, ties to even, as the
// IEEE / OCP definitions ask; subnormals are kept. Overflow: f16, bf16 and e5m2 go to
// infinity; e4m3fn has no infinity and goes to NaN (OCP's non-saturating mode, as ml_dtypes
// does; torch's CPU cast saturates instead), or to +-448 with the `_sat` variant that FP8
// training recipes use.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace surogate {

enum class DType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kF64,
  kI8,
  kU8,
  kI32,
  kI64,
};
constexpr int kNumDTypes = 10;

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);                // "float32", "bfloat16", ...
bool dtype_from_name(std::string_view name, DType* out);  // accepts "f32"/"float32", "bf16"/"bfloat16", ...
inline bool dtype_is_float(DType dt) { return dt <= DType::kF64; }

// ---- bf16 -------------------------------------------------------------------------------
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// ---- f16 (compiler's _Float16: IEEE round-to-nearest-even, subnormals, inf and NaN) ------
inline uint16_t f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u; std::memcpy(&u, &h, 2); return u;
}
inline float f16_to_f32(uint16_t u) {
  _Float16 h; std::memcpy(&h, &u, 2); return static_cast<float>(h);
}

// ---- fp8 ----------------------------------------------------------------------------------
uint8_t f32_to_f8e4m3(float f);      // overflow -> NaN
uint8_t f32_to_f8e4m3_sat(float f);  // overflow -> +-448
uint8_t f32_to_f8e5m2(float f);      // overflow -> +-inf
uint8_t f32_to_f8e5m2_sat(float f);  // overflow -> +-57344
float f8e4m3_to_f32(uint8_t v);
float f8e5m2_to_f32(uint8_t v);

// Storage types the kernels are templated on. Each has load() to f32 and store() from f32.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };
struct f8e4m3_t { uint8_t bits; };
struct f8e5m2_t { uint8_t bits; };

inline float load(float v) { return v; }
inline float load(bf16_t v) { return bf16_to_f32(v.bits); }
inline float load(f16_t v) { return f16_to_f32(v.bits); }
inline float load(f8e4m3_t v) { return f8e4m3_to_f32(v.bits); }
inline float load(f8e5m2_t v) { return f8e5m2_to_f32(v.bits); }

template <typename T> T store(float f);
template <> inline float store<float>(float f) { return f; }
template <> inline bf16_t store<bf16_t>(float f) { return bf16_t{f32_to_bf16(f)}; }
template <> inline f16_t store<f16_t>(float f) { return f16_t{f32_to_f16(f)}; }
template <> inline f8e4m3_t store<f8e4m3_t>(float f) { return f8e4m3_t{f32_to_f8e4m3(f)}; }
template <> inline f8e5m2_t store<f8e5m2_t>(float f) { return f8e5m2_t{f32_to_f8e5m2(f)}; }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::kBF16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::kF16; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }

// Convert n contiguous elements between any two float dtypes (f32/f16/bf16/fp8/f64).
// Returns false when either dtype is not a float type.
bool convert(const void* src, DType src_dt, void* dst, DType dst_dt, int64_t n);

}  // namespace surogate
