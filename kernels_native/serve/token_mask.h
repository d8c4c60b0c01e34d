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
//
// Checked rows (Sampler::checks_first: greedy, or temperature only): a row's token is drawn from
// the unmasked row first and kept when the grammar allows it; only a refused draw is drawn again,
// under the mask, from an independent uniform (kSampleRedraw). That is still an exact draw from
// the masked distribution (P(a) = p(a) + (1 - p(A)) p(a) / p(A) = p(a) / p(A) for a in A), the
// same for greedy rows, and it needs the mask only for refused draws: a masker that can say
// whether one token may come next (check) spares the engine the masks of the rest, which are the
// costly ones (a free string allows nearly every token, and its mask walks the whole vocabulary).
// A masker without check gets every mask filled, and the engine reads the draw's bit instead.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace surogate::serve {

struct MaskRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> new_tokens;  // answer tokens since the masker last saw this request
  // Its last checked draw (the engine's record): -1 none yet, 0 allowed as drawn, 1 refused. A
  // refused one is in a state the grammar narrows, where the next draw is likely refused too.
  int8_t last_refused = -1;
};

class TokenMasker {
 public:
  virtual ~TokenMasker() = default;
  // rows: [requests.size(), words] uint32, to be filled. An error fails those requests.
  virtual Status fill(const std::vector<MaskRequest>& requests, uint32_t* rows, int words) = 0;
  // Whether check() is implemented.
  virtual bool checks_tokens() const { return false; }
  // Advance each request over its new_tokens. With candidates (one per request): allowed[i] = 1
  // when candidates[i] may come next (it is not consumed, and must be what the mask would say),
  // else 0 with rows[i] (`words` words) filled with the request's mask, for the draw again under
  // it. Without (null): the advance while the model runs, and the masker may fill rows[i] now
  // with the mask of a request whose draw it expects to refuse (setting allowed[i] = 1 for each it
  // filled: the engine then reads the draw's bit there, and asks about the others after the
  // model). An error fails them all.
  virtual Status check(const std::vector<MaskRequest>& requests, const int32_t* candidates, uint8_t* allowed,
                       uint32_t* rows, int words) {
    (void)requests, (void)candidates, (void)allowed, (void)rows, (void)words;
    return SG_ERROR(StatusCode::kInternal, "this token masker does not check tokens", "call fill()");
  }
};

inline int mask_words(int vocab_size) { return (vocab_size + 31) / 32; }
inline bool mask_allows(const uint32_t* row, int32_t token) { return (row[token >> 5] >> (token & 31)) & 1u; }

}  // namespace surogate::serve
