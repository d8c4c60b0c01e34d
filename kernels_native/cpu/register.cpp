// One place that lists every group of CPU kernels. Each group's file defines its
// register_cpu_<group>() function next to its kernels.
#include "runtime/op_registry.h"

namespace surogate {
namespace cpu {
void register_cpu_elementwise(OpRegistry& reg);
void register_cpu_matmul(OpRegistry& reg);
void register_cpu_fp8(OpRegistry& reg);
void register_cpu_norm(OpRegistry& reg);
void register_cpu_embedding(OpRegistry& reg);
void register_cpu_rope(OpRegistry& reg);
void register_cpu_activation(OpRegistry& reg);
void register_cpu_attention(OpRegistry& reg);
void register_cpu_cross_entropy(OpRegistry& reg);
void register_cpu_optimizer(OpRegistry& reg);
void register_cpu_gguf(OpRegistry& reg);
void register_cpu_nf4(OpRegistry& reg);
void register_cpu_muon(OpRegistry& reg);
void register_cpu_paged_attention(OpRegistry& reg);
void register_cpu_qkv_rope_cache(OpRegistry& reg);
void register_cpu_dropout(OpRegistry& reg);
void register_cpu_fused_matmul(OpRegistry& reg);
void register_cpu_short_conv(OpRegistry& reg);
void register_cpu_pool(OpRegistry& reg);
void register_cpu_moe(OpRegistry& reg);
void register_cpu_moe_oai(OpRegistry& reg);
void register_cpu_rope_table(OpRegistry& reg);
void register_cpu_embedding_bag(OpRegistry& reg);
void register_cpu_sample(OpRegistry& reg);
void register_cpu_weight_stream(OpRegistry& reg);
void register_cpu_weight_gather(OpRegistry& reg);
void register_cpu_grad_reduce(OpRegistry& reg);
}  // namespace cpu

void register_cpu_ops(OpRegistry& reg) {
  cpu::register_cpu_elementwise(reg);
  cpu::register_cpu_matmul(reg);
  cpu::register_cpu_fp8(reg);
  cpu::register_cpu_norm(reg);
  cpu::register_cpu_embedding(reg);
  cpu::register_cpu_rope(reg);
  cpu::register_cpu_activation(reg);
  cpu::register_cpu_attention(reg);
  cpu::register_cpu_cross_entropy(reg);
  cpu::register_cpu_optimizer(reg);
  cpu::register_cpu_gguf(reg);
  cpu::register_cpu_nf4(reg);
  cpu::register_cpu_muon(reg);
  cpu::register_cpu_paged_attention(reg);
  cpu::register_cpu_qkv_rope_cache(reg);
  cpu::register_cpu_dropout(reg);
  cpu::register_cpu_fused_matmul(reg);
  cpu::register_cpu_short_conv(reg);
  cpu::register_cpu_pool(reg);
  cpu::register_cpu_moe(reg);
  cpu::register_cpu_moe_oai(reg);
  cpu::register_cpu_rope_table(reg);
  cpu::register_cpu_embedding_bag(reg);
  cpu::register_cpu_sample(reg);
  cpu::register_cpu_weight_stream(reg);
  cpu::register_cpu_weight_gather(reg);
  cpu::register_cpu_grad_reduce(reg);
}

}  // namespace surogate
