// Argument checks an op's CPU and CUDA kernels share: shapes, dtypes, strides, which optional
// inputs go together (nothing that reads tensor memory: the CUDA side cannot), so both backends
// refuse the same calls with the same words. Value checks that read host memory (slots in range,
// positions >= 0) stay with the CPU kernels.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_checks_rope.h"
#include "runtime/op_registry.h"

namespace surogate {

// argmax: (x [R, V] float) -> (y int32 [R]); x rows and y contiguous.
Status check_argmax(const OpArgs& a);

// qkv_rope_cache: (q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D], pos int32 [N], slot_mapping int32 [N],
// q_norm [D]?, k_norm [D]?) -> (q_out [N, Hq, D], k_cache, v_cache [blocks, block_size, Hkv, D]).
// q, k, v may have token rows further apart than H * D (column slices of a fused projection).
struct QkvRopeCacheDims {
  int64_t N = 0, Hq = 0, Hkv = 0, D = 0;
  int64_t q_row = 0, k_row = 0, v_row = 0;  // token row strides, in elements
  bool norm = false;                        // q_norm and k_norm given
  float eps = 1e-6f;                        // of the per-head norm
  RopeAttrs rope;
};
Status check_qkv_rope_cache(const OpArgs& a, QkvRopeCacheDims* d);

}  // namespace surogate
