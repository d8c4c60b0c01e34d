#include "runtime/op_checks_moe.h"

namespace surogate {

namespace {

constexpr std::initializer_list<DType> kFloats = {DType::kF32, DType::kBF16, DType::kF16};

// t is a contiguous [rows, cols] tensor of one of `dtypes`.
Status check_2d(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                std::initializer_list<DType> dtypes) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, t, 2));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, t));
  SG_RETURN_IF_ERROR(check_dtype(op, name, t, dtypes));
  SG_CHECK_SHAPE(t.shape[0] == rows && t.shape[1] == cols,
                 str_cat(op, ": ", name, " is ", t.shape_str(), ", expected [", rows, ", ", cols, "]"));
  return Status::OK();
}

Status check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  SG_CHECK(t.dtype == ref.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(t.dtype), " but ", ref_name, " is ", dtype_name(ref.dtype)),
           "keep the activations and their gradients in one dtype");
  return Status::OK();
}

Status check_offsets(const char* op, const Tensor& t, int64_t* E) {
  SG_RETURN_IF_ERROR(check_ndim(op, "offsets", t, 1));
  SG_RETURN_IF_ERROR(check_contiguous(op, "offsets", t));
  SG_RETURN_IF_ERROR(check_dtype(op, "offsets", t, {DType::kI32}));
  SG_CHECK_SHAPE(t.shape[0] >= 2, str_cat(op, ": offsets ", t.shape_str(), " must be [E + 1] with E >= 1"));
  *E = t.shape[0] - 1;
  return Status::OK();
}

}  // namespace

Status check_moe_router_fwd(const OpArgs& a, MoeRouterArgs* r) {
  const char* op = "moe_router_fwd";
  const Tensor &logits = a.in(0), &w = a.out(0), &idx = a.out(1), &probs = a.out(2);
  SG_RETURN_IF_ERROR(check_ndim(op, "logits", logits, 2));
  r->N = logits.shape[0], r->E = logits.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "logits", logits, r->N, r->E, kFloats));
  SG_RETURN_IF_ERROR(check_ndim(op, "weights", w, 2));
  r->K = w.shape[1];
  SG_CHECK_ARG(r->K >= 1 && r->K <= r->E,
               str_cat(op, ": top_k ", r->K, " (weights ", w.shape_str(), ") must be in [1, E = ", r->E, "]"));
  SG_RETURN_IF_ERROR(check_2d(op, "weights", w, r->N, r->K, kFloats));
  SG_RETURN_IF_ERROR(check_same_dtype(op, "weights", w, "logits", logits));
  SG_RETURN_IF_ERROR(check_2d(op, "idx", idx, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_2d(op, "probs", probs, r->N, r->E, {DType::kF32}));
  r->norm_topk_prob = a.attr().get_bool("norm_topk_prob", false);
  return Status::OK();
}

Status check_moe_router_bwd(const OpArgs& a, MoeRouterArgs* r) {
  const char* op = "moe_router_bwd";
  const Tensor &dw = a.in(0), &probs = a.in(1), &idx = a.in(2), &dl = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "probs", probs, 2));
  r->N = probs.shape[0], r->E = probs.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "probs", probs, r->N, r->E, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_ndim(op, "dweights", dw, 2));
  r->K = dw.shape[1];
  SG_CHECK_ARG(r->K >= 1 && r->K <= r->E, str_cat(op, ": top_k ", r->K, " must be in [1, E = ", r->E, "]"));
  SG_RETURN_IF_ERROR(check_2d(op, "dweights", dw, r->N, r->K, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "idx", idx, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_2d(op, "dlogits", dl, r->N, r->E, kFloats));
  r->dprobs = a.has_in(3);
  if (r->dprobs) SG_RETURN_IF_ERROR(check_2d(op, "dprobs", a.in(3), r->N, r->E, {DType::kF32}));
  r->norm_topk_prob = a.attr().get_bool("norm_topk_prob", false);
  return Status::OK();
}

Status check_moe_permute(const OpArgs& a, MoePermuteArgs* r) {
  const char* op = "moe_permute";
  const Tensor &x = a.in(0), &idx = a.in(1), &xp = a.out(0), &rows = a.out(1), &offsets = a.out(2);
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "idx", idx, 2));
  r->N = x.shape[0], r->C = x.shape[1], r->K = idx.shape[1], r->M = r->N * r->K;
  SG_RETURN_IF_ERROR(check_2d(op, "x", x, r->N, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "idx", idx, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_2d(op, "xp", xp, r->M, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_same_dtype(op, "xp", xp, "x", x));
  SG_RETURN_IF_ERROR(check_2d(op, "rows", rows, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_offsets(op, offsets, &r->E));
  SG_CHECK_ARG(r->M < INT32_MAX, str_cat(op, ": ", r->M, " permuted rows; at most 2^31 - 2 in one call"));
  return Status::OK();
}

Status check_moe_unpermute_fwd(const OpArgs& a, MoePermuteArgs* r) {
  const char* op = "moe_unpermute_fwd";
  const Tensor &yp = a.in(0), &rows = a.in(1), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "yp", yp, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "rows", rows, 2));
  r->M = yp.shape[0], r->C = yp.shape[1], r->N = rows.shape[0], r->K = rows.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "yp", yp, r->M, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "rows", rows, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_2d(op, "y", y, r->N, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_same_dtype(op, "y", y, "yp", yp));
  r->weights = a.has_in(2);
  if (r->weights) SG_RETURN_IF_ERROR(check_2d(op, "weights", a.in(2), r->N, r->K, kFloats));
  return Status::OK();
}

Status check_moe_unpermute_bwd(const OpArgs& a, MoePermuteArgs* r) {
  const char* op = "moe_unpermute_bwd";
  const Tensor &dy = a.in(0), &rows = a.in(1), &yp = a.in(2), &w = a.in(3), &dyp = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "yp", yp, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "rows", rows, 2));
  r->M = yp.shape[0], r->C = yp.shape[1], r->N = rows.shape[0], r->K = rows.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "dy", dy, r->N, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "rows", rows, r->N, r->K, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_2d(op, "yp", yp, r->M, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "weights", w, r->N, r->K, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "dyp", dyp, r->M, r->C, kFloats));
  SG_RETURN_IF_ERROR(check_same_dtype(op, "dyp", dyp, "dy", dy));
  r->weights = true;
  r->dweights = a.has_out(1);
  if (r->dweights) SG_RETURN_IF_ERROR(check_2d(op, "dweights", a.out(1), r->N, r->K, kFloats));
  return Status::OK();
}

Status check_moe_grouped_matmul(const OpArgs& a, MoeGroupedArgs* r) {
  const char* op = "moe_grouped_matmul";
  const Tensor &x = a.in(0), &W = a.in(1), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_offsets(op, a.in(2), &r->E));
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "W", W, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, "W", W));
  SG_RETURN_IF_ERROR(check_dtype(op, "W", W, kFloats));
  r->trans_b = a.attr().get_bool("trans_b", true);
  r->M = x.shape[0], r->Kin = x.shape[1];
  r->Nout = r->trans_b ? W.shape[1] : W.shape[2];
  const int64_t w_in = r->trans_b ? W.shape[2] : W.shape[1];
  SG_CHECK_SHAPE(W.shape[0] == r->E && w_in == r->Kin,
                 str_cat(op, ": W ", W.shape_str(), " must be [E = ", r->E, ", ", r->trans_b ? "out, " : "",
                         r->Kin, r->trans_b ? "" : ", out", "] for x ", x.shape_str(), " (trans_b = ", r->trans_b,
                         ")"));
  SG_RETURN_IF_ERROR(check_2d(op, "x", x, r->M, r->Kin, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "y", y, r->M, r->Nout, kFloats));
  SG_RETURN_IF_ERROR(check_same_dtype(op, "y", y, "x", x));
  return Status::OK();
}

Status check_moe_grouped_matmul_wgrad(const OpArgs& a, MoeGroupedArgs* r) {
  const char* op = "moe_grouped_matmul_wgrad";
  const Tensor &dy = a.in(0), &x = a.in(1), &dW = a.out(0);
  SG_RETURN_IF_ERROR(check_offsets(op, a.in(2), &r->E));
  SG_RETURN_IF_ERROR(check_ndim(op, "dy", dy, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "x", x, 2));
  r->M = dy.shape[0], r->Nout = dy.shape[1], r->Kin = x.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "dy", dy, r->M, r->Nout, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "x", x, r->M, r->Kin, kFloats));
  SG_RETURN_IF_ERROR(check_ndim(op, "dW", dW, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dW", dW));
  SG_RETURN_IF_ERROR(check_dtype(op, "dW", dW, kFloats));
  SG_CHECK_SHAPE(dW.shape[0] == r->E && dW.shape[1] == r->Nout && dW.shape[2] == r->Kin,
                 str_cat(op, ": dW ", dW.shape_str(), " must be [", r->E, ", ", r->Nout, ", ", r->Kin, "]"));
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

Status check_moe_aux_loss_fwd(const OpArgs& a, MoeAuxArgs* r) {
  const char* op = "moe_aux_loss_fwd";
  SG_CHECK_ARG(a.num_inputs >= 2 && a.num_inputs % 2 == 0,
               str_cat(op, ": ", a.num_inputs, " inputs; give (probs, idx) of each MoE layer"));
  r->L = a.num_inputs / 2;
  const Tensor &p0 = a.in(0), &i0 = a.in(1);
  SG_RETURN_IF_ERROR(check_ndim(op, "probs", p0, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "idx", i0, 2));
  r->N = p0.shape[0], r->E = p0.shape[1], r->K = i0.shape[1];
  for (int64_t l = 0; l < r->L; ++l) {
    SG_RETURN_IF_ERROR(check_2d(op, "probs", a.in(2 * l), r->N, r->E, {DType::kF32}));
    SG_RETURN_IF_ERROR(check_2d(op, "idx", a.in(2 * l + 1), r->N, r->K, {DType::kI32}));
  }
  SG_CHECK_SHAPE(a.out(0).numel() == 1 && a.out(0).dtype == DType::kF32,
                 str_cat(op, ": loss ", a.out(0).shape_str(), " must be one float32"));
  SG_CHECK_SHAPE(a.out(1).ndim == 1 && a.out(1).shape[0] == r->E && a.out(1).dtype == DType::kF32,
                 str_cat(op, ": counts ", a.out(1).shape_str(), " must be float32 [E = ", r->E, "]"));
  return Status::OK();
}

Status check_moe_aux_loss_bwd(const OpArgs& a, MoeAuxArgs* r) {
  const char* op = "moe_aux_loss_bwd";
  const Tensor &dloss = a.in(0), &counts = a.in(1), &dp = a.out(0);
  SG_CHECK_SHAPE(dloss.numel() == 1 && dloss.dtype == DType::kF32,
                 str_cat(op, ": dloss ", dloss.shape_str(), " must be one float32"));
  SG_RETURN_IF_ERROR(check_ndim(op, "dprobs", dp, 2));
  r->N = dp.shape[0], r->E = dp.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "dprobs", dp, r->N, r->E, {DType::kF32}));
  SG_CHECK_SHAPE(counts.ndim == 1 && counts.shape[0] == r->E && counts.dtype == DType::kF32,
                 str_cat(op, ": counts ", counts.shape_str(), " must be float32 [E = ", r->E, "]"));
  r->L = a.attr().get_int("num_layers", 0);
  SG_CHECK_ARG(r->L >= 1, str_cat(op, ": attr num_layers ", r->L, " must be the number of MoE layers (>= 1)"));
  return Status::OK();
}

Status check_moe_z_loss_fwd(const OpArgs& a, MoeZLossArgs* r) {
  const char* op = "moe_z_loss_fwd";
  SG_CHECK_ARG(a.num_inputs >= 1, str_cat(op, ": no inputs; give the router logits of each MoE layer"));
  r->L = a.num_inputs;
  SG_RETURN_IF_ERROR(check_ndim(op, "logits", a.in(0), 2));
  r->N = a.in(0).shape[0], r->E = a.in(0).shape[1];
  for (int64_t l = 0; l < r->L; ++l) {
    SG_RETURN_IF_ERROR(check_2d(op, "logits", a.in(l), r->N, r->E, kFloats));
    SG_CHECK_ARG(a.in(l).dtype == a.in(0).dtype, str_cat(op, ": logits ", l, " has another dtype than logits 0"));
  }
  SG_CHECK_SHAPE(a.out(0).numel() == 1 && a.out(0).dtype == DType::kF32,
                 str_cat(op, ": loss ", a.out(0).shape_str(), " must be one float32"));
  return Status::OK();
}

Status check_moe_z_loss_bwd(const OpArgs& a, MoeZLossArgs* r) {
  const char* op = "moe_z_loss_bwd";
  const Tensor &dloss = a.in(0), &logits = a.in(1), &dl = a.out(0);
  SG_CHECK_SHAPE(dloss.numel() == 1 && dloss.dtype == DType::kF32,
                 str_cat(op, ": dloss ", dloss.shape_str(), " must be one float32"));
  SG_RETURN_IF_ERROR(check_ndim(op, "logits", logits, 2));
  r->N = logits.shape[0], r->E = logits.shape[1];
  SG_RETURN_IF_ERROR(check_2d(op, "logits", logits, r->N, r->E, kFloats));
  SG_RETURN_IF_ERROR(check_2d(op, "dlogits", dl, r->N, r->E, {logits.dtype}));
  r->L = a.attr().get_int("num_layers", 0);
  SG_CHECK_ARG(r->L >= 1, str_cat(op, ": attr num_layers ", r->L, " must be the number of MoE layers (>= 1)"));
  return Status::OK();
}

}  // namespace surogate
