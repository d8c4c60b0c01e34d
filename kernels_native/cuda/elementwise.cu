// Elementwise CUDA ops: fill, cast, copy, add, scale, softcap_fwd, argmax over rows — the CUDA
// twins of cpu/elementwise.cpp (softcap's three roundings are written there).
#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks.h"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void fill_kernel(T* y, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = st<T>(v);
  }
}

template <typename TI, typename TO>
__global__ void cast_kernel(const TI* x, TO* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = st<TO>(ld(x[i]));
  }
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n, float alpha, float beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = st<T>(alpha * ld(a[i]) + beta * ld(b[i]));
  }
}

template <typename T>
__global__ void softcap_kernel(const T* x, T* y, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float t = ld(st<T>(tanhf(ld(st<T>(ld(x[i]) / cap)))));
    y[i] = st<T>(t * cap);
  }
}

// argmax in two stages, so that one row (a single-stream decode) still spreads over the GPU:
// grid (P, R) blocks each reduce one chunk of a row to (largest value, its lowest index, or -2
// when the chunk holds a NaN / +inf); one warp per row then reduces the P chunks in order.
constexpr int kArgmaxUnroll = 8;

template <typename T>
__global__ void argmax_chunks_kernel(const T* x, int64_t row_stride, int64_t V, int64_t chunk, float* pv, int32_t* pi) {
  const int64_t row = blockIdx.y, lo = blockIdx.x * chunk, hi = min(V, lo + chunk);
  const T* xr = x + row * row_stride;
  float bv = -INFINITY;
  int64_t bi = -1;
  bool bad = false;
  for (int64_t base = lo + threadIdx.x; base < hi; base += int64_t{kThreads} * kArgmaxUnroll) {
    float v[kArgmaxUnroll];
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) {  // the loads first: several in flight per thread
      const int64_t i = base + int64_t{u} * kThreads;
      v[u] = i < hi ? ld(xr[i]) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kThreads;
      if (i >= hi) break;
      bad |= isnan(v[u]) || v[u] == INFINITY;
      if (bi < 0 || v[u] > bv || (v[u] == bv && i < bi)) bv = v[u], bi = i;
    }
  }
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  __shared__ int sbad;
  if (threadIdx.x == 0) sbad = 0;
  __syncthreads();
  if (bad) sbad = 1;
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = sv[threadIdx.x + s];
      const int64_t oi = si[threadIdx.x + s], mi = si[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    pv[row * gridDim.x + blockIdx.x] = sv[0];
    pi[row * gridDim.x + blockIdx.x] = sbad ? -2 : static_cast<int32_t>(si[0]);
  }
}

__global__ void argmax_combine_kernel(const float* pv, const int32_t* pi, int P, int32_t* y) {
  const int row = blockIdx.x, lane = threadIdx.x;
  float bv = -INFINITY;
  int32_t bi = -1;
  bool bad = false;
  for (int p = lane; p < P; p += 32) {  // chunks in order: an equal value later has a larger index
    const float v = pv[row * P + p];
    const int32_t i = pi[row * P + p];
    bad |= i == -2;
    if (i >= 0 && (bi < 0 || v > bv)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
  }
  bad = __any_sync(0xffffffffu, bad);
  if (lane == 0) y[row] = bad ? -1 : bi;
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(blocks_for(n, kThreads), 65535)); }

Status fill(const OpArgs& a) {
  const Tensor& y = a.out(0);
  float v = 0.0f;
  SG_RETURN_IF_ERROR(check_fill(a, &v));
  if (y.numel() == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("fill", y.dtype, T, {
    fill_kernel<T><<<grid_for(y.numel()), kThreads, 0, current_stream()>>>(y.ptr<T>(), y.numel(), v);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status cast(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_cast(a));
  if (x.numel() == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("cast", x.dtype, TI, {
    SG_CUDA_DISPATCH_FLOAT("cast", y.dtype, TO, {
      cast_kernel<TI, TO><<<grid_for(x.numel()), kThreads, 0, current_stream()>>>(x.ptr<TI>(), y.ptr<TO>(), x.numel());
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status copy(const OpArgs& a) { return copy_tensor(a.in(0), a.out(0)); }

Status add(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& z = args.in(1);
  const Tensor& y = args.out(0);
  AddArgs r;
  SG_RETURN_IF_ERROR(check_add(args, &r));
  const float alpha = r.alpha, beta = r.beta;
  if (x.numel() == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("add", x.dtype, T, {
    add_kernel<T><<<grid_for(x.numel()), kThreads, 0, current_stream()>>>(x.ptr<T>(), z.ptr<T>(), y.ptr<T>(), x.numel(), alpha, beta);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status scale(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  AddArgs r;
  SG_RETURN_IF_ERROR(check_scale(args, &r));
  const float alpha = r.alpha;
  if (x.numel() == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("scale", x.dtype, T, {
    add_kernel<T><<<grid_for(x.numel()), kThreads, 0, current_stream()>>>(x.ptr<T>(), x.ptr<T>(), y.ptr<T>(), x.numel(), alpha, 0.0f);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status softcap_fwd(const OpArgs& args) {
  float cap = 0.0f;
  SG_RETURN_IF_ERROR(check_softcap_fwd(args, &cap));
  const int64_t n = args.in(0).numel();
  if (n == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("softcap_fwd", args.in(0).dtype, T, {
    softcap_kernel<T><<<grid_for(n), kThreads, 0, current_stream()>>>(args.in(0).ptr<T>(), args.out(0).ptr<T>(), n, cap);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status argmax(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  SG_RETURN_IF_ERROR(check_argmax(args));
  const int64_t R = x.shape[0], V = x.shape[1];
  if (R == 0) return Status::OK();
  // About four blocks per SM in all, each chunk at least 2048 values, at most 1024 chunks a row.
  const int64_t P = std::clamp<int64_t>(std::min<int64_t>(528 / R, (V + 2047) / 2048), 1, 1024);
  const int64_t chunk = (std::max<int64_t>(V, 1) + P - 1) / P;
  std::shared_ptr<void> part;  // [R, P] values then [R, P] indices
  SG_RETURN_IF_ERROR(allocate(x.device, static_cast<size_t>(R * P) * (sizeof(float) + sizeof(int32_t)), &part));
  float* pv = static_cast<float*>(part.get());
  int32_t* pi = reinterpret_cast<int32_t*>(pv + R * P);
  SG_CUDA_DISPATCH_FLOAT("argmax", x.dtype, T, {
    argmax_chunks_kernel<T><<<dim3(static_cast<unsigned>(P), static_cast<unsigned>(R)), kThreads, 0, current_stream()>>>(
        x.ptr<T>(), x.strides[0], V, chunk, pv, pi);
  });
  SG_CUDA_CHECK_LAUNCH();
  argmax_combine_kernel<<<static_cast<unsigned>(R), 32, 0, current_stream()>>>(pv, pi, static_cast<int>(P),
                                                                                 y.ptr<int32_t>());
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_elementwise(OpRegistry& reg) {
  add_op(reg, "fill", fill);
  add_op(reg, "cast", cast);
  add_op(reg, "copy", copy);
  add_op(reg, "add", add);
  add_op(reg, "scale", scale);
  add_op(reg, "softcap_fwd", softcap_fwd);
  add_op(reg, "argmax", argmax);
}

}  // namespace surogate::cuda
