#include "runtime/op_checks_pool.h"

namespace surogate {

namespace {

// The grid attrs, then x ([B*H*W, C], the full grid) and y ([B*Ho*Wo, C], the pooled one).
Status check_grids(const char* op, const OpArgs& a, const char* x_name, const Tensor& x, const char* y_name,
                   const Tensor& y, MeanPool2dArgs* r) {
  const Attrs& at = a.attr();
  r->H = at.get_int("height", 0);
  r->W = at.get_int("width", 0);
  r->k = at.get_int("kernel", 0);
  SG_CHECK_ARG(r->H > 0 && r->W > 0 && r->k > 0,
               str_cat(op, ": height = ", r->H, ", width = ", r->W, ", kernel = ", r->k, " must all be > 0"));
  SG_CHECK_ARG(r->H % r->k == 0 && r->W % r->k == 0,
               str_cat(op, ": kernel ", r->k, " does not divide the ", r->H, " x ", r->W, " patch grid"));
  for (const auto& [name, t] : {std::pair{x_name, &x}, std::pair{y_name, &y}}) {
    SG_RETURN_IF_ERROR(check_ndim(op, name, *t, 2));
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
    SG_RETURN_IF_ERROR(check_dtype(op, name, *t, {DType::kF32, DType::kBF16, DType::kF16}));
  }
  SG_CHECK(x.dtype == y.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", y_name, " is ", dtype_name(y.dtype), " but ", x_name, " is ", dtype_name(x.dtype)),
           "give the op's tensors one dtype");
  const int64_t cells = r->H * r->W;
  SG_CHECK_SHAPE(x.shape[0] % cells == 0,
                 str_cat(op, ": ", x_name, " ", x.shape_str(), " is not a whole number of ", r->H, " x ", r->W,
                         " patch grids (", cells, " rows each)"));
  r->B = x.shape[0] / cells;
  r->C = x.shape[1];
  r->Ho = r->H / r->k;
  r->Wo = r->W / r->k;
  SG_CHECK_SHAPE(y.shape[0] == r->B * r->Ho * r->Wo && y.shape[1] == r->C,
                 str_cat(op, ": ", y_name, " is ", y.shape_str(), ", expected [", r->B * r->Ho * r->Wo, ", ", r->C,
                         "] for ", r->B, " grids of ", r->Ho, " x ", r->Wo, " pooled patches"));
  return Status::OK();
}

}  // namespace

Status check_mean_pool_2d_fwd(const OpArgs& a, MeanPool2dArgs* r) {
  return check_grids("mean_pool_2d_fwd", a, "x", a.in(0), "y", a.out(0), r);
}

Status check_mean_pool_2d_bwd(const OpArgs& a, MeanPool2dArgs* r) {
  return check_grids("mean_pool_2d_bwd", a, "dx", a.out(0), "dy", a.in(0), r);
}

}  // namespace surogate
