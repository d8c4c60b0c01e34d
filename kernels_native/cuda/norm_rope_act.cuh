// Pieces shared by the CUDA norm / rope / gated-activation files (norm_rope_act_*.cu): 16-byte
// packs, warp and block sums, the deterministic reduction of per-block dw partials, and the
// per-file registration functions that register_cuda_norm_rope_act calls.
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

// A nested namespace: these inline helpers and names must not meet another group's under the ODR.
namespace surogate::cuda::nra {

void register_cuda_rmsnorm(OpRegistry& reg);  // norm_rope_act_rmsnorm.cu
void register_cuda_layernorm(OpRegistry& reg);  // norm_rope_act_layernorm.cu
void register_cuda_rope(OpRegistry& reg);     // norm_rope_act_rope.cu
void register_cuda_gated(OpRegistry& reg);    // norm_rope_act_gated.cu

// V elements of T loaded or stored as one access (V = 16 / sizeof(T) gives 16-byte accesses).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the total. blockDim.x is a multiple of 32. `red` holds 32
// floats of shared memory; the leading barrier lets a loop call this once per row.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // every thread has read the previous call's red
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0.0f;
  return warp_sum(v);
}

// True when p is 16-byte aligned (or absent), so rows of a multiple of 16 bytes can use packs.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// dw[c] = (accumulate ? dw[c] : 0) + sum over b of partial[b, c], in an order fixed by `blocks`
// and C alone, so repeated runs give the same bits. partial is [blocks, C] f32; dw is f32, bf16 or
// f16 (`op` names the caller in a dtype error).
Status reduce_dw_partials(const char* op, const float* partial, int64_t blocks, int64_t C, const Tensor& dw,
                          bool accumulate);

// Raise a kernel's dynamic shared memory limit past the 48 KiB default when `bytes` needs it;
// an error naming `op` when the device cannot give that much to one block.
Status allow_dynamic_smem(const char* op, const void* kernel, size_t bytes, int device, const char* what);

}  // namespace surogate::cuda::nra
