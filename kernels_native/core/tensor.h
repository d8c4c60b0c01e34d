// Tensor: a typed, strided view of memory on one device. A Tensor does not own its bytes by
// itself; `owner` keeps whatever does own them (an allocator block, a numpy array, a Program's
// arena) alive for as long as any view exists.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace surogate {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  std::string to_string() const;
};

constexpr int kMaxDims = 8;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements
  std::shared_ptr<void> owner;
  bool readonly = false;  // wraps memory the owner marked read-only (a mmapped file, a frozen array)

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  bool is_contiguous() const;
  bool defined() const { return data != nullptr || numel() == 0; }
  std::vector<int64_t> shape_vec() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_str() const;  // "[2, 3, 4]"
  std::string describe() const;   // "bfloat16[2, 3, 4] on cpu"

  template <typename T> T* ptr() const { return static_cast<T*>(data); }

  // A contiguous tensor description over `data` (no ownership change).
  static Tensor view_of(void* data, DType dt, const std::vector<int64_t>& shape, Device dev = {},
                        std::shared_ptr<void> owner = nullptr);
  // Same bytes, another shape with the same numel. Requires contiguity.
  Status reshape(const std::vector<int64_t>& new_shape, Tensor* out) const;
  // The sub-range [start, start+len) of dimension 0 (a view).
  Tensor slice0(int64_t start, int64_t len) const;
};

// Allocate a contiguous tensor through the device's caching allocator.
Status empty(const std::vector<int64_t>& shape, DType dt, Device dev, Tensor* out);
// Allocate and zero.
Status zeros(const std::vector<int64_t>& shape, DType dt, Device dev, Tensor* out);

// Common op argument checks, each returning a Status that names the op and argument.
Status check_dtype(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed);
Status check_ndim(const char* op, const char* arg, const Tensor& t, int ndim);
Status check_contiguous(const char* op, const char* arg, const Tensor& t);
Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b);

}  // namespace surogate
