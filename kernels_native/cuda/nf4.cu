// nf4_dequantize on CUDA, the twin of cpu/nf4.cpp (same inputs, attrs and checks:
// runtime/op_checks_gguf.h): weights in bitsandbytes' NF4 layout (core/nf4_codes.h) decoded to
// f32 / bf16 / f16 for the matmul that follows (QLoRA's forward and dx; cuBLASLt does the GEMM).
//
// One thread per packed byte (two values). The absmax of a double-quantized weight is decoded
// per element from its 8-bit code: kDynamic[code] * absmax_scale[b / 256] + offset, with an
// explicit round-to-nearest multiply then add (no FMA contraction), as the CPU and bitsandbytes
// compute it, so the three agree bit for bit.
#include "core/nf4_codes.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_gguf.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

__constant__ float kNF4Dev[16] = {SG_NF4_LEVELS};
__constant__ float kDynamicDev[256] = {SG_NF4_DYNAMIC};

// q: bytes [n / 2]; half: bytes per block (blocksize / 2).
__global__ void nf4_dequant_kernel(const uint8_t* __restrict__ q, const void* __restrict__ absmax, bool dq,
                                   const float* __restrict__ scale, const float* __restrict__ offset,
                                   int64_t nbytes, int64_t half, void* y, DType ydt) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nbytes;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / half;
    float s;
    if (dq) {
      const uint8_t c = static_cast<const uint8_t*>(absmax)[b];
      s = __fadd_rn(__fmul_rn(kDynamicDev[c], scale[b / nf4::kAbsmaxBlock]), offset[0]);
    } else {
      s = static_cast<const float*>(absmax)[b];
    }
    const uint8_t v = q[i];
    store_as(y, ydt, 2 * i, __fmul_rn(kNF4Dev[v >> 4], s));
    store_as(y, ydt, 2 * i + 1, __fmul_rn(kNF4Dev[v & 0xF], s));
  }
}

Status nf4_dequantize(const OpArgs& a) {
  Nf4Args r;
  SG_RETURN_IF_ERROR(check_nf4_dequantize(a, &r));
  const int64_t nbytes = r.rows * r.cols / 2;
  if (nbytes == 0) return Status::OK();
  const Tensor& y = a.out(0);
  const int grid = static_cast<int>(std::min<int64_t>((nbytes + kThreads - 1) / kThreads, 65535));
  nf4_dequant_kernel<<<grid, kThreads, 0, current_stream()>>>(
      a.in(0).ptr<uint8_t>(), a.in(1).data, r.double_quant, r.double_quant ? a.in(2).ptr<float>() : nullptr,
      r.double_quant ? a.in(3).ptr<float>() : nullptr, nbytes, r.blocksize / 2, y.data, y.dtype);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_nf4(OpRegistry& reg) { add_op(reg, "nf4_dequantize", nf4_dequantize); }

}  // namespace surogate::cuda
