// The GGUF ops' argument checks and attributes, shared by cpu/gguf.cpp, cpu/gguf_matmul.cpp and
// cuda/gguf.cu. A quantized tensor is uint8 [rows, bpr] of raw ggml blocks, bpr = cols /
// block_size * type_size; attr `type` is its ggml id (core/gguf_types.h).
//   gguf_dequantize  (q[rows, bpr] u8) -> (y[rows, cols] f32/bf16/f16); attrs type, cols
//   gguf_quantize    (x[rows, cols] f32/bf16/f16) -> (q[rows, bpr] u8); attr type
//   gguf_matmul      (x[N, K] f32/bf16/f16, Wq[M, bpr(K)] u8) -> (y[N, M]); attr type
#pragma once

#include <cstdint>

#include "core/gguf_types.h"
#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct GgufArgs {
  gguf::GgmlType type{};
  const gguf::TypeInfo* info = nullptr;
  int64_t rows = 0, cols = 0, bpr = 0;  // gguf_matmul: rows = N, cols = K, bpr = Wq's row bytes
  int64_t M = 0;                        // gguf_matmul: rows of Wq
};
Status check_gguf_dequantize(const OpArgs& a, GgufArgs* r);
Status check_gguf_quantize(const OpArgs& a, GgufArgs* r);
Status check_gguf_matmul(const OpArgs& a, GgufArgs* r);

// nf4_dequantize: bitsandbytes' NF4 layout (core/nf4_codes.h, surogate/io/nf4.py):
//   (q[rows, cols/2] u8, absmax[blocks] f32 | u8, [absmax_scale[ceil(blocks/256)] f32,
//    absmax_offset[1] f32]) -> (y[rows, cols] f32/bf16/f16); attr blocksize (64).
// A u8 absmax is double-quantized: it needs absmax_scale and absmax_offset.
struct Nf4Args {
  int64_t rows = 0, cols = 0, blocksize = 64, blocks = 0;
  bool double_quant = false;
};
Status check_nf4_dequantize(const OpArgs& a, Nf4Args* r);

}  // namespace surogate
