#include "runtime/op_checks_sample.h"

#include <limits>

namespace surogate {

Status check_sample(const OpArgs& a, SampleDims* d) {
  const char* op = "sample";
  const Tensor& x = a.in(0);
  const Tensor& p = a.in(1);
  SG_RETURN_IF_ERROR(check_ndim(op, "logits", x, 2));
  SG_RETURN_IF_ERROR(check_dtype(op, "logits", x, {DType::kF32, DType::kBF16, DType::kF16}));
  d->R = x.shape[0];
  d->V = x.shape[1];
  SG_CHECK_SHAPE(d->V >= 1 && d->V <= std::numeric_limits<int32_t>::max(),
                 str_cat(op, ": logits ", x.shape_str(), " must have between 1 and 2^31 - 1 columns"));
  SG_CHECK((d->V <= 1 || x.strides[1] == 1) && (d->R <= 1 || x.strides[0] >= d->V), StatusCode::kInvalidArgument,
           str_cat(op, ": logits rows must be contiguous (strides [", x.strides[0], ", ", x.strides[1], "])"),
           "pass a contiguous tensor or a column slice of one");
  d->row_stride = d->R <= 1 ? d->V : x.strides[0];
  SG_RETURN_IF_ERROR(check_dtype(op, "params", p, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "params", p));
  SG_CHECK_SHAPE(p.ndim == 2 && p.shape[0] == d->R && p.shape[1] == kSampleParamCols,
                 str_cat(op, ": params ", p.shape_str(), " must be [R, 8] = [", d->R,
                         ", 8] (temperature, top_k, top_p, min_p, seed_lo, seed_hi, step, reserved per row)"));
  d->mask = a.has_in(2);
  if (d->mask) {
    const Tensor& m = a.in(2);
    const int64_t W = (d->V + 31) / 32;
    SG_RETURN_IF_ERROR(check_dtype(op, "mask", m, {DType::kI32}));
    SG_RETURN_IF_ERROR(check_contiguous(op, "mask", m));
    SG_CHECK_SHAPE(m.ndim == 2 && m.shape[0] == d->R && m.shape[1] == W,
                   str_cat(op, ": mask ", m.shape_str(), " must be [R, ceil(V / 32)] = [", d->R, ", ", W,
                           "] (a bitmask row per logits row: bit i % 32 of word i / 32 allows token i)"));
  }
  const char* names[3] = {"token", "logprob", "rank"};
  const DType types[3] = {DType::kI32, DType::kF32, DType::kI32};
  d->rank = a.has_out(2);
  for (int i = 0; i < (d->rank ? 3 : 2); ++i) {
    const Tensor& t = a.out(i);
    SG_RETURN_IF_ERROR(check_dtype(op, names[i], t, {types[i]}));
    SG_RETURN_IF_ERROR(check_contiguous(op, names[i], t));
    SG_CHECK_SHAPE(t.ndim == 1 && t.shape[0] == d->R,
                   str_cat(op, ": ", names[i], " ", t.shape_str(), " must be [R] = [", d->R, "]"));
  }
  return Status::OK();
}

}  // namespace surogate
