#include "runtime/op_checks_embedding_bag.h"

namespace surogate {

Status check_embedding_bag_fwd(const OpArgs& a, EmbeddingBagArgs* r) {
  const char* op = "embedding_bag_fwd";
  const Tensor &ids = a.in(0), &w = a.in(1), &table = a.in(2), &y = a.out(0);
  SG_RETURN_IF_ERROR(check_ndim(op, "ids", ids, 2));
  SG_RETURN_IF_ERROR(check_dtype(op, "ids", ids, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_ndim(op, "weights", w, 2));
  SG_RETURN_IF_ERROR(check_dtype(op, "weights", w, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_same_shape(op, "weights", w, "ids", ids));
  SG_RETURN_IF_ERROR(check_ndim(op, "table", table, 2));
  SG_RETURN_IF_ERROR(check_dtype(op, "table", table, {DType::kF32, DType::kBF16, DType::kF16}));
  SG_RETURN_IF_ERROR(check_ndim(op, "y", y, 2));
  SG_CHECK(y.dtype == table.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": y is ", dtype_name(y.dtype), " but table is ", dtype_name(table.dtype)),
           "give y the table's dtype");
  for (const auto& [name, t] : {std::pair{"ids", &ids}, std::pair{"weights", &w}, std::pair{"table", &table},
                                std::pair{"y", &y}}) {
    SG_RETURN_IF_ERROR(check_contiguous(op, name, *t));
  }
  r->N = ids.shape[0];
  r->K = ids.shape[1];
  r->V = table.shape[0];
  r->C = table.shape[1];
  SG_CHECK_SHAPE(y.shape[0] == r->N && y.shape[1] == r->C,
                 str_cat(op, ": y is ", y.shape_str(), ", expected [", r->N, ", ", r->C, "]"));
  return Status::OK();
}

}  // namespace surogate
