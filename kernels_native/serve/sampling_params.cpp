#include "serve/sampling_params.h"

#include <cmath>

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
  return Status::OK();
}

}  // namespace surogate::serve
