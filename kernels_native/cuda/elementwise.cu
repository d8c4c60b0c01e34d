// Elementwise CUDA ops: fill, cast, copy, add, scale, argmax over rows — the CUDA twins of
// cpu/elementwise.cpp.
#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"

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

// One block per row: each thread keeps the best (value, lowest index) of its strided share and
// whether it saw a NaN / +inf, then a block reduction. -1 for a row with a non-finite value.
template <typename T>
__global__ void argmax_kernel(const T* x, int64_t row_stride, int64_t V, int32_t* y) {
  const T* row = x + blockIdx.x * row_stride;
  float bv = -INFINITY;
  int64_t bi = -1;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = ld(row[i]);
    bad |= isnan(v) || v == INFINITY;
    if (bi < 0 || v > bv) bv = v, bi = i;  // i increases: a tie keeps the earlier index
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
      const int64_t oi = si[threadIdx.x + s];
      const int64_t mi = si[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = sbad ? -1 : static_cast<int32_t>(si[0]);
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(blocks_for(n, kThreads), 65535)); }

Status fill(const OpArgs& a) {
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_contiguous("fill", "y", y));
  const float v = static_cast<float>(a.attr().get_float("value", 0.0));
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
  SG_RETURN_IF_ERROR(check_contiguous("cast", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("cast", "y", y));
  SG_CHECK_SHAPE(x.numel() == y.numel(), str_cat("cast: x ", x.shape_str(), " and y ", y.shape_str(),
                                                 " have different element counts"));
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
  SG_RETURN_IF_ERROR(check_same_shape("add", "a", x, "b", z));
  SG_RETURN_IF_ERROR(check_same_shape("add", "a", x, "y", y));
  SG_CHECK(x.dtype == z.dtype && x.dtype == y.dtype, StatusCode::kDTypeUnsupported, "add: dtypes differ", "cast first");
  const float alpha = static_cast<float>(args.attr().get_float("alpha", 1.0));
  const float beta = static_cast<float>(args.attr().get_float("beta", 1.0));
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
  SG_RETURN_IF_ERROR(check_same_shape("scale", "x", x, "y", y));
  SG_CHECK(x.dtype == y.dtype, StatusCode::kDTypeUnsupported, "scale: x and y dtypes differ", "cast first");
  const float alpha = static_cast<float>(args.attr().get_float("alpha", 1.0));
  if (x.numel() == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("scale", x.dtype, T, {
    add_kernel<T><<<grid_for(x.numel()), kThreads, 0, current_stream()>>>(x.ptr<T>(), x.ptr<T>(), y.ptr<T>(), x.numel(), alpha, 0.0f);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status argmax(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  SG_CHECK_SHAPE(x.ndim == 2 && y.ndim == 1 && y.shape[0] == x.shape[0],
                 str_cat("argmax: x ", x.shape_str(), " and y ", y.shape_str(), " are not [R, V] and [R]"));
  SG_CHECK(y.dtype == DType::kI32, StatusCode::kDTypeUnsupported, "argmax: y must be int32", "");
  SG_CHECK(x.strides[1] == 1 && y.strides[0] == 1, StatusCode::kInvalidArgument,
           "argmax: x rows and y must be contiguous", "");
  if (x.shape[0] == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("argmax", x.dtype, T, {
    argmax_kernel<T><<<static_cast<unsigned>(x.shape[0]), kThreads, 0, current_stream()>>>(
        x.ptr<T>(), x.strides[0], x.shape[1], y.ptr<int32_t>());
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_elementwise(OpRegistry& reg) {
  add_op(reg, "fill", 0, 0, 1, fill, "() -> (y); attrs: value");
  add_op(reg, "cast", 1, 1, 1, cast, "(x) -> (y) f32/bf16/f16");
  add_op(reg, "copy", 1, 1, 1, copy, "(x) -> (y) same dtype");
  add_op(reg, "add", 2, 2, 1, add, "(a, b) -> (y = alpha*a + beta*b); attrs: alpha, beta");
  add_op(reg, "scale", 1, 1, 1, scale, "(x) -> (y = alpha*x); attrs: alpha");
  add_op(reg, "argmax", 1, 1, 1, argmax, "(x [R, V]) -> (y int32 [R]): lowest index of the row max, -1 on NaN / +inf");
}

}  // namespace surogate::cuda
