// Helpers shared by the CPU kernels: dtype dispatch and argument checks.
#pragma once

#include <cstring>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "runtime/op_contracts.h"

namespace surogate::cpu {

// Run `body` with `T` bound to the storage type of `dt` (float, bf16_t or f16_t); any other
// dtype returns kDTypeUnsupported naming `op`.
#define SG_DISPATCH_FLOAT(op, dt, T, ...)                                                          \
  switch (dt) {                                                                                    \
    case ::surogate::DType::kF32: { using T = float; __VA_ARGS__; break; }                         \
    case ::surogate::DType::kBF16: { using T = ::surogate::bf16_t; __VA_ARGS__; break; }           \
    case ::surogate::DType::kF16: { using T = ::surogate::f16_t; __VA_ARGS__; break; }             \
    default:                                                                                       \
      return SG_ERROR(::surogate::StatusCode::kDTypeUnsupported,                                   \
                      ::surogate::str_cat(op, ": no CPU kernel for ", ::surogate::dtype_name(dt)), \
                      "use float32, bfloat16 or float16");                                         \
  }

// The CPU kernel of a contracted op (arity and doc: runtime/op_contracts.cpp).
inline void add_op(OpRegistry& reg, const char* name, OpFn fn, std::initializer_list<DType> dtypes = kFloatDTypes) {
  add_kernel(reg, DeviceType::kCPU, name, fn, dtypes);
}

// A MoE op's per-expert row offsets: 0 .. M, non-decreasing (what moe_permute makes).
inline Status check_offset_values(const char* op, const int32_t* off, int64_t E, int64_t M) {
  SG_CHECK(off[0] == 0 && off[E] == M, StatusCode::kInvalidArgument,
           str_cat(op, ": offsets run from ", off[0], " to ", off[E], ", expected 0 to M = ", M),
           "pass the offsets moe_permute made for these rows");
  for (int64_t e = 0; e < E; ++e) {
    SG_CHECK(off[e] <= off[e + 1], StatusCode::kInvalidArgument,
             str_cat(op, ": offsets[", e, "] = ", off[e], " > offsets[", e + 1, "] = ", off[e + 1]),
             "pass the offsets moe_permute made for these rows");
  }
  return Status::OK();
}

}  // namespace surogate::cpu
