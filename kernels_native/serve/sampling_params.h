// SamplingParams: how one request turns logits rows into tokens and when it stops. The fields
// and their meaning follow vLLM's SamplingParams and the OpenAI API, so that the gateway can
// pass users' values through unchanged:
//
//   temperature         0 = greedy (argmax, ties -> lowest id); otherwise logits / temperature
//   top_k               keep the k most likely tokens; 0 or -1 = off
//   top_p               keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off
//   min_p               keep tokens with p >= min_p * p_max; 0 = off
//   repetition_penalty  HF / vLLM: for every token in prompt + output, logit > 0 ? logit / r : logit * r
//   presence_penalty    OpenAI: logit -= presence_penalty  when the token occurs in the output
//   frequency_penalty   OpenAI: logit -= frequency_penalty * (occurrences in the output)
//   seed                same seed (and same prompt, params, model) -> same output
//   max_tokens          at most this many generated tokens; -1 = up to the context limit
//   min_tokens          eos and stop_token_ids are masked until this many tokens are generated
//   stop_token_ids      generating one of these finishes the request ("stop")
//   eos_token_ids       the model's end tokens (the engine's default when empty); "stop" unless ignore_eos
//   logprobs            -1 = off; N in 0..20: the chosen token's logprob, its rank and the top N
//   prompt_logprobs     -1 = off; N in 0..20: the same for every prompt token after the first
//
// Processing order (sampler.cpp): min_tokens mask, repetition, frequency and presence penalties,
// temperature, top-k, top-p, min-p, draw.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace surogate::serve {

constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  bool has_seed = false;
  uint64_t seed = 0;
  int32_t max_tokens = -1;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  std::vector<int32_t> eos_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = -1;
  int32_t prompt_logprobs = -1;

  bool greedy() const { return temperature < 1e-5f; }
  // Every field against its range and the vocabulary; the error names the field.
  Status validate(int vocab_size) const;
};

}  // namespace surogate::serve
