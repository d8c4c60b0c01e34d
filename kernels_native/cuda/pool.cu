// Patch-grid pooling on CUDA: mean_pool_2d_fwd / mean_pool_2d_bwd, the twins of cpu/pool.cpp (read
// its header for the row orders and the roundings: f32 sums over each k x k block in (a, c) order,
// one rounding). Grid-stride elementwise kernels over output elements (forward: each sums its k^2
// inputs, which neighbouring threads read at neighbouring channels, so loads coalesce; backward:
// each input element reads its block's dy).
#include <algorithm>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_pool.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t items) { return grid_stride_blocks(items, kThreads); }

template <typename T>
__global__ void mean_pool_2d_fwd_kernel(const T* x, T* y, MeanPool2dArgs r, float inv) {
  const int64_t total = r.B * r.Ho * r.Wo * r.C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / r.C, ch = e - o * r.C;
    const int64_t b = o / (r.Ho * r.Wo), i = o / r.Wo % r.Ho, j = o % r.Wo;
    const T* src = x + ((b * r.H + i * r.k) * r.W + j * r.k) * r.C + ch;
    float acc = 0.0f;
    for (int64_t a = 0; a < r.k; ++a) {
      for (int64_t c = 0; c < r.k; ++c) acc += ld(src[(a * r.W + c) * r.C]);
    }
    y[e] = st<T>(acc * inv);
  }
}

template <typename T>
__global__ void mean_pool_2d_bwd_kernel(const T* dy, T* dx, MeanPool2dArgs r, float inv) {
  const int64_t total = r.B * r.H * r.W * r.C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e / r.C, ch = e - n * r.C;
    const int64_t b = n / (r.H * r.W), row = n / r.W % r.H, col = n % r.W;
    dx[e] = st<T>(ld(dy[((b * r.Ho + row / r.k) * r.Wo + col / r.k) * r.C + ch]) * inv);
  }
}

Status mean_pool_2d_fwd(const OpArgs& a) {
  const char* op = "mean_pool_2d_fwd";
  MeanPool2dArgs r;
  SG_RETURN_IF_ERROR(check_mean_pool_2d_fwd(a, &r));
  const int64_t total = r.B * r.Ho * r.Wo * r.C;
  if (total == 0) return Status::OK();
  const float inv = 1.0f / static_cast<float>(r.k * r.k);
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    mean_pool_2d_fwd_kernel<T><<<grid_for(total), kThreads, 0, current_stream()>>>(a.in(0).ptr<T>(),
                                                                                  a.out(0).ptr<T>(), r, inv);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status mean_pool_2d_bwd(const OpArgs& a) {
  const char* op = "mean_pool_2d_bwd";
  MeanPool2dArgs r;
  SG_RETURN_IF_ERROR(check_mean_pool_2d_bwd(a, &r));
  const int64_t total = r.B * r.H * r.W * r.C;
  if (total == 0) return Status::OK();
  const float inv = 1.0f / static_cast<float>(r.k * r.k);
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    mean_pool_2d_bwd_kernel<T><<<grid_for(total), kThreads, 0, current_stream()>>>(a.in(0).ptr<T>(),
                                                                                  a.out(0).ptr<T>(), r, inv);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_pool(OpRegistry& reg) {
  add_op(reg, "mean_pool_2d_fwd", mean_pool_2d_fwd);
  add_op(reg, "mean_pool_2d_bwd", mean_pool_2d_bwd);
}

}  // namespace surogate::cuda
