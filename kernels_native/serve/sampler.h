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
//   3. temperature 0: argmax (ties -> the lowest id). Otherwise the `sample` op's draw on the row
//      (cpu/sample.h; kernels_native/README-dev.md's op table): logits / temperature, top-k, top-p
//      (in the order logit desc, id asc: a cut through tied logits keeps the lower ids), min-p
//      (relative to the most likely token), then one uniform u = Philox4x32-10(key = the
//      sequence's 64-bit seed, counter = step, the number of tokens it has generated) and the
//      inverse CDF over the kept tokens in id order, on integer weights (core/sample_math.h).
//
// Draws on the device: a runner that samples on its device (ModelRunner::samples_on_device, the
// ProgramRunner: the serve Program ends in the sample op) gets each logits row's parameters in
// StepInput::sample_params and returns the token, its raw logprob and rank. A row whose request
// needs nothing beyond that (no grammar, logit_bias, penalty or min_tokens mask in force, no
// top_logprobs) then never reaches the host (needs_logits is false): its logits stay on the GPU.
// A grammar row too, on a runner that applies masks on its device (ModelRunner::masks_on_device):
// once the step's masks are filled, the runner draws it again with the op's mask input (the mask
// rule is cpu::mask_row's on both paths), and an all-zero mask fails as sample() does here.
// Both paths make the same draw (the same u, the same rule), so a request's tokens do not depend
// on which path a row took, on the batch, on preemption or on speculation (a verification row j
// draws at step num_output + j, as plain decoding would), only on its seed and the logits. A
// seeded request's tokens are not those of the std::mt19937_64 stream this sampler used before.
//
// Logprobs are the model's raw distribution: log_softmax of the row as the runner produced it,
// before penalties, temperature and filters. This is vLLM's default (logprobs_mode
// "raw_logprobs") and what OpenAI clients read as "the model's probability of this token"; it
// also keeps the numbers independent of the sampling knobs, so greedy and sampled runs agree.
#pragma once

#include <cstdint>
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

  // token_ids: prompt then output (num_prompt of them are the prompt). seed, step: the draw's
  // Philox key and counter. allowed: a bitmask row of mask_words(V) words (token_mask.h), or null
  // for no grammar. Fails on NaN / +inf logits, or when every token is masked.
  Status sample(const float* logits, const SamplingParams& params, const std::vector<int32_t>& token_ids,
                int num_prompt, uint64_t seed, uint32_t step, int32_t* token, const uint32_t* allowed = nullptr) const;
  // Whether a grammar row under params is drawn first and checked (token_mask.h): greedy, or
  // temperature without top-k / top-p / min-p. A truncated row is masked before its draw (its kept
  // set is that of the masked distribution, which a draw from the unmasked one does not keep).
  bool checks_first(const SamplingParams& p) const {
    return p.greedy() || ((p.top_k <= 0 || p.top_k >= vocab_size_) && p.top_p >= 1.0f && p.min_p <= 0.0f);
  }
  // The next token of seq: step = the tokens it has generated (during a verification walk, the
  // kept drafts pushed onto token_ids count).
  Status sample(const float* logits, const Sequence& seq, int32_t* token, const uint32_t* allowed = nullptr) const {
    return sample(logits, seq.params, seq.token_ids, seq.num_prompt_tokens, seq.seed,
                  static_cast<uint32_t>(seq.num_output_tokens()), token, allowed);
  }

  // log_softmax(logits)[token], its rank (1 = most likely; ties rank the lower id first) and
  // the top_n most likely (id, logprob), most likely first.
  TokenLogprob logprob(const float* logits, int32_t token, int top_n) const;

  // Whether sampling seq's next token reads its logits row on the host. False when the runner's
  // token is the whole answer: nothing that only the host applies (grammar, logit_bias,
  // penalties, a min_tokens mask in force) and either greedy without logprobs (the device's
  // argmax), or, with device_samples (the runner samples each row under StepInput::sample_params
  // and returns its logprob and rank), any temperature with logprobs at most 0 (the chosen
  // token's own logprob; top_logprobs > 0 needs the row). Also false when the next token is
  // forced and no logprobs are asked. Speculative verification rows follow the same rule: the
  // walk samples each row as plain decoding would (a point-mass draft needs no p(draft); a
  // sampled drafter's min(1, p / q) rule would need the rows). A runner copies only the rows for
  // which this is true, so grammar masks and logit_bias reach the device's rows through this.
  // device_masks: the runner also applies grammar masks on its device (ModelRunner::masks_on_device,
  // and the row is no speculative verification row): a constrained row then follows the same rule
  // as an unconstrained one, its token drawn again under its mask once the mask is filled.
  static bool needs_logits(const Sequence& seq, bool device_samples = false, bool device_masks = false);

  // The error of a row left with nothing to sample (grammar: a mask was applied), on the host
  // path and for the device's token -2 (sample::kNothingAllowed) alike.
  static Status all_masked_error(bool grammar);

  // Steps 1 (min_tokens, logit_bias) and 2 (penalties) in place (exposed for tests).
  void apply_penalties(float* logits, const SamplingParams& params, const std::vector<int32_t>& token_ids,
                       int num_prompt) const;

 private:
  int vocab_size_;
};

}  // namespace surogate::serve
