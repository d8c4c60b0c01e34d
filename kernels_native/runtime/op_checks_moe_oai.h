// Argument checks of GPT-OSS's expert pieces (cpu/moe_oai.cpp, cuda/moe_oai.cu): the clamped,
// interleaved SwiGLU and the per-expert bias over moe_permute's expert-contiguous rows.
//   swiglu_oai_fwd (gu[M,2F], gate at even columns, up at odd) -> (y[M,F]); attrs alpha, limit
//   swiglu_oai_bwd (dy[M,F], gu[M,2F]) -> (dgu[M,2F]); attrs alpha, limit
//   moe_bias_add   (x[M,C], b[E,C], offsets[E+1] i32) -> (y[M,C] = x + b[e] on expert e's rows)
//   moe_bias_grad  (dy[M,C], offsets[E+1] i32) -> (db[E,C], f32 or dy's dtype); attr accumulate
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct SwigluOaiArgs {
  int64_t M = 0, F = 0;
  float alpha = 1.702f, limit = 7.0f;
};
Status check_swiglu_oai_fwd(const OpArgs& a, SwigluOaiArgs* r);
Status check_swiglu_oai_bwd(const OpArgs& a, SwigluOaiArgs* r);

struct MoeBiasArgs {
  int64_t M = 0, C = 0, E = 0;
  bool accumulate = false;
};
Status check_moe_bias_add(const OpArgs& a, MoeBiasArgs* r);
Status check_moe_bias_grad(const OpArgs& a, MoeBiasArgs* r);

}  // namespace surogate
