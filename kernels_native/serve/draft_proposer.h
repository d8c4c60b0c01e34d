// DraftProposer: speculative drafts from a smaller model of the same tokenizer (vLLM's `draft_model`
// method), run greedily on its own ModelRunner in the engine thread, between the target's steps.
//
// KV: the draft runner owns a KV cache of the engine's num_blocks x block_size (its own layers,
// its own memory) and is addressed with the target's block tables: a sequence's draft KV sits at
// the same block ids as its target KV, so the block manager, the prefix cache and preemption need
// no second bookkeeping. Sequence::draft_computed says how many leading positions the draft holds;
// the engine lowers it to what verification kept (a rejected draft's KV is stale) and the block
// manager carries it across prefix-cache hits (blocks marked `drafted`).
//
// One proposal for a batch of sequences that just sampled (each wanting k_i tokens):
//   catch-up: every sequence's positions [draft_computed, num_tokens) run through the draft (the
//     accepted tokens and the bonus token of the last step; a whole prompt after prefill), in runs
//     of at most max_num_batched_tokens tokens; the last position's row gives draft token 1;
//   then k - 1 decode runs: draft token j at position num_tokens + j - 1 gives token j + 1.
// Drafts are the draft model's argmax: a point mass, so the engine's verification (engine.h) keeps
// the target's distribution for sampled requests and greedy outputs equal plain decoding.
// The draft KV of positions num_tokens .. num_tokens + k - 2 needs blocks before the next step
// takes them: they are appended here (BlockManager::may_append), only while free blocks remain
// for every running sequence's next token, so drafting never causes a preemption. A failing draft
// run leaves the batch without drafts (the target decodes plainly) and reports the error.
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "serve/block_manager.h"
#include "serve/model_runner.h"
#include "serve/sequence.h"

namespace surogate::serve {

class DraftProposer {
 public:
  DraftProposer(std::shared_ptr<ModelRunner> runner, int block_size, int max_num_batched_tokens);

  // Writes each seqs[i]'s draft_ids (at most want[i] tokens; fewer where blocks run short, none
  // for a sequence holding a token the draft's vocabulary lacks) and advances draft_computed.
  // `num_running`: sequences that may each need one more block in the next step.
  Status propose(const std::vector<Sequence*>& seqs, const std::vector<int>& want, BlockManager* bm,
                 int num_running);

  int vocab_size() const { return runner_->vocab_size(); }
  int64_t num_runs() const { return num_runs_; }

 private:
  // One draft step over `spans` (sequence, first position, token count; the tokens come from the
  // sequence, or `next` for position num_tokens + j - 1); appends each span's argmax at its last
  // position, where `row` is set, to `out`.
  struct Span {
    Sequence* seq;
    int start;
    int len;
    bool row;
  };
  Status run(const std::vector<Span>& spans, std::vector<int32_t>* argmax);

  std::shared_ptr<ModelRunner> runner_;
  int block_size_;
  int max_tokens_;
  int64_t num_runs_ = 0;
  StepInput in_;
  StepOutput out_;
};

}  // namespace surogate::serve
