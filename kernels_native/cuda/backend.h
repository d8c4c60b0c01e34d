// The CUDA backend's entry points: device discovery, the allocator / copy hooks it registers
// with core/allocator, and the registration of its op kernels. Compiled only when the CUDA
// toolkit is found (SUROGATE_CUDA=AUTO|ON).
#pragma once

#include <string>
#include <vector>

#include "runtime/op_registry.h"

namespace surogate::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
  std::string driver_version;
};

// Devices the driver reports; empty (not an error) when there is no GPU or no driver.
std::vector<DeviceInfo> devices();
std::string runtime_version();
// Register device hooks and every CUDA op kernel. Safe to call with no GPU present.
void register_backend();

// Per-group op registration (one per .cu file).
void register_cuda_elementwise(OpRegistry& reg);
void register_cuda_matmul(OpRegistry& reg);  // matmul (cuBLASLt) and lm_head_ce_fwd / lm_head_ce_bwd
void register_cuda_attention(OpRegistry& reg);  // attention_fwd / attention_bwd (packed varlen causal GQA)
void register_cuda_norm_rope_act(OpRegistry& reg);  // rmsnorm, add_rmsnorm, layer_norm, rope, qk_norm_rope, swiglu, geglu (fwd + bwd)
void register_cuda_embed_optim(OpRegistry& reg);  // embedding fwd / bwd, dropout_fwd, global_norm, adamw, adamw8
void register_cuda_paged_attention(OpRegistry& reg);  // kv_cache_write and paged_attention (serving)
void register_cuda_qkv_rope_cache(OpRegistry& reg);  // qkv_rope_cache (serving: q / k rope + KV cache write)
void register_cuda_gguf(OpRegistry& reg);  // gguf_dequantize and gguf_matmul
void register_cuda_nf4(OpRegistry& reg);   // nf4_dequantize
void register_cuda_fp8(OpRegistry& reg);   // quantize_fp8 and matmul_fp8 (the fp8_hybrid recipe)
void register_cuda_muon(OpRegistry& reg);  // muon_momentum and muon_update
void register_cuda_fused_matmul(OpRegistry& reg);  // gated_matmul and add_rmsnorm_matmul (serving)
void register_cuda_pool(OpRegistry& reg);  // mean_pool_2d_fwd / _bwd (Gemma 3's projector's average pool)
void register_cuda_short_conv(OpRegistry& reg);  // short_conv_fwd / _bwd / _cache (LFM2's gated short convolution)
void register_cuda_moe(OpRegistry& reg);  // MoE router, permute / unpermute, load-balancing loss (fwd + bwd)
void register_cuda_moe_gemm(OpRegistry& reg);  // moe_grouped_matmul and its weight gradient (one launch, all experts)
void register_cuda_moe_oai(OpRegistry& reg);   // GPT-OSS: swiglu_oai, the per-expert bias (moe_oai.cu)
void register_cuda_rope_table(OpRegistry& reg);  // rope_table_fwd / _bwd (RoPE by per-token cos / sin)
void register_cuda_embedding_bag(OpRegistry& reg);  // embedding_bag_fwd (a weighted row gather)
void register_cuda_sample(OpRegistry& reg);  // sample (serving: one token per logits row, on the device)
void register_cuda_weight_stream(OpRegistry& reg);  // weight_fetch / weight_wait (serving with weights in host memory)
void register_cuda_weight_gather(OpRegistry& reg);  // weight_gather (ZeRO-3: a layer's weights from the ranks owning them)

}  // namespace surogate::cuda
