// The `sample` op's numerics, shared by cpu/sample.cpp and cuda/sample.cu (host and device code)
// so that both backends make the same choice from the same row and the same uniform.
//
// A row's candidates are ordered by logit, larger first, then by lower id (the host Sampler's
// order: it compares exp'ed values, which differ only where exp rounds two distinct logits to
// one float). order_key maps a logit to a uint32 whose unsigned order is that float order (-0
// and +0 one key), so "the k-th largest" is a radix select over keys.
//
// Probabilities are exact integers: e = exp(x / T - x_max / T) in [0, 1] (float, as the host
// Sampler computes it) becomes the weight round(e * 2^shift), shift = 62 - bit_width(V), so any
// sum of a row's weights fits 62 bits. Sums are then the same whatever order a backend adds in,
// the top-p crossing and the inverse-CDF draw compare integers (exactly reproducible), and only
// the exp itself may differ by an ulp between backends. A weight is 0 below e = 2^-(shift+1)
// (2^-45 for V = 151,936): at most V * 2^-45 of the mass is dropped.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SG_SAMPLE_FN __host__ __device__ __forceinline__
#else
#define SG_SAMPLE_FN inline
#endif

namespace surogate::sample {

// A row's float logit (its bits) -> a key in the logit's order; -0 is +0. NaN never gets here.
SG_SAMPLE_FN uint32_t order_key(uint32_t bits) {
  if ((bits << 1) == 0) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

SG_SAMPLE_FN int weight_shift(int64_t V) {
  int b = 0;
  while (b < 62 && (int64_t{1} << b) <= V) ++b;
  return 62 - b;
}

// e in [0, 1] as fixed point (scale = 2^shift); e * scale is exact, so no rounding order matters.
SG_SAMPLE_FN uint64_t weight(float e, double scale) {
  return static_cast<uint64_t>(static_cast<double>(e) * scale + 0.5);
}

// top-p keeps the shortest prefix of the order whose weight reaches top_p of the kept mass (the
// host Sampler's `acc < target` walk). The target is at least 0.5, so the prefix is never empty
// (a weight is an integer: the first one >= 1, the top token's 2^shift).
SG_SAMPLE_FN double top_p_target(float top_p, uint64_t kept_mass) {
  const double t = static_cast<double>(top_p) * static_cast<double>(kept_mass);
  return t > 0.5 ? t : 0.5;
}
SG_SAMPLE_FN bool reaches(uint64_t cum, double target) { return static_cast<double>(cum) >= target; }

// How many of `count` tokens tied at the cut (each of weight w, after `above` of mass) top-p
// keeps: the smallest j in [1, count] with above + j w reaching the target.
SG_SAMPLE_FN int64_t top_p_ties(uint64_t above, uint64_t w, int64_t count, double target) {
  int64_t lo = 1, hi = count < 1 ? 1 : count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (reaches(above + static_cast<uint64_t>(mid) * w, target)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// A grammar's bitmask row (the op's optional mask input, serve/token_mask.h's layout): token i is
// allowed when bit i % 32 of word i / 32 is set. A token it does not allow is a -inf logit for the
// choice (weight 0, last in the order); the logprob and rank stay those of the unmasked row.
SG_SAMPLE_FN bool allows(const uint32_t* mask, int64_t i) {
  return mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1u) != 0;
}

// The token of a masked row that allows no token with a finite logit (the host Sampler's "every
// token is masked" error); -1 stays a row with NaN / +inf.
constexpr int32_t kNothingAllowed = -2;

// The draw: the token is the first (in id order) whose running kept weight exceeds this point.
SG_SAMPLE_FN uint64_t draw_point(double u, uint64_t mass) {
  const uint64_t t = static_cast<uint64_t>(u * static_cast<double>(mass));
  return t < mass ? t : mass - 1;
}

}  // namespace surogate::sample

#undef SG_SAMPLE_FN
