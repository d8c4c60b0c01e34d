#include "serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu/sample.h"
#include "runtime/op_checks_sample.h"

namespace surogate::serve {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Scratch reused across calls on one thread (sampling runs on the engine thread or its pool).
struct Scratch {
  std::vector<float> row;
  std::vector<int32_t> counts;  // per token id, zero between calls
  std::vector<int32_t> order;
};

Scratch& scratch(int vocab_size) {
  thread_local Scratch s;
  if (static_cast<int>(s.row.size()) < vocab_size) {
    s.row.resize(vocab_size);
    s.counts.assign(vocab_size, 0);
  }
  return s;
}

// "a before b" in the order: larger value first, then lower id.
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

}  // namespace

void Sampler::apply_penalties(float* logits, const SamplingParams& p, const std::vector<int32_t>& token_ids,
                              int num_prompt) const {
  const int num_output = static_cast<int>(token_ids.size()) - num_prompt;
  if (num_output < p.min_tokens) {
    for (int32_t t : p.stop_token_ids) logits[t] = kNegInf;
    if (!p.ignore_eos) {
      for (int32_t t : p.eos_token_ids) logits[t] = kNegInf;
    }
  }
  for (const auto& [t, bias] : p.logit_bias) logits[t] += bias;  // -inf stays -inf
  std::vector<int32_t>& seen = scratch(vocab_size_).counts;
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    for (int32_t t : token_ids) {
      if (seen[t]++ == 0) logits[t] = logits[t] > 0.0f ? logits[t] / r : logits[t] * r;
    }
    for (int32_t t : token_ids) seen[t] = 0;
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    const auto out_begin = token_ids.begin() + num_prompt;
    for (auto it = out_begin; it != token_ids.end(); ++it) ++seen[*it];
    for (auto it = out_begin; it != token_ids.end(); ++it) {
      const int32_t t = *it;
      if (seen[t] == 0) continue;  // already done
      logits[t] -= p.frequency_penalty * static_cast<float>(seen[t]) + p.presence_penalty;
      seen[t] = 0;
    }
  }
}

Status Sampler::all_masked_error(bool grammar) {
  return SG_ERROR(StatusCode::kInvalidArgument, "every token is masked: nothing left to sample",
                  grammar ? "the grammar allows only tokens that min_tokens, logit_bias or the stop "
                            "tokens exclude (often: it allows only eos while min_tokens masks it)"
                          : "min_tokens masks eos and stop_token_ids; check that they do not cover the "
                            "vocabulary");
}

bool Sampler::needs_logits(const Sequence& seq, bool device_samples, bool device_masks) {
  const SamplingParams& p = seq.params;
  if (!seq.forced.empty()) return p.logprobs >= 0;
  const bool masking = seq.num_output_tokens() < p.min_tokens &&
                       (!p.stop_token_ids.empty() || (!p.ignore_eos && !p.eos_token_ids.empty()));
  // A grammar row's mask goes to the device with it (ModelRunner::sample_masked) when the runner
  // takes masks and nothing else needs the host; a constrained sequence still reasoning has no mask.
  const bool host_grammar = p.constrained && !(device_samples && device_masks);
  if (masking || !p.logit_bias.empty() || host_grammar || p.repetition_penalty != 1.0f ||
      p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    return true;
  }
  if (device_samples) return p.logprobs > 0;
  return !p.greedy() || p.logprobs >= 0;
}

Status Sampler::sample(const float* logits, const SamplingParams& p, const std::vector<int32_t>& token_ids,
                       int num_prompt, uint64_t seed, uint32_t step, int32_t* token, const uint32_t* allowed) const {
  const int V = vocab_size_;
  Scratch& s = scratch(V);
  float* x = s.row.data();
  for (int i = 0; i < V; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      return SG_ERROR(StatusCode::kInternal, str_cat("the model produced a non-finite logit (", logits[i],
                                                     ") for token ", i),
                      "check the model's weights and dtype; NaN logits usually mean an overflow");
    }
    x[i] = logits[i];
  }
  apply_penalties(x, p, token_ids, num_prompt);  // a masked token's -inf stays -inf under a penalty
  float row[kSampleParamCols];
  if (allowed != nullptr && !p.greedy() && checks_first(p)) {  // drawn first, checked (token_mask.h)
    pack_sample_params(row, p.temperature, p.top_k, p.top_p, p.min_p, seed, step);
    const int32_t t = cpu::sample_token(x, V, row);
    if (x[t] != kNegInf && mask_allows(allowed, t)) {  // (-inf: a row of -inf only, failed below)
      *token = t;
      return Status::OK();
    }
    step |= kSampleRedraw;  // refused: drawn again under the mask, from an independent uniform
  }
  if (allowed != nullptr) cpu::mask_row(x, V, allowed);

  int32_t best = 0;
  for (int i = 1; i < V; ++i) best = x[i] > x[best] ? i : best;
  if (x[best] == kNegInf) return all_masked_error(allowed != nullptr);
  if (p.greedy()) {
    *token = best;
    return Status::OK();
  }

  // The sample op's draw on the masked, penalized row (masked tokens are -inf: weight 0).
  pack_sample_params(row, p.temperature, p.top_k, p.top_p, p.min_p, seed, step);
  *token = cpu::sample_token(x, V, row);
  return Status::OK();
}

TokenLogprob Sampler::logprob(const float* logits, int32_t token, int top_n) const {
  const int V = vocab_size_;
  float m = kNegInf;
  for (int i = 0; i < V; ++i) m = std::max(m, logits[i]);
  double sum = 0.0;
  for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  const double lse = m + std::log(sum);

  TokenLogprob out;
  out.token_id = token;
  out.logprob = static_cast<float>(logits[token] - lse);
  ByValueDesc by{logits};
  int rank = 1;
  for (int i = 0; i < V; ++i) rank += by(i, token);
  out.rank = rank;
  if (top_n > 0) {
    std::vector<int32_t>& ids = scratch(V).order;
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
    const int n = std::min(top_n, V);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), by);
    for (int i = 0; i < n; ++i) {
      out.top_ids.push_back(ids[i]);
      out.top_logprobs.push_back(static_cast<float>(logits[ids[i]] - lse));
    }
  }
  return out;
}

}  // namespace surogate::serve
