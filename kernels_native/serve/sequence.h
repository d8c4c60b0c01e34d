// Sequence: one request inside the engine. Its tokens (prompt, then output), where their KV
// lives (block table), how far the KV is computed, its sampling parameters and seed, and the
// logprobs waiting to be sent. The draw of output token i is Philox(seed, step i)
// (core/philox.h): a pure function of the seed and the position, on the host or the device.
//
// Token accounting (the scheduler's whole state per sequence):
//   num_tokens()          prompt + output tokens; the last one has no KV yet (it is the next input)
//   num_computed_tokens   tokens whose KV is in the cache; prefill chunks and decodes advance it
//   num_cached_tokens     of those, how many came from the prefix cache at admission
// A sequence is "prefilling" while num_tokens() - num_computed_tokens > 1 and "decoding" when
// exactly one token is left; preemption resets num_computed_tokens to 0 (recompute).
//
// Decoding state beyond sampling: `forced`, tokens the engine appends next instead of sampling
// (the end of a reasoning span whose budget ran out); the reasoning span's state; and how many
// of the answer's tokens the grammar's TokenMasker has seen.
//
// Embedding spans (`embeds`, sorted by start, disjoint, inside the prompt): prompt positions whose
// first-layer input is a given row (image features) instead of the token's embedding. `digest`
// (of the request's key, or of the rows) goes into the prefix-cache hash of every block a span
// overlaps. A bidirectional span's tokens also see its later tokens, so a prefill chunk never
// ends inside one (scheduler.h) and a prefix-cache hit never ends inside one (block_manager.h).
// A span's `position_shift` moves the rope position (StepInput::positions) of every later token:
// `rope_position(p)` = p + the shifts of the spans ending at or before p.
//
// Speculative decoding: `draft_ids`, tokens a proposer guessed to follow token_ids (never part
// of token_ids; the next step verifies them, see engine.h). A sequence speculates only when its
// tokens are sampled token by token from the model: no grammar (the matcher would have to roll
// back), no reasoning budget (forced tokens), nothing forced. With a draft model
// (draft_proposer.h) `draft_computed` counts the leading positions whose KV the draft model has
// in its own cache (same block ids, its own memory), for tokens that are this sequence's.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "serve/sampling_params.h"

namespace surogate::serve {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kFinished };

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };

inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    default: return "";
  }
}

struct EmbedSpan {
  int start = 0;              // first prompt position
  int len = 0;                // rows
  std::vector<float> rows;    // [len, width] float32
  std::string key;            // the caller's key bytes (empty: the rows' bytes identify the span)
  uint64_t digest = 0;        // hash of key (or rows), computed at submit
  bool bidirectional = false;
  // The rope positions of every later token (the prompt's after the span, and all generated ones)
  // move by this (Qwen3-VL's MRoPE: an image's tokens advance the position by max(h, w) / merge,
  // not by their number; transformers' rope_deltas).
  int position_shift = 0;  // (mixed into digest at submit)
  int end() const { return start + len; }
};

// The logprob of one token at one position, its rank in the distribution (1 = most likely) and
// the top-N (id, logprob) pairs, most likely first.
struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

class Sequence {
 public:
  Sequence(uint64_t id, std::vector<int32_t> prompt, SamplingParams params, int32_t adapter_id, uint64_t seed)
      : id(id), token_ids(std::move(prompt)), num_prompt_tokens(static_cast<int>(token_ids.size())),
        params(std::move(params)), seed(seed), adapter_id(adapter_id) {
    const SamplingParams& p = this->params;
    in_reasoning = p.reasoning_started && p.reasoning_end_token_id >= 0;
    answer_start = in_reasoning ? -1 : num_prompt_tokens;
    mask_fed = num_prompt_tokens;
    if (in_reasoning && p.max_reasoning_tokens == 0) forced.assign(p.reasoning_end_ids.begin(), p.reasoning_end_ids.end());
  }

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
  bool is_decoding() const { return num_uncomputed_tokens() == 1; }
  bool is_finished() const { return status == SequenceStatus::kFinished; }
  int32_t output_token(int i) const { return token_ids[num_prompt_tokens + i]; }
  // Prompt positions whose logits feed prompt_logprobs: 0 .. P-2 (the row at P-1 is sampled).
  bool wants_prompt_logprobs() const {
    return params.prompt_logprobs >= 0 && prompt_logprobs_next < num_prompt_tokens - 1;
  }

  const uint64_t id;
  std::vector<int32_t> token_ids;
  const int num_prompt_tokens;
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string finish_message;  // for kError: what went wrong
  int32_t stop_token_id = -1;  // the eos / stop token that finished it

  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks of token_ids
  int num_registered_blocks = 0;       // leading blocks already offered to the prefix cache
  int num_cached_tokens = 0;
  int num_computed_tokens = 0;
  // The slot of the runner's per-sequence recurrent state (LFM2's conv state, later SSM states)
  // while running, -1 otherwise: taken at admission, given back at preemption and finish.
  int32_t state_slot = -1;

  SamplingParams params;
  const uint64_t seed;  // the request's seed, or one the engine drew at submit
  const int32_t adapter_id;  // LoRA adapter slot, -1 = base model

  // Prompt logprobs computed so far (position 0 has none and is not stored); sent once, with
  // the first generated token. prompt_logprobs_next is the next prompt position whose row is due.
  std::vector<TokenLogprob> prompt_logprobs;
  int prompt_logprobs_next = 0;
  bool prompt_logprobs_sent = false;
  int num_preemptions = 0;

  std::deque<int32_t> forced;  // appended next, in order, without sampling
  bool in_reasoning = false;   // inside <think> ... </think>
  bool reasoning_done = false;  // the span closed (it opens at most once)
  int reasoning_tokens = 0;    // sampled inside the span
  int answer_start = 0;        // index in token_ids where the answer begins; -1 while reasoning
  int mask_fed = 0;            // token_ids before this index were given to the TokenMasker
  int8_t draw_refused = -1;    // its last checked grammar draw: -1 none yet, 0 allowed, 1 refused

  std::vector<int32_t> draft_ids;  // proposed next tokens, verified by the next step
  int draft_computed = 0;          // the draft model's KV is valid for positions [0, draft_computed)

  std::vector<EmbedSpan> embeds;  // sorted by start, disjoint, inside the prompt

  // The bidirectional span that position `pos` would cut (start < pos < end), or null.
  int rope_position(int pos) const {
    int shift = 0;
    for (const EmbedSpan& e : embeds) {
      if (e.end() > pos) break;
      shift += e.position_shift;
    }
    return pos + shift;
  }
  const EmbedSpan* bidirectional_span_across(int pos) const {
    for (const EmbedSpan& e : embeds) {
      if (e.start >= pos) break;
      if (e.bidirectional && pos < e.end()) return &e;
    }
    return nullptr;
  }

  bool can_speculate() const { return !params.constrained && params.max_reasoning_tokens < 0 && forced.empty(); }

  // Whether the grammar limits the next token: constrained, in the answer, nothing forced.
  bool masked_next() const { return params.constrained && answer_start >= 0 && forced.empty(); }
};

}  // namespace surogate::serve
