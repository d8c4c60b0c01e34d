// CPU ops on GGML-quantized tensors (GGUF weights kept in their blocks).
//
// A quantized tensor is a uint8 tensor [rows, bytes_per_row] of raw blocks; `type` (int attr)
// is its ggml type id (core/gguf_types.h); bytes_per_row = cols / block_size * type_size.
//
//   gguf_dequantize (q[rows, bpr] u8) -> (y[rows, cols] f32/bf16/f16); attrs: type, cols
//   gguf_quantize   (x[rows, cols] f32/bf16/f16) -> (q[rows, bpr] u8); attrs: type
//   gguf_matmul     (x[N, K], Wq[M, bpr(K)] u8) -> (y[N, M] = x @ dequant(Wq)^T); attrs: type
//                   (cpu/gguf_matmul.cpp)
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/gguf_types.h"
#include "cpu/common.h"
#include "cpu/gguf_dot.h"
#include "runtime/op_checks_gguf.h"

namespace surogate::cpu {

Status gguf_matmul(const OpArgs& a);  // cpu/gguf_matmul.cpp

namespace {

using gguf::GgmlType;

// Rows per task: about 64 Ki values.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)); }

Status gguf_dequantize(const OpArgs& a) {
  const Tensor& q = a.in(0);
  const Tensor& y = a.out(0);
  GgufArgs g;
  SG_RETURN_IF_ERROR(check_gguf_dequantize(a, &g));
  const GgmlType t = g.type;
  const int64_t rows = g.rows, cols = g.cols, bpr = g.bpr;
  const uint8_t* src = q.ptr<uint8_t>();
  // The AVX2 decoders give the same bits as dequantize_row, faster.
  const bool avx2 = decode_avx2_supported(t);
  auto decode = [&](const uint8_t* b, float* out, int64_t n) {
    if (avx2) {
      decode_avx2(t, b, out, n);
    } else {
      (void)gguf::dequantize_row(t, b, out, n);
    }
  };
  if (y.dtype == DType::kF32) {
    parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
      decode(src + lo * bpr, y.ptr<float>() + lo * cols, (hi - lo) * cols);
    });
    return Status::OK();
  }
  SG_DISPATCH_FLOAT("gguf_dequantize", y.dtype, T, {
    T* out = y.ptr<T>();
    parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
      std::vector<float> row(cols);
      for (int64_t r = lo; r < hi; ++r) {
        decode(src + r * bpr, row.data(), cols);
        for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = store<T>(row[j]);
      }
    });
  });
  return Status::OK();
}

template <typename T>
void quantize_rows(GgmlType t, const T* src, int64_t rows, int64_t cols, uint8_t* dst, int64_t bpr) {
  // The K-type searches cost ~100x a decode per value: smaller tasks.
  parallel_for(0, rows, std::max<int64_t>(1, row_grain(cols) / 16), [&](int64_t lo, int64_t hi) {
    std::vector<float> row;
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr;
      if constexpr (std::is_same_v<T, float>) {
        xr = src + r * cols;
      } else {
        row.resize(cols);
        for (int64_t j = 0; j < cols; ++j) row[j] = load(src[r * cols + j]);
        xr = row.data();
      }
      (void)gguf::quantize_row(t, xr, dst + r * bpr, cols);
    }
  });
}

Status gguf_quantize(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& q = a.out(0);
  GgufArgs g;
  SG_RETURN_IF_ERROR(check_gguf_quantize(a, &g));
  const GgmlType t = g.type;
  const int64_t rows = g.rows, cols = g.cols, bpr = g.bpr;
  SG_DISPATCH_FLOAT("gguf_quantize", x.dtype, T, quantize_rows(t, x.ptr<T>(), rows, cols, q.ptr<uint8_t>(), bpr));
  return Status::OK();
}

}  // namespace

void register_cpu_gguf(OpRegistry& reg) {
  add_op(reg, "gguf_dequantize", gguf_dequantize);
  add_op(reg, "gguf_quantize", gguf_quantize);
  add_op(reg, "gguf_matmul", gguf_matmul);
}

}  // namespace surogate::cpu
