// The norm ops' argument checks and attributes, shared by cpu/norm.cpp and
// cuda/norm_rope_act_rmsnorm.cu / norm_rope_act_layernorm.cu (formulas: cpu/norm.cpp's header).
// N rows, C channels.
//   rmsnorm_fwd      (x[N,C], w[C]) -> (y[N,C], rstd[N] f32)
//   add_rmsnorm_fwd  (x, residual, w) -> (y, h = x + residual, rstd)
//   rmsnorm_bwd      (dy, x, w, rstd) -> (dx, [dw])
//   add_rmsnorm_bwd  (dy, [dh], h, w, rstd) -> (dx, [dw])
// x / h, y, residual, dy, dh, dx share one dtype and are contiguous; w is f32, bf16 or f16;
// dw has w's shape, in f32 or w's dtype.
//   layer_norm_fwd   (x[N,C], w[C], [b[C]]) -> (y[N,C], mean[N] f32, rstd[N] f32)
//   layer_norm_bwd   (dy, x, w, mean, rstd) -> (dx, [dw], [db])
// As RMSNorm's, plus b (w's shape and dtype) and db (w's shape, f32 or w's dtype).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct RmsNormArgs {
  int64_t N = 0, C = 0;
  float eps = 1e-6f;         // forward
  float offset = 0.0f;       // attr weight_offset (Gemma: 1)
  bool accumulate = false;   // backward: add into dw
  const Tensor* dh = nullptr;  // add_rmsnorm_bwd's optional dh
  const Tensor* dw = nullptr;  // backward's optional dw
};

Status check_rmsnorm_fwd(const OpArgs& a, RmsNormArgs* r);
Status check_add_rmsnorm_fwd(const OpArgs& a, RmsNormArgs* r);
Status check_rmsnorm_bwd(const OpArgs& a, RmsNormArgs* r);
Status check_add_rmsnorm_bwd(const OpArgs& a, RmsNormArgs* r);

struct LayerNormArgs {
  int64_t N = 0, C = 0;
  float eps = 1e-5f;           // forward (torch's nn.LayerNorm default)
  bool accumulate = false;     // backward: add into dw and db
  const Tensor* b = nullptr;   // forward's optional bias
  const Tensor* dw = nullptr;  // backward's optional outputs
  const Tensor* db = nullptr;
};

Status check_layer_norm_fwd(const OpArgs& a, LayerNormArgs* r);
Status check_layer_norm_bwd(const OpArgs& a, LayerNormArgs* r);

}  // namespace surogate
