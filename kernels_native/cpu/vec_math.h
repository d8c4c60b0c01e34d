// Vectorizable scalar math shared by the CPU kernels, and the macro that compiles a hot loop
// once per x86-64 level (AVX-512, AVX2+FMA+F16C, SSE2) so that a portable binary (no
// -march=native) still runs wide vectors where the CPU has them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SG_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SG_CPU_CLONES
#endif

namespace surogate::cpu {

// ---- scalar math the vectorizer can take: no libm calls in the hot loops -----------------

// a < b ? x : y with bit operations. Under the default -ftrapping-math GCC does not if-convert a
// float comparison, and the conditional expression would keep the AVX2 and baseline clones of
// the loops around it scalar.
inline float select_lt(float a, float b, float x, float y) {
  const int32_t m = -static_cast<int32_t>(a < b);
  return std::bit_cast<float>((std::bit_cast<int32_t>(x) & m) | (std::bit_cast<int32_t>(y) & ~m));
}

// exp(x): Cephes' expf polynomial after x = n ln2 + r, |r| <= ln2/2 (about 1 ulp). Rounding to
// n uses the 1.5 * 2^23 trick instead of nearbyint so that the baseline clone vectorizes too.
// x is clamped to [-87, 88]: below, the result is ~1e-38 instead of 0, which no softmax notices.
inline float exp_approx(float x) {
  x = select_lt(x, -87.0f, -87.0f, x);
  x = select_lt(88.0f, x, 88.0f, x);
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  return y * std::bit_cast<float>((ni + 127) << 23);
}

// tanh(x): Cephes' odd polynomial for |x| < 0.625 (where 1 - e loses digits), else
// (1 - e) / (1 + e) with e = exp(-2|x|). Both are computed and one is selected, branch free.
inline float tanh_approx(float x) {
  const float ax = std::fabs(x);
  const float e = exp_approx(-2.0f * ax);
  const float big = (1.0f - e) / (1.0f + e);
  const float z = x * x;
  const float small =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
       3.33332819422e-1f) * z * ax + ax;
  return std::copysign(select_lt(ax, 0.625f, small, big), x);
}

}  // namespace surogate::cpu
