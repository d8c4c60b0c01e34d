#include "runtime/op_checks_norm.h"

namespace surogate {

namespace {

Status check_like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  SG_RETURN_IF_ERROR(check_same_shape(op, name, t, ref_name, ref));
  SG_CHECK(t.dtype == ref.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(t.dtype), " but ", ref_name, " is ", dtype_name(ref.dtype)),
           "give the activations and their gradients one dtype");
  return check_contiguous(op, name, t);
}

// x [N, C] (the tensor that sets N and C), w [C], rstd [N] f32.
Status check_norm_args(const char* op, const char* x_name, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       RmsNormArgs* r) {
  SG_RETURN_IF_ERROR(check_ndim(op, x_name, x, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, x_name, x));
  SG_RETURN_IF_ERROR(check_dtype(op, x_name, x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK_ARG(x.shape[1] > 0, str_cat(op, ": ", x_name, " ", x.shape_str(), " has no channels"));
  SG_RETURN_IF_ERROR(check_ndim(op, "w", w, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "w", w));
  SG_RETURN_IF_ERROR(check_dtype(op, "w", w, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK_SHAPE(w.shape[0] == x.shape[1],
                 str_cat(op, ": w ", w.shape_str(), " does not match the ", x.shape[1], " channels of ", x_name, " ",
                         x.shape_str()));
  SG_RETURN_IF_ERROR(check_ndim(op, "rstd", rstd, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "rstd", rstd));
  SG_RETURN_IF_ERROR(check_dtype(op, "rstd", rstd, {DType::kF32}));
  SG_CHECK_SHAPE(rstd.shape[0] == x.shape[0],
                 str_cat(op, ": rstd ", rstd.shape_str(), " must have one entry per row of ", x_name, " ",
                         x.shape_str()));
  r->N = x.shape[0];
  r->C = x.shape[1];
  return Status::OK();
}

// A [N] f32 row statistic of x (LayerNorm's mean and rstd).
Status check_row_stat(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kF32}));
  SG_CHECK_SHAPE(t.shape[0] == x.shape[0],
                 str_cat(op, ": ", name, " ", t.shape_str(), " must have one entry per row of x ", x.shape_str()));
  return Status::OK();
}

// A parameter gradient (dw, db) of p's shape, in f32 or p's dtype.
Status check_param_grad(const char* op, const char* name, const Tensor& g, const char* p_name, const Tensor& p) {
  SG_RETURN_IF_ERROR(check_same_shape(op, name, g, p_name, p));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, g));
  SG_CHECK(g.dtype == DType::kF32 || g.dtype == p.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(g.dtype), ", expected float32 or ", p_name, "'s ",
                   dtype_name(p.dtype)),
           "keep weight gradients in float32 or in the weight's dtype");
  return Status::OK();
}

Status check_dw(const char* op, const OpArgs& a, int slot, const Tensor& w, RmsNormArgs* r) {
  r->accumulate = a.attr().get_bool("accumulate", false);
  r->offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
  if (!a.has_out(slot)) return Status::OK();
  SG_RETURN_IF_ERROR(check_param_grad(op, "dw", a.out(slot), "w", w));
  r->dw = &a.out(slot);
  return Status::OK();
}

void forward_attrs(const OpArgs& a, RmsNormArgs* r) {
  r->eps = static_cast<float>(a.attr().get_float("eps", 1e-6));
  r->offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
}

}  // namespace

Status check_rmsnorm_fwd(const OpArgs& a, RmsNormArgs* r) {
  const char* op = "rmsnorm_fwd";
  const Tensor &x = a.in(0), &w = a.in(1), &y = a.out(0), &rstd = a.out(1);
  SG_RETURN_IF_ERROR(check_norm_args(op, "x", x, w, rstd, r));
  SG_RETURN_IF_ERROR(check_like(op, "y", y, "x", x));
  forward_attrs(a, r);
  return Status::OK();
}

Status check_add_rmsnorm_fwd(const OpArgs& a, RmsNormArgs* r) {
  const char* op = "add_rmsnorm_fwd";
  const Tensor &x = a.in(0), &res = a.in(1), &w = a.in(2), &y = a.out(0), &h = a.out(1), &rstd = a.out(2);
  SG_RETURN_IF_ERROR(check_norm_args(op, "x", x, w, rstd, r));
  SG_RETURN_IF_ERROR(check_like(op, "residual", res, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "y", y, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "h", h, "x", x));
  forward_attrs(a, r);
  return Status::OK();
}

Status check_rmsnorm_bwd(const OpArgs& a, RmsNormArgs* r) {
  const char* op = "rmsnorm_bwd";
  const Tensor &dy = a.in(0), &x = a.in(1), &w = a.in(2), &rstd = a.in(3), &dx = a.out(0);
  SG_RETURN_IF_ERROR(check_norm_args(op, "x", x, w, rstd, r));
  SG_RETURN_IF_ERROR(check_like(op, "dy", dy, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "dx", dx, "x", x));
  return check_dw(op, a, 1, w, r);
}

Status check_add_rmsnorm_bwd(const OpArgs& a, RmsNormArgs* r) {
  const char* op = "add_rmsnorm_bwd";
  // Inputs (dy, [dh], h, w, rstd): dh sits in the middle, so the registry sees inputs 1..4 as
  // optional and the required ones are checked here.
  SG_CHECK_ARG(a.num_inputs == 5 && a.has_in(2) && a.has_in(3) && a.has_in(4),
               str_cat(op, ": takes (dy, [dh], h, w, rstd); h, w and rstd are required"));
  const Tensor &dy = a.in(0), &h = a.in(2), &w = a.in(3), &rstd = a.in(4), &dx = a.out(0);
  SG_RETURN_IF_ERROR(check_norm_args(op, "h", h, w, rstd, r));
  SG_RETURN_IF_ERROR(check_like(op, "dy", dy, "h", h));
  if (a.has_in(1)) {
    SG_RETURN_IF_ERROR(check_like(op, "dh", a.in(1), "h", h));
    r->dh = &a.in(1);
  }
  SG_RETURN_IF_ERROR(check_like(op, "dx", dx, "h", h));
  return check_dw(op, a, 1, w, r);
}

Status check_layer_norm_fwd(const OpArgs& a, LayerNormArgs* r) {
  const char* op = "layer_norm_fwd";
  const Tensor &x = a.in(0), &w = a.in(1), &y = a.out(0), &mean = a.out(1), &rstd = a.out(2);
  RmsNormArgs dims;
  SG_RETURN_IF_ERROR(check_norm_args(op, "x", x, w, rstd, &dims));
  SG_RETURN_IF_ERROR(check_row_stat(op, "mean", mean, x));
  SG_RETURN_IF_ERROR(check_like(op, "y", y, "x", x));
  if (a.has_in(2)) {
    const Tensor& b = a.in(2);
    SG_RETURN_IF_ERROR(check_same_shape(op, "b", b, "w", w));
    SG_RETURN_IF_ERROR(check_contiguous(op, "b", b));
    SG_CHECK(b.dtype == w.dtype, StatusCode::kDTypeUnsupported,
             str_cat(op, ": b is ", dtype_name(b.dtype), " but w is ", dtype_name(w.dtype)),
             "give the norm's weight and bias one dtype");
    r->b = &b;
  }
  r->N = dims.N;
  r->C = dims.C;
  r->eps = static_cast<float>(a.attr().get_float("eps", 1e-5));
  SG_CHECK_ARG(r->eps >= 0.0f, str_cat(op, ": eps = ", r->eps, " must be >= 0"));
  return Status::OK();
}

Status check_layer_norm_bwd(const OpArgs& a, LayerNormArgs* r) {
  const char* op = "layer_norm_bwd";
  const Tensor &dy = a.in(0), &x = a.in(1), &w = a.in(2), &mean = a.in(3), &rstd = a.in(4), &dx = a.out(0);
  RmsNormArgs dims;
  SG_RETURN_IF_ERROR(check_norm_args(op, "x", x, w, rstd, &dims));
  SG_RETURN_IF_ERROR(check_row_stat(op, "mean", mean, x));
  SG_RETURN_IF_ERROR(check_like(op, "dy", dy, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "dx", dx, "x", x));
  if (a.has_out(1)) {
    SG_RETURN_IF_ERROR(check_param_grad(op, "dw", a.out(1), "w", w));
    r->dw = &a.out(1);
  }
  if (a.has_out(2)) {  // b is not an input: db has w's shape, in f32 or w's dtype
    SG_RETURN_IF_ERROR(check_param_grad(op, "db", a.out(2), "w", w));
    r->db = &a.out(2);
  }
  r->N = dims.N;
  r->C = dims.C;
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

}  // namespace surogate
