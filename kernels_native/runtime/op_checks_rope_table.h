// The argument checks of rope_table_fwd / rope_table_bwd, shared by cpu/rope_table.cpp and
// cuda/rope_table.cu: RoPE whose cos / sin come per token from the caller rather than from
// positions and a frequency rule (Qwen3-VL's 2D vision rotary: each patch's row and column angles,
// computed on the host from the image grids).
//   rope_table_fwd (x[N,H,D], cos[N,half] f32, sin[N,half] f32) -> (y[N,H,D])
//   rope_table_bwd (dy[N,H,D], cos, sin) -> (dx[N,H,D]), the rotation by -angle
// R = 2 half <= D rotary dims in HF's rotate_half layout (dims i and i + half pair up); dims
// [R, D) pass through. x / y: one float dtype, contiguous; y may alias x.
// attr round_products (0 / 1, default 0): 0 computes in f32 and rounds once at the store (HF's
// vision rotary); 1 rounds cos / sin to x's dtype, then each product and the sum (HF's text rope,
// apply_rotary_pos_emb: y = T(T(x cos) + T(rotate_half(x) sin)) in T's arithmetic; the backward
// in the same order, torch autograd's). For f32 both are the same.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct RopeTableArgs {
  int64_t N = 0, H = 0, D = 0, half = 0;
  bool round_products = false;
};

Status check_rope_table(const char* op, const OpArgs& a, RopeTableArgs* r);

}  // namespace surogate
