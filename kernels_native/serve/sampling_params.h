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
//   logit_bias          OpenAI: (token id, bias in [-100, 100]) pairs added to the logits before
//                       penalties, greedy and sampling; -100 bans a token, +100 all but forces it
//   constrained         the request's next tokens are limited by a grammar: the engine's
//                       TokenMasker (token_mask.h) gives a bitmask of the allowed ones per step
//
// A reasoning budget (Anthropic's thinking.budget_tokens, our max_reasoning_tokens): the span
// between reasoning_start_token_id and reasoning_end_token_id (<think> ... </think>) holds at
// most max_reasoning_tokens tokens; when it reaches them the engine forces reasoning_end_ids
// (ending with the end token), then sampling goes on with the answer.
//   max_reasoning_tokens      -1 = no budget
//   reasoning_start_token_id  the token that opens the span; -1 = the template has none
//   reasoning_end_token_id    the token that closes it
//   reasoning_started         the prompt already opened the span (the template wrote <think>)
//   reasoning_end_ids         what closes it when the budget runs out, e.g. "\n</think>"
// A constrained request's grammar applies to the answer: not inside the reasoning span.
//
// Processing order (sampler.cpp): grammar mask, min_tokens mask, logit_bias, repetition,
// frequency and presence penalties, temperature, top-k, top-p, min-p, draw.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/status.h"

namespace surogate::serve {

constexpr int kMaxLogprobs = 20;
constexpr float kMaxLogitBias = 100.0f;

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
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool constrained = false;
  int32_t max_reasoning_tokens = -1;
  int32_t reasoning_start_token_id = -1;
  int32_t reasoning_end_token_id = -1;
  bool reasoning_started = false;
  std::vector<int32_t> reasoning_end_ids;

  bool greedy() const { return temperature < 1e-5f; }
  // Every field against its range and the vocabulary; the error names the field.
  Status validate(int vocab_size) const;
};

}  // namespace surogate::serve
