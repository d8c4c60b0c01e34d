// Argument rules of the data-parallel gradient reduction ops (surogate/compile/grad_reduce.py
// places them; dist/grad_reducer.h runs them):
//   grad_reduce (a layer's gradient accumulators) -> (); attrs owners (one rank per input, or none:
//     an all-reduce), tag (the decoder layer, -1 outside the layers). Armed (the rank's last
//     backward of the step): starts their reduction on the reducer's thread and returns at once.
//     every: staged (this rank's tensors of other owners are a staging buffer): acts armed or not,
//     and zeroes those after the reduction.
//   grad_wait () -> (): returns when every reduction started is done (armed: then disarms);
//     attrs tag (optional): waits only for that tag's last reduction (a staging buffer's reuse).
// Unarmed, a grad_reduce without every does nothing. The accumulators: contiguous f32 / bf16 / f16, on the op's device;
// nothing may write them between the grad_reduce and the grad_wait (the pass's placement).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct GradReduceArgs {
  std::vector<int> owners;  // empty: all-reduce
  int64_t tag = -1;
  bool every = false;
};

Status check_grad_reduce(const OpArgs& a, GradReduceArgs* r);
Status check_grad_wait(const OpArgs& a);

}  // namespace surogate
