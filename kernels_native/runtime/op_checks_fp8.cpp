#include "runtime/op_checks_fp8.h"

#include <utility>

namespace surogate {

namespace {

bool is_fp8(DType dt) { return dt == DType::kF8E4M3 || dt == DType::kF8E5M2; }

Status check_scale(const char* op, const char* name, const Tensor& t) {
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kF32}));
  SG_CHECK_SHAPE(t.numel() == 1, str_cat(op, ": ", name, " must hold one float32, got ", t.shape_str()));
  return Status::OK();
}

}  // namespace

Status check_quantize_fp8(const OpArgs& a, QuantizeFp8Args* r) {
  const char* op = "quantize_fp8";
  const Tensor& x = a.in(0);
  const Tensor& q = a.out(0);
  SG_RETURN_IF_ERROR(check_dtype(op, "x", x, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 2));
  SG_CHECK(x.numel() == 0 || (x.strides[1] == 1 && x.strides[0] >= x.shape[1]), StatusCode::kInvalidArgument,
           str_cat(op, ": x must have contiguous rows (a row stride is fine), got strides [", x.strides[0], ", ",
                   x.strides[1], "]"),
           "quantize a contiguous copy");
  SG_CHECK(is_fp8(q.dtype), StatusCode::kDTypeUnsupported,
           str_cat(op, ": q must be float8_e4m3fn or float8_e5m2 (its dtype is the format), got ",
                   dtype_name(q.dtype)),
           "declare q as float8_e4m3fn (weights, activations) or float8_e5m2 (gradients)");
  SG_RETURN_IF_ERROR(check_ndim(op, "q", q, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, "q", q));
  r->R = x.shape[0];
  r->C = x.shape[1];
  r->ld = x.numel() == 0 ? r->C : x.strides[0];
  r->transpose = a.attr().get_bool("transpose", false);
  const int64_t qr = r->transpose ? r->C : r->R, qc = r->transpose ? r->R : r->C;
  SG_CHECK_SHAPE(q.shape[0] == qr && q.shape[1] == qc,
                 str_cat(op, ": q must be [", qr, ", ", qc, "] (x ", x.shape_str(),
                         r->transpose ? " transposed" : "", "), got ", q.shape_str()));
  SG_RETURN_IF_ERROR(check_scale(op, "scale_inv", a.out(1)));
  r->e5m2 = q.dtype == DType::kF8E5M2;
  r->fp8_max = r->e5m2 ? kE5M2Max : kE4M3Max;
  r->H = 0;
  if (a.has_out(2)) {
    const Tensor& h = a.out(2);
    SG_RETURN_IF_ERROR(check_dtype(op, "amax_history", h, {DType::kF32}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "amax_history", h));
    SG_CHECK_SHAPE(h.ndim == 1 && h.shape[0] >= 2,
                   str_cat(op, ": amax_history must be [H + 1] with H >= 1 (this run's amax, then the last H "
                               "runs'), got ", h.shape_str()));
    r->H = h.shape[0] - 1;
    r->roll = a.attr().get_bool("roll", false);
  }
  return Status::OK();
}

Status check_matmul_fp8(const OpArgs& a, MatmulFp8Args* r) {
  const char* op = "matmul_fp8";
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(2);
  const Tensor& C = a.out(0);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"a", &A}, {"b", &B}}) {
    SG_CHECK(is_fp8(t->dtype), StatusCode::kDTypeUnsupported,
             str_cat(op, ": ", name, " must be float8_e4m3fn or float8_e5m2, got ", dtype_name(t->dtype)),
             "quantize it with quantize_fp8 first");
    SG_RETURN_IF_ERROR(check_ndim(op, name, *t, 2));
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
  }
  SG_CHECK(!(A.dtype == DType::kF8E5M2 && B.dtype == DType::kF8E5M2), StatusCode::kDTypeUnsupported,
           str_cat(op, ": a and b are both float8_e5m2 (no GEMM has that pair)"),
           "quantize one operand (the weight or the activation) to float8_e4m3fn");
  SG_RETURN_IF_ERROR(check_scale(op, "a_scale_inv", a.in(1)));
  SG_RETURN_IF_ERROR(check_scale(op, "b_scale_inv", a.in(3)));
  SG_CHECK_SHAPE(A.shape[1] == B.shape[1],
                 str_cat(op, ": a ", A.shape_str(), " and b ", B.shape_str(),
                         " must share their inner dim K (both K-major: c = a @ b^T)"));
  SG_RETURN_IF_ERROR(check_dtype(op, "c", C, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "c", C));
  r->M = A.shape[0];
  r->N = B.shape[0];
  r->K = A.shape[1];
  SG_CHECK_SHAPE(C.ndim == 2 && C.shape[0] == r->M && C.shape[1] == r->N,
                 str_cat(op, ": c must be [", r->M, ", ", r->N, "] (a @ b^T), got ", C.shape_str()));
  r->bias = nullptr;
  if (a.has_in(4)) {
    const Tensor& bias = a.in(4);
    SG_RETURN_IF_ERROR(check_dtype(op, "bias", bias, {DType::kF32, DType::kBF16, DType::kF16}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "bias", bias));
    SG_CHECK_SHAPE(bias.ndim == 1 && bias.shape[0] == r->N,
                   str_cat(op, ": bias must be [", r->N, "] (one value per column of c), got ", bias.shape_str()));
    r->bias = &bias;
  }
  r->alpha = static_cast<float>(a.attr().get_float("alpha", 1.0));
  r->beta = static_cast<float>(a.attr().get_float("beta", 0.0));
  return Status::OK();
}

}  // namespace surogate
