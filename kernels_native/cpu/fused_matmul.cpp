// The serving fusions of a matmul with the op that feeds it, on the CPU: each is its composition
// (runtime/fused_matmul.h), the existing kernels run one after the other, so the results equal
// the unfused graph's bit for bit.
#include "cpu/common.h"
#include "runtime/fused_matmul.h"

namespace surogate::cpu {

void register_cpu_fused_matmul(OpRegistry& reg) {
  add_op(reg, "gated_matmul", 2, 3, 1, gated_matmul_unfused,
         "(gu[M,2F] = [gate, up], W[N,F], [bias[N]]) -> (y[M,N] = act(gate) * up @ W^T + bias); attrs: act "
         "(silu | gelu_tanh)");
  add_op(reg, "add_rmsnorm_matmul", 1, 5, 2, add_rmsnorm_matmul_unfused,
         "(x[M,K], [residual[M,K]], w[K], W[N,K], [bias[N]]) -> (y[M,N] = rmsnorm(x + residual) w @ W^T + bias, "
         "[h = x + residual]); attrs: eps, weight_offset",
         /*min_out=*/1);
}

}  // namespace surogate::cpu
