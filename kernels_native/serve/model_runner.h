// ModelRunner: what the engine asks of a model, once per step. The engine decides which tokens
// of which sequences run and where their KV goes; the runner computes the KV of those tokens into
// its paged cache and the logits of the rows the engine asks for. The real runner (a native
// Program over the paged KV cache) implements this interface; PyModelRunner (bindings) calls a
// Python callable instead, for tests and as a bridge.
//
// Shape letters: T tokens in the step, S sequences, B max_blocks_per_seq, R logits rows, V vocab.
// Every array is host int32, row-major, flattened in sequence order (the tokens of sequence s are
// [cu_q[s], cu_q[s+1])).
//
//   token_ids     [T]     input token of each row
//   positions     [T]     its rope position: its position in its sequence (0-based), moved by the
//                         position_shift of the request's EmbedSpans before it (Sequence::rope_position)
//   slot_mapping  [T]     where its K/V go: block * block_size + offset in the block
//   cu_q          [S+1]   query start of each sequence (cu_seqlens_q); cu_q[S] = T
//   context_lens  [S]     tokens of the sequence in the cache after this step (cached prefix +
//                         earlier chunks + this step's tokens); each query row at position p
//                         attends causally to positions 0..p of its own sequence
//   block_tables  [S, B]  the blocks holding positions 0..context_len-1, padded with -1;
//                         position p is in slot block_tables[s, p / block_size] * block_size + p % block_size
//   logits_rows   [R]     rows (indices into T, increasing) whose logits the engine needs: the last
//                         token of a sequence whose prompt is complete (or decoding), and every
//                         prompt row of a request that asked for prompt_logprobs
//   need_logits   [R]     (uint8) 1: the engine reads this row's logits (grammar unless the runner
//                         masks on its device (masks_on_device), logit_bias,
//                         penalties, top_logprobs, prompt logprobs; any sampled row on a runner
//                         that does not sample on its device); 0: the runner's token is all it
//                         needs (Sampler::needs_logits): the argmax, or the device's draw
//   sample_params [R, 8]  (float32) for a runner that samples on its device (samples_on_device):
//                         each row's `sample` op parameters (runtime/op_checks_sample.h:
//                         temperature, top_k, top_p, min_p, the sequence's seed, step = the tokens
//                         it generated before this row's), temperature 0 (the argmax) for every
//                         row whose token the engine does not take from the device; empty: all 0
//   device_logprobs       some row with need_logits 0 wants its token's logprob: the runner brings
//                         StepOutput::logprobs and ranks back too
//   adapter_ids   [S]     LoRA adapter slot per sequence, -1 = the base model
//   state_slots   [S]     the sequence's recurrent-state slot in [0, max_num_seqs) (a conv or SSM
//                         state the runner keeps per sequence beside the KV blocks), -1 = none;
//                         a span starting at position 0 must not read what the slot held
//   request_ids   [S]     (int64) the engine's request ids, for logging and per-request state
//   embed_index   [E]     token rows (into T, increasing) whose first-layer input is given: the
//                         embedding rows of a request's EmbedSpan (image features) at the prompt
//                         positions this step computes; empty: none
//   embed_rows    [E, C]  (float32) those rows, C = embed_width = the runner's hidden_size()
//   kv_limit      [T]     per token, the last position of its sequence its query may see: its own
//                         position (causal), the span's last position for a token of a
//                         bidirectional span (whose tokens are all in this step); empty: causal
//                         (the scheduler fills it in every step with embedding rows: a token's
//                         position in its sequence, which a shifted rope position is not)
//
// Writes to the cache happen before attention reads it (as in a layer: store K/V, then attend),
// so a sequence's query rows see this step's own tokens. Blocks shared between sequences (prefix
// cache hits) are only read: slot_mapping never points into a block another sequence holds.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace surogate::serve {

struct StepInput {
  int32_t block_size = 0;
  int32_t num_tokens = 0;          // T
  int32_t num_seqs = 0;            // S
  int32_t max_blocks_per_seq = 0;  // B
  int32_t max_query_len = 0;       // max over sequences of cu_q[s+1] - cu_q[s]
  int32_t max_context_len = 0;     // max of context_lens
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> slot_mapping;
  std::vector<int32_t> cu_q;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> block_tables;
  std::vector<int32_t> logits_rows;
  std::vector<uint8_t> need_logits;
  std::vector<float> sample_params;
  bool device_logprobs = false;
  std::vector<int32_t> adapter_ids;
  std::vector<int32_t> state_slots;
  std::vector<int64_t> request_ids;
  int32_t embed_width = 0;
  std::vector<int32_t> embed_index;
  std::vector<float> embed_rows;
  std::vector<int32_t> kv_limit;

  int32_t num_embed_rows() const { return static_cast<int32_t>(embed_index.size()); }  // E

  int32_t num_logits_rows() const { return static_cast<int32_t>(logits_rows.size()); }  // R
  bool is_decode_only() const { return num_tokens == num_seqs; }

  // A Tensor view (no copy) of one of the arrays above, e.g. int32_view(slot_mapping, {T}).
  static Tensor int32_view(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
    return Tensor::view_of(const_cast<int32_t*>(v.data()), DType::kI32, shape);
  }
};

// What a step gives back. `logits` is a host float32 [R, V] tensor with contiguous rows (its row
// stride may exceed V), possibly the runner's own memory, read by the engine before the next
// run(). A runner that picks each row's token on its device (so that a step moves R ints instead
// of R x V floats) returns it in `tokens` ([R]: the argmax (the lowest id among the largest
// logits) or, on a runner that samples on its device, the draw under the row's sample_params;
// -1 for a row holding a NaN or +inf) and may then leave the rows whose need_logits is 0
// unfilled. An empty `tokens`: every row of `logits` is filled. `logprobs` / `ranks` ([R], when
// StepInput::device_logprobs): the raw log_softmax of each row at its token and the token's rank
// (1 = most likely), as Sampler::logprob computes them.
struct StepOutput {
  Tensor logits;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> ranks;
};

// Grammar rows whose tokens a runner draws again under their masks, after run() and on the
// logits that run() left on its device (ModelRunner::sample_masked): the masks are filled on a
// helper thread while the model runs, so they are known only after it.
//   rows          [n]        logits rows of the last run() (indices into its logits_rows)
//   sample_params [n, 8]     (float32) each row's `sample` op parameters, as StepInput's
//   masks         [n]        each row's bitmask, `words` = ceil(V / 32) uint32 (serve/token_mask.h)
//   logprobs                 bring the rows' raw logprobs and ranks back too
// The runner overwrites StepOutput::tokens (and logprobs / ranks) of those rows: the `sample` op's
// token with the mask (-2: the mask allows no token with a finite logit; -1: NaN / +inf).
struct MaskedRows {
  std::vector<int32_t> rows;
  std::vector<float> sample_params;
  std::vector<const uint32_t*> masks;
  int words = 0;
  bool logprobs = false;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Compute the KV of in's tokens into the cache and the logits of in.logits_rows.
  virtual Status run(const StepInput& in, StepOutput* out) = 0;
  virtual int vocab_size() const = 0;
  // The width of the embedding rows this runner takes (StepInput::embed_rows; the model's hidden
  // size), 0: it takes none (requests with embeds are refused at submit).
  virtual int hidden_size() const { return 0; }
  // Whether run() samples each row under StepInput::sample_params on its device (the `sample`
  // op: the same draw as Sampler::sample) and returns tokens, and logprobs / ranks when asked.
  virtual bool samples_on_device() const { return false; }
  // Whether sample_masked() draws grammar rows on the device (then their logits never reach the
  // host; with samples_on_device() only).
  virtual bool masks_on_device() const { return false; }
  virtual Status sample_masked(const MaskedRows& in, StepOutput* out) {
    (void)in, (void)out;
    return SG_ERROR(StatusCode::kUnsupported, "this model runner does not apply grammar masks on its device",
                    "sample constrained rows on the host (masks_on_device() is false)");
  }
};

}  // namespace surogate::serve
