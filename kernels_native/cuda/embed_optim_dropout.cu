// dropout_fwd on CUDA, the twin of cpu/dropout.cpp: the same mask bit for bit, so a model trained
// on one backend resumes on the other with the same dropout pattern.
//
// dropout_fwd: (x, [rng]) -> (y); attrs: p, seed, offset.
//   seed64 = seed ^ (rng[0] | rng[1] << 32)   (rng: optional int32 [>=2] or int64 [>=1] device tensor,
//            read in-kernel: the host never waits for it)
//   h_i    = splitmix64(splitmix64(seed64) ^ (offset + i))     (uint64 arithmetic, wraps)
//   y_i    = (h_i >> 40) >= thr ? x_i * (1 / (1 - p)) : 0       thr = ceil(p * 2^24), as the CPU
// i is the flat index into contiguous x. y may alias x (each thread reads its elements, then
// writes them). The hash costs more than the memory traffic, so a thread takes 16 bytes at once
// only to keep the loads wide.
#include <cmath>
#include <cstdint>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/embed_optim.cuh"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

// The kind of the rng input, as check_dropout_fwd reports it.
enum RngKind : int { kNoRng = DropoutArgs::kNone, kRngI32 = DropoutArgs::kI32, kRngI64 = DropoutArgs::kI64 };

__host__ __device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// Thread t handles elements [t * VEC, t * VEC + VEC) (grid-stride); the last, partial group
// element by element. VEC > 1 only when x and y are 16-byte aligned.
template <typename T, int VEC>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, uint64_t seed, const void* rng, int rng_kind,
                               uint64_t offset, uint64_t thr, float scale) {
  uint64_t seed64 = seed;
  if (rng_kind == kRngI32) {
    const uint32_t* q = static_cast<const uint32_t*>(rng);
    seed64 ^= static_cast<uint64_t>(q[0]) | (static_cast<uint64_t>(q[1]) << 32);
  } else if (rng_kind == kRngI64) {
    seed64 ^= *static_cast<const uint64_t*>(rng);
  }
  const uint64_t s = splitmix64(seed64);
  const int64_t groups = (n + VEC - 1) / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t gi = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gi < groups; gi += stride) {
    const int64_t i0 = gi * VEC;
    if (VEC > 1 && i0 + VEC <= n) {
      Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(x + i0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint64_t h = splitmix64(s ^ (offset + static_cast<uint64_t>(i0 + j)));
        p.v[j] = st<T>((h >> 40) >= thr ? __fmul_rn(ld(p.v[j]), scale) : 0.0f);
      }
      *reinterpret_cast<Pack<T, VEC>*>(y + i0) = p;
    } else {
      for (int64_t i = i0; i < n && i < i0 + VEC; ++i) {
        const uint64_t h = splitmix64(s ^ (offset + static_cast<uint64_t>(i)));
        y[i] = st<T>((h >> 40) >= thr ? __fmul_rn(ld(x[i]), scale) : 0.0f);
      }
    }
  }
}

Status dropout_fwd(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  DropoutArgs d;
  SG_RETURN_IF_ERROR(check_dropout_fwd(a, &d));
  const uint64_t seed = d.seed, offset = d.offset, thr = d.thr;
  const float scale = d.scale;
  const void* rng = d.rng == DropoutArgs::kNone ? nullptr : a.in(1).data;
  const int rng_kind = d.rng;
  const int64_t n = x.numel();
  if (n == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("dropout_fwd", x.dtype, T, {
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(y.data) % 16 == 0;
    const int64_t groups = vec ? (n + kVec - 1) / kVec : n;
    const int grid = static_cast<int>(std::min<int64_t>(blocks_for(groups, kThreads), 65535));
    if (vec) {
      dropout_kernel<T, kVec><<<grid, kThreads, 0, current_stream()>>>(x.ptr<T>(), y.ptr<T>(), n, seed, rng, rng_kind, offset, thr, scale);
    } else {
      dropout_kernel<T, 1><<<grid, kThreads, 0, current_stream()>>>(x.ptr<T>(), y.ptr<T>(), n, seed, rng, rng_kind, offset, thr, scale);
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_dropout(OpRegistry& reg) {
  // rng is read on the device; the mask is the CPU's bit for bit.
  add_op(reg, "dropout_fwd", dropout_fwd);
}

}  // namespace surogate::cuda
