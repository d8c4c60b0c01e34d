// The argument checks of embedding_bag_fwd, shared by cpu/embedding_bag.cpp and
// cuda/embedding_bag.cu: each output row a weighted sum of K table rows (torch's
// F.embedding_bag(mode="sum", per_sample_weights=...); Qwen3-VL's learned position embeddings
// bilinearly resampled to each image's grid: 4 taps per patch, their rows and weights made on the
// host from the image grids).
//   embedding_bag_fwd (ids[N,K] i32, weights[N,K] f32, table[V,C]) -> (y[N,C], table's dtype)
// Every id must be in [0, V). Forward only (the table it reads is a frozen tower's).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct EmbeddingBagArgs {
  int64_t N = 0, K = 0, V = 0, C = 0;
};

Status check_embedding_bag_fwd(const OpArgs& a, EmbeddingBagArgs* r);

}  // namespace surogate
