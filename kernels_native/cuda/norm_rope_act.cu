// CUDA kernels: rmsnorm, add_rmsnorm, layer_norm, rope, qk_norm_rope, swiglu, geglu (fwd + bwd), the CUDA twins
// of cpu/norm.cpp, cpu/rope.cpp and cpu/activation.cpp. The kernels live in norm_rope_act_*.cu (one
// per CPU file); this file holds their registration hook and the dw reduction two of them share.
#include "cuda/backend.h"
#include "cuda/norm_rope_act.cuh"

namespace surogate::cuda::nra {

namespace {

constexpr int kReduceRows = 8;  // warps per block of the dw reduction, each summing every 8th partial

// Block (32, kReduceRows) per 32 columns: thread (x, y) sums partials y, y + 8, ... of column x,
// then row 0 adds the 8 sums in order. Reads are coalesced along columns.
template <typename W>
__global__ void reduce_dw_kernel(const float* partial, int64_t blocks, int64_t C, W* dw, bool accumulate) {
  __shared__ float sums[kReduceRows][33];
  const int64_t c = blockIdx.x * int64_t(32) + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    for (int64_t b = threadIdx.y; b < blocks; b += kReduceRows) acc += partial[b * C + c];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = accumulate ? ld(dw[c]) : 0.0f;
    for (int y = 0; y < kReduceRows; ++y) s += sums[y][threadIdx.x];
    dw[c] = st<W>(s);
  }
}

}  // namespace

Status reduce_dw_partials(const char* op, const float* partial, int64_t blocks, int64_t C, const Tensor& dw,
                          bool accumulate) {
  if (C == 0) return Status::OK();
  const dim3 block(32, kReduceRows);
  const auto grid = static_cast<unsigned>((C + 31) / 32);
  SG_CUDA_DISPATCH_FLOAT(op, dw.dtype, W, {
    reduce_dw_kernel<W><<<grid, block, 0, current_stream()>>>(partial, blocks, C, dw.ptr<W>(), accumulate);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status allow_dynamic_smem(const char* op, const void* kernel, size_t bytes, int device, const char* what) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return Status::OK();
  int optin = 0;
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SG_CHECK(bytes <= static_cast<size_t>(optin), StatusCode::kUnsupported,
           str_cat(op, ": ", what, " needs ", bytes, " bytes of shared memory per block, the device has ", optin),
           "this size has no CUDA kernel; run the op on the CPU");
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return Status::OK();
}

}  // namespace surogate::cuda::nra

namespace surogate::cuda {

void register_cuda_norm_rope_act(OpRegistry& reg) {
  nra::register_cuda_rmsnorm(reg);
  nra::register_cuda_layernorm(reg);
  nra::register_cuda_rope(reg);
  nra::register_cuda_gated(reg);
}

}  // namespace surogate::cuda
