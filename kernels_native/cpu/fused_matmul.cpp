// The serving fusions of a matmul with the op that feeds it, on the CPU: each is its composition
// (runtime/fused_matmul.h), the existing kernels run one after the other, so the results equal
// the unfused graph's bit for bit.
#include "cpu/common.h"
#include "runtime/fused_matmul.h"

namespace surogate::cpu {

void register_cpu_fused_matmul(OpRegistry& reg) {
  add_op(reg, "gated_matmul", gated_matmul_unfused);
  add_op(reg, "add_rmsnorm_matmul", add_rmsnorm_matmul_unfused);
}

}  // namespace surogate::cpu
