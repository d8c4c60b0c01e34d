#include "runtime/op_checks.h"

namespace surogate {

Status check_argmax(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  SG_CHECK_SHAPE(x.ndim == 2 && y.ndim == 1 && y.shape[0] == x.shape[0],
                 str_cat("argmax: x ", x.shape_str(), " and y ", y.shape_str(), " are not [R, V] and [R]"));
  SG_CHECK(y.dtype == DType::kI32, StatusCode::kDTypeUnsupported, "argmax: y must be int32", "");
  SG_CHECK(x.strides[1] == 1 && y.strides[0] == 1, StatusCode::kInvalidArgument,
           "argmax: x rows and y must be contiguous", "");
  return Status::OK();
}

namespace {

constexpr const char* kQkv = "qkv_rope_cache";

// [N, H, D] with each token's heads packed ([H, D] contiguous) and rows `row` elements apart,
// row >= H * D. Returns the row stride in *row.
Status check_rows(const char* name, const Tensor& t, int64_t* row) {
  SG_RETURN_IF_ERROR(check_ndim(kQkv, name, t, 3));
  SG_RETURN_IF_ERROR(check_dtype(kQkv, name, t, {DType::kF32, DType::kBF16, DType::kF16}));
  const int64_t N = t.shape[0], H = t.shape[1], D = t.shape[2];
  const bool packed = (D <= 1 || t.strides[2] == 1) && (H <= 1 || t.strides[1] == D);
  *row = N <= 1 ? H * D : t.strides[0];
  SG_CHECK(t.numel() == 0 || (packed && *row >= H * D), StatusCode::kInvalidArgument,
           str_cat(kQkv, ": ", name, " ", t.shape_str(), " has strides [", t.strides[0], ", ", t.strides[1], ", ",
                   t.strides[2], "]; it must be [row >= ", H * D, ", ", D, ", 1] (each token's heads contiguous)"),
           "pass a contiguous tensor or a column slice of one");
  return Status::OK();
}

Status check_same_dtype(const char* name, const Tensor& t, const Tensor& q) {
  SG_CHECK(t.dtype == q.dtype, StatusCode::kDTypeUnsupported,
           str_cat(kQkv, ": ", name, " is ", dtype_name(t.dtype), " but q is ", dtype_name(q.dtype)),
           "keep q, k, v, the norm weights and the cache in the model's activation dtype");
  return Status::OK();
}

Status check_index(const char* name, const Tensor& t, int64_t N, const char* what) {
  SG_RETURN_IF_ERROR(check_dtype(kQkv, name, t, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(kQkv, name, t));
  SG_CHECK_SHAPE(t.ndim == 1 && t.shape[0] == N,
                 str_cat(kQkv, ": ", name, " ", t.shape_str(), " must be [N] = [", N, "], one ", what, " per token"));
  return Status::OK();
}

}  // namespace

Status check_qkv_rope_cache(const OpArgs& a, QkvRopeCacheDims* d) {
  const char* op = kQkv;
  const Tensor& q = a.in(0);
  const Tensor& k = a.in(1);
  const Tensor& v = a.in(2);
  const Tensor& qo = a.out(0);
  const Tensor& kc = a.out(1);
  const Tensor& vc = a.out(2);
  SG_RETURN_IF_ERROR(check_rows("q", q, &d->q_row));
  SG_RETURN_IF_ERROR(check_rows("k", k, &d->k_row));
  SG_RETURN_IF_ERROR(check_rows("v", v, &d->v_row));
  d->N = q.shape[0], d->Hq = q.shape[1], d->D = q.shape[2], d->Hkv = k.shape[1];
  SG_RETURN_IF_ERROR(check_same_shape(op, "k", k, "v", v));
  SG_CHECK_SHAPE(k.shape[0] == d->N && k.shape[2] == d->D,
                 str_cat(op, ": k ", k.shape_str(), " must be [N, Hkv, D] with q's N and D (q ", q.shape_str(), ")"));
  SG_RETURN_IF_ERROR(check_same_shape(op, "q", q, "q_out", qo));
  SG_RETURN_IF_ERROR(check_ndim(op, "k_cache", kc, 4));
  SG_RETURN_IF_ERROR(check_same_shape(op, "k_cache", kc, "v_cache", vc));
  SG_CHECK_SHAPE(kc.shape[2] == d->Hkv && kc.shape[3] == d->D,
                 str_cat(op, ": k_cache ", kc.shape_str(), " must be [num_blocks, block_size, ", d->Hkv, ", ", d->D,
                         "] for k ", k.shape_str()));
  const char* names[] = {"k", "v", "q_out", "k_cache", "v_cache"};
  const Tensor* ts[] = {&k, &v, &qo, &kc, &vc};
  for (int i = 0; i < 5; ++i) SG_RETURN_IF_ERROR(check_same_dtype(names[i], *ts[i], q));
  for (int i = 2; i < 5; ++i) SG_RETURN_IF_ERROR(check_contiguous(op, names[i], *ts[i]));
  SG_RETURN_IF_ERROR(check_index("pos", a.in(3), d->N, "position"));
  SG_RETURN_IF_ERROR(check_index("slot_mapping", a.in(4), d->N, "slot"));
  d->norm = a.has_in(5);
  SG_CHECK_ARG(d->norm == a.has_in(6), str_cat(op, ": pass both norm weights (q_norm, k_norm) or neither"));
  if (d->norm) {
    const char* wn[] = {"q_norm", "k_norm"};
    for (int i = 0; i < 2; ++i) {
      const Tensor& w = a.in(5 + i);
      SG_CHECK_SHAPE(w.ndim == 1 && w.shape[0] == d->D,
                     str_cat(op, ": ", wn[i], " ", w.shape_str(), " must be [D] = [", d->D, "]"));
      SG_RETURN_IF_ERROR(check_contiguous(op, wn[i], w));
      SG_RETURN_IF_ERROR(check_same_dtype(wn[i], w, q));
    }
  }
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), d->D, &d->rope));
  d->eps = static_cast<float>(a.attr().get_float("eps", 1e-6));
  return Status::OK();
}

}  // namespace surogate
