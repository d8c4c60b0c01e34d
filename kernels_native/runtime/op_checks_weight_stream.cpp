#include "runtime/op_checks_weight_stream.h"

#include "dist/collective.h"

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

Status check_weight_gather(const OpArgs& a, WeightGatherArgs* r) {
  const char* op = "weight_gather";
  SG_CHECK(a.comm != nullptr, StatusCode::kInvalidArgument,
           str_cat(op, ": the Program has no communicator: it gathers weights from the other data-parallel ranks"),
           "a ZeRO-3 rank's Programs get their rank's Communicator (Program.set_communicator)");
  const Tensor& dst = a.out(0);
  SG_RETURN_IF_ERROR(check_contiguous(op, "dst", dst));
  const Attrs& at = a.attr();
  r->offsets = at.get_ints("offsets");
  r->sizes = at.get_ints("sizes");
  r->owners = at.get_ints("owners");
  r->rank = a.comm->rank();
  const size_t n = r->offsets.size();
  SG_CHECK_ARG(r->sizes.size() == n && r->owners.size() == n,
               str_cat(op, ": ", n, " offsets, ", r->sizes.size(), " sizes and ", r->owners.size(),
                       " owners; one of each per piece"));
  const int64_t world = a.comm->world_size(), bytes = static_cast<int64_t>(dst.nbytes());
  int64_t end = 0;
  int mine = 0;
  for (size_t i = 0; i < n; ++i) {
    SG_CHECK_ARG(r->owners[i] >= 0 && r->owners[i] < world,
                 str_cat(op, ": piece ", i, " is owned by rank ", r->owners[i], " of a group of ", world));
    SG_CHECK_SHAPE(r->offsets[i] >= end && r->sizes[i] >= 0 && r->offsets[i] + r->sizes[i] <= bytes,
                   str_cat(op, ": piece ", i, " (bytes ", r->offsets[i], " + ", r->sizes[i],
                           ") overlaps the one before it or ends past dst's ", bytes, " bytes"));
    end = r->offsets[i] + r->sizes[i];
    if (r->owners[i] != r->rank) continue;
    SG_CHECK_ARG(mine < a.num_inputs, str_cat(op, ": rank ", r->rank, " owns more pieces than the ", a.num_inputs,
                                              " inputs it gives"));
    const Tensor& src = a.in(mine);
    SG_RETURN_IF_ERROR(check_contiguous(op, "a piece", src));
    SG_CHECK_SHAPE(static_cast<int64_t>(src.nbytes()) == r->sizes[i],
                   str_cat(op, ": input ", mine, " holds ", src.nbytes(), " bytes, its piece ", i, " ", r->sizes[i]));
    SG_CHECK_ARG(src.device == dst.device, str_cat(op, ": input ", mine, " is on ", src.device.to_string(),
                                                   ", dst on ", dst.device.to_string()));
    ++mine;
  }
  SG_CHECK_ARG(mine == a.num_inputs, str_cat(op, ": rank ", r->rank, " owns ", mine, " pieces but gives ",
                                             a.num_inputs, " inputs"));
  return Status::OK();
}

}  // namespace surogate
