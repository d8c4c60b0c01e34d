// TokenMasker: grammar-constrained decoding's hook into the engine. Before a step's tokens are
// sampled, the engine hands the masker every constrained sequence that samples this step (its
// SamplingParams::constrained is set, it is past its reasoning span and no forced token is due),
// with the answer tokens it generated since the masker last saw it; the masker advances its
// matcher over them and writes the bitmask of the tokens allowed next. The sampler then gives
// every other token -inf, on the greedy path as on the sampled one.
//
// Bitmask rows are W = ceil(V / 32) uint32 words; token t is allowed when bit (t % 32) of word
// (t / 32) is set (llguidance's and xgrammar's layout, so their fill functions write it directly).
// The engine computes the masks on a helper thread while the model runs the step: they depend
// only on tokens sampled by earlier steps.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace surogate::serve {

struct MaskRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> new_tokens;  // answer tokens since the masker last saw this request
};

class TokenMasker {
 public:
  virtual ~TokenMasker() = default;
  // rows: [requests.size(), words] uint32, to be filled. An error fails those requests.
  virtual Status fill(const std::vector<MaskRequest>& requests, uint32_t* rows, int words) = 0;
};

inline int mask_words(int vocab_size) { return (vocab_size + 31) / 32; }
inline bool mask_allows(const uint32_t* row, int32_t token) { return (row[token >> 5] >> (token & 31)) & 1u; }

}  // namespace surogate::serve
