#include "serve/sampling_params.h"

#include <cmath>
#include <utility>

namespace surogate::serve {

namespace {

Status invalid(const char* field, const std::string& what, const std::string& hint) {
  return Status(StatusCode::kInvalidArgument, str_cat("sampling parameter '", field, "' ", what), __FILE__, __LINE__,
                hint);
}

Status check_token_ids(const char* field, const std::vector<int32_t>& ids, int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return invalid(field, str_cat("[", i, "] = ", ids[i], " is not a token id"),
                     str_cat("token ids are in [0, ", vocab_size, ")"));
    }
  }
  return Status::OK();
}

}  // namespace

Status SamplingParams::validate(int vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return invalid("temperature", str_cat("is ", temperature), "use a value >= 0 (0 = greedy)");
  }
  if (top_k < -1) return invalid("top_k", str_cat("is ", top_k), "use -1 or 0 (off) or a positive count");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid("top_p", str_cat("is ", top_p), "use a value in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return invalid("min_p", str_cat("is ", min_p), "use a value in [0, 1]");
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return invalid("repetition_penalty", str_cat("is ", repetition_penalty), "use a value > 0 (1 = off)");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return invalid("presence_penalty", str_cat("is ", presence_penalty), "use a value in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return invalid("frequency_penalty", str_cat("is ", frequency_penalty), "use a value in [-2, 2]");
  }
  if (max_tokens == 0 || max_tokens < -1) {
    return invalid("max_tokens", str_cat("is ", max_tokens), "use a positive count, or leave it unset");
  }
  if (min_tokens < 0) return invalid("min_tokens", str_cat("is ", min_tokens), "use a count >= 0");
  if (max_tokens > 0 && min_tokens > max_tokens) {
    return invalid("min_tokens", str_cat("(", min_tokens, ") is larger than max_tokens (", max_tokens, ")"),
                   "lower min_tokens or raise max_tokens");
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return invalid("logprobs", str_cat("is ", logprobs), str_cat("use 0..", kMaxLogprobs, ", or leave it unset"));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs) {
    return invalid("prompt_logprobs", str_cat("is ", prompt_logprobs),
                   str_cat("use 0..", kMaxLogprobs, ", or leave it unset"));
  }
  SG_RETURN_IF_ERROR(check_token_ids("stop_token_ids", stop_token_ids, vocab_size));
  SG_RETURN_IF_ERROR(check_token_ids("eos_token_ids", eos_token_ids, vocab_size));
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [token, bias] = logit_bias[i];
    if (token < 0 || token >= vocab_size) {
      return invalid("logit_bias", str_cat("has token id ", token, ", outside the vocabulary"),
                     str_cat("token ids are in [0, ", vocab_size, ")"));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return invalid("logit_bias", str_cat("[", token, "] = ", bias), "use a bias in [-100, 100]");
    }
  }
  if (max_reasoning_tokens < -1) {
    return invalid("max_reasoning_tokens", str_cat("is ", max_reasoning_tokens), "use a count >= 0, or leave it unset");
  }
  const std::pair<const char*, int32_t> markers[] = {{"reasoning_start_token_id", reasoning_start_token_id},
                                                      {"reasoning_end_token_id", reasoning_end_token_id}};
  for (const auto& [name, t] : markers) {
    if (t < -1 || t >= vocab_size) {
      return invalid(name, str_cat("is ", t), str_cat("use -1 (none) or a token id in [0, ", vocab_size, ")"));
    }
  }
  SG_RETURN_IF_ERROR(check_token_ids("reasoning_end_ids", reasoning_end_ids, vocab_size));
  if (max_reasoning_tokens >= 0) {
    if (reasoning_end_token_id < 0 || reasoning_end_ids.empty() || reasoning_end_ids.back() != reasoning_end_token_id) {
      return invalid("max_reasoning_tokens", "needs the template's reasoning end token",
                     "set reasoning_end_token_id, and reasoning_end_ids ending with it (the model has no reasoning "
                     "span otherwise)");
    }
  }
  return Status::OK();
}

}  // namespace surogate::serve
