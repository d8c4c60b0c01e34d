#include "runtime/op_checks_pointwise.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

namespace surogate {

Status check_fill(const OpArgs& a, float* value) {
  SG_RETURN_IF_ERROR(check_contiguous("fill", "y", a.out(0)));
  *value = static_cast<float>(a.attr().get_float("value", 0.0));
  return Status::OK();
}

Status check_cast(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_contiguous("cast", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("cast", "y", y));
  SG_CHECK_SHAPE(x.numel() == y.numel(), str_cat("cast: x ", x.shape_str(), " and y ", y.shape_str(),
                                                 " have different element counts"));
  SG_CHECK(dtype_is_float(x.dtype) && dtype_is_float(y.dtype), StatusCode::kDTypeUnsupported,
           str_cat("cast: ", dtype_name(x.dtype), " -> ", dtype_name(y.dtype), " is not a float conversion"), "");
  return Status::OK();
}

Status check_add(const OpArgs& args, AddArgs* r) {
  const Tensor& x = args.in(0);
  const Tensor& z = args.in(1);
  const Tensor& y = args.out(0);
  SG_RETURN_IF_ERROR(check_same_shape("add", "a", x, "b", z));
  SG_RETURN_IF_ERROR(check_same_shape("add", "a", x, "y", y));
  SG_CHECK(x.dtype == z.dtype && x.dtype == y.dtype, StatusCode::kDTypeUnsupported,
           str_cat("add: dtypes differ (", dtype_name(x.dtype), ", ", dtype_name(z.dtype), ", ", dtype_name(y.dtype),
                   ")"), "cast first");
  r->alpha = static_cast<float>(args.attr().get_float("alpha", 1.0));
  r->beta = static_cast<float>(args.attr().get_float("beta", 1.0));
  return Status::OK();
}

Status check_scale(const OpArgs& args, AddArgs* r) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  SG_RETURN_IF_ERROR(check_same_shape("scale", "x", x, "y", y));
  SG_CHECK(x.dtype == y.dtype, StatusCode::kDTypeUnsupported, "scale: x and y dtypes differ", "cast first");
  r->alpha = static_cast<float>(args.attr().get_float("alpha", 1.0));
  return Status::OK();
}

namespace {

// gu [N, 2F] and x [N, F] (y or dy): float storage, one dtype, contiguous.
Status check_gated(const char* op, const Tensor& gu, const char* name, const Tensor& x) {
  SG_RETURN_IF_ERROR(check_ndim(op, "gu", gu, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, "gu", gu));
  SG_RETURN_IF_ERROR(check_dtype(op, "gu", gu, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK_SHAPE(gu.shape[1] % 2 == 0,
                 str_cat(op, ": gu ", gu.shape_str(), " must be [N, 2F] (gate, up), its last dim is odd"));
  SG_RETURN_IF_ERROR(check_ndim(op, name, x, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, x));
  SG_CHECK_SHAPE(x.shape[0] == gu.shape[0] && 2 * x.shape[1] == gu.shape[1],
                 str_cat(op, ": ", name, " is ", x.shape_str(), ", expected [", gu.shape[0], ", ", gu.shape[1] / 2,
                         "] for gu ", gu.shape_str()));
  SG_CHECK(x.dtype == gu.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(x.dtype), " but gu is ", dtype_name(gu.dtype)),
           "give the activations and their gradients one dtype");
  return Status::OK();
}

}  // namespace

Status check_gated_fwd(const char* op, const OpArgs& a, int64_t* N, int64_t* F) {
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_gated(op, a.in(0), "y", y));
  *N = y.shape[0];
  *F = y.shape[1];
  return Status::OK();
}

Status check_gated_bwd(const char* op, const OpArgs& a, int64_t* N, int64_t* F) {
  const Tensor &dy = a.in(0), &gu = a.in(1), &dgu = a.out(0);
  SG_RETURN_IF_ERROR(check_gated(op, gu, "dy", dy));
  SG_RETURN_IF_ERROR(check_same_shape(op, "dgu", dgu, "gu", gu));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dgu", dgu));
  SG_CHECK(dgu.dtype == gu.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": dgu is ", dtype_name(dgu.dtype), " but gu is ", dtype_name(gu.dtype)),
           "give the activations and their gradients one dtype");
  *N = dy.shape[0];
  *F = dy.shape[1];
  return Status::OK();
}

namespace {

// Tensors of one shape and one float dtype, contiguous (the elementwise ops over separate tensors).
Status check_same_float(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const auto& [n0, t0] = *ts.begin();
  for (const auto& [name, t] : ts) {
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
    SG_RETURN_IF_ERROR(check_dtype(op, name, *t, {DType::kF32, DType::kBF16, DType::kF16}));
    SG_RETURN_IF_ERROR(check_same_shape(op, name, *t, n0, *t0));
    SG_CHECK(t->dtype == t0->dtype, StatusCode::kDTypeUnsupported,
             str_cat(op, ": ", name, " is ", dtype_name(t->dtype), " but ", n0, " is ", dtype_name(t0->dtype)),
             "give the op's tensors one dtype");
  }
  return Status::OK();
}

}  // namespace

namespace {

// The attributes and b's form (input b_slot, optional), after a and y (or dy, da) were checked.
Status act_mul_args(const char* op, const OpArgs& args, const Tensor& x, int b_slot, ActMulArgs* r) {
  r->has_b = args.has_in(b_slot);
  if (r->has_b) {
    const Tensor& b = args.in(b_slot);
    SG_RETURN_IF_ERROR(check_contiguous(op, "b", b));
    SG_CHECK(b.dtype == x.dtype, StatusCode::kDTypeUnsupported,
             str_cat(op, ": b is ", dtype_name(b.dtype), " but a is ", dtype_name(x.dtype)), "give a and b one dtype");
    r->broadcast = b.numel() == 1 && x.numel() != 1;
    if (!r->broadcast) SG_RETURN_IF_ERROR(check_same_shape(op, "b", b, "a", x));
  } else {
    r->broadcast = true;  // act(a) * 1
  }
  const std::string act = args.attr().get_str("act", "none");
  SG_CHECK_ARG(act == "none" || act == "gelu_tanh" || act == "gelu",
               str_cat(op, ": act must be none, gelu_tanh or gelu, got '", act, "'"));
  r->gelu = act == "gelu_tanh";
  r->gelu_erf = act == "gelu";
  r->n = x.numel();
  return Status::OK();
}

}  // namespace

Status check_act_mul_fwd(const OpArgs& a, ActMulArgs* r) {
  SG_RETURN_IF_ERROR(check_same_float("act_mul_fwd", {{"a", &a.in(0)}, {"y", &a.out(0)}}));
  return act_mul_args("act_mul_fwd", a, a.in(0), 1, r);
}

Status check_act_mul_bwd(const OpArgs& a, ActMulArgs* r) {
  SG_RETURN_IF_ERROR(check_same_float("act_mul_bwd", {{"dy", &a.in(0)}, {"a", &a.in(1)}, {"da", &a.out(0)}}));
  SG_RETURN_IF_ERROR(act_mul_args("act_mul_bwd", a, a.in(1), 2, r));
  if (a.has_out(1)) {
    SG_CHECK_ARG(r->has_b, "act_mul_bwd: db was asked for but there is no b (the op is act(a) alone)");
    SG_CHECK_ARG(!r->broadcast, "act_mul_bwd: db of a broadcast b (one value) is not supported");
    SG_RETURN_IF_ERROR(check_same_float("act_mul_bwd", {{"db", &a.out(1)}, {"b", &a.in(2)}}));
  }
  return Status::OK();
}

Status check_softcap_fwd(const OpArgs& a, float* cap) {
  SG_RETURN_IF_ERROR(check_same_float("softcap_fwd", {{"x", &a.in(0)}, {"y", &a.out(0)}}));
  const double c = a.attr().get_float("cap", 0.0);
  SG_CHECK_ARG(c > 0, str_cat("softcap_fwd: cap must be > 0, got ", c));
  *cap = static_cast<float>(c);
  return Status::OK();
}

Status check_dropout_fwd(const OpArgs& a, DropoutArgs* r) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "y", y));
  SG_RETURN_IF_ERROR(check_same_shape("dropout_fwd", "x", x, "y", y));
  SG_CHECK(x.dtype == y.dtype, StatusCode::kDTypeUnsupported, "dropout_fwd: x and y dtypes differ", "cast first");
  const double p = a.attr().get_float("p", 0.0);
  r->seed = static_cast<uint64_t>(a.attr().get_int("seed", 0));
  r->offset = static_cast<uint64_t>(a.attr().get_int("offset", 0));
  if (a.has_in(1)) {
    const Tensor& rng = a.in(1);
    SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "rng", rng));
    if (rng.dtype == DType::kI32) {
      SG_CHECK_SHAPE(rng.numel() >= 2, str_cat("dropout_fwd: rng (int32) needs 2 elements, got ", rng.shape_str()));
      r->rng = DropoutArgs::kI32;
    } else if (rng.dtype == DType::kI64) {
      SG_CHECK_SHAPE(rng.numel() >= 1, str_cat("dropout_fwd: rng (int64) needs 1 element, got ", rng.shape_str()));
      r->rng = DropoutArgs::kI64;
    } else {
      SG_CHECK(false, StatusCode::kDTypeUnsupported,
               str_cat("dropout_fwd: rng must be int32 or int64, got ", dtype_name(rng.dtype)), "");
    }
  }
  // keep iff (h >> 40) >= thr, thr = ceil(p * 2^24): exactly u >= p for the 24-bit u.
  const double thr_d = std::ceil(p * 16777216.0);
  r->thr = p <= 0.0 ? 0 : (p >= 1.0 ? (1ull << 24) : static_cast<uint64_t>(thr_d));
  r->scale = p >= 1.0 ? 0.0f : static_cast<float>(1.0 / (1.0 - p));
  return Status::OK();
}

}  // namespace surogate
