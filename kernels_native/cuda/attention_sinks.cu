// Attention sinks folded into the attention kernels' results (cuda/attention_sinks.cuh says how).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/attention_sinks.cuh"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_attention.h"

namespace surogate::cuda {

namespace {

__device__ __forceinline__ float load_any(const void* p, int dt, int64_t i) {
  if (dt == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dt == 2) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_any(void* p, int dt, int64_t i, float v) {
  if (dt == 1) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else if (dt == 2) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<float*>(p)[i] = v;
}

int code(DType dt) { return dt == DType::kBF16 ? 1 : dt == DType::kF16 ? 2 : 0; }

// One warp per (token, head) row.
__global__ void sinks_fwd_kernel(const void* sinks, int sdt, void* out, int odt, float* lse, int64_t rows, int64_t Hq,
                                 int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
    const float z = load_any(sinks, sdt, row % Hq), l = lse[row];
    const float mx = fmaxf(l, z);
    // A row without keys (lse = -inf) is all sink: out 0, lse = z.
    const float nl = mx + logf((l == -INFINITY ? 0.0f : expf(l - mx)) + expf(z - mx));
    const float mul = l == -INFINITY ? 0.0f : expf(l - nl);
    for (int64_t d = lane; d < D; d += 32) store_any(out, odt, row * D + d, load_any(out, odt, row * D + d) * mul);
    __syncwarp();
    if (lane == 0) lse[row] = nl;
  }
}

// One block per head, a fixed-order tree reduction (deterministic).
template <typename T>
__global__ void sinks_bwd_kernel(const T* dout, const T* out, const void* sinks, int sdt, const float* lse,
                                 int64_t tokens, int64_t Hq, int64_t D, void* dsinks, int ddt, bool accumulate) {
  __shared__ float part[256];
  const int64_t h = blockIdx.x;
  const float z = load_any(sinks, sdt, h);
  float acc = 0.0f;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    const int64_t i = t * Hq + h;
    float delta = 0.0f;
    for (int64_t d = 0; d < D; ++d) delta += ld(dout[i * D + d]) * ld(out[i * D + d]);
    acc -= expf(z - lse[i]) * delta;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) store_any(dsinks, ddt, h, (accumulate ? load_any(dsinks, ddt, h) : 0.0f) + part[0]);
}

}  // namespace

Status attention_sinks_fwd(const void* sinks, DType sinks_dtype, void* out, DType out_dtype, float* lse,
                           int64_t tokens, int64_t Hq, int64_t D) {
  const int64_t rows = tokens * Hq;
  if (rows == 0) return Status::OK();
  const int blocks = static_cast<int>(std::min<int64_t>((rows + 7) / 8, 1 << 20));
  sinks_fwd_kernel<<<blocks, 256, 0, current_stream()>>>(sinks, code(sinks_dtype), out, code(out_dtype), lse, rows,
                                                         Hq, D);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status attention_sinks_bwd(const OpArgs& a) {
  AttentionSinksArgs r;
  SG_RETURN_IF_ERROR(check_attention_sinks_bwd(a, &r));
  if (r.Hq == 0) return Status::OK();
  const Tensor &z = a.in(3), &dz = a.out(0);
  SG_CUDA_DISPATCH_FLOAT("attention_sinks_bwd", a.in(0).dtype, T, {
    sinks_bwd_kernel<T><<<static_cast<unsigned>(r.Hq), 256, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), z.data, code(z.dtype), a.in(2).ptr<float>(), r.N, r.Hq, r.D, dz.data,
        code(dz.dtype), r.accumulate);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace surogate::cuda
