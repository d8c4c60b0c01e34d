#include "serve/ngram_proposer.h"

#include <algorithm>

namespace surogate::serve {

void ngram_propose(const std::vector<int32_t>& tokens, const NgramConfig& config, int k, std::vector<int32_t>* draft) {
  draft->clear();
  const int N = static_cast<int>(tokens.size());
  if (k <= 0 || N < config.min_n || N < 2) return;
  // An occurrence ends (exclusive) at e <= N - 1, so that it is not the suffix itself and at
  // least one token follows it; its match length is how far it agrees with the suffix backwards.
  int best_len = 0, best_end = -1;
  for (int e = 1; e <= N - 1; ++e) {
    const int cap = std::min(config.max_n, e);
    int len = 0;
    while (len < cap && tokens[e - 1 - len] == tokens[N - 1 - len]) ++len;
    if (len > best_len) {  // strictly longer: the earliest occurrence of a length stays
      best_len = len;
      best_end = e;
      if (len == config.max_n) break;  // nothing longer can be found, and later ones only tie
    }
  }
  if (best_len < config.min_n || best_end < 0) return;
  const int n = std::min(k, N - best_end);
  draft->assign(tokens.begin() + best_end, tokens.begin() + best_end + n);
}

}  // namespace surogate::serve
