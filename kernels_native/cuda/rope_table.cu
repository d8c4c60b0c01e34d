// RoPE from per-token cos / sin tables on CUDA: rope_table_fwd / rope_table_bwd, the twins of
// cpu/rope_table.cpp (read its header for the formula and the rounding: f32 math, one rounding at
// the store). One thread per rotated pair (n, h, i < half); the pass-through dims [R, D) are copied
// by the same threads when y does not alias x.
#include <algorithm>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_rope_table.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t items) { return grid_stride_blocks(items, kThreads); }

template <typename T>
__global__ void rope_table_kernel(const T* x, const float* cos, const float* sin, T* y, RopeTableArgs r, float sign) {
  const int64_t half = r.half, R = 2 * half, pairs = r.N * r.H * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < pairs; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, nh = e / half, n = nh / r.H;
    const T* xr = x + nh * r.D;
    T* yr = y + nh * r.D;
    const float a = ld(xr[i]), b = ld(xr[i + half]);
    const float c = cos[n * half + i], s = sign * sin[n * half + i];
    if (r.round_products) {  // HF's text rope in T: cos / sin, each product and the sum rounded to T
      const float ct = ld(st<T>(c)), s_t = ld(st<T>(s));
      yr[i] = st<T>(ld(st<T>(a * ct)) + ld(st<T>((-b) * s_t)));
      yr[i + half] = st<T>(ld(st<T>(b * ct)) + ld(st<T>(a * s_t)));
    } else {
      yr[i] = st<T>(a * c + (-b) * s);
      yr[i + half] = st<T>(b * c + a * s);
    }
    if (xr != yr) {
      for (int64_t j = R + i; j < r.D; j += half) yr[j] = xr[j];
    }
  }
}

Status rope_table_apply(const char* op, const OpArgs& a, float sign) {
  RopeTableArgs r;
  SG_RETURN_IF_ERROR(check_rope_table(op, a, &r));
  const int64_t pairs = r.N * r.H * r.half;
  if (pairs == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    rope_table_kernel<T><<<grid_for(pairs), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<float>(), a.in(2).ptr<float>(), a.out(0).ptr<T>(), r, sign);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status rope_table_fwd(const OpArgs& a) { return rope_table_apply("rope_table_fwd", a, 1.0f); }
Status rope_table_bwd(const OpArgs& a) { return rope_table_apply("rope_table_bwd", a, -1.0f); }

}  // namespace

void register_cuda_rope_table(OpRegistry& reg) {
  add_op(reg, "rope_table_fwd", rope_table_fwd);
  add_op(reg, "rope_table_bwd", rope_table_bwd);
}

}  // namespace surogate::cuda
