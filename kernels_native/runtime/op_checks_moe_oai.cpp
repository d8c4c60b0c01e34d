#include "runtime/op_checks_moe_oai.h"

namespace surogate {

namespace {

Status check_float2(const char* op, const char* name, const Tensor& t) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  return check_dtype(op, name, t, {DType::kF32, DType::kBF16, DType::kF16});
}

Status same_dtype(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  SG_CHECK(a.dtype == b.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", b_name, " is ", dtype_name(b.dtype), " but ", a_name, " is ", dtype_name(a.dtype)),
           "cast first");
  return Status::OK();
}

Status read_swiglu(const char* op, const OpArgs& a, const Tensor& gu, const Tensor& y, SwigluOaiArgs* r) {
  SG_RETURN_IF_ERROR(check_float2(op, "gu", gu));
  SG_RETURN_IF_ERROR(check_float2(op, "y", y));
  SG_RETURN_IF_ERROR(same_dtype(op, "gu", gu, "y", y));
  SG_CHECK_SHAPE(y.shape[0] == gu.shape[0] && 2 * y.shape[1] == gu.shape[1],
                 str_cat(op, ": gu ", gu.shape_str(), " must be [M, 2F] for y ", y.shape_str(), " [M, F]"));
  r->M = y.shape[0];
  r->F = y.shape[1];
  r->alpha = static_cast<float>(a.attr().get_float("alpha", 1.702));
  r->limit = static_cast<float>(a.attr().get_float("limit", 7.0));
  SG_CHECK_ARG(r->limit > 0, str_cat(op, ": limit must be > 0, got ", r->limit));
  return Status::OK();
}

Status check_offsets(const char* op, const Tensor& off, int64_t* E) {
  SG_RETURN_IF_ERROR(check_ndim(op, "offsets", off, 1));
  SG_RETURN_IF_ERROR(check_dtype(op, "offsets", off, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "offsets", off));
  SG_CHECK_SHAPE(off.shape[0] >= 2, str_cat(op, ": offsets must be [E + 1] with E >= 1, got ", off.shape_str()));
  *E = off.shape[0] - 1;
  return Status::OK();
}

}  // namespace

Status check_swiglu_oai_fwd(const OpArgs& a, SwigluOaiArgs* r) {
  return read_swiglu("swiglu_oai_fwd", a, a.in(0), a.out(0), r);
}

Status check_swiglu_oai_bwd(const OpArgs& a, SwigluOaiArgs* r) {
  const char* op = "swiglu_oai_bwd";
  SG_RETURN_IF_ERROR(read_swiglu(op, a, a.in(1), a.in(0), r));
  SG_RETURN_IF_ERROR(check_float2(op, "dgu", a.out(0)));
  SG_RETURN_IF_ERROR(check_same_shape(op, "gu", a.in(1), "dgu", a.out(0)));
  return same_dtype(op, "gu", a.in(1), "dgu", a.out(0));
}

Status check_moe_bias_add(const OpArgs& a, MoeBiasArgs* r) {
  const char* op = "moe_bias_add";
  const Tensor &x = a.in(0), &b = a.in(1), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_float2(op, "x", x));
  SG_RETURN_IF_ERROR(check_float2(op, "b", b));
  SG_RETURN_IF_ERROR(check_float2(op, "y", y));
  SG_RETURN_IF_ERROR(same_dtype(op, "x", x, "b", b));
  SG_RETURN_IF_ERROR(same_dtype(op, "x", x, "y", y));
  SG_RETURN_IF_ERROR(check_same_shape(op, "x", x, "y", y));
  SG_RETURN_IF_ERROR(check_offsets(op, a.in(2), &r->E));
  SG_CHECK_SHAPE(b.shape[0] == r->E && b.shape[1] == x.shape[1],
                 str_cat(op, ": b ", b.shape_str(), " must be [E, C] = [", r->E, ", ", x.shape[1], "]"));
  r->M = x.shape[0];
  r->C = x.shape[1];
  return Status::OK();
}

Status check_moe_bias_grad(const OpArgs& a, MoeBiasArgs* r) {
  const char* op = "moe_bias_grad";
  const Tensor &dy = a.in(0), &db = a.out(0);
  SG_RETURN_IF_ERROR(check_float2(op, "dy", dy));
  SG_RETURN_IF_ERROR(check_float2(op, "db", db));
  SG_CHECK(db.dtype == dy.dtype || db.dtype == DType::kF32, StatusCode::kDTypeUnsupported,
           str_cat(op, ": db is ", dtype_name(db.dtype), "; it must be float32 or dy's ", dtype_name(dy.dtype)),
           "cast first");
  SG_RETURN_IF_ERROR(check_offsets(op, a.in(1), &r->E));
  SG_CHECK_SHAPE(db.shape[0] == r->E && db.shape[1] == dy.shape[1],
                 str_cat(op, ": db ", db.shape_str(), " must be [E, C] = [", r->E, ", ", dy.shape[1], "]"));
  r->M = dy.shape[0];
  r->C = dy.shape[1];
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

}  // namespace surogate
