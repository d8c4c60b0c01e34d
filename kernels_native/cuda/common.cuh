// Helpers shared by the CUDA kernels: error checks that return Status, dtype dispatch,
// bf16 / f16 loads and stores in f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/status.h"
#include "core/tensor.h"
#include "runtime/op_contracts.h"

namespace surogate::cuda {

// The stream every CUDA op launches on: the legacy default stream (0), except while a Program
// captures a CUDA graph on this thread (then the capturing stream). backend.cpp owns it.
cudaStream_t current_stream();

#define SG_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    cudaError_t _sg_err = (expr);                                                                  \
    if (_sg_err != cudaSuccess) {                                                                  \
      return ::surogate::Status(::surogate::StatusCode::kDeviceError,                              \
                                ::surogate::str_cat(#expr, ": ", cudaGetErrorString(_sg_err)),     \
                                __FILE__, __LINE__, "run `surogate doctor` to check the driver");  \
    }                                                                                              \
  } while (0)

// Launch errors surface at the next call; check right after each launch.
#define SG_CUDA_CHECK_LAUNCH() SG_CUDA_CHECK(cudaGetLastError())

// 16 bytes of a weight read once (decode GEMVs): no L1 allocation, a 256-byte L2 prefetch along the row.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T st(float v);
template <> __device__ __forceinline__ float st<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half st<__half>(float v) { return __float2half_rn(v); }

// v rounded to T and back to f32 (a no-op for float): the intermediate roundings of the CPU ops.
template <typename T>
__device__ __forceinline__ float rnd(float v) {
  return ld(st<T>(v));
}

// 16 bytes of storage type T (16 / sizeof(T) elements) widened to f32, and back (round to nearest).
template <typename T>
__device__ __forceinline__ void unpack16(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      f[i] = __uint_as_float(w[i]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      f[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
      f[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
    }
  }
}
template <typename T>
__device__ __forceinline__ uint32_t bits16(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat16_as_ushort(st<T>(v));
  else return __half_as_ushort(st<T>(v));
}
template <typename T>
__device__ __forceinline__ uint4 pack16(const float* f) {
  if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = bits16<T>(f[2 * i]) | (bits16<T>(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Loads and stores through a dtype known only at run time (f32 / bf16 / f16): for epilogues and
// side operands that touch few values, so one kernel serves every output / bias dtype (the
// switch is uniform across the grid).
__device__ __forceinline__ float load_as(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::kBF16: return ld(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return ld(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_as(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = st<__nv_bfloat16>(v); break;
    case DType::kF16: static_cast<__half*>(p)[i] = st<__half>(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

#define SG_CUDA_DISPATCH_FLOAT(op, dt, T, ...)                                                     \
  switch (dt) {                                                                                    \
    case ::surogate::DType::kF32: { using T = float; __VA_ARGS__; break; }                         \
    case ::surogate::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; break; }                \
    case ::surogate::DType::kF16: { using T = __half; __VA_ARGS__; break; }                        \
    default:                                                                                       \
      return SG_ERROR(::surogate::StatusCode::kDTypeUnsupported,                                   \
                      ::surogate::str_cat(op, ": no CUDA kernel for ", ::surogate::dtype_name(dt)), \
                      "use float32, bfloat16 or float16");                                         \
  }

// The CUDA kernel of a contracted op (arity and doc: runtime/op_contracts.cpp).
inline void add_op(OpRegistry& reg, const char* name, OpFn fn, std::initializer_list<DType> dtypes = kFloatDTypes) {
  add_kernel(reg, DeviceType::kCUDA, name, fn, dtypes);
}

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// Blocks of `threads` for a grid-stride loop over `items`: at least one, at most 65535 x 16 (the
// loop covers what a capped grid leaves).
inline unsigned grid_stride_blocks(int64_t items, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + threads - 1) / threads, 1, 65535 * 16));
}

}  // namespace surogate::cuda
