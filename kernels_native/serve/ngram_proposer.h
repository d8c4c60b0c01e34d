// NgramProposer: prompt-lookup drafting for speculative decoding (vLLM's `ngram` method). No
// extra model: the draft is what followed an earlier occurrence of the sequence's own last
// n-gram in its prompt + output.
//
// For n from prompt_lookup_max down to prompt_lookup_min, the longest suffix of the tokens (at
// most prompt_lookup_max long, at least prompt_lookup_min) that also occurs earlier wins; among
// earlier occurrences of that length the first one (the earliest in the text) wins, as in vLLM's
// _find_longest_matched_ngram_and_propose_tokens. The draft is the (at most k) tokens that
// followed it; fewer when the occurrence sits near the end, none when nothing matches.
//
// The cost is O(tokens x prompt_lookup_max) per proposal, on the engine thread between steps.
#pragma once

#include <cstdint>
#include <vector>

namespace surogate::serve {

struct NgramConfig {
  int min_n = 5;  // prompt_lookup_min
  int max_n = 5;  // prompt_lookup_max
};

// Writes at most k draft tokens for `tokens` (prompt then output) into *draft (cleared first).
void ngram_propose(const std::vector<int32_t>& tokens, const NgramConfig& config, int k, std::vector<int32_t>* draft);

}  // namespace surogate::serve
