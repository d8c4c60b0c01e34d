// The training attention ops' argument checks and attributes, shared by cpu/attention.cpp and
// cuda/attention.cu. N packed tokens of S documents, Hq query heads, Hkv kv heads (G = Hq / Hkv
// query heads share one), D head dim.
//   attention_fwd  (q[N,Hq,D], k[N,Hkv,D], v[N,Hkv,D], cu_seqlens[S+1] i32) -> (out[N,Hq,D], lse[N,Hq] f32)
//   attention_bwd  (dout, q, k, v, out, lse, cu_seqlens) -> (dq, dk, dv)
// Optional sinks[Hq] (GPT-OSS: a learned logit per query head in the softmax's denominator, no
// value) as attention_fwd's input 4; lse then includes the sink, so attention_bwd is unchanged,
// and the sinks' gradient is its own op:
//   attention_sinks_bwd (dout, out, lse, sinks[Hq]) -> (dsinks[Hq], f32 or the sinks' dtype)
// Optional kv_limit[N] i32 (attention_fwd's input 5, attention_bwd's input 7; causal only): for
// each query token, the last key it sees, counted from its document's start, in place of itself:
// a causal token has its own index, a token of a bidirectional span (Gemma 3's image tokens) the
// span's last one. Visible keys become [key_lo(i), kv_limit[i]] (the sliding window's lower bound
// stays: transformers' AND(sliding window, OR(causal, same image span))). Within each document
// i <= kv_limit[i] < L and kv_limit is nondecreasing (causal tokens and contiguous spans), so the
// queries that see a key are still one interval: the kernels rely on it.
// Every tensor contiguous; q, k, v and their gradients in one dtype. The values of cu_seqlens
// (0 first, nondecreasing, N last) and kv_limit are host memory: the CPU checks them, CUDA cannot.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct AttentionArgs {
  int64_t N = 0, Hq = 0, Hkv = 0, D = 0, G = 1, S = 0;
  bool causal = true;           // attr causal (default true)
  int64_t window = 0;           // attr window: 0 none, else the sliding window's keys
  float scale = 1.0f;           // attr scale, default 1 / sqrt(D)
  float softcap = 0.0f;         // attr softcap: 0 none
  bool sinks = false;           // a sinks[Hq] input is given
  const Tensor* kv_limit = nullptr;  // the optional kv_limit[N] i32 input
};

// sinks[Hq], any float dtype, contiguous (shared with paged_attention).
Status check_sinks(const char* op, const Tensor& sinks, int64_t Hq);

struct AttentionSinksArgs {
  int64_t N = 0, Hq = 0, D = 0;
  bool accumulate = false;
};
Status check_attention_sinks_bwd(const OpArgs& a, AttentionSinksArgs* r);

Status check_attention_fwd(const OpArgs& a, AttentionArgs* c);
Status check_attention_bwd(const OpArgs& a, AttentionArgs* c);

}  // namespace surogate
