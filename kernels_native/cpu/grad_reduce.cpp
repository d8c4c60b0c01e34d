// The data-parallel gradient reduction ops on the CPU: grad_reduce hands a layer's finished
// gradient accumulators to the rank's GradReducer (dist/grad_reducer.h), whose thread reduces
// them among the ranks while the backward goes on; grad_wait, at the backward's end, waits for
// them. Unarmed (a micro-batch before the step's last) a grad_reduce does nothing (the
// accumulators keep adding up) unless staged (``every``: ZeRO-2/3's staging buffers, reduced to
// their owners every backward and zeroed); grad_wait {tag} waits for one layer's reduction only. Argument rules in runtime/op_checks_grad_reduce.h.
#include "cpu/common.h"
#include "dist/grad_reducer.h"
#include "runtime/op_checks_grad_reduce.h"

namespace surogate::cpu {

namespace {

Status grad_reduce(const OpArgs& a) {
  GradReduceArgs r;
  SG_RETURN_IF_ERROR(check_grad_reduce(a, &r));
  if (!r.every && !a.reducer->armed()) return Status::OK();
  // Views without the arrays' owners: the Program keeps them bound, and the reducer thread must
  // not drop the last reference to a Python array (that takes the GIL).
  std::vector<Tensor> bufs(a.inputs, a.inputs + a.num_inputs);
  for (Tensor& t : bufs) t.owner.reset();
  return a.reducer->start(std::move(bufs), std::move(r.owners), r.tag, r.every);
}

Status grad_wait(const OpArgs& a) {
  SG_RETURN_IF_ERROR(check_grad_wait(a));
  if (a.attr().has("tag")) return a.reducer->wait_for(a.attr().get_int("tag", -1));
  return a.reducer->wait();
}

}  // namespace

void register_cpu_grad_reduce(OpRegistry& reg) {
  add_op(reg, "grad_reduce", grad_reduce);
  add_op(reg, "grad_wait", grad_wait);
}

}  // namespace surogate::cpu
