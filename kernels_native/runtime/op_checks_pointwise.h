// The pointwise ops' argument checks and attributes, shared by the CPU kernels (cpu/elementwise.cpp,
// cpu/activation.cpp, cpu/dropout.cpp) and the CUDA ones (cuda/elementwise.cu,
// cuda/norm_rope_act_gated.cu, cuda/embed_optim_dropout.cu).
//   fill         () -> (y); attr value                      cast  (x) -> (y), float dtypes, same numel
//   add          (a, b) -> (y = alpha a + beta b)           scale (x) -> (y = alpha x)
//   swiglu_fwd / geglu_fwd  (gu[N,2F]) -> (y[N,F])          swiglu_bwd / geglu_bwd (dy[N,F], gu) -> (dgu)
//   dropout_fwd  (x, [rng int32[2] | int64[1]]) -> (y); attrs p, seed, offset
//   act_mul_fwd  (a, [b]) -> (y = act(a) * b), b of a's shape or one value, absent: act(a) alone (the
//                plain gelu_tanh of SigLIP's MLP); attr act (none | gelu_tanh)
//   act_mul_bwd  (dy, a, [b]) -> (da, [db]) (db only for b of a's shape)
//   softcap_fwd  (x) -> (y = cap tanh(x / cap)); attr cap
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

// act(a) * b (Gemma 4: its per-layer input gate, gelu_tanh(gate) * per_layer_input, and its layer
// scalar, x * s with s one value): n elements of a; b of a's shape, or one value (broadcast), or
// absent: act(a) (SigLIP's gelu_tanh), a broadcast of 1 that the kernels read as b == nullptr.
struct ActMulArgs {
  int64_t n = 0;
  bool has_b = true;       // input b given
  bool broadcast = false;  // b holds one value (or is absent)
  bool gelu = false;       // act: gelu_tanh, else none
  bool gelu_erf = false;   // act: gelu (the exact, erf form: nn.GELU())
};
Status check_act_mul_fwd(const OpArgs& a, ActMulArgs* r);
Status check_act_mul_bwd(const OpArgs& a, ActMulArgs* r);

// softcap_fwd: *cap > 0.
Status check_softcap_fwd(const OpArgs& a, float* cap);

struct DropoutArgs {
  enum Rng : int { kNone = 0, kI32 = 1, kI64 = 2 };  // the optional rng input's kind
  Rng rng = kNone;
  uint64_t seed = 0, offset = 0;
  uint64_t thr = 0;    // keep iff (hash >> 40) >= thr, thr = ceil(p 2^24)
  float scale = 1.0f;  // 1 / (1 - p), 0 for p >= 1
};
Status check_dropout_fwd(const OpArgs& a, DropoutArgs* r);

}  // namespace surogate
