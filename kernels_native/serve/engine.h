// Engine: one model's continuous-batching loop. Requests come in through submit() and abort()
// from any thread (an inbox under a mutex); the engine thread owns everything else (sequences,
// scheduler, block manager) and runs step() until shutdown:
//
//   plan = scheduler.schedule();         // which tokens run, where their KV goes
//   runner.run(plan.input, &out);        // the model: logits rows (and their tokens, on the device)
//   postprocess(plan, out, masks);       // sample, append, check stop conditions
//   collect_finished();                  // free finished sequences, push outputs to the channel
//
// Constrained requests' grammar masks (token_mask.h) are computed on a helper thread while the
// runner runs the step, and read by the sampler in postprocess.
//
// Speculative decoding (num_speculative_tokens > 0): after a sequence samples, a proposer (the
// n-gram one, ngram_proposer.h) guesses its next k tokens (`draft_ids`); the next step runs
// them as one span of 1 + k tokens (the chunked-prefill path over the paged cache) with a
// logits row at each position. postprocess verifies them in order: the token sampled from row j
// exactly as plain decoding would sample it (same penalties, filters and draw: Philox at step
// num_output + j, on the host or the device) is emitted;
// while it equals draft j the walk goes on to row j + 1, after all k the last row gives a bonus
// token. For a point-mass draft (n-gram, greedy drafting) this is speculative rejection
// sampling: draft t is accepted with probability p(t), and a rejection emits a token from p with
// t removed and renormalised, so outputs keep the target distribution; and since one draw is
// made per emitted token in order, a seeded request's tokens are those of plain decoding (greedy
// ones are identical). The stop rules run token by token inside the walk (nothing past a stop
// is emitted). Then the KV of the rejected positions is rolled back (num_computed_tokens), the
// blocks taken only for them are freed, and the prefix cache registers only accepted blocks.
//
// Proposers: "ngram" (ngram_proposer.h: prompt lookup, per sequence) and "draft" (a draft
// model, draft_proposer.h: a second ModelRunner run greedily over the batch of sequences that
// just sampled, once per step after the samples; its KV cache shares the engine's block ids).
//
// Outputs go to an OutputChannel that consumers poll. The engine never touches Python: a
// runner that calls Python (PyModelRunner) takes the GIL only inside its run(), a Python
// TokenMasker only inside its fill().
// Without start(), step() drives the same loop from the caller's thread (tests, offline use).
#pragma once

#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve/block_manager.h"
#include "serve/draft_proposer.h"
#include "serve/model_runner.h"
#include "serve/ngram_proposer.h"
#include "serve/output_channel.h"
#include "serve/sampler.h"
#include "serve/scheduler.h"
#include "serve/token_mask.h"

namespace surogate::serve {

struct EngineConfig {
  int block_size = 16;
  int num_blocks = 0;                // KV cache size, in blocks (the runner allocates the memory)
  int max_num_seqs = 128;
  int max_num_batched_tokens = 8192;
  int max_model_len = 0;             // prompt + output per request; 0 = what the cache holds
  bool enable_prefix_caching = true;
  std::vector<int32_t> eos_token_ids;  // the model's; used by requests that name none
  bool has_seed = false;             // base of the seeds of requests without one
  uint64_t seed = 0;
  // Speculative decoding: "" (off), "ngram" or "draft" (needs the draft runner at create());
  // drafts of up to num_speculative_tokens tokens.
  std::string speculative_method;
  int num_speculative_tokens = 0;
  NgramConfig ngram;                 // prompt_lookup_min / max of the ngram method
  // No drafts while more than this many sequences run (a large batch is compute-bound: rejected
  // rows cost real time there); 0 = always speculate. vLLM's speculative_disable_by_batch_size.
  int speculative_disable_by_batch_size = 0;
};

struct Request {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  int32_t adapter_id = -1;
  // Embedding rows in place of prompt tokens' embeddings (start, len, rows, key, bidirectional
  // set; embed_widths[i] the width of span i's rows), checked at submit against the prompt and
  // the runner's hidden size; the engine fills in their digests.
  std::vector<EmbedSpan> embeds;
  std::vector<int> embed_widths;  // per span: the width of its rows
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  BlockManagerStats blocks;
  int64_t prompt_tokens = 0;      // prompts of requests that reached their first token
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_finished = 0;       // requests finished for any reason (aborts and errors included)
  double step_seconds = 0;        // wall time in steps (scheduling, the model, sampling, outputs)
  double model_seconds = 0;       // of which in the model runner (grammar masks' waits included)
  // Of model_seconds, a grammar step's parts after the runner's run: waiting for the masks filled
  // beside it, checking its draws, and drawing refused rows again under their masks.
  double mask_wait_seconds = 0;
  double check_seconds = 0;
  double redraw_seconds = 0;
  // Speculative decoding (vLLM's spec_decode_* counters): verification spans with at least one
  // draft token, the draft tokens in them, those accepted, and accepted per draft position.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  // Grammar rows whose mask was applied on the device (Engine::sample_masked), not on the host.
  int64_t device_masked_rows = 0;
  // Grammar rows drawn first on the device and checked (token_mask.h), and of those the ones the
  // grammar allowed as drawn (no mask filled: the masker checked them).
  int64_t grammar_checked_rows = 0;
  int64_t grammar_checked_allowed = 0;
  std::string last_error;         // the last runner / sampling failure, if any
};

class Engine {
 public:
  // Validates the config against the runner (vocab size) and builds the engine, not started.
  // `draft`: the draft model's runner of speculative_method "draft" (its KV cache of the same
  // num_blocks x block_size; vocabularies may differ in padding: see draft_proposer.h).
  static Status create(const EngineConfig& config, std::shared_ptr<ModelRunner> runner,
                       std::unique_ptr<Engine>* out, std::shared_ptr<ModelRunner> draft = nullptr);
  ~Engine();

  // Queue a request; its id is written to *id. Bad input (empty prompt, token ids outside the
  // vocabulary, sampling parameters out of range, embedding spans outside the prompt,
  // overlapping or of the wrong width) is an error naming the field.
  Status submit(Request request, uint64_t* id);
  // Finish a request now ("abort"): its blocks are freed before the next step. Unknown or
  // already finished ids are ignored.
  void abort(uint64_t id);
  // Forget every cached prefix, on the engine thread between steps (the KV memory is about to be
  // released or was rewritten); waits for it and returns how many blocks left the cache.
  int reset_prefix_cache();

  // The grammar hook of constrained requests; before start(). Without one, a constrained
  // request is refused at submit.
  void set_token_masker(std::shared_ptr<TokenMasker> masker) { masker_ = std::move(masker); }

  // Hold the engine thread before its next step (the step in flight finishes) until release():
  // a caller submitting a batch of requests (GRPO's rollouts) has the first step see them all
  // instead of one. Submits and aborts queue meanwhile; reset_prefix_cache must not be called.
  void hold();
  void release();

  Status start();
  // Stop the engine thread after its current step; requests still in flight finish as "abort".
  void shutdown();
  bool running() const { return running_.load(); }
  // One iteration on the calling thread; only while the engine thread is not running.
  Status step();

  std::vector<RequestOutput> poll(double timeout_s) { return outputs_.poll(timeout_s); }
  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  int vocab_size() const { return sampler_.vocab_size(); }

 private:
  Engine(const EngineConfig& config, std::shared_ptr<ModelRunner> runner, std::shared_ptr<ModelRunner> draft);

  struct Command {
    std::unique_ptr<Sequence> seq;  // a submission, or
    uint64_t abort_id = 0;          // an abort when seq is null and reset is not set, or
    std::shared_ptr<std::promise<int>> reset;  // a prefix-cache reset (answered with the blocks dropped)
  };

  // A step's grammar rows: seqs[k]'s next token is limited by mask[k] (mask_words(V) words, in
  // rows or the engine's check_rows_; null: no mask, its draw was checked and allowed).
  // checked[k]: drawn first and checked (Sampler::checks_first, token_mask.h), its mask filled
  // only when the check refuses the draw (redraw[k]: then drawn again under it, from the second
  // uniform); by the masker's check when it has one, else its mask is filled with the rest and
  // the draw's bit read.
  struct StepMasks {
    std::vector<Sequence*> seqs;
    std::vector<MaskRequest> requests;
    std::vector<int> sample_row;
    std::vector<uint8_t> checked;
    std::vector<const uint32_t*> mask;
    std::vector<uint8_t> redraw;
    std::vector<uint32_t> rows;
    Status status;
  };

  void loop();
  bool step_once();  // true when it scheduled anything
  void drain_inbox();
  Status run(const StepPlan& plan, StepOutput* out);
  // The masker's requests for the plan's constrained sequences that sample (advances mask_fed).
  void collect_masks(const StepPlan& plan, StepMasks* masks);
  // On the helper thread while the model runs: the masks of the rows masked before their draw
  // (and of every row, with a masker that cannot check), the other checked rows' matchers advanced.
  Status fill_masks(StepMasks* masks);
  // After the model ran: the checked rows' device draws checked; a refused one gets its mask.
  Status check_draws(const StepOutput& out, StepMasks* masks);
  // Once the masks are filled: the runner draws the grammar rows that stayed on the device under
  // their masks (SchedulerConfig::device_masks), overwriting their tokens in out.
  Status sample_masked(const StepPlan& plan, const StepMasks& masks, StepOutput* out);
  void postprocess(const StepPlan& plan, const StepOutput& out, const StepMasks& masks);
  // The reasoning span after `token` was appended (forced: it came from seq.forced).
  void track_reasoning(Sequence& seq, int32_t token, bool forced);
  void check_stop(Sequence& seq, int32_t token);
  // The reason appending `token` (already in seq.token_ids) finishes seq, kNone if it does not.
  FinishReason stop_reason(const Sequence& seq, int32_t token) const;
  // Draft tokens for a sequence that just sampled (speculative decoding): how many it may take,
  // and the n-gram proposer's; the draft model's run over all of them at once (propose_drafts).
  int draft_budget(const Sequence& seq) const;
  void propose(Sequence& seq);
  void propose_drafts(const std::vector<Sequence*>& seqs);
  void finish(Sequence& seq, FinishReason reason, std::string message);
  void collect_finished();
  void abort_all();
  RequestOutput& output_for(Sequence& seq);
  void publish_stats();

  EngineConfig config_;
  std::shared_ptr<ModelRunner> runner_;
  std::shared_ptr<TokenMasker> masker_;
  std::vector<uint32_t> check_rows_;  // the masks of checked draws the grammar refused, this step
  std::unique_ptr<DraftProposer> drafter_;  // speculative_method "draft"
  BlockManager block_manager_;
  Scheduler scheduler_;
  Sampler sampler_;
  OutputChannel outputs_;

  // Engine-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  std::vector<RequestOutput> step_outputs_;
  std::unordered_map<uint64_t, size_t> step_output_index_;
  std::vector<Sequence*> finished_;
  EngineStats counters_;

  // Shared with submitters.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Command> inbox_;
  bool stop_ = false;
  bool held_ = false;
  bool shut_down_ = false;
  std::atomic<uint64_t> next_id_{1};
  uint64_t seed_base_ = 0;
  std::atomic<uint64_t> seed_counter_{0};
  std::thread thread_;
  std::atomic<bool> running_{false};

  mutable std::mutex stats_mu_;
  EngineStats stats_;
};

}  // namespace surogate::serve
