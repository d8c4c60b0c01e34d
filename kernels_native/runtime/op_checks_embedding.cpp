#include "runtime/op_checks_embedding.h"

#include <cstdint>

namespace surogate {

namespace {

Status check_ids(const char* op, const Tensor& ids) {
  SG_RETURN_IF_ERROR(check_ndim(op, "ids", ids, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "ids", ids));
  return check_dtype(op, "ids", ids, {DType::kI32});
}

// t is [rows, C] of a float storage dtype, contiguous.
Status check_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t C) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK_SHAPE(t.shape[0] == rows && t.shape[1] == C,
                 str_cat(op, ": ", name, " is ", t.shape_str(), ", expected [", rows, ", ", C, "]"));
  return Status::OK();
}

}  // namespace

Status check_embedding_fwd(const OpArgs& a, EmbeddingArgs* r) {
  const char* op = "embedding_fwd";
  const Tensor &ids = a.in(0), &table = a.in(1), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "table", table, 2));
  r->V = table.shape[0];
  r->C = table.shape[1];
  SG_RETURN_IF_ERROR(check_rows(op, "table", table, r->V, r->C));
  SG_RETURN_IF_ERROR(check_ids(op, ids));
  r->N = ids.shape[0];
  SG_RETURN_IF_ERROR(check_rows(op, "y", y, r->N, r->C));
  SG_CHECK(y.dtype == table.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": y is ", dtype_name(y.dtype), " but table is ", dtype_name(table.dtype)),
           "allocate y in the table's dtype");
  return Status::OK();
}

Status check_embedding_bwd(const OpArgs& a, EmbeddingArgs* r) {
  const char* op = "embedding_bwd";
  const Tensor &ids = a.in(0), &dy = a.in(1), &dtable = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "dtable", dtable, 2));
  r->V = dtable.shape[0];
  r->C = dtable.shape[1];
  SG_RETURN_IF_ERROR(check_ids(op, ids));
  r->N = ids.shape[0];
  SG_RETURN_IF_ERROR(check_rows(op, "dy", dy, r->N, r->C));
  SG_RETURN_IF_ERROR(check_rows(op, "dtable", dtable, r->V, r->C));
  SG_CHECK(dtable.dtype == DType::kF32 || dtable.dtype == dy.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": dtable is ", dtype_name(dtable.dtype), ", expected float32 or dy's ",
                   dtype_name(dy.dtype)),
           "keep the embedding gradient in float32 or in the activations' dtype");
  SG_CHECK_ARG(r->N < INT32_MAX, str_cat(op, ": ", r->N, " tokens; at most 2^31 - 2 in one call"));
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

Status check_embed_rows(const OpArgs& a, EmbedRowsArgs* r) {
  const char* op = "embed_rows";
  const Tensor &x = a.in(0), &index = a.in(1), &rows = a.in(2), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 2));
  r->N = x.shape[0];
  r->C = x.shape[1];
  SG_RETURN_IF_ERROR(check_rows(op, "x", x, r->N, r->C));
  SG_RETURN_IF_ERROR(check_rows(op, "y", y, r->N, r->C));
  SG_CHECK(y.dtype == x.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": y is ", dtype_name(y.dtype), " but x is ", dtype_name(x.dtype)), "allocate y in x's dtype");
  SG_RETURN_IF_ERROR(check_ndim(op, "index", index, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "index", index));
  SG_RETURN_IF_ERROR(check_dtype(op, "index", index, {DType::kI32}));
  r->E = index.shape[0];
  // rows may be row-strided (a column slice of a wider matrix: Qwen3-VL's serving rows carry the
  // merged row, the DeepStack rows and the MRoPE angles side by side).
  SG_RETURN_IF_ERROR(check_ndim(op, "rows", rows, 2));
  SG_RETURN_IF_ERROR(check_dtype(op, "rows", rows, {DType::kF32}));
  SG_CHECK_SHAPE(rows.shape[0] == r->E && rows.shape[1] == r->C,
                 str_cat(op, ": rows is ", rows.shape_str(), ", expected [", r->E, ", ", r->C, "]"));
  const bool row_strided = rows.strides[1] == 1 && rows.strides[0] >= rows.shape[1];
  if (!row_strided && rows.numel() > 0) SG_RETURN_IF_ERROR(check_contiguous(op, "rows", rows));
  r->row_stride = rows.numel() > 0 && row_strided ? rows.strides[0] : r->C;
  return Status::OK();
}

}  // namespace surogate
