#include "runtime/fused_matmul.h"

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"

namespace surogate {

namespace {

Status check_float2d(const char* op, const char* name, const Tensor& t) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  return check_dtype(op, name, t, {DType::kF32, DType::kBF16, DType::kF16});
}

// W [N, K] against the operand's K, bias [N], y [M, N]: the matmul half of both ops.
Status check_projection(const char* op, const OpArgs& a, int w_slot, int64_t M, int64_t K, int64_t* N) {
  const Tensor &W = a.in(w_slot), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_float2d(op, "W", W));
  SG_CHECK_SHAPE(W.shape[1] == K, str_cat(op, ": W ", W.shape_str(), " must be [N, ", K,
                                          "] (the HF [out, in] layout, in = ", K, ")"));
  const int64_t n = W.shape[0];
  if (a.has_in(w_slot + 1)) {
    const Tensor& bias = a.in(w_slot + 1);
    SG_RETURN_IF_ERROR(check_dtype(op, "bias", bias, {DType::kF32, DType::kBF16, DType::kF16}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "bias", bias));
    SG_CHECK_SHAPE(bias.ndim == 1 && bias.shape[0] == n,
                   str_cat(op, ": bias must be [", n, "] (one value per row of W), got ", bias.shape_str()));
  }
  SG_RETURN_IF_ERROR(check_float2d(op, "y", y));
  SG_CHECK_SHAPE(y.shape[0] == M && y.shape[1] == n,
                 str_cat(op, ": y is ", y.shape_str(), ", expected [", M, ", ", n, "]"));
  *N = n;
  return Status::OK();
}

Status run(const char* name, const std::vector<Tensor>& ins, const std::vector<Tensor>& outs,
           const Attrs& attrs) {
  return OpRegistry::global().call(name, ins, outs, attrs);
}

// matmul(x, W^T) (+ bias) into y: the last step of both compositions.
Status project(const Tensor& x, const OpArgs& a, int w_slot) {
  Attrs mm;
  mm.set("trans_b", int64_t{1});
  return run("matmul", {x, a.in(w_slot), a.has_in(w_slot + 1) ? a.in(w_slot + 1) : Tensor{}}, {a.out(0)}, mm);
}

}  // namespace

Status check_gated_matmul(const OpArgs& a, GatedMatmulDims* d) {
  const char* op = "gated_matmul";
  const Tensor& gu = a.in(0);
  SG_RETURN_IF_ERROR(check_float2d(op, "gu", gu));
  SG_CHECK_SHAPE(gu.shape[1] % 2 == 0,
                 str_cat(op, ": gu ", gu.shape_str(), " must be [M, 2F] (gate, up), its last dim is odd"));
  const std::string act = a.attr().get_str("act", "silu");
  SG_CHECK_ARG(act == "silu" || act == "gelu_tanh",
               str_cat(op, ": act must be \"silu\" (swiglu) or \"gelu_tanh\" (geglu), got \"", act, "\""));
  GatedMatmulDims r{gu.shape[0], 0, gu.shape[1] / 2, act == "gelu_tanh"};
  SG_RETURN_IF_ERROR(check_projection(op, a, 1, r.M, r.F, &r.N));
  *d = r;
  return Status::OK();
}

Status check_add_rmsnorm_matmul(const OpArgs& a, NormMatmulDims* d) {
  const char* op = "add_rmsnorm_matmul";
  // Inputs (x, [residual], w, W, [bias]): residual sits in the middle, so the registry sees inputs
  // 1.. as optional and the required ones are checked here.
  SG_CHECK_ARG(a.num_inputs >= 4 && a.has_in(0) && a.has_in(2) && a.has_in(3),
               str_cat(op, ": takes (x, [residual], w, W, [bias]); x, w and W are required"));
  const Tensor &x = a.in(0), &w = a.in(2);
  SG_RETURN_IF_ERROR(check_float2d(op, "x", x));
  SG_CHECK_ARG(x.shape[1] > 0, str_cat(op, ": x ", x.shape_str(), " has no channels"));
  auto like_x = [&](const char* name, const Tensor& t) -> Status {
    SG_RETURN_IF_ERROR(check_same_shape(op, name, t, "x", x));
    SG_CHECK(t.dtype == x.dtype, StatusCode::kDTypeUnsupported,
             str_cat(op, ": ", name, " is ", dtype_name(t.dtype), " but x is ", dtype_name(x.dtype)),
             "give the residual stream one dtype");
    return check_contiguous(op, name, t);
  };
  if (a.has_in(1)) SG_RETURN_IF_ERROR(like_x("residual", a.in(1)));
  if (a.has_out(1)) {
    SG_CHECK(a.has_in(1), StatusCode::kInvalidArgument, str_cat(op, ": h is x + residual, but no residual is given"),
             "without a residual h would be x itself: leave h out");
    SG_RETURN_IF_ERROR(like_x("h", a.out(1)));
  }
  SG_RETURN_IF_ERROR(check_ndim(op, "w", w, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "w", w));
  SG_RETURN_IF_ERROR(check_dtype(op, "w", w, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_CHECK_SHAPE(w.shape[0] == x.shape[1],
                 str_cat(op, ": w ", w.shape_str(), " does not match the ", x.shape[1], " channels of x ",
                         x.shape_str()));
  NormMatmulDims r{x.shape[0], 0, x.shape[1], static_cast<float>(a.attr().get_float("eps", 1e-6)),
                   static_cast<float>(a.attr().get_float("weight_offset", 0.0))};
  SG_RETURN_IF_ERROR(check_projection(op, a, 3, r.M, r.K, &r.N));
  *d = r;
  return Status::OK();
}

Status gated_matmul_unfused(const OpArgs& a) {
  GatedMatmulDims d;
  SG_RETURN_IF_ERROR(check_gated_matmul(a, &d));
  const Tensor& gu = a.in(0);
  Tensor act;
  SG_RETURN_IF_ERROR(empty({d.M, d.F}, gu.dtype, gu.device, &act));
  SG_RETURN_IF_ERROR(run(d.gelu ? "geglu_fwd" : "swiglu_fwd", {gu}, {act}, Attrs{}));
  return project(act, a, 1);
}

Status add_rmsnorm_matmul_unfused(const OpArgs& a) {
  NormMatmulDims d;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_matmul(a, &d));
  const Tensor& x = a.in(0);
  Tensor normed, rstd;
  SG_RETURN_IF_ERROR(empty({d.M, d.K}, x.dtype, x.device, &normed));
  SG_RETURN_IF_ERROR(empty({d.M}, DType::kF32, x.device, &rstd));
  if (a.has_in(1)) {
    Tensor h = a.has_out(1) ? a.out(1) : Tensor{};
    if (!h.data) SG_RETURN_IF_ERROR(empty({d.M, d.K}, x.dtype, x.device, &h));
    SG_RETURN_IF_ERROR(run("add_rmsnorm_fwd", {x, a.in(1), a.in(2)}, {normed, h, rstd}, a.attr()));
  } else {
    SG_RETURN_IF_ERROR(run("rmsnorm_fwd", {x, a.in(2)}, {normed, rstd}, a.attr()));
  }
  return project(normed, a, 3);
}

}  // namespace surogate
