// Helpers shared by the CUDA kernels: error checks that return Status, dtype dispatch,
// bf16 / f16 loads and stores in f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/status.h"
#include "core/tensor.h"
#include "runtime/op_registry.h"

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

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T st(float v);
template <> __device__ __forceinline__ float st<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half st<__half>(float v) { return __float2half_rn(v); }

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

inline void add_op(OpRegistry& reg, const char* name, int min_in, int max_in, int n_out, OpFn fn, const char* doc,
                   int min_out = -1) {
  reg.add(OpDef{name, DeviceType::kCUDA, min_in, max_in, n_out, fn, doc, min_out});
}

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

}  // namespace surogate::cuda
