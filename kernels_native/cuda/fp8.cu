// quantize_fp8 and matmul_fp8 on CUDA, the twins of cpu/fp8.cpp (same checks and scale rule:
// runtime/op_checks_fp8.h). Nothing here reads device memory on the host: the amax, the scale
// and scale_inv stay on the device, and matmul_fp8 hands cuBLASLt the scale_inv pointers.
//
// quantize_fp8 is a memset and two kernels: the amax (a grid-stride max over |x| as ordered bits,
// so NaN wins as on the CPU, one atomicMax per block; the last block to finish, found by a counter,
// computes the scale: under delayed scaling from the history, op_checks_fp8.h's delayed_amax),
// then the conversion x * scale -> fp8 with round-to-nearest-even and saturation
// (cvt.rn.satfinite: +-inf and finite overflow to +-max, NaN kept), either in place order or
// transposed through a 32 x 32 shared-memory tile (the K-major copies of W, dy and x the
// backward's GEMMs need: Hopper's FP8 kernels take only the TN layout). Contiguous inputs whose
// size and address allow it are read 16 bytes and written 8 codes at a time.
// The scale is an IEEE division (__fdiv_rn) and x * scale one rounded product (__fmul_rn), so the
// codes are the CPU's bit for bit.
//
// matmul_fp8 is cuBLASLt's FP8 GEMM (cuda/matmul_gemm.cu: gemm_fp8_rowmajor), f32 accumulation,
// output f32 / bf16 / f16. cuBLASLt's FP8 kernels want 16-byte aligned leading dimensions: M, N
// and K must be multiples of 16 here (surogate/compile/fp8.py only tags projections that fit and
// the trainer refuses a token count that does not).
#include <cuda_fp8.h>

#include <cfloat>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/matmul_gemm.h"
#include "runtime/op_checks_fp8.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;  // transposed quantize: 32 x 32 tiles, 32 x 8 threads

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 14)); }

// |v| as bits that order like the values: NaN patterns lie above +inf's.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Element i of a row-major [R, C] matrix with row stride `stride` (no division when contiguous).
__device__ __forceinline__ int64_t offset_of(int64_t i, int64_t C, int64_t stride) {
  if (stride == C) return i;
  const int64_t r = i / C;
  return r * stride + (i - r * C);
}

// The quantizer's scale from the amax (ordered bits), as op_checks_fp8.h's rule (with a history,
// H > 0: delayed_amax). scale[0] = the scale, scale_inv[0] = 1 / scale.
__device__ void finish_scale(unsigned amax_bits, float* __restrict__ hist, int64_t H, bool roll, float fp8_max,
                             float* __restrict__ scale, float* __restrict__ scale_inv) {
  float amax = __uint_as_float(amax_bits);
  if (H > 0) amax = delayed_amax(amax, hist, H, roll);
  float s = amax == 0.0f ? 1.0f : __fdiv_rn(fp8_max, amax);
  if (isinf(s)) s = FLT_MAX;
  *scale = s;
  *scale_inv = __fdiv_rn(1.0f, s);
}

// Elements of T in one 16-byte load.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) v[k] = ld(e[k]);
}

// scratch[0]: the amax bits, scratch[1]: blocks done (both zeroed before the launch). `vec`: x is
// contiguous, 16-byte aligned and R * C a multiple of kVec<T>.
template <typename T>
__global__ void amax_scale_kernel(const T* __restrict__ x, int64_t R, int64_t C, int64_t stride, bool vec,
                                  unsigned* __restrict__ scratch, float* __restrict__ hist, int64_t H, bool roll, float fp8_max,
                                  float* __restrict__ scale, float* __restrict__ scale_inv) {
  unsigned m = 0;
  const int64_t n = R * C;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  if (vec) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i * kVec<T> < n; i += step) {
      float v[kVec<T>];
      load_vec(x + i * kVec<T>, v);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) m = max(m, abs_bits(v[k]));
    }
  } else {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += step) {
      m = max(m, abs_bits(ld(x[offset_of(i, C, stride)])));
    }
  }
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ unsigned warp_max[kThreads / 32];
  __shared__ bool last;
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? warp_max[threadIdx.x] : 0u;
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) {
      atomicMax(&scratch[0], m);
      __threadfence();  // this block's max is visible before it counts itself done
      last = atomicAdd(&scratch[1], 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    finish_scale(atomicMax(&scratch[0], 0u), hist, H, roll, fp8_max, scale, scale_inv);
  }
}

__device__ __forceinline__ uint8_t to_fp8(float v, bool e5m2) {
  if (isinf(v)) v = copysignf(FLT_MAX, v);  // satfinite's rule for inf, spelled out
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
}

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t R, int64_t C, int64_t stride,
                                const float* __restrict__ scale, uint8_t* __restrict__ q, bool e5m2) {
  const float s = *scale;
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    q[i] = to_fp8(__fmul_rn(ld(x[offset_of(i, C, stride)]), s), e5m2);
  }
}

// 8 codes a thread: x contiguous and 16-byte aligned, n a multiple of 8 (q then 8-byte aligned).
template <typename T>
__global__ void quantize8_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                 uint8_t* __restrict__ q, bool e5m2) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i * 8 < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v[8];
    for (int h = 0; h < 8; h += kVec<T>) {
      float part[kVec<T>];
      load_vec(x + i * 8 + h, part);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) v[h + k] = part[k];
    }
    uint8_t c[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) c[k] = to_fp8(__fmul_rn(v[k], s), e5m2);
    *reinterpret_cast<uint2*>(q + i * 8) = *reinterpret_cast<const uint2*>(c);
  }
}

// q[c, r] = fp8(x[r, c] * scale): blockIdx.x over column tiles, blockIdx.y over row tiles.
template <typename T>
__global__ void quantize_t_kernel(const T* __restrict__ x, int64_t R, int64_t C, int64_t stride,
                                  const float* __restrict__ scale, uint8_t* __restrict__ q, bool e5m2) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int64_t c0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[k][threadIdx.x] = to_fp8(__fmul_rn(ld(x[r * stride + c]), s), e5m2);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (c < C && r < R) q[c * R + r] = tile[threadIdx.x][k];
  }
}

Status quantize_fp8(const OpArgs& a) {
  QuantizeFp8Args r;
  SG_RETURN_IF_ERROR(check_quantize_fp8(a, &r));
  const Tensor& x = a.in(0);
  const Device dev = x.device;
  const int64_t n = r.R * r.C;
  SG_CHECK(r.R / kTile < 65535, StatusCode::kUnsupported,
           str_cat("quantize_fp8: ", r.R, " rows exceed the CUDA kernel's grid"), "quantize fewer rows at a time");
  Tensor scratch;  // [0]: the amax as ordered bits, [1]: blocks done, [2]: the scale
  SG_RETURN_IF_ERROR(empty({3}, DType::kF32, dev, &scratch));
  unsigned* counters = static_cast<unsigned*>(scratch.data);
  float* scale = scratch.ptr<float>() + 2;
  SG_CUDA_CHECK(cudaMemsetAsync(counters, 0, 2 * sizeof(unsigned), current_stream()));
  uint8_t* q = a.out(0).ptr<uint8_t>();
  SG_CUDA_DISPATCH_FLOAT("quantize_fp8", x.dtype, T, {
    const T* xp = x.ptr<T>();
    const bool contiguous = r.ld == r.C && reinterpret_cast<uintptr_t>(xp) % 16 == 0;
    const bool vec = contiguous && n % kVec<T> == 0;
    const int64_t work = vec ? n / kVec<T> : n;
    amax_scale_kernel<T><<<n > 0 ? grid_for(work) : 1, kThreads, 0, current_stream()>>>(
        xp, r.R, r.C, r.ld, vec, counters, r.H ? a.out(2).ptr<float>() : nullptr, r.H, r.roll, r.fp8_max, scale,
        a.out(1).ptr<float>());
    SG_CUDA_CHECK_LAUNCH();
    if (n == 0) return Status::OK();
    if (!r.transpose && contiguous && n % 8 == 0) {
      quantize8_kernel<T><<<grid_for(n / 8), kThreads, 0, current_stream()>>>(xp, n, scale, q, r.e5m2);
    } else if (!r.transpose) {
      quantize_kernel<T><<<grid_for(n), kThreads, 0, current_stream()>>>(xp, r.R, r.C, r.ld, scale, q, r.e5m2);
    } else {
      const dim3 grid(static_cast<unsigned>((r.C + kTile - 1) / kTile), static_cast<unsigned>((r.R + kTile - 1) / kTile));
      quantize_t_kernel<T><<<grid, dim3(kTile, 8), 0, current_stream()>>>(xp, r.R, r.C, r.ld, scale, q, r.e5m2);
    }
    SG_CUDA_CHECK_LAUNCH();
  });
  return Status::OK();
}

Status matmul_fp8(const OpArgs& a) {
  MatmulFp8Args r;
  SG_RETURN_IF_ERROR(check_matmul_fp8(a, &r));
  SG_CHECK(r.M % 16 == 0 && r.N % 16 == 0 && r.K % 16 == 0, StatusCode::kUnsupported,
           str_cat("matmul_fp8: [", r.M, ", ", r.K, "] x [", r.N, ", ", r.K,
                   "]^T: cuBLASLt's FP8 GEMMs need M, N and K multiples of 16"),
           "pad the operands, or keep this projection in bf16");
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(2);
  const Tensor& C = a.out(0);
  return gemm_fp8_rowmajor("matmul_fp8", C.device.index, r.M, r.N, r.K, r.alpha, {A.data, A.dtype, r.K},
                           a.in(1).ptr<float>(), {B.data, B.dtype, r.K}, a.in(3).ptr<float>(), r.beta,
                           {C.data, C.dtype, r.N}, r.bias ? r.bias->data : nullptr,
                           r.bias ? r.bias->dtype : DType::kF32);
}

}  // namespace

void register_cuda_fp8(OpRegistry& reg) {
  add_op(reg, "quantize_fp8", quantize_fp8);
  add_op(reg, "matmul_fp8", matmul_fp8);
}

}  // namespace surogate::cuda
