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

namespace surogate::cpu {

Status gguf_matmul(const OpArgs& a);  // cpu/gguf_matmul.cpp

namespace {

using gguf::GgmlType;

// The ggml type of attr `type`, known to the type table and supported in direction `dequant`.
Status op_type(const char* op, const OpArgs& a, bool dequant, GgmlType* t, const gguf::TypeInfo** info) {
  SG_CHECK_ARG(a.attr().has("type"), str_cat(op, ": attr `type` (a ggml type id) is required"));
  *t = static_cast<GgmlType>(a.attr().get_int("type", -1));
  *info = gguf::type_info(*t);
  SG_CHECK_ARG(*info, str_cat(op, ": unknown GGUF type id ", static_cast<int>(*t)));
  SG_CHECK((dequant ? (*info)->dequantize : (*info)->quantize), StatusCode::kUnsupported,
           str_cat(op, ": unsupported GGUF type ", (*info)->name),
           dequant ? "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K, IQ4_NL, IQ4_XS"
                   : "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K");
  return Status::OK();
}

// Rows per task: about 64 Ki values.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)); }

Status gguf_dequantize(const OpArgs& a) {
  const Tensor& q = a.in(0);
  const Tensor& y = a.out(0);
  GgmlType t;
  const gguf::TypeInfo* info;
  SG_RETURN_IF_ERROR(op_type("gguf_dequantize", a, true, &t, &info));
  SG_RETURN_IF_ERROR(check_ndim("gguf_dequantize", "q", q, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_dequantize", "y", y, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_dequantize", "q", q, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_dequantize", "y", y, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_dequantize", "q", q));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_dequantize", "y", y));
  const int64_t rows = q.size(0), cols = a.attr().get_int("cols", y.size(1));
  SG_CHECK_SHAPE(y.size(0) == rows && y.size(1) == cols,
                 str_cat("gguf_dequantize: y ", y.shape_str(), " should be [", rows, ", ", cols, "]"));
  SG_CHECK_SHAPE(cols % info->block_size == 0, str_cat("gguf_dequantize: cols = ", cols, " is not a multiple of the ",
                                                       info->name, " block size ", info->block_size));
  const int64_t bpr = cols / info->block_size * info->type_size;
  SG_CHECK_SHAPE(q.size(1) == bpr, str_cat("gguf_dequantize: a ", info->name, " row of ", cols, " values takes ", bpr,
                                           " bytes, q ", q.shape_str(), " has ", q.size(1)));
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
  GgmlType t;
  const gguf::TypeInfo* info;
  SG_RETURN_IF_ERROR(op_type("gguf_quantize", a, false, &t, &info));
  SG_RETURN_IF_ERROR(check_ndim("gguf_quantize", "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_quantize", "q", q, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_quantize", "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_quantize", "q", q, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_quantize", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_quantize", "q", q));
  const int64_t rows = x.size(0), cols = x.size(1);
  SG_CHECK_SHAPE(cols % info->block_size == 0,
                 str_cat("gguf_quantize: a row of ", cols, " values is not a multiple of the ", info->name,
                         " block size ", info->block_size));
  const int64_t bpr = cols / info->block_size * info->type_size;
  SG_CHECK_SHAPE(q.size(0) == rows && q.size(1) == bpr,
                 str_cat("gguf_quantize: q ", q.shape_str(), " should be [", rows, ", ", bpr, "] for ", info->name,
                         " rows of ", cols, " values"));
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
