#include "runtime/op_checks_weight_stream.h"

namespace surogate {

Status check_weight_fetch(const OpArgs& a, WeightFetchArgs* r) {
  const char* op = "weight_fetch";
  const Tensor& src = a.in(0);
  const Tensor& dst = a.out(0);
  SG_RETURN_IF_ERROR(check_contiguous(op, "src", src));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dst", dst));
  SG_CHECK(src.device.is_cpu(), StatusCode::kInvalidArgument,
           str_cat(op, ": src is on ", src.device.to_string(), "; it copies from host memory"),
           "bind the packed weights as a host buffer (Program.external(..., host=True))");
  SG_CHECK_SHAPE(src.nbytes() == dst.nbytes(),
                 str_cat(op, ": src holds ", src.nbytes(), " bytes, dst ", dst.nbytes()));
  r->bytes = src.nbytes();
  return Status::OK();
}

Status check_weight_wait(const OpArgs& a) {
  SG_RETURN_IF_ERROR(check_contiguous("weight_wait", "dst", a.in(0)));
  return Status::OK();
}

}  // namespace surogate
