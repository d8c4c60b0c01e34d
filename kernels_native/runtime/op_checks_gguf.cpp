#include "runtime/op_checks_gguf.h"

namespace surogate {

namespace {

// The ggml type of attr `type`, known to the type table and supported in direction `dequant`.
Status op_type(const char* op, const OpArgs& a, bool dequant, gguf::GgmlType* t, const gguf::TypeInfo** info) {
  SG_CHECK_ARG(a.attr().has("type"), str_cat(op, ": attr `type` (a ggml type id) is required"));
  *t = static_cast<gguf::GgmlType>(a.attr().get_int("type", -1));
  *info = gguf::type_info(*t);
  SG_CHECK_ARG(*info, str_cat(op, ": unknown GGUF type id ", static_cast<int>(*t)));
  SG_CHECK((dequant ? (*info)->dequantize : (*info)->quantize), StatusCode::kUnsupported,
           str_cat(op, ": unsupported GGUF type ", (*info)->name),
           dequant ? "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K, IQ4_NL, IQ4_XS"
                   : "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K");
  return Status::OK();
}

}  // namespace

Status check_gguf_dequantize(const OpArgs& a, GgufArgs* r) {
  const Tensor& q = a.in(0);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(op_type("gguf_dequantize", a, true, &r->type, &r->info));
  SG_RETURN_IF_ERROR(check_ndim("gguf_dequantize", "q", q, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_dequantize", "y", y, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_dequantize", "q", q, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_dequantize", "y", y, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_dequantize", "q", q));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_dequantize", "y", y));
  r->rows = q.size(0);
  r->cols = a.attr().get_int("cols", y.size(1));
  const int64_t rows = r->rows, cols = r->cols;
  const gguf::TypeInfo* info = r->info;
  SG_CHECK_SHAPE(y.size(0) == rows && y.size(1) == cols,
                 str_cat("gguf_dequantize: y ", y.shape_str(), " should be [", rows, ", ", cols, "]"));
  SG_CHECK_SHAPE(cols % info->block_size == 0, str_cat("gguf_dequantize: cols = ", cols, " is not a multiple of the ",
                                                       info->name, " block size ", info->block_size));
  r->bpr = cols / info->block_size * info->type_size;
  SG_CHECK_SHAPE(q.size(1) == r->bpr, str_cat("gguf_dequantize: a ", info->name, " row of ", cols, " values takes ",
                                              r->bpr, " bytes, q ", q.shape_str(), " has ", q.size(1)));
  return Status::OK();
}

Status check_gguf_quantize(const OpArgs& a, GgufArgs* r) {
  const Tensor& x = a.in(0);
  const Tensor& q = a.out(0);
  SG_RETURN_IF_ERROR(op_type("gguf_quantize", a, false, &r->type, &r->info));
  SG_RETURN_IF_ERROR(check_ndim("gguf_quantize", "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_quantize", "q", q, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_quantize", "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_quantize", "q", q, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_quantize", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_quantize", "q", q));
  r->rows = x.size(0);
  r->cols = x.size(1);
  const int64_t rows = r->rows, cols = r->cols;
  const gguf::TypeInfo* info = r->info;
  SG_CHECK_SHAPE(cols % info->block_size == 0,
                 str_cat("gguf_quantize: a row of ", cols, " values is not a multiple of the ", info->name,
                         " block size ", info->block_size));
  r->bpr = cols / info->block_size * info->type_size;
  SG_CHECK_SHAPE(q.size(0) == rows && q.size(1) == r->bpr,
                 str_cat("gguf_quantize: q ", q.shape_str(), " should be [", rows, ", ", r->bpr, "] for ", info->name,
                         " rows of ", cols, " values"));
  return Status::OK();
}

Status check_gguf_matmul(const OpArgs& a, GgufArgs* r) {
  const Tensor& x = a.in(0);
  const Tensor& Wq = a.in(1);
  const Tensor& y = a.out(0);
  SG_CHECK_ARG(a.attr().has("type"), "gguf_matmul: attr `type` (the ggml type id of Wq) is required");
  const auto t = static_cast<gguf::GgmlType>(a.attr().get_int("type", -1));
  const gguf::TypeInfo* info = gguf::type_info(t);
  r->type = t;
  r->info = info;
  SG_CHECK_ARG(info, str_cat("gguf_matmul: unknown GGUF type id ", static_cast<int>(t)));
  SG_CHECK(info->dequantize, StatusCode::kUnsupported, str_cat("gguf_matmul: unsupported GGUF type ", info->name),
           "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K, IQ4_NL, IQ4_XS; requantize the "
           "weight to one of them");
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "Wq", Wq, 2));
  SG_RETURN_IF_ERROR(check_ndim("gguf_matmul", "y", y, 2));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "Wq", Wq, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype("gguf_matmul", "y", y, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_matmul", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_matmul", "Wq", Wq));
  SG_RETURN_IF_ERROR(check_contiguous("gguf_matmul", "y", y));
  const int64_t N = x.size(0), K = x.size(1), M = Wq.size(0);
  r->rows = N;
  r->cols = K;
  r->M = M;
  SG_CHECK_SHAPE(K % info->block_size == 0, str_cat("gguf_matmul: K = ", K, " is not a multiple of the ", info->name,
                                                    " block size ", info->block_size));
  const int64_t row_bytes = K / info->block_size * info->type_size;
  r->bpr = row_bytes;
  SG_CHECK_SHAPE(Wq.size(1) == row_bytes, str_cat("gguf_matmul: a ", info->name, " row of K = ", K, " values takes ",
                                                  row_bytes, " bytes, Wq ", Wq.shape_str(), " has ", Wq.size(1)));
  SG_CHECK_SHAPE(y.size(0) == N && y.size(1) == M,
                 str_cat("gguf_matmul: y ", y.shape_str(), " should be [", N, ", ", M, "] for x ", x.shape_str(),
                         " and ", info->name, " Wq ", Wq.shape_str()));
  return Status::OK();
}

Status check_nf4_dequantize(const OpArgs& a, Nf4Args* r) {
  const Tensor& q = a.in(0);
  const Tensor& absmax = a.in(1);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim("nf4_dequantize", "q", q, 2));
  SG_RETURN_IF_ERROR(check_ndim("nf4_dequantize", "y", y, 2));
  SG_RETURN_IF_ERROR(check_dtype("nf4_dequantize", "q", q, {DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("nf4_dequantize", "absmax", absmax, {DType::kF32, DType::kU8}));
  SG_RETURN_IF_ERROR(check_dtype("nf4_dequantize", "y", y, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous("nf4_dequantize", "q", q));
  SG_RETURN_IF_ERROR(check_contiguous("nf4_dequantize", "absmax", absmax));
  SG_RETURN_IF_ERROR(check_contiguous("nf4_dequantize", "y", y));
  r->rows = y.size(0);
  r->cols = y.size(1);
  r->blocksize = a.attr().get_int("blocksize", 64);
  SG_CHECK_ARG(r->blocksize >= 2 && r->blocksize % 2 == 0,
               str_cat("nf4_dequantize: blocksize ", r->blocksize, " must be even and positive"));
  SG_CHECK_SHAPE(q.size(0) == r->rows && q.size(1) * 2 == r->cols,
                 str_cat("nf4_dequantize: q ", q.shape_str(), " should be [", r->rows, ", ", r->cols / 2, "] for y ",
                         y.shape_str()));
  SG_CHECK_SHAPE(r->cols % r->blocksize == 0, str_cat("nf4_dequantize: a row of ", r->cols, " values is not a whole "
                                                      "number of ", r->blocksize, "-value blocks"));
  r->blocks = r->rows * r->cols / r->blocksize;
  SG_CHECK_SHAPE(absmax.numel() == r->blocks, str_cat("nf4_dequantize: absmax has ", absmax.numel(), " values, the ",
                                                      "weight has ", r->blocks, " blocks of ", r->blocksize));
  r->double_quant = absmax.dtype == DType::kU8;
  SG_CHECK_ARG(r->double_quant == (a.has_in(2) && a.has_in(3)),
               r->double_quant ? "nf4_dequantize: a u8 (double-quantized) absmax needs absmax_scale and absmax_offset"
                               : "nf4_dequantize: absmax_scale / absmax_offset go with a u8 absmax only");
  if (r->double_quant) {
    const Tensor& scale = a.in(2);
    const Tensor& offset = a.in(3);
    SG_RETURN_IF_ERROR(check_dtype("nf4_dequantize", "absmax_scale", scale, {DType::kF32}));
    SG_RETURN_IF_ERROR(check_dtype("nf4_dequantize", "absmax_offset", offset, {DType::kF32}));
    const int64_t want = (r->blocks + 255) / 256;
    SG_CHECK_SHAPE(scale.numel() == want, str_cat("nf4_dequantize: absmax_scale has ", scale.numel(),
                                                  " values, should be ", want));
    SG_CHECK_SHAPE(offset.numel() == 1, "nf4_dequantize: absmax_offset must hold one value");
  }
  return Status::OK();
}

}  // namespace surogate
