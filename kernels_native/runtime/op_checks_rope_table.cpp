#include "runtime/op_checks_rope_table.h"

namespace surogate {

Status check_rope_table(const char* op, const OpArgs& a, RopeTableArgs* r) {
  const Tensor &x = a.in(0), &cos = a.in(1), &sin = a.in(2), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, "x", x));
  SG_RETURN_IF_ERROR(check_contiguous(op, "y", y));
  SG_RETURN_IF_ERROR(check_dtype(op, "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK(y.dtype == x.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": y is ", dtype_name(y.dtype), " but x is ", dtype_name(x.dtype)), "give x and y one dtype");
  SG_RETURN_IF_ERROR(check_same_shape(op, "y", y, "x", x));
  for (const auto& [name, t] : {std::pair{"cos", &cos}, std::pair{"sin", &sin}}) {
    SG_RETURN_IF_ERROR(check_ndim(op, name, *t, 2));
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
    SG_RETURN_IF_ERROR(check_dtype(op, name, *t, {DType::kF32}));
  }
  SG_RETURN_IF_ERROR(check_same_shape(op, "sin", sin, "cos", cos));
  r->N = x.shape[0];
  r->H = x.shape[1];
  r->D = x.shape[2];
  r->half = cos.shape[1];
  r->round_products = a.attr().get_int("round_products", 0) != 0;
  SG_CHECK_SHAPE(cos.shape[0] == r->N,
                 str_cat(op, ": cos ", cos.shape_str(), " has ", cos.shape[0], " rows for the ", r->N, " tokens of x ",
                         x.shape_str()));
  SG_CHECK_SHAPE(r->half > 0 && 2 * r->half <= r->D,
                 str_cat(op, ": cos ", cos.shape_str(), " gives ", 2 * r->half, " rotary dims, not in [2, head dim ",
                         r->D, "]"));
  return Status::OK();
}

}  // namespace surogate
