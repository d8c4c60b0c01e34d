// The serving attention ops' argument checks and attributes, shared by cpu/paged_attention.cpp and
// cuda/paged_attention.cu (the cache layout is written down in cpu/paged_attention.cpp). T new
// tokens of S sequences, Hq query heads over Hkv kv heads, D head dim; the cache is
// [NB blocks, BS tokens a block, Hkv, D].
//   kv_cache_write   (k[T,Hkv,D], v, slot_mapping[T] i32) -> (k_cache, v_cache)
//   paged_attention  (q[T,Hq,D], k_cache, v_cache, block_tables[S, max_blocks] i32, cu_q[S+1] i32,
//                     context_lens[S] i32, [sinks[Hq]], [kv_limit[T] i32]) -> (out[T,Hq,D], [lse[T,Hq] f32])
//                    sinks: GPT-OSS's per-head logit in the softmax's denominator (op_checks_attention.h)
//                    kv_limit: per query row, the last key position of its sequence it may see
//                    (its own position for a causal row; the end of its span for a row inside a
//                    bidirectional image span, Gemma 3's token_type_ids mask); absent: causal.
//                    Row i at position p sees key j iff j <= kv_limit[i] and (window == 0 or
//                    j > p - window); p <= kv_limit[i] < context_len (the CPU checks).
// Only shapes, dtypes and strides: the values of slot_mapping, cu_q, context_lens and
// block_tables are host memory on the CPU (which checks them) and device memory on CUDA.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct KvCacheWriteArgs {
  int64_t T = 0, Hkv = 0, D = 0;
};
Status check_kv_cache_write(const OpArgs& a, KvCacheWriteArgs* r);

struct PagedAttentionArgs {
  int64_t T = 0, Hq = 0, D = 0;
  int64_t NB = 0, BS = 0, Hkv = 0;
  int64_t S = 0, max_blocks = 0;
  double scale = 0.0;    // attr scale, default 1 / sqrt(D)
  int64_t window = 0;    // attr window: 0 none
  double softcap = 0.0;  // attr softcap: 0 none
  const Tensor* lse = nullptr;  // the optional lse output
  const Tensor* sinks = nullptr;  // the optional sinks input
  const Tensor* kv_limit = nullptr;  // the optional kv_limit input [T] i32
};
Status check_paged_attention(const OpArgs& a, PagedAttentionArgs* r);

}  // namespace surogate
