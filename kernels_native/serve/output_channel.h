// OutputChannel: what the engine thread hands to its consumers. Each step pushes one
// RequestOutput per request that produced something (new tokens, a finish, or both); a consumer
// (the Python client's poller thread, with the GIL released) takes everything queued with poll().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "serve/sequence.h"

namespace surogate::serve {

struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> new_token_ids;      // tokens generated since the last output (a stop token included)
  std::vector<TokenLogprob> logprobs;      // one per new token, when the request asked for logprobs
  bool has_prompt_logprobs = false;        // set once, on the first output of a prompt_logprobs request
  std::vector<TokenLogprob> prompt_logprobs;  // for prompt tokens 1 .. P-1 (token 0 has none)
  FinishReason finish_reason = FinishReason::kNone;
  std::string finish_message;  // why it failed (kError) or was cut (kLength on the context limit)
  int32_t stop_token_id = -1;  // the eos / stop token that finished the request
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
  int32_t num_output_tokens = 0;  // generated so far, these included
};

class OutputChannel {
 public:
  void push(std::vector<RequestOutput>&& batch);
  // Everything queued; waits up to timeout_s (< 0: until something arrives) when the queue is
  // empty. Returns at once, possibly empty, once the channel is closed and drained.
  std::vector<RequestOutput> poll(double timeout_s);
  void close();
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool closed_ = false;
};

}  // namespace surogate::serve
