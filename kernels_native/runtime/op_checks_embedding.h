// The embedding ops' argument checks, shared by cpu/embedding.cpp and cuda/embed_optim.cu.
//   embedding_fwd  (ids[N] i32, table[V,C]) -> (y[N,C]), y in table's dtype
//   embedding_bwd  (ids[N] i32, dy[N,C]) -> (dtable[V,C], f32 or dy's dtype); attr accumulate
//   embed_rows     (x[N,C], index[E] i32, rows[E,C] f32, may be row-strided) -> (y[N,C] in x's dtype): y = x, then
//                  y[index[e]] = rows[e] rounded to x's dtype for every e with index[e] >= 0
//                  (serving: per-request embedding rows, e.g. image features, in place of the
//                  prompt tokens' embeddings; index -1 pads). Indices >= 0 must be distinct
//                  and below N (the CPU checks; the CUDA kernel skips an index past N).
// The ids' values are host memory on the CPU (which checks them against V) and device memory on
// CUDA (whose kernels give zero rows or skip out-of-range ids).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct EmbeddingArgs {
  int64_t N = 0, V = 0, C = 0;
  bool accumulate = false;  // backward: add into dtable
};
Status check_embedding_fwd(const OpArgs& a, EmbeddingArgs* r);
Status check_embedding_bwd(const OpArgs& a, EmbeddingArgs* r);

struct EmbedRowsArgs {
  int64_t N = 0, E = 0, C = 0;
  int64_t row_stride = 0;  // elements between rows' starts (C, or more for a column slice)
};
Status check_embed_rows(const OpArgs& a, EmbedRowsArgs* r);

}  // namespace surogate
