// The sample op's choice for one row, for host code that samples like the op (serve/sampler.cpp):
// after its grammar mask, logit_bias and penalties, the host Sampler draws with this, so a request's
// rows drawn on the host and on the device (the op) are the same draws.
#pragma once

#include <cstdint>

namespace surogate::cpu {

// Steps 2-4 of cpu/sample.cpp for a float32 row [V] without NaN / +inf (the caller checks; -inf,
// a masked token, is never drawn unless every token is): the token under a params row [8]
// (runtime/op_checks_sample.h).
int32_t sample_token(const float* x, int64_t V, const float* params);

// A grammar's bitmask on a row [V] (core/sample_math.h: allows): every token it does not allow
// becomes -inf. The op's mask input and the host Sampler both mask with this.
void mask_row(float* x, int64_t V, const uint32_t* mask);

}  // namespace surogate::cpu
