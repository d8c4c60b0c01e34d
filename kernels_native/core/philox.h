// Philox4x32-10: a counter-based random generator (Salmon, Moraes, Dror, Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC'11; Random123's philox4x32_R(10, ctr, key)). The output is a
// pure function of (counter, key), so the host and a device compute the same bits with no state
// to carry: the `sample` op (cpu/sample.cpp, cuda/sample.cu) draws its one uniform per row from
// key = the request's 64-bit seed, counter = (tokens it has generated, 0, kSampleStream, 0), so a
// seeded request's draws depend neither on the backend nor on the batch it runs in.
//
// Known answers (Random123's kat_vectors, checked by tests/native/test_sample.py):
//   ctr 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8
//   ctr ffffffff x4, key ffffffff x2 -> 408f276d 41c83b0e a20bc7c6 6d5451fd
//   ctr 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0 -> d16cfe09 94fdcceb 5001e420 24126ea1
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SG_PHILOX_FN __host__ __device__ __forceinline__
#else
#define SG_PHILOX_FN inline
#endif

namespace surogate {

struct Philox4x32 {
  uint32_t v[4];
};

SG_PHILOX_FN Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  uint32_t c0 = ctr.v[0], c1 = ctr.v[1], c2 = ctr.v[2], c3 = ctr.v[3];
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += kW0, k1 += kW1;  // the first round uses the key as given
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The third counter word of the `sample` op's draws: another user of a request's seed (a future
// op) takes another stream word and never sees the same bits.
constexpr uint32_t kSampleStream = 0x53414d50u;  // "SAMP"

// The sample op's uniform in [0, 1) for (seed, step): 53 bits, the first output word high.
SG_PHILOX_FN double sample_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t step) {
  const Philox4x32 r = philox4x32_10(Philox4x32{{step, 0u, kSampleStream, 0u}}, seed_lo, seed_hi);
  const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) | (r.v[1] >> 11);
  return static_cast<double>(bits) * 0x1.0p-53;
}

}  // namespace surogate

#undef SG_PHILOX_FN
