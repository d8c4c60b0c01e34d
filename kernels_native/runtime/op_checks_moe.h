// The mixture-of-experts ops' argument checks and attributes, shared by cpu/moe.cpp and
// cuda/moe*.cu. The op set is the fused_moe one (vLLM, Megatron's grouped GEMM): route, permute
// the token rows into expert-contiguous order, one grouped GEMM per projection over all experts,
// un-permute with the routing weights. Shapes, with N tokens, C channels, E experts, K experts
// per token (top_k), M = N * K permuted rows:
//   moe_router_fwd   (logits[N,E]) -> (weights[N,K] logits' dtype, idx[N,K] i32, probs[N,E] f32)
//   moe_router_bwd   (dweights[N,K], probs[N,E] f32, idx[N,K] i32, [dprobs[N,E] f32]) -> (dlogits[N,E])
//   moe_permute      (x[N,C], idx[N,K] i32) -> (xp[M,C], rows[N,K] i32, offsets[E+1] i32)
//   moe_unpermute_fwd (yp[M,C], rows[N,K] i32, [weights[N,K]]) -> (y[N,C])
//   moe_unpermute_bwd (dy[N,C], rows[N,K] i32, yp[M,C], weights[N,K]) -> (dyp[M,C], [dweights[N,K]])
//   moe_grouped_matmul (x[M,Kin], W[E,..], offsets[E+1] i32) -> (y[M,Nout]); W_e [Nout,Kin] (trans_b,
//                    the HF layout) or [Kin,Nout]
//   moe_grouped_matmul_wgrad (dy[M,Nout], x[M,Kin], offsets[E+1] i32) -> (dW[E,Nout,Kin])
//   moe_aux_loss_fwd (probs_0, idx_0, probs_1, idx_1, ...) -> (loss[1] f32, counts[E] f32)
//   moe_aux_loss_bwd (dloss[1] f32, counts[E] f32) -> (dprobs[N,E] f32); attr num_layers
//   moe_z_loss_fwd   (logits_0[N,E], logits_1, ...) -> (loss[1] f32)
//   moe_z_loss_bwd   (dloss[1] f32, logits[N,E]) -> (dlogits[N,E] logits' dtype); attr num_layers
// Index values (idx in [0, E), offsets monotone and ending at M) are host memory on the CPU,
// which checks them, and device memory on CUDA, which clamps.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct MoeRouterArgs {
  int64_t N = 0, E = 0, K = 0;
  bool norm_topk_prob = false;  // renormalise the K chosen probabilities to sum to 1
  bool dprobs = false;          // backward: the optional dense gradient of probs is given
};
Status check_moe_router_fwd(const OpArgs& a, MoeRouterArgs* r);
Status check_moe_router_bwd(const OpArgs& a, MoeRouterArgs* r);

struct MoePermuteArgs {
  int64_t N = 0, K = 0, C = 0, E = 0, M = 0;
  bool weights = false;   // unpermute: the routing weights are given (else a plain sum)
  bool dweights = false;  // unpermute_bwd: their gradient is wanted
};
Status check_moe_permute(const OpArgs& a, MoePermuteArgs* r);
Status check_moe_unpermute_fwd(const OpArgs& a, MoePermuteArgs* r);
Status check_moe_unpermute_bwd(const OpArgs& a, MoePermuteArgs* r);

struct MoeGroupedArgs {
  int64_t M = 0, E = 0, Kin = 0, Nout = 0;
  bool trans_b = true;
  bool accumulate = false;  // wgrad: add into dW
};
Status check_moe_grouped_matmul(const OpArgs& a, MoeGroupedArgs* r);
Status check_moe_grouped_matmul_wgrad(const OpArgs& a, MoeGroupedArgs* r);

struct MoeAuxArgs {
  int64_t L = 0, N = 0, E = 0, K = 0;  // layers, rows per layer, experts, top_k
};
Status check_moe_aux_loss_fwd(const OpArgs& a, MoeAuxArgs* r);
Status check_moe_aux_loss_bwd(const OpArgs& a, MoeAuxArgs* r);

struct MoeZLossArgs {
  int64_t L = 0, N = 0, E = 0;  // layers, rows per layer, experts
};
Status check_moe_z_loss_fwd(const OpArgs& a, MoeZLossArgs* r);
Status check_moe_z_loss_bwd(const OpArgs& a, MoeZLossArgs* r);

}  // namespace surogate
