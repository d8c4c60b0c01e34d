#include "runtime/op_checks_short_conv.h"

namespace surogate {

namespace {

constexpr std::initializer_list<DType> kFloats = {DType::kF32, DType::kBF16, DType::kF16};

// bcx [N, 3C] and w [C, L] or [C, 1, L]: the tensors that set N, C and L.
Status check_bcx_w(const char* op, const Tensor& bcx, const Tensor& w, ShortConvArgs* r) {
  SG_RETURN_IF_ERROR(check_ndim(op, "bcx", bcx, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, "bcx", bcx));
  SG_RETURN_IF_ERROR(check_dtype(op, "bcx", bcx, kFloats));
  SG_CHECK_SHAPE(bcx.shape[1] % 3 == 0 && bcx.shape[1] > 0,
                 str_cat(op, ": bcx ", bcx.shape_str(), " must be [N, 3C] (B, C, x: in_proj's output)"));
  const int64_t C = bcx.shape[1] / 3;
  SG_CHECK_SHAPE(w.ndim == 2 || (w.ndim == 3 && w.shape[1] == 1),
                 str_cat(op, ": w ", w.shape_str(), " must be [C, L] or HF's Conv1d layout [C, 1, L]"));
  SG_RETURN_IF_ERROR(check_contiguous(op, "w", w));
  const int64_t L = w.shape[w.ndim - 1];
  SG_CHECK_SHAPE(w.shape[0] == C, str_cat(op, ": w ", w.shape_str(), " does not have the ", C, " channels of bcx ",
                                          bcx.shape_str()));
  SG_CHECK_ARG(L >= 1 && L <= kShortConvMaxTaps,
               str_cat(op, ": ", L, " taps (conv_L_cache); 1 to ", kShortConvMaxTaps, " are supported"));
  SG_CHECK(w.dtype == bcx.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": w is ", dtype_name(w.dtype), " but bcx is ", dtype_name(bcx.dtype)),
           "give the weights and the activations one dtype");
  r->N = bcx.shape[0];
  r->C = C;
  r->L = L;
  return Status::OK();
}

Status check_vec(const char* op, const char* name, const Tensor& t, int64_t C, DType dt, bool f32_too) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_CHECK_SHAPE(t.shape[0] == C, str_cat(op, ": ", name, " ", t.shape_str(), " must have one entry per channel (", C,
                                          ")"));
  SG_CHECK(t.dtype == dt || (f32_too && t.dtype == DType::kF32), StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dt),
                   f32_too ? " or float32" : ""), "");
  return Status::OK();
}

Status check_i32(const char* op, const char* name, const Tensor& t, int64_t n) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kI32}));
  SG_CHECK_SHAPE(n < 0 || t.shape[0] == n, str_cat(op, ": ", name, " ", t.shape_str(), " must have ", n, " entries"));
  return Status::OK();
}

Status check_y(const char* op, const char* name, const Tensor& y, const Tensor& bcx, const ShortConvArgs& r) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, y, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, y));
  SG_CHECK_SHAPE(y.shape[0] == r.N && y.shape[1] == r.C,
                 str_cat(op, ": ", name, " is ", y.shape_str(), ", expected [", r.N, ", ", r.C, "] for bcx ",
                         bcx.shape_str()));
  SG_CHECK(y.dtype == bcx.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(y.dtype), " but bcx is ", dtype_name(bcx.dtype)),
           "give the activations and their gradients one dtype");
  return Status::OK();
}

}  // namespace

Status check_short_conv_fwd(const OpArgs& a, ShortConvArgs* r) {
  constexpr const char* op = "short_conv_fwd";
  const Tensor &bcx = a.in(0), &w = a.in(1);
  SG_RETURN_IF_ERROR(check_bcx_w(op, bcx, w, r));
  SG_RETURN_IF_ERROR(check_i32(op, "cu_seqlens", a.in(2), -1));
  SG_CHECK_SHAPE(a.in(2).shape[0] >= 2, str_cat(op, ": cu_seqlens ", a.in(2).shape_str(), " needs S + 1 >= 2 entries"));
  r->S = a.in(2).shape[0] - 1;
  r->bias = a.has_in(3);
  if (r->bias) SG_RETURN_IF_ERROR(check_vec(op, "bias", a.in(3), r->C, bcx.dtype, false));
  return check_y(op, "y", a.out(0), bcx, *r);
}

Status check_short_conv_bwd(const OpArgs& a, ShortConvArgs* r) {
  constexpr const char* op = "short_conv_bwd";
  const Tensor &dy = a.in(0), &bcx = a.in(1), &w = a.in(2);
  SG_RETURN_IF_ERROR(check_bcx_w(op, bcx, w, r));
  SG_RETURN_IF_ERROR(check_y(op, "dy", dy, bcx, *r));
  SG_RETURN_IF_ERROR(check_i32(op, "cu_seqlens", a.in(3), -1));
  SG_CHECK_SHAPE(a.in(3).shape[0] >= 2, str_cat(op, ": cu_seqlens ", a.in(3).shape_str(), " needs S + 1 >= 2 entries"));
  r->S = a.in(3).shape[0] - 1;
  r->bias = a.has_in(4);
  if (r->bias) SG_RETURN_IF_ERROR(check_vec(op, "bias", a.in(4), r->C, bcx.dtype, false));
  const Tensor& dbcx = a.out(0);
  SG_RETURN_IF_ERROR(check_same_shape(op, "dbcx", dbcx, "bcx", bcx));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dbcx", dbcx));
  SG_CHECK(dbcx.dtype == bcx.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": dbcx is ", dtype_name(dbcx.dtype), " but bcx is ", dtype_name(bcx.dtype)), "");
  r->accumulate = a.attr().get_bool("accumulate", false);
  if (a.has_out(1)) {
    const Tensor& dw = a.out(1);
    SG_CHECK_SHAPE(dw.numel() == r->C * r->L && (dw.ndim == 2 || dw.ndim == 3),
                   str_cat(op, ": dw ", dw.shape_str(), " must have w's shape ", w.shape_str()));
    SG_RETURN_IF_ERROR(check_contiguous(op, "dw", dw));
    SG_CHECK(dw.dtype == DType::kF32 || dw.dtype == w.dtype, StatusCode::kDTypeUnsupported,
             str_cat(op, ": dw is ", dtype_name(dw.dtype), ", expected float32 or w's ", dtype_name(w.dtype)),
             "keep weight gradients in float32 or in the weight's dtype");
    r->dw = &dw;
  }
  if (a.has_out(2)) {
    SG_RETURN_IF_ERROR(check_vec(op, "dbias", a.out(2), r->C, bcx.dtype, true));
    r->dbias = &a.out(2);
  }
  return Status::OK();
}

Status check_short_conv_cache(const OpArgs& a, ShortConvArgs* r) {
  constexpr const char* op = "short_conv_cache";
  const Tensor &bcx = a.in(0), &w = a.in(1);
  SG_RETURN_IF_ERROR(check_bcx_w(op, bcx, w, r));
  SG_RETURN_IF_ERROR(check_i32(op, "state_slots", a.in(2), -1));
  r->S = a.in(2).shape[0];
  SG_RETURN_IF_ERROR(check_i32(op, "cu_q", a.in(3), r->S + 1));
  SG_RETURN_IF_ERROR(check_i32(op, "context_lens", a.in(4), r->S));
  r->bias = a.has_in(5);
  if (r->bias) SG_RETURN_IF_ERROR(check_vec(op, "bias", a.in(5), r->C, bcx.dtype, false));
  SG_RETURN_IF_ERROR(check_y(op, "y", a.out(0), bcx, *r));
  const Tensor& st = a.out(1);
  SG_RETURN_IF_ERROR(check_ndim(op, "conv_state", st, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, "conv_state", st));
  SG_CHECK_SHAPE(st.shape[1] == r->L - 1 && st.shape[2] == r->C,
                 str_cat(op, ": conv_state ", st.shape_str(), " must be [slots, ", r->L - 1, ", ", r->C, "]"));
  SG_CHECK(st.dtype == bcx.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": conv_state is ", dtype_name(st.dtype), " but bcx is ", dtype_name(bcx.dtype)),
           "keep the conv state in the activations' dtype");
  r->P = st.shape[0];
  return Status::OK();
}

}  // namespace surogate
