// The pointwise ops' argument checks and attributes, shared by the CPU kernels (cpu/elementwise.cpp,
// cpu/activation.cpp, cpu/dropout.cpp) and the CUDA ones (cuda/elementwise.cu,
// cuda/norm_rope_act_gated.cu, cuda/embed_optim_dropout.cu).
//   fill         () -> (y); attr value                      cast  (x) -> (y), float dtypes, same numel
//   add          (a, b) -> (y = alpha a + beta b)           scale (x) -> (y = alpha x)
//   swiglu_fwd / geglu_fwd  (gu[N,2F]) -> (y[N,F])          swiglu_bwd / geglu_bwd (dy[N,F], gu) -> (dgu)
//   dropout_fwd  (x, [rng int32[2] | int64[1]]) -> (y); attrs p, seed, offset
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

Status check_fill(const OpArgs& a, float* value);
Status check_cast(const OpArgs& a);

struct AddArgs {
  float alpha = 1.0f, beta = 1.0f;  // scale: alpha only
};
Status check_add(const OpArgs& a, AddArgs* r);
Status check_scale(const OpArgs& a, AddArgs* r);

// op names the caller (swiglu_fwd or geglu_fwd, ...); *N, *F the rows and the half width of gu.
Status check_gated_fwd(const char* op, const OpArgs& a, int64_t* N, int64_t* F);
Status check_gated_bwd(const char* op, const OpArgs& a, int64_t* N, int64_t* F);

struct DropoutArgs {
  enum Rng : int { kNone = 0, kI32 = 1, kI64 = 2 };  // the optional rng input's kind
  Rng rng = kNone;
  uint64_t seed = 0, offset = 0;
  uint64_t thr = 0;    // keep iff (hash >> 40) >= thr, thr = ceil(p 2^24)
  float scale = 1.0f;  // 1 / (1 - p), 0 for p >= 1
};
Status check_dropout_fwd(const OpArgs& a, DropoutArgs* r);

}  // namespace surogate
