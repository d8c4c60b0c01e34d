#include "core/dtype.h"

#include <cmath>
#include <limits>

namespace surogate {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
    case DType::kF64: return 8;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kF8E5M2: return "float8_e5m2";
    case DType::kF64: return "float64";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "?";
}

bool dtype_from_name(std::string_view n, DType* out) {
  struct Alias { const char* name; DType dt; };
  static const Alias kAliases[] = {
      {"float32", DType::kF32},       {"f32", DType::kF32},         {"fp32", DType::kF32},
      {"float16", DType::kF16},       {"f16", DType::kF16},         {"fp16", DType::kF16},
      {"bfloat16", DType::kBF16},     {"bf16", DType::kBF16},
      {"float8_e4m3fn", DType::kF8E4M3}, {"f8e4m3", DType::kF8E4M3}, {"e4m3", DType::kF8E4M3},
      {"float8_e5m2", DType::kF8E5M2},   {"f8e5m2", DType::kF8E5M2}, {"e5m2", DType::kF8E5M2},
      {"float64", DType::kF64},       {"f64", DType::kF64},
      {"int8", DType::kI8},           {"i8", DType::kI8},
      {"uint8", DType::kU8},          {"u8", DType::kU8},
      {"int32", DType::kI32},         {"i32", DType::kI32},
      {"int64", DType::kI64},         {"i64", DType::kI64},
  };
  for (const auto& a : kAliases) {
    if (n == a.name) { *out = a.dt; return true; }
  }
  return false;
}

namespace {

// A small binary float format: `exp_bits` exponent bits with the IEEE bias, `man_bits`
// mantissa bits. `has_inf`: the all-ones exponent is inf/NaN (IEEE style, e5m2); otherwise only
// the all-ones pattern is NaN and the rest of that exponent holds normal numbers (e4m3fn).
struct SmallFloat {
  int exp_bits, man_bits;
  bool has_inf;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  double max_finite() const {
    int top_exp = (1 << exp_bits) - 1 - bias();  // exponent of the all-ones field
    if (has_inf) return std::ldexp(2.0 - std::ldexp(1.0, -man_bits), top_exp - 1);
    return std::ldexp(2.0 - std::ldexp(1.0, -(man_bits - 1)), top_exp);  // mantissa all-ones is NaN
  }
};

constexpr SmallFloat kE4M3{4, 3, false};
constexpr SmallFloat kE5M2{5, 2, true};

uint8_t encode_small(float f, const SmallFloat& fmt, bool saturate) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const uint8_t nan = fmt.has_inf ? 0x7e : 0x7f;
  const uint8_t inf = static_cast<uint8_t>(((1 << fmt.exp_bits) - 1) << fmt.man_bits);
  const uint8_t max_code = fmt.has_inf ? static_cast<uint8_t>(inf - 1) : 0x7e;
  if (std::isnan(f)) return sign | nan;
  double v = std::fabs(static_cast<double>(f));
  if (std::isinf(f)) {
    if (saturate) return sign | max_code;
    return sign | (fmt.has_inf ? inf : nan);
  }
  if (v == 0.0) return sign;
  const int min_exp = 1 - fmt.bias();
  int e;
  std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // v in [2^exp, 2^(exp+1))
  if (exp < min_exp) exp = min_exp;  // subnormal range shares the smallest quantum
  const double quantum = std::ldexp(1.0, exp - fmt.man_bits);
  const double r = std::nearbyint(v / quantum) * quantum;  // ties to even (default rounding mode)
  if (r > fmt.max_finite()) {
    if (saturate) return sign | max_code;
    return sign | (fmt.has_inf ? inf : nan);
  }
  if (r == 0.0) return sign;
  std::frexp(r, &e);
  int rexp = e - 1;
  uint32_t code;
  if (rexp < min_exp) {
    code = static_cast<uint32_t>(r / std::ldexp(1.0, min_exp - fmt.man_bits));  // subnormal
  } else {
    uint32_t man = static_cast<uint32_t>(r / std::ldexp(1.0, rexp - fmt.man_bits)) - (1u << fmt.man_bits);
    code = (static_cast<uint32_t>(rexp + fmt.bias()) << fmt.man_bits) | man;
  }
  return sign | static_cast<uint8_t>(code);
}

float decode_small(uint8_t v, const SmallFloat& fmt) {
  const bool neg = v & 0x80;
  const uint32_t exp_field = (v >> fmt.man_bits) & ((1u << fmt.exp_bits) - 1);
  const uint32_t man = v & ((1u << fmt.man_bits) - 1);
  const uint32_t exp_max = (1u << fmt.exp_bits) - 1;
  float out;
  if (fmt.has_inf && exp_field == exp_max) {
    out = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!fmt.has_inf && exp_field == exp_max && man == ((1u << fmt.man_bits) - 1)) {
    out = std::numeric_limits<float>::quiet_NaN();
  } else if (exp_field == 0) {
    out = static_cast<float>(std::ldexp(static_cast<double>(man), 1 - fmt.bias() - fmt.man_bits));
  } else {
    out = static_cast<float>(std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -fmt.man_bits),
                                        static_cast<int>(exp_field) - fmt.bias()));
  }
  return neg ? -out : out;
}

struct DecodeTables {
  float e4m3[256];
  float e5m2[256];
  DecodeTables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = decode_small(static_cast<uint8_t>(i), kE4M3);
      e5m2[i] = decode_small(static_cast<uint8_t>(i), kE5M2);
    }
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

}  // namespace

uint8_t f32_to_f8e4m3(float f) { return encode_small(f, kE4M3, false); }
uint8_t f32_to_f8e4m3_sat(float f) { return encode_small(f, kE4M3, true); }
uint8_t f32_to_f8e5m2(float f) { return encode_small(f, kE5M2, false); }
uint8_t f32_to_f8e5m2_sat(float f) { return encode_small(f, kE5M2, true); }
float f8e4m3_to_f32(uint8_t v) { return tables().e4m3[v]; }
float f8e5m2_to_f32(uint8_t v) { return tables().e5m2[v]; }

namespace {

float load_any(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF8E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::kF8E5M2: return f8e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
    default: return 0.f;
  }
}

void store_any(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::kF8E4M3: static_cast<uint8_t*>(p)[i] = f32_to_f8e4m3(v); break;
    case DType::kF8E5M2: static_cast<uint8_t*>(p)[i] = f32_to_f8e5m2(v); break;
    default: break;
  }
}

}  // namespace

bool convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) {
  if (!dtype_is_float(sdt) || !dtype_is_float(ddt)) return false;
  if (sdt == ddt) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(sdt));
    return true;
  }
  // f64 goes through double directly so that f64 -> f32 rounds once, not twice.
  if (sdt == DType::kF64) {
    const double* s = static_cast<const double*>(src);
    if (ddt == DType::kF32) {
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = static_cast<float>(s[i]);
      return true;
    }
    if (ddt == DType::kF16) {
      for (int64_t i = 0; i < n; ++i) {
        _Float16 h = static_cast<_Float16>(s[i]);
        std::memcpy(static_cast<uint16_t*>(dst) + i, &h, 2);
      }
      return true;
    }
    // bf16 / fp8 from f64: round to f32 first (double rounding is possible here, documented).
    for (int64_t i = 0; i < n; ++i) store_any(dst, ddt, i, static_cast<float>(s[i]));
    return true;
  }
  if (ddt == DType::kF64) {
    double* d = static_cast<double*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = load_any(src, sdt, i);
    return true;
  }
  for (int64_t i = 0; i < n; ++i) store_any(dst, ddt, i, load_any(src, sdt, i));
  return true;
}

}  // namespace surogate
