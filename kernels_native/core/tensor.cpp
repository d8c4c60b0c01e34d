#include "core/tensor.h"

#include <cstring>

#include "core/allocator.h"

namespace surogate {

std::string Device::to_string() const {
  return type == DeviceType::kCPU ? std::string("cpu") : str_cat("cuda:", index);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no elements: any strides (numpy gives zeros) address nothing
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += str_cat(i ? ", " : "", shape[i]);
  return s + "]";
}

std::string Tensor::describe() const {
  return str_cat(dtype_name(dtype), shape_str(), " on ", device.to_string());
}

Tensor Tensor::view_of(void* data, DType dt, const std::vector<int64_t>& shape, Device dev,
                       std::shared_ptr<void> owner) {
  Tensor t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  t.owner = std::move(owner);
  return t;
}

Status Tensor::reshape(const std::vector<int64_t>& new_shape, Tensor* out) const {
  SG_CHECK_ARG(is_contiguous(), str_cat("reshape needs a contiguous tensor, got ", describe()));
  SG_CHECK_ARG(new_shape.size() <= kMaxDims, str_cat("at most ", kMaxDims, " dimensions"));
  int64_t n = 1;
  for (int64_t d : new_shape) n *= d;
  SG_CHECK_SHAPE(n == numel(), str_cat("cannot reshape ", shape_str(), " (", numel(), " elements) to ",
                                       new_shape.size(), " dims with ", n, " elements"));
  *out = view_of(data, dtype, new_shape, device, owner);
  return Status::OK();
}

Tensor Tensor::slice0(int64_t start, int64_t len) const {
  Tensor t = *this;
  t.shape[0] = len;
  t.data = static_cast<char*>(data) + start * strides[0] * static_cast<int64_t>(dtype_size(dtype));
  return t;
}

Status empty(const std::vector<int64_t>& shape, DType dt, Device dev, Tensor* out) {
  SG_CHECK_ARG(shape.size() <= kMaxDims, str_cat("at most ", kMaxDims, " dimensions"));
  int64_t n = 1;
  for (int64_t d : shape) {
    SG_CHECK_ARG(d >= 0, str_cat("negative dimension ", d));
    n *= d;
  }
  std::shared_ptr<void> block;
  SG_RETURN_IF_ERROR(allocate(dev, static_cast<size_t>(n) * dtype_size(dt), &block));
  *out = Tensor::view_of(block.get(), dt, shape, dev, block);
  return Status::OK();
}

Status zeros(const std::vector<int64_t>& shape, DType dt, Device dev, Tensor* out) {
  SG_RETURN_IF_ERROR(empty(shape, dt, dev, out));
  return fill_zero(*out);
}

Status check_dtype(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed) {
  std::string names;
  for (DType d : allowed) {
    if (t.dtype == d) return Status::OK();
    names += str_cat(names.empty() ? "" : ", ", dtype_name(d));
  }
  return SG_ERROR(StatusCode::kDTypeUnsupported,
                  str_cat(op, ": ", arg, " has dtype ", dtype_name(t.dtype), ", expected one of ", names), "");
}

Status check_ndim(const char* op, const char* arg, const Tensor& t, int ndim) {
  SG_CHECK_SHAPE(t.ndim == ndim, str_cat(op, ": ", arg, " must have ", ndim, " dims, got ", t.describe()));
  return Status::OK();
}

Status check_contiguous(const char* op, const char* arg, const Tensor& t) {
  SG_CHECK_ARG(t.is_contiguous(), str_cat(op, ": ", arg, " must be contiguous"));
  return Status::OK();
}

Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  bool same = a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i];
  SG_CHECK_SHAPE(same, str_cat(op, ": ", a_name, " ", a.shape_str(), " and ", b_name, " ", b.shape_str(),
                               " must have the same shape"));
  return Status::OK();
}

}  // namespace surogate
