// The RoPE ops' attributes and argument checks, shared by cpu/rope.cpp and
// cuda/norm_rope_act_rope.cu (qkv_rope_cache reads the same rope attributes): parse_rope reads
// theta, rotary_dim, rope_type and its factors once and computes inv_freq on the host exactly as
// HF does (formulas and rounding order: cpu/rope.cpp's header). N tokens, H heads, D head dim.
//   rope_fwd / rope_bwd  (x[N,H,D], pos[N] i32) -> (y[N,H,D])
//   qk_norm_rope_fwd     (x, w[D], pos) -> (y, rstd[N,H] f32)
//   qk_norm_rope_bwd     (dy, x, w, rstd, pos) -> (dx, [dw])
// x, y, dy, dx share one dtype (f32, bf16, f16) and are contiguous; w is x's dtype; dw has w's
// shape, in w's dtype or f32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct RopeAttrs {
  int64_t rotary_dim = 0;       // R, even, in (0, D]
  std::vector<float> inv_freq;  // [R / 2], HF's f32 values to the bit
  float attention_factor = 1.0f;
};

// The rope attributes of op `op` for head dim D, checked, with inv_freq.
Status parse_rope(const char* op, const Attrs& at, int64_t D, RopeAttrs* r);

// pos: int32 [N], contiguous.
Status check_pos(const char* op, const Tensor& pos, int64_t N);

struct RopeArgs {
  int64_t N = 0, H = 0, D = 0;
  RopeAttrs rope;
  float eps = 1e-6f;           // qk_norm_rope
  bool accumulate = false;     // qk_norm_rope_bwd: add into dw
  const Tensor* dw = nullptr;  // qk_norm_rope_bwd's optional dw
};

// rope_fwd (op "rope_fwd") and rope_bwd ("rope_bwd"): the same arguments.
Status check_rope(const char* op, const OpArgs& a, RopeArgs* r);
Status check_qk_norm_rope_fwd(const OpArgs& a, RopeArgs* r);
Status check_qk_norm_rope_bwd(const OpArgs& a, RopeArgs* r);

}  // namespace surogate
