// Scheduler: decides, each step, which tokens of which sequences run. Two queues: waiting (FIFO;
// preempted sequences go back to its front) and running (admission order; a running sequence
// holds KV blocks for all its tokens).
//
// One step, in this order, under a token budget (max_num_batched_tokens) and max_num_seqs:
//   1. decodes: every running sequence with one token left gets it, plus its draft tokens
//      (speculative decoding: a span of 1 + k tokens with a logits row at each, the k drafts
//      cut to what the budget and the free blocks allow, never a preemption for them). When its next block cannot be
//      had, the most recently admitted running sequence not yet scheduled is preempted (blocks
//      freed, back to the front of waiting, recomputed later); if there is none, the sequence
//      itself is. Nothing is ever truncated or dropped.
//   2. prefill chunks of running sequences admitted in an earlier step.
//   3. admissions from waiting, in order, while blocks, the budget and max_num_seqs allow (none
//      in a step that preempted). A prompt longer than the budget is split across steps (chunked
//      prefill). A prompt that can never fit (more tokens than max_model_len or the whole cache)
//      finishes with an error instead of waiting forever.
// Bidirectional embedding spans (Sequence::embeds): a chunk never ends inside one, since its
// tokens see the span's later keys, which must be written in the same step. A chunk that would
// stops before the span instead; a chunk that starts at the span takes all of it, even past the
// token budget (by at most the span's length), so a span longer than the budget still runs.
// Embedding rows of the positions a step computes go into its StepInput (embed_index /
// embed_rows), with each token's kv_limit when a bidirectional span is among them.
// Each running sequence also holds one of max_num_seqs recurrent-state slots (StepInput::
// state_slots), so a model with per-sequence state beside its KV blocks (a conv or SSM state)
// finds it again next step; a slot is always free at admission (no more than max_num_seqs run).
// The result is a StepPlan: each sequence's token span and logits rows, plus the flattened
// StepInput for the runner.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "serve/block_manager.h"
#include "serve/model_runner.h"
#include "serve/sequence.h"

namespace surogate::serve {

struct SchedulerConfig {
  int max_num_seqs = 128;
  int max_num_batched_tokens = 8192;
  int max_model_len = 0;  // tokens per sequence (prompt + output); the engine resolves it
  // The runner samples on its device (ModelRunner::samples_on_device): plain sampled rows need no
  // logits on the host, and every step carries StepInput::sample_params.
  bool device_sampling = false;
  // It also draws grammar rows under their masks (ModelRunner::masks_on_device; the engine's
  // SUROGATE_DEVICE_MASKS=0 turns it off): a plain constrained row needs no logits on the host.
  bool device_masks = false;
};

// One sequence's share of a step: positions [start, start + len) are computed.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  int start = 0;
  int len = 0;
  int sample_row = -1;        // logits row (in [0, R)) to sample the next token from; -1: mid-prompt chunk
  int prompt_lp_row = -1;     // first logits row of this chunk's prompt-logprob rows
  int prompt_lp_pos = 0;      // the prompt position of that row
  int num_prompt_lp_rows = 0;
  int num_draft = 0;          // draft tokens verified: rows sample_row .. sample_row + num_draft
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  StepInput input;
  std::vector<Sequence*> rejected;  // finished by admission control in this step
  int num_preempted = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager* block_manager);

  void add(Sequence* seq);
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }

  StepPlan schedule();
  const SchedulerConfig& config() const { return config_; }
  // After the runner: the step's tokens are in the cache; full blocks become findable. Spans
  // with draft tokens are left to accept().
  void update(const StepPlan& plan);
  // After verifying a speculative span and appending the tokens it kept: the KV of all tokens
  // but the last is valid (the rest of the span is rolled back), full blocks become findable,
  // blocks taken only for rejected drafts go back.
  void accept(Sequence& seq);
  // Take a sequence out of the queues and free its blocks.
  void finish(Sequence* seq, FinishReason reason, std::string message = {});

 private:
  void preempt(Sequence* seq);
  // How many of seq's uncomputed tokens the next chunk takes under `budget` (see the header).
  static int chunk_len(const Sequence& seq, int budget);
  void build_input(StepPlan& plan) const;

  SchedulerConfig config_;
  BlockManager* block_manager_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  int64_t num_preemptions_ = 0;
  std::vector<int32_t> free_state_slots_;  // of [0, max_num_seqs); back = next handed out
};

}  // namespace surogate::serve
