// Sampler: one float32 logits row [V] -> the next token, per the request's SamplingParams.
//
// Order (as vLLM's sampler, with HF's order among the filters):
//   0. a grammar's bitmask (token_mask.h), when given: every token it does not allow gets -inf
//   1. min_tokens: eos (unless ignore_eos) and stop_token_ids get -inf while fewer than
//      min_tokens tokens have been generated; then logit_bias added (OpenAI; vLLM applies it
//      at the same point, before the penalties)
//   2. repetition_penalty over the prompt + output tokens (HF / vLLM: a positive logit is divided
//      by r, a negative one multiplied), then frequency_penalty * count and presence_penalty *
//      [count > 0] subtracted for the output tokens (OpenAI)
//   3. temperature 0: argmax (ties -> the lowest id). Otherwise logits / temperature, then top-k,
//      top-p, min-p (relative to the most likely token), then one uniform draw from the request's
//      std::mt19937_64 (53-bit doubles made by hand, so that a seed gives the same tokens with
//      any standard library).
//
// Logprobs are the model's raw distribution: log_softmax of the row as the runner produced it,
// before penalties, temperature and filters. This is vLLM's default (logprobs_mode
// "raw_logprobs") and what OpenAI clients read as "the model's probability of this token"; it
// also keeps the numbers independent of the sampling knobs, so greedy and sampled runs agree.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"
#include "serve/sampling_params.h"
#include "serve/sequence.h"
#include "serve/token_mask.h"

namespace surogate::serve {

class Sampler {
 public:
  explicit Sampler(int vocab_size) : vocab_size_(vocab_size) {}

  int vocab_size() const { return vocab_size_; }

  // token_ids: prompt then output (num_prompt of them are the prompt). allowed: a bitmask row
  // of mask_words(V) words (token_mask.h), or null for no grammar. Fails on NaN / +inf logits,
  // or when every token is masked.
  Status sample(const float* logits, const SamplingParams& params, const std::vector<int32_t>& token_ids,
                int num_prompt, std::mt19937_64& rng, int32_t* token, const uint32_t* allowed = nullptr) const;
  Status sample(const float* logits, Sequence& seq, int32_t* token, const uint32_t* allowed = nullptr) const {
    return sample(logits, seq.params, seq.token_ids, seq.num_prompt_tokens, seq.rng, token, allowed);
  }

  // log_softmax(logits)[token], its rank (1 = most likely; ties rank the lower id first) and
  // the top_n most likely (id, logprob), most likely first.
  TokenLogprob logprob(const float* logits, int32_t token, int top_n) const;

  // Whether sampling seq's next token reads its logits row; false when the row's argmax is the
  // whole answer (greedy, no penalty, bias, grammar or min_tokens mask in force, no logprobs
  // asked), or when the next token is forced and no logprobs are asked. A runner that computes
  // the argmax on its device (the CUDA path) copies only the rows for which this is true, so
  // logit_bias and grammar masks reach the device's rows through this.
  static bool needs_logits(const Sequence& seq);

  // Steps 1 (min_tokens, logit_bias) and 2 (penalties) in place (exposed for tests).
  void apply_penalties(float* logits, const SamplingParams& params, const std::vector<int32_t>& token_ids,
                       int num_prompt) const;

 private:
  int vocab_size_;
};

}  // namespace surogate::serve
