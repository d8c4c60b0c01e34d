#include "runtime/op_checks_attention.h"

#include <cmath>

namespace surogate {

namespace {

Status check_float_like(const char* op, const char* arg, const Tensor& t, const Tensor& like, const char* like_name) {
  SG_RETURN_IF_ERROR(check_same_shape(op, arg, t, like_name, like));
  SG_CHECK(t.dtype == like.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", arg, " is ", dtype_name(t.dtype), " but ", like_name, " is ", dtype_name(like.dtype)),
           "attention takes q, k, v and their gradients in one dtype; cast first");
  return check_contiguous(op, arg, t);
}

// q, k, v, cu_seqlens' shape and the attributes.
Status read_config(const char* op, const OpArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& cu, AttentionArgs* c) {
  SG_RETURN_IF_ERROR(check_ndim(op, "q", q, 3));
  SG_RETURN_IF_ERROR(check_ndim(op, "k", k, 3));
  SG_RETURN_IF_ERROR(check_dtype(op, "q", q, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "q", q));
  SG_CHECK(k.dtype == q.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": k is ", dtype_name(k.dtype), " but q is ", dtype_name(q.dtype)),
           "attention takes q, k and v in one dtype; cast first");
  SG_RETURN_IF_ERROR(check_contiguous(op, "k", k));
  SG_RETURN_IF_ERROR(check_float_like(op, "v", v, k, "k"));
  c->N = q.shape[0];
  c->Hq = q.shape[1];
  c->D = q.shape[2];
  c->Hkv = k.shape[1];
  SG_CHECK_SHAPE(k.shape[0] == c->N && k.shape[2] == c->D,
                 str_cat(op, ": k ", k.shape_str(), " does not fit q ", q.shape_str(),
                         " (want [N, Hkv, D] with the same N tokens and head dim D)"));
  SG_CHECK_SHAPE(c->D > 0 && c->Hq > 0 && c->Hkv > 0,
                 str_cat(op, ": q ", q.shape_str(), " and k ", k.shape_str(), " need D > 0 and at least one head"));
  SG_CHECK(c->Hq % c->Hkv == 0, StatusCode::kShapeMismatch,
           str_cat(op, ": Hq = ", c->Hq, " query heads is not a multiple of Hkv = ", c->Hkv, " kv heads"),
           "grouped-query attention shares each kv head among Hq / Hkv query heads");
  c->G = c->Hq / c->Hkv;

  SG_RETURN_IF_ERROR(check_ndim(op, "cu_seqlens", cu, 1));
  SG_RETURN_IF_ERROR(check_dtype(op, "cu_seqlens", cu, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "cu_seqlens", cu));
  SG_CHECK_SHAPE(cu.shape[0] >= 1, str_cat(op, ": cu_seqlens must hold S+1 >= 1 offsets, got ", cu.shape_str()));
  c->S = cu.shape[0] - 1;

  const Attrs& at = a.attr();
  c->causal = at.get_bool("causal", true);
  c->window = at.get_int("window", 0);
  SG_CHECK_ARG(c->window >= 0, str_cat(op, ": window = ", c->window, " must be >= 0 (0: no sliding window)"));
  const double sc = at.get_float("scale", 0.0);
  c->scale = sc > 0.0 ? static_cast<float>(sc) : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c->D)));
  const double cap = at.get_float("softcap", 0.0);
  SG_CHECK_ARG(cap >= 0.0, str_cat(op, ": softcap = ", cap, " must be >= 0 (0: none)"));
  c->softcap = static_cast<float>(cap);
  return Status::OK();
}

// The optional kv_limit [N] i32 of input `slot` (its values: the CPU kernel's checks).
Status check_kv_limit(const char* op, const OpArgs& a, int slot, AttentionArgs* c) {
  if (!a.has_in(slot)) return Status::OK();
  const Tensor& t = a.in(slot);
  SG_RETURN_IF_ERROR(check_dtype(op, "kv_limit", t, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "kv_limit", t));
  SG_CHECK_SHAPE(t.ndim == 1 && t.shape[0] == c->N,
                 str_cat(op, ": kv_limit must be [N] = [", c->N, "], one entry per token; got ", t.shape_str()));
  SG_CHECK_ARG(c->causal, str_cat(op, ": kv_limit widens a causal mask (bidirectional spans); this attention is "
                                      "not causal"));
  c->kv_limit = &t;
  return Status::OK();
}

Status check_lse(const char* op, const Tensor& lse, const AttentionArgs& c) {
  SG_RETURN_IF_ERROR(check_dtype(op, "lse", lse, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "lse", lse));
  SG_CHECK_SHAPE(lse.ndim == 2 && lse.shape[0] == c.N && lse.shape[1] == c.Hq,
                 str_cat(op, ": lse must be [N, Hq] = [", c.N, ", ", c.Hq, "], got ", lse.shape_str()));
  return Status::OK();
}

}  // namespace

Status check_sinks(const char* op, const Tensor& sinks, int64_t Hq) {
  SG_RETURN_IF_ERROR(check_dtype(op, "sinks", sinks, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "sinks", sinks));
  SG_CHECK_SHAPE(sinks.ndim == 1 && sinks.shape[0] == Hq,
                 str_cat(op, ": sinks must be [Hq] = [", Hq, "], one logit per query head; got ", sinks.shape_str()));
  return Status::OK();
}

Status check_attention_fwd(const OpArgs& a, AttentionArgs* c) {
  const char* op = "attention_fwd";
  const Tensor& q = a.in(0);
  SG_RETURN_IF_ERROR(read_config(op, a, q, a.in(1), a.in(2), a.in(3), c));
  SG_RETURN_IF_ERROR(check_float_like(op, "out", a.out(0), q, "q"));
  c->sinks = a.has_in(4);
  if (c->sinks) SG_RETURN_IF_ERROR(check_sinks(op, a.in(4), c->Hq));
  SG_RETURN_IF_ERROR(check_kv_limit(op, a, 5, c));
  return check_lse(op, a.out(1), *c);
}

Status check_attention_bwd(const OpArgs& a, AttentionArgs* c) {
  const char* op = "attention_bwd";
  const Tensor &q = a.in(1), &k = a.in(2), &v = a.in(3);
  SG_RETURN_IF_ERROR(read_config(op, a, q, k, v, a.in(6), c));
  SG_RETURN_IF_ERROR(check_float_like(op, "dout", a.in(0), q, "q"));
  SG_RETURN_IF_ERROR(check_float_like(op, "out", a.in(4), q, "q"));
  SG_RETURN_IF_ERROR(check_lse(op, a.in(5), *c));
  SG_RETURN_IF_ERROR(check_float_like(op, "dq", a.out(0), q, "q"));
  SG_RETURN_IF_ERROR(check_float_like(op, "dk", a.out(1), k, "k"));
  SG_RETURN_IF_ERROR(check_kv_limit(op, a, 7, c));
  return check_float_like(op, "dv", a.out(2), v, "v");
}

Status check_attention_sinks_bwd(const OpArgs& a, AttentionSinksArgs* r) {
  const char* op = "attention_sinks_bwd";
  const Tensor &dout = a.in(0), &out = a.in(1), &lse = a.in(2), &dz = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "out", out, 3));
  SG_RETURN_IF_ERROR(check_dtype(op, "out", out, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "out", out));
  SG_RETURN_IF_ERROR(check_float_like(op, "dout", dout, out, "out"));
  AttentionArgs c;
  c.N = out.shape[0];
  c.Hq = out.shape[1];
  SG_RETURN_IF_ERROR(check_lse(op, lse, c));
  SG_RETURN_IF_ERROR(check_sinks(op, a.in(3), c.Hq));
  SG_RETURN_IF_ERROR(check_same_shape(op, "dsinks", dz, "sinks", a.in(3)));
  SG_RETURN_IF_ERROR(check_dtype(op, "dsinks", dz, {DType::kF32, a.in(3).dtype}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dsinks", dz));
  r->N = c.N;
  r->Hq = c.Hq;
  r->D = out.shape[2];
  r->accumulate = a.attr().get_bool("accumulate", false);
  return Status::OK();
}

}  // namespace surogate
