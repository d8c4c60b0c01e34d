#include "runtime/op_checks_grad_reduce.h"

#include "dist/grad_reducer.h"

namespace surogate {

namespace {
Status check_reducer(const OpArgs& a, const char* op) {
  SG_CHECK(a.reducer != nullptr, StatusCode::kInvalidArgument,
           str_cat(op, ": the Program has no gradient reducer: it reduces gradients among the data-parallel ranks"),
           "a data-parallel rank's training Program gets its rank's GradReducer (Program.set_grad_reducer)");
  return Status::OK();
}
}  // namespace

Status check_grad_reduce(const OpArgs& a, GradReduceArgs* r) {
  const char* op = "grad_reduce";
  SG_RETURN_IF_ERROR(check_reducer(a, op));
  const Attrs& at = a.attr();
  for (int64_t o : at.has("owners") ? at.get_ints("owners") : std::vector<int64_t>{}) r->owners.push_back(static_cast<int>(o));
  r->tag = at.get_int("tag", -1);
  r->every = at.get_bool("every", false);
  SG_CHECK_ARG(!r->every || !r->owners.empty(), str_cat(op, ": every (staged) needs owners: the staging is what "
                                                        "this rank does not own"));
  SG_CHECK_ARG(r->owners.empty() || static_cast<int>(r->owners.size()) == a.num_inputs,
               str_cat(op, ": ", r->owners.size(), " owners for ", a.num_inputs, " inputs; one per input, or none"));
  const int world = a.reducer->comm().world_size();
  for (size_t i = 0; i < r->owners.size(); ++i) {
    SG_CHECK_ARG(r->owners[i] >= 0 && r->owners[i] < world,
                 str_cat(op, ": input ", i, " is owned by rank ", r->owners[i], " of a group of ", world));
  }
  for (int i = 0; i < a.num_inputs; ++i) {
    const Tensor& t = a.in(i);
    SG_RETURN_IF_ERROR(check_contiguous(op, "a gradient", t));
    SG_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16,
             StatusCode::kDTypeUnsupported, str_cat(op, ": input ", i, " is ", dtype_name(t.dtype)),
             "gradient accumulators are f32, bf16 or f16");
  }
  return Status::OK();
}

Status check_grad_wait(const OpArgs& a) { return check_reducer(a, "grad_wait"); }

}  // namespace surogate
