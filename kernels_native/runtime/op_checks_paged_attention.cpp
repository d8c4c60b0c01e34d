#include "runtime/op_checks_paged_attention.h"

#include <cmath>

#include "runtime/op_checks_attention.h"

namespace surogate {

Status check_kv_cache_write(const OpArgs& a, KvCacheWriteArgs* r) {
  const char* op = "kv_cache_write";
  const Tensor& k = a.in(0);
  const Tensor& v = a.in(1);
  const Tensor& sm = a.in(2);
  const Tensor& kc = a.out(0);
  const Tensor& vc = a.out(1);
  SG_RETURN_IF_ERROR(check_ndim(op, "k", k, 3));
  SG_RETURN_IF_ERROR(check_ndim(op, "slot_mapping", sm, 1));
  SG_RETURN_IF_ERROR(check_ndim(op, "k_cache", kc, 4));
  SG_RETURN_IF_ERROR(check_same_shape(op, "k", k, "v", v));
  SG_RETURN_IF_ERROR(check_same_shape(op, "k_cache", kc, "v_cache", vc));
  SG_RETURN_IF_ERROR(check_dtype(op, "k", k, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype(op, "slot_mapping", sm, {DType::kI32}));
  SG_CHECK(v.dtype == k.dtype && kc.dtype == k.dtype && vc.dtype == k.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": k, v, k_cache and v_cache must share one dtype (got ", dtype_name(k.dtype), ", ",
                   dtype_name(v.dtype), ", ", dtype_name(kc.dtype), ", ", dtype_name(vc.dtype), ")"),
           "keep the cache in the model's activation dtype");
  const char* names[] = {"k", "v", "slot_mapping", "k_cache", "v_cache"};
  const Tensor* ts[] = {&k, &v, &sm, &kc, &vc};
  for (int i = 0; i < 5; ++i) SG_RETURN_IF_ERROR(check_contiguous(op, names[i], *ts[i]));
  r->T = k.shape[0];
  r->Hkv = k.shape[1];
  r->D = k.shape[2];
  SG_CHECK_SHAPE(sm.shape[0] == r->T, str_cat(op, ": slot_mapping ", sm.shape_str(),
                                              " must have one slot per token of k ", k.shape_str()));
  SG_CHECK_SHAPE(kc.shape[2] == r->Hkv && kc.shape[3] == r->D,
                 str_cat(op, ": k_cache ", kc.shape_str(), " must be [num_blocks, block_size, ", r->Hkv, ", ", r->D,
                         "] for k ", k.shape_str()));
  return Status::OK();
}

Status check_paged_attention(const OpArgs& a, PagedAttentionArgs* r) {
  const char* op = "paged_attention";
  const Tensor& q = a.in(0);
  const Tensor& kc = a.in(1);
  const Tensor& vc = a.in(2);
  const Tensor& bt = a.in(3);
  const Tensor& cu = a.in(4);
  const Tensor& cl = a.in(5);
  const Tensor& out = a.out(0);

  SG_RETURN_IF_ERROR(check_ndim(op, "q", q, 3));
  SG_RETURN_IF_ERROR(check_ndim(op, "k_cache", kc, 4));
  SG_RETURN_IF_ERROR(check_ndim(op, "v_cache", vc, 4));
  SG_RETURN_IF_ERROR(check_ndim(op, "block_tables", bt, 2));
  SG_RETURN_IF_ERROR(check_ndim(op, "cu_q", cu, 1));
  SG_RETURN_IF_ERROR(check_ndim(op, "context_lens", cl, 1));
  SG_RETURN_IF_ERROR(check_ndim(op, "out", out, 3));
  SG_RETURN_IF_ERROR(check_dtype(op, "q", q, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_dtype(op, "block_tables", bt, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_dtype(op, "cu_q", cu, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_dtype(op, "context_lens", cl, {DType::kI32}));
  SG_CHECK(kc.dtype == q.dtype && vc.dtype == q.dtype && out.dtype == q.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": q, k_cache, v_cache and out must share one dtype (got ", dtype_name(q.dtype), ", ",
                   dtype_name(kc.dtype), ", ", dtype_name(vc.dtype), ", ", dtype_name(out.dtype), ")"),
           "keep the cache in the model's activation dtype");
  const char* names[] = {"q", "k_cache", "v_cache", "block_tables", "cu_q", "context_lens", "out"};
  const Tensor* ts[] = {&q, &kc, &vc, &bt, &cu, &cl, &out};
  for (int i = 0; i < 7; ++i) SG_RETURN_IF_ERROR(check_contiguous(op, names[i], *ts[i]));

  const int64_t T = q.shape[0], Hq = q.shape[1], D = q.shape[2];
  const int64_t BS = kc.shape[1], Hkv = kc.shape[2];
  const int64_t S = bt.shape[0];
  SG_RETURN_IF_ERROR(check_same_shape(op, "k_cache", kc, "v_cache", vc));
  SG_RETURN_IF_ERROR(check_same_shape(op, "q", q, "out", out));
  SG_CHECK_SHAPE(kc.shape[3] == D, str_cat(op, ": k_cache ", kc.shape_str(), " has head dim ", kc.shape[3],
                                           " but q ", q.shape_str(), " has ", D));
  SG_CHECK_SHAPE(Hkv > 0 && Hq % Hkv == 0,
                 str_cat(op, ": q has ", Hq, " heads, not a multiple of the cache's ", Hkv, " kv heads"));
  SG_CHECK_SHAPE(BS > 0 && D > 0, str_cat(op, ": k_cache ", kc.shape_str(), " has an empty block or head"));
  SG_CHECK_SHAPE(cu.shape[0] == S + 1 && cl.shape[0] == S,
                 str_cat(op, ": block_tables ", bt.shape_str(), " has ", S, " sequences, so cu_q must have ", S + 1,
                         " entries and context_lens ", S, " (got ", cu.shape_str(), " and ", cl.shape_str(), ")"));
  if (a.has_out(1)) {
    const Tensor& lse = a.out(1);
    SG_RETURN_IF_ERROR(check_dtype(op, "lse", lse, {DType::kF32}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "lse", lse));
    SG_CHECK_SHAPE(lse.ndim == 2 && lse.shape[0] == T && lse.shape[1] == Hq,
                   str_cat(op, ": lse must be [", T, ", ", Hq, "], got ", lse.shape_str()));
    r->lse = &lse;
  }
  if (a.has_in(6)) {
    SG_RETURN_IF_ERROR(check_sinks(op, a.in(6), Hq));
    r->sinks = &a.in(6);
  }
  if (a.has_in(7)) {
    const Tensor& kl = a.in(7);
    SG_RETURN_IF_ERROR(check_ndim(op, "kv_limit", kl, 1));
    SG_RETURN_IF_ERROR(check_dtype(op, "kv_limit", kl, {DType::kI32}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "kv_limit", kl));
    SG_CHECK_SHAPE(kl.shape[0] == T, str_cat(op, ": kv_limit ", kl.shape_str(), " must have one entry per row of q ",
                                             q.shape_str()));
    r->kv_limit = &kl;
  }

  r->scale = a.attr().get_float("scale", 1.0 / std::sqrt(static_cast<double>(D)));
  r->window = a.attr().get_int("window", 0);
  r->softcap = a.attr().get_float("softcap", 0.0);
  SG_CHECK_ARG(r->window >= 0, str_cat(op, ": window must be >= 0 (0: none), got ", r->window));
  SG_CHECK_ARG(r->softcap >= 0.0, str_cat(op, ": softcap must be >= 0 (0: none), got ", r->softcap));
  // The one cu_q check the shapes decide: with no sequence, cu_q = [0] cannot end at T > 0.
  SG_CHECK_ARG(S > 0 || T == 0,
               str_cat(op, ": cu_q must start at 0 and end at the ", T, " rows of q, but block_tables has no "
                       "sequence"));
  r->T = T;
  r->Hq = Hq;
  r->D = D;
  r->NB = kc.shape[0];
  r->BS = BS;
  r->Hkv = Hkv;
  r->S = S;
  r->max_blocks = bt.shape[1];
  return Status::OK();
}

}  // namespace surogate
