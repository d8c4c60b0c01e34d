// The patch-grid pooling ops' argument checks and attributes, shared by cpu/pool.cpp and
// cuda/pool.cu. Each of B images is an H x W grid of patch rows (row-major: patch (r, c) is row
// r W + c of its image), C channels; k x k blocks are averaged (Gemma 3's multimodal projector:
// nn.AvgPool2d(k, stride k) over the vision tower's patch grid).
//   mean_pool_2d_fwd (x[B*H*W, C]) -> (y[B*(H/k)*(W/k), C])
//   mean_pool_2d_bwd (dy[B*(H/k)*(W/k), C]) -> (dx[B*H*W, C] = dy of its block / k^2)
// Attrs height (H), width (W), kernel (k); k divides H and W. x / dx, y / dy: one float dtype,
// contiguous.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct MeanPool2dArgs {
  int64_t B = 0, H = 0, W = 0, k = 1, C = 0;
  int64_t Ho = 0, Wo = 0;  // H / k, W / k
};

Status check_mean_pool_2d_fwd(const OpArgs& a, MeanPool2dArgs* r);
Status check_mean_pool_2d_bwd(const OpArgs& a, MeanPool2dArgs* r);

}  // namespace surogate
