#include "runtime/op_checks_matmul.h"

#include <utility>
#include <vector>

namespace surogate {

Status check_matmul(const OpArgs& a, MatmulArgs* d) {
  const bool ta = a.attr().get_bool("trans_a", false);
  const bool tb = a.attr().get_bool("trans_b", false);
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(1);
  const Tensor& C = a.out(0);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"A", &A}, {"B", &B}, {"C", &C}}) {
    SG_RETURN_IF_ERROR(check_dtype("matmul", name, *t, {DType::kF32, DType::kBF16, DType::kF16}));
    // 2-D operands may be row-strided (a column slice of a wider matrix: LoRA on a fused
    // projection); anything else must be contiguous. Empty arrays pass (numpy: zero strides).
    const bool row_strided = t->ndim == 2 && t->strides[1] == 1 && t->strides[0] >= t->shape[1];
    if (t->numel() > 0 && !row_strided) SG_RETURN_IF_ERROR(check_contiguous("matmul", name, *t));
  }
  SG_CHECK_SHAPE(A.ndim == 2 || (A.ndim == 3 && !ta),
                 str_cat("matmul: A must be 2-D [M, K] (or 3-D [B, T, K] without trans_a), got ", A.describe(),
                         " with trans_a=", ta));
  SG_RETURN_IF_ERROR(check_ndim("matmul", "B", B, 2));
  const int64_t M = ta ? A.shape[1] : A.ndim == 3 ? A.shape[0] * A.shape[1] : A.shape[0];
  const int64_t K = ta ? A.shape[0] : A.size(-1);
  const int64_t Kb = tb ? B.shape[1] : B.shape[0];
  const int64_t N = tb ? B.shape[0] : B.shape[1];
  SG_CHECK(K == Kb, StatusCode::kShapeMismatch,
           str_cat("matmul: inner dims differ: op(A) is [", M, ", ", K, "] (A ", A.shape_str(), ", trans_a=", ta,
                   ") but op(B) is [", Kb, ", ", N, "] (B ", B.shape_str(), ", trans_b=", tb, ")"),
           "check trans_a / trans_b against the operands' layouts");
  std::vector<int64_t> want = ta ? std::vector<int64_t>{M, N} : A.shape_vec();
  if (!ta) want.back() = N;
  SG_CHECK_SHAPE(C.shape_vec() == want, str_cat("matmul: C is ", C.shape_str(), " but op(A) @ op(B) is [", M, ", ",
                                                N, "]", A.ndim == 3 ? " (with A's leading dims)" : ""));
  if (a.has_in(2)) {
    const Tensor& bias = a.in(2);
    SG_RETURN_IF_ERROR(check_dtype("matmul", "bias", bias, {DType::kF32, DType::kBF16, DType::kF16}));
    SG_RETURN_IF_ERROR(check_contiguous("matmul", "bias", bias));
    SG_CHECK_SHAPE(bias.ndim == 1 && bias.shape[0] == N,
                   str_cat("matmul: bias must be [", N, "] (one value per column of C), got ", bias.shape_str()));
  }
  d->M = M;
  d->N = N;
  d->K = K;
  d->trans_a = ta;
  d->trans_b = tb;
  d->alpha = static_cast<float>(a.attr().get_float("alpha", 1.0));
  d->beta = static_cast<float>(a.attr().get_float("beta", 0.0));
  d->bias = a.has_in(2) ? &a.in(2) : nullptr;
  return Status::OK();
}

namespace {

Status read_attrs(const char* op, const OpArgs& a, LmHeadCeArgs* out) {
  LmHeadCeArgs& c = *out;
  c.ignore_index = a.attr().get_int("ignore_index", -100);
  c.eps = static_cast<float>(a.attr().get_float("label_smoothing", 0.0));
  c.chunk = a.attr().get_int("chunk", 4096);
  c.cap = static_cast<float>(a.attr().get_float("softcap", 0.0));
  SG_CHECK_ARG(c.eps >= 0.0f && c.eps <= 1.0f, str_cat(op, ": label_smoothing must be in [0, 1], got ", c.eps));
  SG_CHECK_ARG(c.chunk >= 1, str_cat(op, ": chunk must be >= 1, got ", c.chunk));
  SG_CHECK_ARG(c.cap >= 0.0f, str_cat(op, ": softcap must be >= 0 (0 = none), got ", c.cap));
  return Status::OK();
}

// Shapes and dtypes shared by forward and backward: h[N,C], W[V,C], targets[N] i32.
Status check_head(const char* op, const Tensor& h, const Tensor& W, const Tensor& targets) {
  SG_RETURN_IF_ERROR(check_dtype(op, "h", h, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype(op, "W", W, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype(op, "targets", targets, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_ndim(op, "h", h, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "W", W, 2));
  SG_CHECK_SHAPE(W.shape[1] == h.shape[1], str_cat(op, ": h ", h.shape_str(), " and W ", W.shape_str(),
                                                   " must share the channel dim (W is [V, C], HF layout)"));
  SG_CHECK_SHAPE(targets.ndim == 1 && targets.shape[0] == h.shape[0],
                 str_cat(op, ": targets must be [", h.shape[0], "] (one per row of h), got ", targets.shape_str()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"h", &h}, {"W", &W}, {"targets", &targets}}) {
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
  }
  return Status::OK();
}

Status check_row_stat(const char* op, const char* name, const Tensor& t, int64_t N) {
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_CHECK_SHAPE(t.ndim == 1 && t.shape[0] == N, str_cat(op, ": ", name, " must be [", N, "], got ", t.shape_str()));
  return Status::OK();
}

}  // namespace

Status check_lm_head_ce_fwd(const OpArgs& a, LmHeadCeArgs* r) {
  const char* op = "lm_head_ce_fwd";
  const Tensor& h = a.in(0);
  SG_RETURN_IF_ERROR(check_head(op, h, a.in(1), a.in(2)));
  r->N = h.shape[0];
  r->C = h.shape[1];
  r->V = a.in(1).shape[0];
  SG_RETURN_IF_ERROR(check_row_stat(op, "loss", a.out(0), r->N));
  SG_RETURN_IF_ERROR(check_row_stat(op, "lse", a.out(1), r->N));
  return read_attrs(op, a, r);
}

Status check_lm_head_ce_bwd(const OpArgs& a, LmHeadCeArgs* r) {
  const char* op = "lm_head_ce_bwd";
  const Tensor& h = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor& dh = a.out(0);
  SG_RETURN_IF_ERROR(check_head(op, h, W, a.in(2)));
  r->N = h.shape[0];
  r->C = h.shape[1];
  r->V = W.shape[0];
  SG_RETURN_IF_ERROR(check_row_stat(op, "lse", a.in(3), r->N));
  SG_RETURN_IF_ERROR(check_row_stat(op, "dloss", a.in(4), r->N));
  SG_RETURN_IF_ERROR(check_dtype(op, "dh", dh, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dh", dh));
  SG_RETURN_IF_ERROR(check_same_shape(op, "h", h, "dh", dh));
  if (a.has_out(1)) {
    const Tensor& dW = a.out(1);
    SG_RETURN_IF_ERROR(check_dtype(op, "dW", dW, {DType::kF32, DType::kBF16, DType::kF16}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "dW", dW));
    SG_RETURN_IF_ERROR(check_same_shape(op, "W", W, "dW", dW));
    r->dW = &dW;
  }
  SG_RETURN_IF_ERROR(read_attrs(op, a, r));
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

}  // namespace surogate
