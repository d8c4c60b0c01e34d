// The `sample` op's argument checks and its per-row parameters, shared by cpu/sample.cpp and
// cuda/sample.cu (the numerics both follow: core/sample_math.h; the draw: core/philox.h).
//   sample (logits [R, V] f32 / bf16 / f16 (rows contiguous, row stride >= V), params f32 [R, 8],
//           [mask int32 [R, W]: a grammar's bitmask, W = ceil(V / 32), bit i % 32 of word i / 32 =
//            token i allowed; a row of all ones: unconstrained])
//     -> (token int32 [R], logprob f32 [R], [rank int32 [R]])
// With a mask, disallowed tokens are -inf for the choice only (core/sample_math.h: allows); a row
// whose mask leaves no finite logit gets token -2 (sample::kNothingAllowed), logprob -inf, rank 0.
// A params row: temperature, top_k (<= 0 or >= V: off), top_p (>= 1: off), min_p (<= 0: off),
// seed_lo, seed_hi, step (uint32 bit patterns stored in the f32 slots), reserved (0).
// Serving only: no derivative.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

enum SampleParam : int {
  kSampleTemperature = 0,
  kSampleTopK,
  kSampleTopP,
  kSampleMinP,
  kSampleSeedLo,
  kSampleSeedHi,
  kSampleStep,
  kSampleReserved,
  kSampleParamCols  // 8
};

// A grammar row's second draw (Sampler::checks_first: its first, unmasked draw was refused) sets
// this bit of its step: the Philox counter of a uniform no first draw uses (steps stay below 2^31).
constexpr uint32_t kSampleRedraw = 1u << 31;

// Below this temperature a row is greedy (SamplingParams::greedy): the argmax op's token.
constexpr float kSampleGreedyBelow = 1e-5f;

struct SampleDims {
  int64_t R = 0, V = 0;
  int64_t row_stride = 0;  // of logits, in elements
  bool rank = false;       // the rank output is given
  bool mask = false;       // the mask input is given
};
Status check_sample(const OpArgs& a, SampleDims* d);

// One params row, as the serving runner fills it (bit patterns into the seed and step slots).
inline void pack_sample_params(float* row, float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed,
                               uint32_t step) {
  const uint32_t bits[3] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), step};
  row[kSampleTemperature] = temperature;
  row[kSampleTopK] = static_cast<float>(top_k);
  row[kSampleTopP] = top_p;
  row[kSampleMinP] = min_p;
  std::memcpy(row + kSampleSeedLo, bits, sizeof(bits));
  row[kSampleReserved] = 0.0f;
}

}  // namespace surogate
